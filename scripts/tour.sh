#!/usr/bin/env bash
# The terminal tour: what FlashLab has, in a few short sections, using the built `flashlab` command.
# Builds nothing. Usage: bash scripts/tour.sh [BUILD_DIR]   (default: build; needs BUILD_DIR/bin/flashlab)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
flashlab="$build/bin/flashlab"
if [ ! -x "$flashlab" ]; then
  echo "tour: $flashlab not found: build first (bash scripts/build.sh), or pass the build folder" >&2
  exit 2
fi

bold=""; plain=""
if [ -t 1 ]; then bold=$'\033[1m'; plain=$'\033[0m'; fi
section() {
  printf '\n%s== %s%s\n' "$bold" "$1" "$plain"
  [ $# -lt 2 ] || printf '%s\n' "$2"
}
show() {  # echo the command, then run it
  printf '\n$ flashlab %s\n' "$*"
  "$flashlab" "$@"
}

section "1. The variants" \
  "One table lists every implementation; check, run, bench and the app all read it."
show check --list

section "2. Every variant against naive attention in double (causal, GQA: 4 query heads share 2 K/V heads)" \
  "Fresh random inputs each run; the seed is printed so a failure can be repeated."
show check --batch 1 --heads 4 --heads-kv 2 --seq-q 200 --seq-k 256 --head-dim 64 --causal bottom-right

section "3. The backward pass too (dQ, dK, dV), with dropout: every variant drops the same elements" \
  "The tiled backward recomputes S and P from the saved log-sum-exp instead of storing them."
show check --heads 2 --seq-q 96 --head-dim 32 --causal top-left --dropout 0.1 --backward

section "4. Where the bytes go: N = 4096, d = 64, an SRAM of 96 KiB, fp16" \
  "Standard attention writes S and P (N x N) to HBM and reads them back. FlashAttention never does:
its inner loop re-reads tiles instead. FA1 (K/V outer) re-reads Q and re-reads and re-writes O, m, l
once per K/V block (Tc times); FA2 (Q outer) keeps O in SRAM, writes it once, and re-reads K and V
once per Q block (Tr times). Which total is smaller depends on Tr vs Tc; the O traffic is FA1's alone."
for algorithm in standard fa1 fa2; do
  show trace --algorithm "$algorithm" --seq-q 4096 --head-dim 64 --sram-bytes 98304
done

section "5. More SRAM, fewer bytes: FA2's traffic falls about as 1/M (N = 4096, d = 64)" \
  "Doubling M doubles the block sizes, so K and V are re-read half as often, until Br reaches d
(the paper's Br = min(Bc, d)): from then on Tr stays N/d and the traffic stops falling."
for sram in 4096 8192 16384 32768 65536; do
  printf '$ flashlab trace --algorithm fa2 --seq-q 4096 --head-dim 64 --sram-bytes %-6s -> ' "$sram"
  "$flashlab" trace --algorithm fa2 --seq-q 4096 --head-dim 64 --sram-bytes "$sram" | grep "HBM traffic"
done

section "6. The same events on an H100: cuda-fa2's own grid through the L2 (B = 1, H = 16, d = 64)" \
  "The paper's count treats every tile load as a trip to HBM. On the GPU, 264 thread blocks run at once
and share the K/V tiles they load through the L2, so DRAM moves far less: Q, K and V once while the
K/V of the heads in flight fit the L2, more past that knee."
for n in 8192 131072; do
  printf '$ flashlab trace --variant cuda-fa2 --gpu h100 --heads 16 --seq-q %-6s --head-dim 64 -> ' "$n"
  "$flashlab" trace --variant cuda-fa2 --gpu h100 --heads 16 --seq-q "$n" --head-dim 64 | grep "DRAM reads"
done

section "Next" \
  "flashlab run --help      one variant on your own .npy tensors (NumPy / PyTorch)
flashlab bench --help    time and memory against sequence length
flashlab trace --events  the tile-by-tile event stream the app animates"
