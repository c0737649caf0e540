#!/usr/bin/env bash
# The cuda-fa3-ws backward at d = 64 with two consumer warpgroups (A, Bc = 128) and with three (B, Bc = 192,
# FLASHLAB_FA3_BACKWARD_D64_CONSUMERS=3), side by side in one call on the lent GPU machine, through
# scripts/backward_ab.sh: the backward's GPU suite on both, `flashlab check --backward` and compute-sanitizer on B,
# then the A/B at the FA2 setting and at a Llama's grouped-query attention.
#   device run: bash scripts/backward_d64_consumers_ab.sh "$OUT"     (carry .deps; make it with scripts/make_deps.sh)
# Environment: SEQS, ROUNDS, TIMELINE as backward_ab.sh's; PARTS (default "check sanitize bench"); A_CONSUMERS and
# B_CONSUMERS (default 2 and 3) to swap the sides.
set -uo pipefail
A_ARGS="-DFLASHLAB_FA3_BACKWARD_D64_CONSUMERS=${A_CONSUMERS:-2}" \
B_ARGS="-DFLASHLAB_FA3_BACKWARD_D64_CONSUMERS=${B_CONSUMERS:-3}" HEAD_DIM=64 PARTS=${PARTS:-"check sanitize bench"} \
  exec bash "$(dirname "$0")/backward_ab.sh" "$@"
