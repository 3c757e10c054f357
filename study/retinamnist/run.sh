#!/usr/bin/env bash
# retinamnist's stages of the study: see ../stages.sh (run from anywhere).
#   bash study/retinamnist/run.sh STAGE...     # STAGE = a sweep file of this folder without .yaml
exec bash "$(dirname "${BASH_SOURCE[0]}")/../stages.sh" retinamnist "$@"
