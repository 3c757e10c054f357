#!/usr/bin/env bash
# Tables (Markdown and CSV) and plots of the study from its results files; run from anywhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
here=docs/results/pneumoniamnist
res=results/pneumoniamnist-study
report() { .venv/bin/python -m mpicd report "$@"; }
main=("$res"/main-high/*.h5 "$res"/main-low/*.h5)
{
  echo "# Main grid: 4 clients, authors' LeNet5 + Adam, 150 images/class, 100 rounds"
  echo; echo "## Score = mean of the last 10 rounds"; echo
  report "${main[@]}" --last 10 --csv "$here/main-last10.csv" --plot "$here/minority-vs-skew.png" \
    --plot-rounds "$here/minority-vs-round.png" --plot-bytes "$here/bytes-per-round.png"
  echo; echo "## Score = test metrics at the round with the best validation minority accuracy"; echo
  report "${main[@]}" --select best-val --csv "$here/main-bestval.csv"
  for ref in local fedavg fedproto feddistill fedamp centralized; do
    echo; echo "## Paired differences against $ref (last 10 rounds)"; echo
    report "${main[@]}" --last 10 --versus "$ref" --versus-csv "$here/main-versus-$ref.csv"
  done
} > "$here/main.md"
for stage in cnn six-clients; do
  files=("$res/$stage"/*.h5)
  {
    echo "# $stage"; echo
    report "${files[@]}" --last 10 --csv "$here/$stage.csv"
    echo; echo "## Paired differences against local (last 10 rounds)"; echo
    report "${files[@]}" --last 10 --versus local --versus-csv "$here/$stage-versus-local.csv"
    echo; echo "## Paired differences against codistill (last 10 rounds)"; echo
    report "${files[@]}" --last 10 --versus codistill --versus-csv "$here/$stage-versus-codistill.csv"
  } > "$here/$stage.md"
done
echo "written: $here/{main,cnn,six-clients}.md, *.csv (cells, *-versus-*: paired comparisons), *.png"
