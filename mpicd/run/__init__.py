"""One run, in the order it happens: the plan, where it starts (startpoint, resume, checkpoint), what
it records about itself (metadata), the round loop (loop) over clients (client, participation), the
command that drives it (runner), and its guards (signals, watchdog, faults, nonfinite)."""
