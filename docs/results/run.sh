#!/usr/bin/env bash
# Issue 18's study on the three official MedMNIST files, every stage in order, resumable: each stage
# is one sweep run by `mpicd pack` (finished runs skipped, an interrupted run resumed from its
# checkpoint of the last round). Stop it any time (see README.md: pause / resume) and start it again.
#   nohup nice -n 19 bash docs/results/run.sh > study.log 2>&1 &      # from the project root
# After each stage the tables of what has finished are regenerated (report.sh), so a finished
# stage can be committed with its tables. Results files: results/study/<dataset>/<stage>/ (never
# committed). STAGES="c d" bash docs/results/run.sh runs only those stages (still in this order).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p results/study && ps -o pgid= -p $$ | tr -d ' ' > results/study/study.pgid  # for docs/results/pause.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's mpicd, not the venv's editable install
here=docs/results
stages=${STAGES:-a b c d e f}
want() { [[ " $stages " == *" $1 "* ]]; }
ds() { bash "$here/$1/run.sh" "${@:2}"; }
stage() { echo "== stage $1 ($(date -u +%FT%TZ)): $2"; }
if want a; then
  stage a "tuning on the validation split: PneumoniaMNIST, RetinaMNIST (48 runs each)"
  ds pneumoniamnist tune
  ds retinamnist tune
  for d in pneumoniamnist retinamnist breastmnist; do .venv/bin/python "$here/choose.py" "$d"; done
fi
if [ ! -f "$here/pneumoniamnist/chosen.yaml" ] || [ ! -f "$here/retinamnist/chosen.yaml" ]; then
  echo "run.sh: stage a (tuning) has not finished: no chosen.yaml; the sweep files hold placeholders" >&2
  exit 2
fi
if want b; then
  stage b "low data at skew 0.6: BreastMNIST 36/class (80 runs), PneumoniaMNIST and RetinaMNIST 25/50/100 (240 each)"
  ds breastmnist lowdata
  ds pneumoniamnist lowdata
  ds retinamnist lowdata
  bash "$here/report.sh" || true
fi
if want c; then
  stage c "RetinaMNIST main grid, 4 clients (360 runs)"
  ds retinamnist main-low main-high
  bash "$here/report.sh" || true
fi
if want d; then
  stage d "PneumoniaMNIST main grid, 4 clients (360 runs)"
  ds pneumoniamnist main-low main-high
  bash "$here/report.sh" || true
fi
if want e; then
  stage e "6 clients: RetinaMNIST full grid (360 runs), PneumoniaMNIST skew 0.9 (80 runs)"
  ds retinamnist six-low six-high
  ds pneumoniamnist six-clients
  bash "$here/report.sh" || true
fi
if want f; then
  stage f "fairness options at skew 0.8 x 5 seeds: RetinaMNIST, then PneumoniaMNIST (90 runs each)"
  ds retinamnist fairness-reset fairness-termmean fairness-balanced
  ds pneumoniamnist fairness-reset fairness-termmean fairness-balanced
  bash "$here/report.sh" || true
fi
stage done "every requested stage finished"
