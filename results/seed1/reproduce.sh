#!/usr/bin/env bash
# Table 1 on the first GPU-trained zoo seed (zoo v2, seed 1: 3.6-4.2M parameters, every model
# above its accuracy bars unmasked), with the random-key control beside each column: the grid
# of results/control (arm, arm_all_rows, llada, llada_l2r, dream, each masked at its top-K
# Eq. 3 sinks and at as many random non-sink keys; sinks minus random per column pair; first
# 64 test problems per task, greedy, one thread per process) on the checkpoints zoo:NAME@1
# (installed in zoo_seeds/), over four draws. Its sink columns are what
# `SEEDS=1 PROBLEMS=64 results/tiny/reproduce.sh OUT` gives.
#
#   results/seed1/reproduce.sh [OUT]      # OUT defaults to runs/seed1; compared with results/seed1
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=1 DRAWS=0-3 COMMITTED=results/seed1 \
TITLE="Zoo v2 seed 1: accuracy under masking of the top-K Eq. 3 sinks and of as many random non-sink keys, over four draws (eps = 3)" \
  exec results/control/reproduce.sh "${1:-runs/seed1}"
