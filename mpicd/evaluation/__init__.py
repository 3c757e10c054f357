"""Held-out scores: one client's metrics, each distinct predictor evaluated once, runs that learned
nothing, and the per-round diagnostics of an algorithm's mechanism."""
