#!/usr/bin/env bash
# One dataset's tables (Markdown and CSV) and plots from its stages' runs ledgers
# (study/DATASET/<stage>.runs.jsonl, committed: first brought up to date from the results
# files in results/study/DATASET/, where there are any):
#   bash study/tables.sh DATASET        # DATASET/report.sh calls it; run from anywhere
# A stage without finished runs yet is skipped and said so. For every stage: the cells (last 10
# rounds; best-validation round; the training-split audit, --split train), paired comparisons by
# seed against codistill and local (minority and balanced accuracy, and on the training split),
# then the mechanism diagnostics (diagnostics.py). Fairness stages are reported together with the
# main grid's skew 0.8 seeds 0-4 runs, their keep / matching / ce references. The privacy-utility
# stage (PneumoniaMNIST) has its own table and plot: privacy.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(( $# == 1 )) || { echo "usage: $0 DATASET" >&2; exit 2; }
ds=$1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's mpicd, not the venv's editable install
here=study/$ds
res=results/study/$ds
report() { .venv/bin/python -m mpicd report "$@"; }
shopt -s nullglob
# the ledgers first: every finished run's scores, in git (a new machine has no results files)
for sweep in "$here"/*.yaml; do
  stage=$(basename "$sweep" .yaml)
  case "$stage" in base|chosen) continue ;; esac
  files=("$res/$stage"/*.h5)
  if ((${#files[@]})); then .venv/bin/python -m mpicd ledger "$sweep"; fi
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
declare -A parts=([lowdata]=lowdata [main]="main-low main-high" [six]="six-low six-high six-clients"
                  [fairness]="fairness-reset fairness-termmean fairness-balanced" [tune]=tune
                  [mechanism]="mechanism mechanism-control" [privacy]="privacy-off privacy-shared privacy-dpsgd")
for table in tune lowdata main six fairness mechanism; do
  files=()
  for stage in ${parts[$table]}; do if [ -f "$here/$stage.runs.jsonl" ]; then files+=("$here/$stage.runs.jsonl"); fi; done
  if ((${#files[@]} == 0)); then echo "tables.sh: $ds $table: no finished runs yet" >&2; continue; fi
  if [ "$table" = fairness ] && [ -f "$here/main-high.runs.jsonl" ]; then  # the references: skew 0.8, seeds 0-4
    grep -E '^\{"name":"[0-9]+_[^"]*_skew=0\.8_seed=[0-4]"' "$here/main-high.runs.jsonl" > "$tmp/main-high-skew0.8-seeds0-4.runs.jsonl" || true
    files+=("$tmp/main-high-skew0.8-seeds0-4.runs.jsonl")
  fi
  out="$here/$table"
  {
    echo "# $ds, $table (${parts[$table]}); written by report.sh"
    echo; echo "## Test split, mean of the last 10 rounds"; echo
    report "${files[@]}" --last 10 --csv "$out-last10.csv" \
      $( [ "$table" = main ] && echo --plot "$here/minority-vs-skew.png" --plot-rounds "$here/minority-vs-round.png" --plot-bytes "$here/bytes-per-round.png" )
    if [ "$table" != tune ]; then  # tuning: choose.py reads validation only; its test table is for the record
    echo; echo "## Test split, at each run's best-validation round"; echo
    report "${files[@]}" --select best-val --csv "$out-bestval.csv"
    echo; echo "## Training-split audit (eval.train_split; not a held-out score), last 10 rounds"; echo
    report "${files[@]}" --split train --last 10 --csv "$out-train-last10.csv"
    for ref in codistill local; do
      for metric in minority_acc balanced_acc; do
        echo; echo "## Paired by seed against $ref, $metric, test split, last 10 rounds"; echo
        report "${files[@]}" --last 10 --versus $ref --versus-metric $metric --versus-only --versus-csv "$out-versus-$ref-$metric.csv" || echo "(no $ref runs yet)"
      done
      echo; echo "## Paired by seed against $ref, minority_acc, test split, best-validation round"; echo
      report "${files[@]}" --select best-val --versus $ref --versus-only --versus-csv "$out-bestval-versus-$ref.csv" || echo "(no $ref runs yet)"
      echo; echo "## Paired by seed against $ref, minority_acc, TRAINING split (audit), last 10 rounds"; echo
      report "${files[@]}" --split train --last 10 --versus $ref --versus-only --versus-csv "$out-train-versus-$ref.csv" || echo "(no $ref runs yet)"
    done
    fi
  } | sed "s#$tmp/main-high-skew0.8-seeds0-4.runs.jsonl#$here/main-high.runs.jsonl#g" > "$out.md" \
    || echo "tables.sh: $ds $table: mpicd report failed, see $out.md" >&2  # the references' runs by their own ledger's name, not a temporary file's
done
.venv/bin/python study/diagnostics.py "$ds" || true
if [ -f "$here/privacy-off.yaml" ]; then  # the privacy-utility stage: PneumoniaMNIST only
  .venv/bin/python study/privacy.py > /dev/null || echo "tables.sh: $ds privacy: privacy.py failed" >&2
fi
