"""One run, in the order it happens: the plan, where it starts (startpoint, checkpoint), the round loop
(loop) over clients (client, participation), the command that drives it (runner), and its guards
(signals, watchdog, faults, nonfinite)."""
