"""mpicd report writes only at the paths it is given: a symbolic link at an output path (dangling or
not) is refused with exit 2 and nothing written, unless --follow-symlinks; a plain path is written as before.

The runs reported on are a committed runs ledger (no MPI run, no results file to make).
"""

import os

import pytest

from mpicd.cli import main
from mpicd.core.paths import PathRefused
from mpicd.report.export import write_replacing

from conftest import ROOT

LEDGER = ROOT / "study" / "retinamnist" / "consortium-tune-loss.runs.jsonl"  # 6 runs: codistill x 2, local
OUTPUTS = {  # flag: (file name, the bytes it starts with)
    "--csv": ("cells.csv", b"method,"),
    "--versus-csv": ("versus.csv", b"method,versus,"),
    "--plot": ("skew.png", b"\x89PNG\r\n\x1a\n"),
    "--plot-rounds": ("rounds.svg", b"<?xml"),
    "--plot-bytes": ("bytes.pdf", b"%PDF"),
}


def report(*args):
    return main(["report", str(LEDGER), "--last", "10", "--versus", "local", *map(str, args)])


@pytest.fixture(autouse=True)
def _ledger():
    if not LEDGER.is_file():
        pytest.skip(f"committed ledger absent: {LEDGER}")


def _needs(flag):
    if flag.startswith("--plot"):
        pytest.importorskip("matplotlib")


@pytest.mark.parametrize("flag", OUTPUTS)
def test_a_link_to_an_existing_file_is_refused_and_the_file_left_alone(flag, tmp_path, capsys):
    _needs(flag)
    target = tmp_path / "another-run.txt"
    target.write_bytes(b"another run's rows\n")
    link = tmp_path / OUTPUTS[flag][0]
    link.symlink_to(target)
    assert report(flag, link) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mpicd: {link}: {flag} is a symbolic link (to {target})"), err
    assert "--follow-symlinks" in err[0]
    assert target.read_bytes() == b"another run's rows\n"
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, link.name])


@pytest.mark.parametrize("flag", OUTPUTS)
def test_a_dangling_link_is_refused_and_its_target_not_made(flag, tmp_path, capsys):
    _needs(flag)
    target = tmp_path / "elsewhere" / "planted.txt"
    target.parent.mkdir()
    link = tmp_path / OUTPUTS[flag][0]
    link.symlink_to(target)
    assert report(flag, link) == 2
    err = capsys.readouterr().err
    assert f"mpicd: {link}: {flag} is a symbolic link" in err and "which does not exist" in err
    assert not os.path.lexists(target) and not any(target.parent.iterdir())
    assert link.is_symlink()


def test_a_refused_path_costs_the_others_too(tmp_path, capsys):
    """All output paths are checked before any is written: one link leaves the plain ones unmade."""
    plain, link = tmp_path / "cells.csv", tmp_path / "versus.csv"
    link.symlink_to(tmp_path / "nowhere.csv")
    assert report("--csv", plain, "--versus-csv", link) == 2
    assert "--versus-csv is a symbolic link" in capsys.readouterr().err
    assert not plain.exists() and not os.path.lexists(tmp_path / "nowhere.csv")


@pytest.mark.parametrize("dangling", [False, True], ids=["existing", "dangling"])
@pytest.mark.parametrize("flag", OUTPUTS)
def test_follow_symlinks_writes_the_links_target(flag, dangling, tmp_path):
    _needs(flag)
    name, head = OUTPUTS[flag]
    target = tmp_path / "real" / name
    target.parent.mkdir()
    if not dangling:
        target.write_bytes(b"old bytes\n")
    link = tmp_path / name
    link.symlink_to(target)
    assert report(flag, link, "--follow-symlinks") == 0
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link stays, its target is the file
    assert target.read_bytes().startswith(head)
    assert [p.name for p in target.parent.iterdir()] == [name]  # no temporary file left behind


@pytest.mark.parametrize("flag", OUTPUTS)
def test_a_plain_path_is_written_as_before(flag, tmp_path, capsys):
    _needs(flag)
    name, head = OUTPUTS[flag]
    path = tmp_path / name
    path.write_bytes(b"an older report\n")  # replaced whole
    assert report(flag, path) == 0
    assert path.read_bytes().startswith(head)
    assert f": {path}" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # a normal user file, as open() makes


def test_the_csv_rows_are_the_reports(tmp_path):
    path = tmp_path / "cells.csv"
    assert report("--csv", path) == 0
    lines = path.read_bytes().split(b"\r\n")  # the csv module's line endings, as before
    assert lines[0].startswith(b"method,") and lines[-1] == b""
    assert sorted(line.split(b",")[0] for line in lines[1:-1]) == [b"codistill", b"codistill", b"local"]


# ----------------------------------------------------------------------------- the writer itself


def test_the_writer_refuses_a_link_for_library_callers_too(tmp_path):
    target = tmp_path / "another-run.csv"
    target.write_bytes(b"kept\n")
    link = tmp_path / "cells.csv"
    link.symlink_to(target)
    with pytest.raises(PathRefused, match="the CSV file is a symbolic link"):
        write_replacing(link, lambda fh: fh.write(b"new\n"), what="the CSV file")
    assert target.read_bytes() == b"kept\n" and link.is_symlink()


def test_a_link_planted_after_the_check_is_replaced_not_written_through(tmp_path):
    """The window between the check and the write: a link made there is replaced by the file."""
    target = tmp_path / "another-run.csv"
    target.write_bytes(b"kept\n")
    path = tmp_path / "cells.csv"

    def write(fh):
        path.symlink_to(target)  # planted while the report writes
        fh.write(b"new\n")

    write_replacing(path, write)
    assert not path.is_symlink() and path.read_bytes() == b"new\n"
    assert target.read_bytes() == b"kept\n"
