"""The communication layer under a real mpiexec: data moves correctly and every byte is counted."""

import pytest

from conftest import DRIVERS, mpiexec


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_every_operation_is_counted_exactly(ranks):
    result = mpiexec(ranks, str(DRIVERS / "comm_ledger.py"), timeout=120)
    assert result.returncode == 0, result.stderr
    # ranks' lines may interleave on mpiexec's stdout: count, don't split
    assert all(result.stdout.count(f"rank {r} ok") == 1 for r in range(ranks)), result.stdout


def test_short_message_is_an_error_not_a_silent_short_buffer():
    result = mpiexec(2, str(DRIVERS / "comm_ledger.py"), "short", timeout=120)
    assert result.returncode != 0
    assert "expected 40 bytes from rank 0" in result.stderr and "received 36" in result.stderr


@pytest.mark.parametrize("case", ["undeclared", "dtype", "operation"])
def test_a_transfer_its_channel_does_not_declare_is_refused_before_anything_is_sent(case):
    result = mpiexec(2, str(DRIVERS / "comm_ledger.py"), case, timeout=120)
    assert result.returncode == 0, result.stderr
    why = {
        "undeclared": "allreduce on undeclared channel 'extra'",
        "dtype": "channel 'payload' declares float32, but a float64 buffer (2,) was about to be sent",
        "operation": "channel 'payload' declares allreduce, not allgather",
    }[case]
    assert all(
        result.stdout.count(f"rank {r} refused: mpicd: rank {r}: {why}; nothing was sent") == 1 for r in range(2)
    ), result.stdout


@pytest.mark.parametrize("ranks", [1, 3])
def test_the_exact_sum_is_the_same_bits_on_every_layout_and_the_rounded_exact_sum(ranks):
    result = mpiexec(ranks, str(DRIVERS / "exact_sum.py"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert all(result.stdout.count(f"rank {r} ok") == 1 for r in range(ranks)), result.stdout
