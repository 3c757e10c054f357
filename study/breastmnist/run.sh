#!/usr/bin/env bash
# breastmnist's stages of the study: see ../stages.sh (run from anywhere).
#   bash study/breastmnist/run.sh STAGE...     # STAGE = a sweep file of this folder without .yaml
exec bash "$(dirname "${BASH_SOURCE[0]}")/../stages.sh" breastmnist "$@"
