"""Durations as people read them in progress lines (a run's rounds, a sweep's runs)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """12s, 4m05s, 3h07m: times in progress lines."""
    s = int(round(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"
