"""Many runs: a base config and a grid of overrides (grid), and many runs in one allocation (pack)."""
