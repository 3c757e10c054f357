"""The attacker who can write files where a run writes or reads, but is not the user running it:
a link at ``--out`` (to another run's file, or dangling), a key folder open to others' writes, a key
file another uid planted, a site key others can read. Each is refused with exit 2 and one line naming
the path (and its owner), before anything is written; ``--follow-symlinks`` is the user's word that a
link at ``--out`` is meant. Real ``mpiexec -n 2``."""

from __future__ import annotations

import os
import stat

import pytest

from mpicd.core import sitekey
from mpicd.core.paths import PathRefused
from mpicd.privacy import secret
from mpicd.run import checkpoint

from conftest import mpiexec, QUICKSTART

RUN = ("clients=2", "rounds=2")
PRIVATE = "privacy={noise_multiplier: 2.0, sample_rate: 0.5}"
STRANGER = 4242  # a uid that is not the one running the tests, nor root


def refused(result, *named: str) -> str:
    """The one ``mpicd:`` line of a run refused with exit 2, which names each of ``named``."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    lines = [line for line in result.stderr.splitlines() if line.startswith("mpicd:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for name in named:
        assert name in lines[0], lines[0]
    return lines[0]


def run(out, *extra: str):
    return mpiexec(2, "-m", "mpicd", "run", str(QUICKSTART), *RUN, *extra, "--out", str(out), timeout=240)


def test_a_link_at_out_is_refused_dangling_or_not_and_followed_only_when_asked(tmp_path):
    other = tmp_path / "other-run.h5"  # another run's results file: its bytes stay as they are
    other.write_bytes(b"another run's rows")
    out = tmp_path / "link.h5"
    out.symlink_to(other)
    line = refused(run(out, "--resume"), str(out), "symbolic link", "--follow-symlinks")
    assert str(other) in line and other.read_bytes() == b"another run's rows"
    assert not checkpoint.folder_for(other).exists() and not checkpoint.folder_for(out).exists()

    gone = tmp_path / "elsewhere" / "target.h5"
    dangling = tmp_path / "dangling.h5"
    dangling.symlink_to(gone)
    refused(run(dangling), str(dangling), "does not exist")
    assert not gone.exists() and not gone.parent.exists()

    real = tmp_path / "real.h5"  # a link at the checkpoint folder: refused too
    checkpoint.folder_for(real).symlink_to(tmp_path)
    refused(run(real), f"{real}.ckpt", "symbolic link")
    assert not real.exists()

    followed = run(dangling, "--follow-symlinks")  # the user's word: the target is the results file
    assert followed.returncode == 0, followed.stderr[-3000:]
    assert gone.is_file() and dangling.is_symlink() and not checkpoint.folder_for(dangling).exists()


def test_a_key_folder_others_can_write_or_a_key_another_uid_planted_is_refused(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    keys.chmod(0o777)  # open to everyone's writes: whoever wrote a key there knows it
    line = refused(run(tmp_path / "open.h5", PRIVATE, f"privacy.key_dir={keys}"), str(keys), "others can write")
    assert "drwxrwxrwx" in line and not (tmp_path / "open.h5").exists() and list(keys.iterdir()) == []

    linked = tmp_path / "linked"
    linked.symlink_to(keys)
    refused(run(tmp_path / "linked.h5", PRIVATE, f"privacy.key_dir={linked}"), str(linked), "symbolic link")

    if os.geteuid() != 0:
        pytest.skip("planting a key owned by another uid needs root (chown)")
    keys.chmod(0o700)
    planted = secret.key_file(keys, 1)
    planted.write_text(bytes(range(32)).hex() + "\n")  # the planter's key, mode 0600, the planter's uid
    planted.chmod(0o600)
    os.chown(planted, STRANGER, STRANGER)
    refused(run(tmp_path / "planted.h5", PRIVATE, f"privacy.key_dir={keys}"), str(planted), f"uid {STRANGER}")
    assert not (tmp_path / "planted.h5").exists() and sorted(keys.iterdir()) == [planted]


def test_a_site_key_others_can_read_or_write_or_that_another_uid_owns_is_refused(tmp_path):
    folder = tmp_path / "site"
    key = sitekey.load(folder / "site.key")
    assert len(key) == 32 and stat.S_IMODE((folder / "site.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and sitekey.load(folder / "site.key") == key
    (folder / "site.key").chmod(0o640)
    with pytest.raises(PathRefused, match="others can reach it"):
        sitekey.load(folder / "site.key")
    (folder / "site.key").chmod(0o600)
    folder.chmod(0o770)
    with pytest.raises(PathRefused, match="others can write in it"):
        sitekey.load(folder / "site.key")
    folder.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(folder / "site.key", STRANGER, STRANGER)
        with pytest.raises(PathRefused, match=f"belongs to uid {STRANGER}"):
            sitekey.load(folder / "site.key")
