#!/usr/bin/env bash
# Every table, CSV and plot of the study from its results files (results/study/), then the
# summary page's claims table (summary.py rewrites the block between the claims markers of
# README.md) and claims-secondary.md, the headline sentences (headlines.py: the blocks between the
# headline markers of README.md and docs/explanation/study.md), and the mechanism table (mechanism.py: mechanism.md and the
# block between README.md's mechanism markers), and the fairness options' tables (fairness.py: fairness.md
# and the block between README.md's fairness markers). Run from anywhere; stages not run yet are skipped and said so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's mpicd, not the venv's editable install
for d in pneumoniamnist retinamnist breastmnist; do bash study/$d/report.sh; done
.venv/bin/python study/summary.py
.venv/bin/python study/headlines.py
.venv/bin/python study/mechanism.py
.venv/bin/python study/fairness.py
.venv/bin/python study/consortium_table.py
.venv/bin/python study/progress.py
