#!/usr/bin/env bash
# Tables (Markdown and CSV) and plots of the study from its results files; run from anywhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
here=study/archive/pneumoniamnist-unofficial
res=results/pneumoniamnist-study
report() { .venv/bin/python -m mpicd report "$@"; }
shopt -s nullglob # a stage not started yet has no files: report the others and say so
main=("$res"/main-high/*.h5 "$res"/main-low/*.h5)
if ((${#main[@]} == 0)); then
  echo "report.sh: no results files under $res/main-high or $res/main-low; run run.sh first" >&2
  exit 2
fi
{
  echo "# Main grid: 4 clients, authors' LeNet5 + Adam, 150 images/class, 100 rounds"
  echo; echo "## Score = mean of the last 10 rounds"; echo
  report "${main[@]}" --last 10 --csv "$here/main-last10.csv" --plot "$here/minority-vs-skew.png" \
    --plot-rounds "$here/minority-vs-round.png" --plot-bytes "$here/bytes-per-round.png"
  echo; echo "## Score = test metrics at the round with the best validation minority accuracy"; echo
  report "${main[@]}" --select best-val --csv "$here/main-bestval.csv"
  for ref in local fedavg fedproto feddistill fedamp centralized; do
    ran=("$res"/main-*/*_algorithm="${ref}"_*.h5)
    if ((${#ran[@]} == 0)); then
      echo "report.sh: no $ref runs yet: no paired differences against it" >&2
      continue
    fi
    echo; echo "## Paired differences against $ref (last 10 rounds)"; echo
    report "${main[@]}" --last 10 --versus "$ref" --versus-only --versus-csv "$here/main-versus-$ref.csv"
  done
} > "$here/main.md"
for stage in cnn six-clients authors-skew; do
  files=("$res/$stage"/*.h5)
  if ((${#files[@]} == 0)); then
    echo "report.sh: $stage skipped: no results files under $res/$stage yet" >&2
    continue
  fi
  {
    echo "# $stage"; echo
    report "${files[@]}" --last 10 --csv "$here/$stage.csv"
    echo; echo "## Paired differences against local (last 10 rounds)"; echo
    report "${files[@]}" --last 10 --versus local --versus-only --versus-csv "$here/$stage-versus-local.csv"
    echo; echo "## Paired differences against codistill (last 10 rounds)"; echo
    report "${files[@]}" --last 10 --versus codistill --versus-only --versus-csv "$here/$stage-versus-codistill.csv"
  } > "$here/$stage.md"
done
.venv/bin/python "$here/verdict.py" # codistill minus each method: verdict.md, verdict.csv
echo "written: $here/{main,cnn,six-clients,authors-skew,verdict}.md, *.csv (cells, *-versus-*: paired comparisons), *.png"
