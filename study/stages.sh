#!/usr/bin/env bash
# One dataset's stages of the study (../run.sh runs every dataset's stages in the study's order):
#   bash study/stages.sh DATASET STAGE...   # STAGE = a sweep file of DATASET's folder without .yaml
# (DATASET/run.sh STAGE... calls it.) Each stage is one `mpicd pack` job (one MPI start-up; finished
# runs skipped; an interrupted run resumes from its last checkpoint), so running it again resumes; a
# run its runs ledger holds is done even where its results file is gone (a new machine). Ranks = the
# sweep's clients (at most the cores where the sweep packs clients on ranks).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's mpicd, not the venv's editable install
(( $# )) || { echo "usage: $0 DATASET STAGE..." >&2; exit 2; }
ds=$1; shift
here=study/$ds
[ -d "$here" ] || { echo "$0: no dataset folder $here" >&2; exit 2; }
(( $# )) || { echo "usage: $0 $ds STAGE... ($(cd "$here" && ls *.yaml | grep -v -e '^base' -e '^chosen' | sed 's/.yaml$//' | tr '\n' ' '))" >&2; exit 2; }
for stage in "$@"; do
  sweep="$here/$stage.yaml"
  listing=$(.venv/bin/python -m mpicd sweep "$sweep")
  ranks=$(awk '$2 == "ranks" && !n {print $3; n = 1}' <<< "$listing")
  # a sweep that packs its clients (clients_per_rank=balanced) runs each run on at most the cores' ranks
  if grep -q "clients_per_rank=balanced" <<< "$listing" && ((ranks > $(nproc))); then ranks=$(nproc); fi
  echo "== $ds $stage: $ranks ranks ($(date -u +%FT%TZ))"
  nice -n 19 bash jobs/mpirun.sh "$ranks" pack "$sweep"
  .venv/bin/python -m mpicd ledger "$sweep"  # the finished runs' scores, to commit: $here/$stage.runs.jsonl
done
