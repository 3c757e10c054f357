"""A how-to guide's worked example carried out as written, in a copy of the package: its new files
(``<!-- example file: PATH -->`` before a python block) and its edits to existing files, each edit's
new lines shown in the guide and its old lines found exactly once in the file (so the test fails,
naming the guide, when the code moves)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE_FILE = re.compile(r"<!-- example file: (\S+) -->\n```python\n(.*?)```", flags=re.S)


def copy_of_the_package(tmp_path: Path) -> Path:
    """mpicd/, configs/, tests/conftest.py and pyproject.toml, in tmp_path/copy."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "mpicd", copy / "mpicd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", copy / "configs")
    (copy / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", copy / "tests")
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


def write_example_files(guide: str, copy: Path) -> list[str]:
    """The guide's new files, written into the copy (none may exist there yet); their paths."""
    paths = []
    for path, body in GUIDE_FILE.findall((ROOT / guide).read_text()):
        assert not (copy / path).exists(), f"{guide}: {path} already exists: the example is in the package"
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text(body)
        paths.append(path)
    return paths


def apply_edits(guide: str, copy: Path, edits: list[tuple[str, str, str]]) -> None:
    """Each (file, old, new): the new lines are shown in the guide, old occurs once in the copy's file."""
    text = (ROOT / guide).read_text()
    for path, old, new in edits:
        for line in set(new.splitlines()) - set(old.splitlines()):
            assert line in text, f"{guide} does not show the edit {line.strip()!r}"
        source = (copy / path).read_text()
        assert source.count(old) == 1, f"{guide}: {path} no longer has {old.strip()!r}: update the guide"
        (copy / path).write_text(source.replace(old, new))
