#!/usr/bin/env bash
# pneumoniamnist's stages of issue 18's study: see ../stages.sh (run from anywhere).
#   bash docs/results/pneumoniamnist/run.sh STAGE...     # STAGE = a sweep file of this folder without .yaml
exec bash "$(dirname "${BASH_SOURCE[0]}")/../stages.sh" pneumoniamnist "$@"
