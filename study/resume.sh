#!/usr/bin/env bash
# Start or resume the study on this machine (a new one, or after a session's stop), from a
# checkout of main: a git worktree at the commit study/next-start names (so development on
# main never changes the code the study runs), main's runs ledgers brought into it (a run a ledger
# holds is done), results/study here a link to the worktree's results, then run.sh in the background,
# niced, in a session of its own (study/pause.sh pauses it).
#   bash study/resume.sh                    # worktree /work/study (STUDY_WORKTREE=DIR for another)
#   bash study/resume.sh --dry-run          # say what it would do, do nothing
# Refuses (exit 2) a worktree at another commit, and does nothing while run.sh already runs there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
main=$PWD
dry=0; [ "${1:-}" = --dry-run ] && dry=1
# shellcheck source=/dev/null
source study/next-start
worktree=${STUDY_WORKTREE:-/work/study}
say() { echo "resume.sh: $*"; }
do_() { if ((dry)); then echo "  would run: $*"; else "$@"; fi; }
if [ -f "$worktree/results/study/study.pgid" ] && pgrep -g "$(cat "$worktree/results/study/study.pgid")" -f '(study|docs/results)/run.sh' >/dev/null; then
  say "the study already runs in $worktree (process group $(cat "$worktree/results/study/study.pgid")); nothing to do"
  exit 0
fi
if [ -d "$worktree" ]; then
  have=$(git -C "$worktree" rev-parse HEAD)
  if [ "$have" != "$commit" ]; then
    say "$worktree is at $have, but study/next-start names $commit: remove it (git worktree remove --force $worktree) or set STUDY_WORKTREE" >&2
    exit 2
  fi
  say "worktree $worktree at $commit"
else
  say "worktree $worktree at $commit (new)"
  do_ git worktree add --detach "$worktree" "$commit"
fi
# The study's scripts stand in study/ since the tree was moved, in docs/results/ at older commits.
if git cat-file -e "$commit:study/run.sh" 2>/dev/null; then there=study; else there=docs/results; fi
do_ bash jobs/setup.sh  # returns at once where it has run
[ -e "$worktree/.venv" ] || do_ ln -s "$main/.venv" "$worktree/.venv"
say "main's runs ledgers into the worktree (data, not code)"
for ledger in study/*/*.runs.jsonl; do do_ cp "$ledger" "$worktree/$there/${ledger#study/}"; done
do_ mkdir -p results "$worktree/results/study"
do_ ln -sfn "$worktree/results/study" results/study  # report.sh here reads the study's results files
say "STAGES=\"$stages\" run.sh in $worktree, log $worktree/study.log"
# The whole group's stdio goes to the log (and exec leaves no shell behind): a launcher that kept the
# caller's stdout would hold `resume.sh | tail` open for as long as the study runs.
if ((dry)); then
  echo "  would run: (cd $worktree && export STAGES=\"$stages\" && exec nohup setsid nice -n 19 bash $there/run.sh) >> $worktree/study.log 2>&1 < /dev/null &"
else
  (cd "$worktree" && export STAGES="$stages" && exec nohup setsid nice -n 19 bash $there/run.sh) >> "$worktree/study.log" 2>&1 < /dev/null &
fi
