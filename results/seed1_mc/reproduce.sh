#!/usr/bin/env bash
# Sink masking on multiple choice (mini_mc, scored by likelihood, not generated) on the first
# GPU-trained zoo seed (zoo v2, seed 1: checkpoints zoo:NAME@1, installed in zoo_seeds/), the
# grid of results/mc (arm, llada, dream, each masked at its top-K Eq. 3 sinks and at as many
# random non-sink keys; first 40 questions; the DLMs' Monte Carlo bound with 32 samples per
# choice) over four draws of the random keys.
# The reruns on the staged seed 0 (tools/gpu_box/rerun_on_staged_seed0.sh) start from these cells.
#
#   results/seed1_mc/reproduce.sh [OUT]      # OUT defaults to results/seed1_mc (resumes)
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=1 DRAWS=0-3 \
TITLE="Zoo v2 seed 1: mini_mc accuracy under masking of the top-K Eq. 3 sinks and of as many random non-sink keys, over four draws (eps = 3)" \
  exec results/mc/reproduce.sh "${1:-results/seed1_mc}"
