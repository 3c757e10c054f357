"""A full disk for real (root: a 4 MiB tmpfs as the output folder, filled mid-run by another
process): the job ends non-zero with one clear line naming the checkpoint folder, the free space
and --resume; the results file keeps its completed rounds (verify passes), every rank's newest
checkpoint loads and no temporary file is left; with the space freed, --resume completes the run
and it equals an uninterrupted one. Skipped, with the reason, where a tmpfs cannot be mounted."""

import importlib.util
import sys

import pytest

from conftest import ROOT


def torture_module():
    spec = importlib.util.spec_from_file_location("mpicd_torture", ROOT / "tests" / "support" / "torture.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_disk_full_mid_run_fails_clearly_keeps_the_file_and_resumes(tmp_path):
    torture = torture_module()
    torture.use_code(tmp_path, snapshot=False)  # the tree's mpicd, which this session imports
    try:
        result = torture.full_disk(tmp_path, ranks=2)
    except torture.Skip as why:
        pytest.skip(str(why))
    shown = {k: v for k, v in result.items() if k != "resume_stdout"}
    assert result["rc"] != 0, shown
    line = result["error_line"]
    folder = str(tmp_path / "tmpfs" / "run.h5.ckpt")
    assert "cannot write the checkpoint" in line and folder in line, shown
    assert "MiB free" in line and "free space and run again with --resume" in line, shown
    assert result["verify_ok"] and result["completed"] >= 2, shown
    assert result["checkpoints_load"] and not result["temporary_files"], shown
    assert result["resume_rc"] == 0 and "resuming at round" in result["resume_line"], shown
    assert result["compare"] == [] and not result["checkpoints_left"], shown
    assert result["problems"] == [], shown
