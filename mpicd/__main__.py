"""``python -m mpicd``."""

import sys

from mpicd.cli import main

sys.exit(main())
