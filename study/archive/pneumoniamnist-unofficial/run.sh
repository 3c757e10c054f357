#!/usr/bin/env bash
# The whole PneumoniaMNIST study, from the project root's point of view; resumable: every stage is
# a sweep run by `mpicd pack` (one MPI job per stage, runs one after another, finished runs
# skipped, an interrupted run resumes from its checkpoint). Stop it any time and start it again.
#   bash study/archive/pneumoniamnist-unofficial/run.sh            # about 6-7 hours on a 2-core CPU box
#   nice -n 19 bash study/archive/pneumoniamnist-unofficial/run.sh # in the background while you work
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
here=study/archive/pneumoniamnist-unofficial
pack() { bash jobs/mpirun.sh "$1" pack "$here/$2"; }
pack 4 tune.yaml                      # stage 1: lambda / k on validation, skew 0.8
pack 4 tune-cnn.yaml                  # stage 1b: SGD learning rate for FedAvgCNN on validation
.venv/bin/python "$here/choose.py"    # -> chosen.yaml and the sweep files below
pack 4 main-high.yaml                 # stage 2: skew 0.6, 0.8, 0.9 x 10 seeds, 7 methods
pack 4 main-low.yaml                  # stage 3: skew 0, 0.2, 0.4 x 5 seeds
pack 4 cnn.yaml                       # stage 4: FedAvgCNN + SGD, skew 0.6 x 3 seeds
pack 6 six-clients.yaml               # stage 5: 6 clients, skew 0.9 x 3 seeds
pack 4 authors-skew.yaml              # stage 6: the authors' skew variant, skew 0.9 x 5 seeds
bash "$here/report.sh"
