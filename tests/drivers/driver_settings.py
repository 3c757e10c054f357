"""What the test drivers run, written once: each driver imports its figures from here (a driver's
folder is first on its path), and the tests that read a driver's output import the same names
(``from drivers.driver_settings import ...``) instead of copying them."""

# tests/drivers/baselines.py: rounds of the statistics replay, of the identical-start check, of each run
STATS_ROUNDS = 3
IDENTICAL_ROUNDS = 3
RUN_ROUNDS = 2

# tests/drivers/fedavg_rounds.py: FedAvg through mpicd run on this many clients and rounds
FEDAVG_CLIENTS = 3
FEDAVG_ROUNDS = 3

# tests/drivers/fedamp_ring.py: rounds of both exchanges
FEDAMP_RING_ROUNDS = 3

# tests/drivers/buffered_writer.py: the clients each rank holds
HELD = {0: [0, 3], 1: [1], 2: [2, 4]}

# tests/drivers/payloads.py: the algorithm sections whose bytes are counted (label -> section)
PAYLOAD_VARIANTS = {
    "codistill": {"name": "codistill"},
    "codistill_batch": {"name": "codistill", "teacher_per": "batch"},
    "codistill_all": {"name": "codistill", "classes": "all"},
    "codistill_logits": {"name": "codistill", "share": "logits"},
    "local": {"name": "local"},
    "centralized": {"name": "centralized"},
    "fedavg": {"name": "fedavg"},
    "fedproto": {"name": "fedproto"},
    "fedproto_equal": {"name": "fedproto", "weighting": "equal"},
    "feddistill": {"name": "feddistill"},
    "fedamp": {"name": "fedamp"},
    "fedamp_ring": {"name": "fedamp", "exchange": "ring"},
    "fedavg_exact": {"name": "fedavg", "reduction": "exact"},
    "fedproto_exact": {"name": "fedproto", "reduction": "exact"},
    "fedlc": {"name": "fedlc"},
    "fedrs": {"name": "fedrs"},
    "fedntd": {"name": "fedntd"},
    "fedrod": {"name": "fedrod"},
    "ccvr": {"name": "ccvr"},
    "ccvr_exact": {"name": "ccvr", "reduction": "exact"},
}
