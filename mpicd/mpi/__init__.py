"""Everything MPI: the one place bytes cross it (comm) and the accounting of every byte (accounting,
channels), where a rank lives (placement), which rank holds which client (assignment), and the one
place a launcher command line is built (launch)."""
