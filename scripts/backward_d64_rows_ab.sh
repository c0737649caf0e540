#!/usr/bin/env bash
# The cuda-fa3-ws backward at d = 64 in its two block shapes, side by side in one call on the lent GPU machine:
# Br = 64 query rows per step (the shipped build, A) and Br = 128 (FLASHLAB_FA3_BACKWARD_D64_ROWS=128, B), through
# scripts/backward_ab.sh: the backward's GPU suite on both, `flashlab check --backward` and compute-sanitizer on the
# Br = 128 one, then the A/B at the FA2 setting and at a Llama's grouped-query attention.
#   device run: bash scripts/backward_d64_rows_ab.sh "$OUT"     (carry .deps; make it with scripts/make_deps.sh)
# Environment: SEQS, ROUNDS as backward_ab.sh's; PARTS (default "check sanitize bench").
set -uo pipefail
A_ARGS="" B_ARGS="-DFLASHLAB_FA3_BACKWARD_D64_ROWS=128" HEAD_DIM=64 PARTS=${PARTS:-"check sanitize bench"} \
  exec bash "$(dirname "$0")/backward_ab.sh" "$@"
