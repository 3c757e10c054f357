#!/usr/bin/env bash
# retinamnist's tables and plots from its runs ledgers: see ../tables.sh (run from anywhere).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../tables.sh" retinamnist
