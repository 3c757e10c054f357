#!/usr/bin/env bash
# The study on the three official MedMNIST files, every stage in order, resumable: each stage
# is one sweep run by `mpicd pack` (finished runs skipped, an interrupted run resumed from its
# checkpoint of the last round). Stop it any time (see README.md: pause / resume) and start it again.
#   nohup nice -n 19 bash study/run.sh > study.log 2>&1 &      # from the project root
# After each stage the tables of what has finished are regenerated (report.sh), so a finished
# stage can be committed with its tables. Results files: results/study/<dataset>/<stage>/ (never
# committed). STAGES="c d" bash study/run.sh runs only those stages (still in this order: a1 p a2 m c d b f e
# k1 k2 k3; k = the consortium stage, consortium.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Its own session and process group (setsid --wait keeps the caller waiting, as before), so that
# study/pause.sh signals the study's group and never its caller's; study.proof says which
# process leads it: pid, start time (field 22 of /proc/PID/stat), session.
# (By its path from the project root, where it now is: "$0" may be relative to another folder.)
[ "$(ps -o sid= -p $$ | tr -d ' ')" = $$ ] || exec setsid --wait bash study/run.sh "$@"
mkdir -p results/study && echo $$ > results/study/study.pgid
echo "$$ $(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f20) $(ps -o sid= -p $$ | tr -d ' ')" > results/study/study.proof
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's mpicd, not the venv's editable install
here=study
stages=${STAGES:-a1 p a2 m c d b f e k1 k2 k3}
want() { [[ " $stages " == *" $1 "* ]]; }
ds() { bash "$here/$1/run.sh" "${@:2}"; }
stage() { echo "== stage $1 ($(date -u +%FT%TZ)): $2"; }
chosen() { [ -f "$here/$1/chosen.yaml" ] || { echo "run.sh: $1's tuning (stage $2) has not finished: no $1/chosen.yaml" >&2; exit 2; }; }
# Order: PneumoniaMNIST's tuning, then the privacy-utility stage (PneumoniaMNIST only), then
# RetinaMNIST's tuning, the mechanism runs, the primary family's main grids (c, d), and the rest.
if want a1; then
  stage a1 "tuning on the validation split: PneumoniaMNIST (52 runs)"
  ds pneumoniamnist tune
  .venv/bin/python "$here/choose.py" pneumoniamnist
  .venv/bin/python "$here/choose.py" breastmnist
fi
if want p; then
  chosen pneumoniamnist a1
  stage p "privacy-utility: PneumoniaMNIST skew 0.8 x 5 seeds, epsilon 1, 4, 16, infinity (85 runs)"
  ds pneumoniamnist privacy-off privacy-shared privacy-dpsgd
  bash "$here/report.sh" || true
fi
if want a2; then
  stage a2 "tuning on the validation split: RetinaMNIST (52 runs)"
  ds retinamnist tune
  .venv/bin/python "$here/choose.py" retinamnist
fi
if want m; then
  chosen pneumoniamnist a1
  chosen retinamnist a2
  stage m "the mechanism: co-distillation's two readings with the diagnostics, skew 0 and 0.8 (20 runs each), and its lambda-0 control (10 each)"
  ds pneumoniamnist mechanism mechanism-control
  ds retinamnist mechanism mechanism-control
  bash "$here/report.sh" || true
fi
if want c; then
  chosen retinamnist a2
  stage c "RetinaMNIST main grid, 4 clients (360 runs)"
  ds retinamnist main-low main-high
  bash "$here/report.sh" || true
fi
if want d; then
  chosen pneumoniamnist a1
  stage d "PneumoniaMNIST main grid, 4 clients (360 runs)"
  ds pneumoniamnist main-low main-high
  bash "$here/report.sh" || true
fi
if want b; then
  chosen pneumoniamnist a1
  chosen retinamnist a2
  stage b "low data at skew 0.6: BreastMNIST 36/class (80 runs), PneumoniaMNIST and RetinaMNIST 25/50/100 (240 each)"
  ds breastmnist lowdata
  ds pneumoniamnist lowdata
  ds retinamnist lowdata
  bash "$here/report.sh" || true
fi
if want f; then
  chosen pneumoniamnist a1
  chosen retinamnist a2
  stage f "fairness options at skew 0.8 x 5 seeds: RetinaMNIST, then PneumoniaMNIST (90 runs each)"
  ds retinamnist fairness-reset fairness-termmean fairness-balanced
  ds pneumoniamnist fairness-reset fairness-termmean fairness-balanced
  bash "$here/report.sh" || true
fi
if want e; then
  chosen pneumoniamnist a1
  chosen retinamnist a2
  stage e "6 clients: RetinaMNIST full grid (360 runs), PneumoniaMNIST skew 0.9 (80 runs)"
  ds retinamnist six-low six-high
  ds pneumoniamnist six-clients
  bash "$here/report.sh" || true
fi
# The consortium stage (consortium.py): which label-skew method protects the minority class, at what cost.
# k1 tunes on validation (consortium.py choose then writes k2's and k3's sweep files), k2 runs the methods
# at skew 0.8 and 0.9 x 10 seeds, k3 re-runs FedAvg and local for the personalised score (cut first).
consortium() { for d in retinamnist pneumoniamnist; do [ -f "$here/$d/$1" ] || { echo "run.sh: no $d/$1: stage k1 has not finished" >&2; exit 2; }; done; }
if want k1; then
  chosen pneumoniamnist a1
  chosen retinamnist a2
  stage k1 "consortium tuning on the validation split, skew 0.8, seeds 100-101 (88 runs)"
  for d in retinamnist pneumoniamnist; do
    ds "$d" consortium-tune consortium-tune-sampler consortium-tune-loss
    .venv/bin/python "$here/consortium.py" choose "$d"
  done
fi
if want k2; then
  consortium consortium-chosen.yaml
  stage k2 "consortium: label-skew methods and balanced sampling, skew 0.8, 0.9 x 10 seeds (320-340 runs)"
  for d in retinamnist pneumoniamnist; do
    ds "$d" consortium consortium-sampler $([ -f "$here/$d/consortium-moonshot.yaml" ] && echo consortium-moonshot)
  done
  bash "$here/report.sh" || true
fi
if want k3; then
  consortium consortium-references.yaml
  stage k3 "consortium references: FedAvg and local re-run for the personalised score (80 runs)"
  for d in retinamnist pneumoniamnist; do ds "$d" consortium-references; done
  bash "$here/report.sh" || true
fi
stage done "every requested stage finished"
