#!/usr/bin/env bash
# Ring attention on a host with several GPUs, in two device calls (each well inside a call's 10 minutes):
#   bash scripts/ring_session.sh check   OUT   build; --check forward and backward on 2 and 4 GPUs (every layout,
#                                              causal none / top-left / bottom-right, GQA, odd lengths); the GPU ring
#                                              tests; compute-sanitizer on a 2-GPU check; a check under torchrun
#   bash scripts/ring_session.sh measure OUT   ours and PyTorch's context parallelism on the same shapes, in one
#                                              command: B = 1, H = 16, d = 128, bf16, causal, N = 256k and 1M (4M
#                                              forward while time is left), 2 and 4 GPUs, with each rank's timeline
#   bash scripts/ring_session.sh long OUT      N = 4M forward + backward, zigzag on 4 GPUs, with the one-GPU kernel
#                                              beside it (at H = 4, see below), and contiguous at 1M on 4 GPUs while
#                                              time is left
#   bash scripts/ring_session.sh layouts OUT   the rest of the 1M rows: striped and contiguous on 2 GPUs, PyTorch's
#                                              all-gather on 2 GPUs, and PyTorch at 4M forward + backward on 4 GPUs
#   bash scripts/ring_session.sh long2 OUT     where the ring loses at 4M, on 2 GPUs: zigzag forward at 4M with H = 4
#                                              and H = 16 and each rank's timeline, the block kernel alone on one GPU
#                                              at 4M (H = 4, 8), and every GPU's clocks, power and throttle reasons
#                                              sampled all along
#   bash scripts/ring_session.sh power OUT     the block kernel alone on GPU 0 (any host), causal against unmasked
#                                              at equal FLOPs (N = 2M: causal with H = 4, unmasked with H = 2, so
#                                              every tile of the second is a full one, as in the ring's off-diagonal
#                                              blocks), the clocks, power and throttle reasons sampled all along
# Carry .deps (scripts/make_deps.sh). Everything lands in OUT/ring/ and OUT/ring.tgz; scripts/ring_tables.py reads
# the JSON files. Multicast stays off in every process (the hosts require it).
set -uo pipefail
usage="usage: ring_session.sh check|measure|long|layouts|long2|power OUT"
phase=${1:?$usage} out=${2:?$usage}
case $phase in check | measure | long | layouts | long2 | power) ;; *) echo "ring_session: no phase '$phase'; $usage"; exit 2 ;; esac
res=$out/ring
mkdir -p "$res"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
bin=$PWD/build-device/bin/flashlab
started=$SECONDS
gpus=$(nvidia-smi -L | wc -l)
pack() { tar -C "$out" -czf "$out/ring.tgz" ring; }
trap pack EXIT

if [ "$phase" = check ]; then
  nvidia-smi -L | tee "$res/gpus.txt"
  nvidia-smi topo -m >"$res/topo.txt" 2>&1
  echo "== build"
  bash scripts/device_build.sh flashlab_cmd gpu_ring_tests >"$res/build.log" 2>&1 || { tail -40 "$res/build.log"; exit 1; }
  echo "built in $((SECONDS - started)) s"
  echo "== --check --backward (P = 2, 4; every layout and mask; B = 2, H = 4, H_kv = 2 (GQA), d = 128, N = 1000)"
  for P in 2 4; do
    ((P <= gpus)) || continue
    for layout in contiguous zigzag striped; do
      for causal in none top-left bottom-right; do
        log="$res/check-p$P-$layout-$causal.txt"
        timeout 180 "$bin" ring --gpus "$P" --layout "$layout" --causal "$causal" --check --backward \
          --batch 2 --heads 4 --heads-kv 2 --seq-q 1000 --head-dim 128 >"$log" 2>&1
        echo "P=$P $layout $causal: exit $? $(grep -cE '\bpass' "$log") pass lines, $(grep -ciE '\bfail' "$log") fail lines"
      done
    done
  done
  # Other head dims and lengths, and the cuda-fa2 blocks.
  for args in "--layout zigzag --causal bottom-right --seq-q 1992 --head-dim 64" \
              "--layout striped --causal top-left --seq-q 777 --head-dim 256" \
              "--layout contiguous --causal none --seq-q 1000 --seq-k 1500 --head-dim 128" \
              "--layout contiguous --causal top-left --seq-q 1000 --seq-k 1500 --head-dim 128" \
              "--layout zigzag --causal bottom-right --seq-q 1000 --head-dim 128 --blocks cuda-fa2"; do
    log="$res/check-p4-extra-$(echo "$args" | tr -c 'a-z0-9' '_' | cut -c1-60).txt"
    timeout 180 "$bin" ring --gpus 4 $args --check --backward --batch 1 --heads 4 --heads-kv 1 >"$log" 2>&1
    echo "P=4 $args: exit $? $(grep -cE '\bpass' "$log") pass lines"
  done
  echo "== gpu_ring_tests"
  timeout 240 build-device/bin/gpu_ring_tests >"$res/gpu_ring_tests.txt" 2>&1; echo "gpu_ring_tests: exit $?"; tail -3 "$res/gpu_ring_tests.txt"
  echo "== compute-sanitizer memcheck, every rank (P = 2, zigzag, causal, forward and backward)"
  timeout 240 compute-sanitizer --target-processes all --tool memcheck --error-exitcode 9 "$bin" ring --gpus 2 \
    --layout zigzag --causal bottom-right --check --backward --batch 1 --heads 2 --seq-q 512 --head-dim 128 \
    >"$res/memcheck-p2.txt" 2>&1
  echo "memcheck: exit $? ($(grep -E 'ERROR SUMMARY' "$res/memcheck-p2.txt" | sort | uniq -c | tr '\n' ' '))"
  echo "== under torchrun (--no-python): 4 processes, a check"
  timeout 180 torchrun --standalone --nproc_per_node "$gpus" --no-python "$bin" ring --gpus "$gpus" --layout zigzag \
    --causal bottom-right --check --backward --batch 1 --heads 4 --heads-kv 2 --seq-q 1000 --head-dim 128 \
    >"$res/torchrun-check.txt" 2>&1
  echo "torchrun: exit $?"; cat "$res/torchrun-check.txt" | grep -v "^$" | head -30
  exit 0
fi

# measure: each run under a time limit; the last ones only while the call has time left.
left() { echo $((585 - (SECONDS - started))); }
common=(--batch 1 --head-dim 128 --causal bottom-right --dtype bf16)
ours() {  # name P layout N warmup iters extra...
  local name=$1 P=$2 layout=$3 n=$4 warmup=$5 iters=$6
  shift 6
  if (($(left) < 30)); then echo "$name: skipped, the call's time is spent"; return; fi
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((P - 1))) timeout "$(left)" "$bin" ring --gpus "$P" --layout "$layout" \
    --seq-q "$n" --heads "${HEADS:-16}" "${common[@]}" --warmup "$warmup" --iters "$iters" --json "$res/$name.json" "$@" >"$res/$name.txt" 2>&1
  echo "$name: exit $? at $((SECONDS - started)) s"
  grep -E "^(forward|backward) " "$res/$name.txt"
}
peer() {  # name P N... extra (after --)
  local name=$1 P=$2
  shift 2
  if (($(left) < 40)); then echo "$name: skipped, the call's time is spent"; return; fi
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((P - 1))) timeout "$(left)" torchrun --standalone --nproc_per_node "$P" \
    scripts/cp_bench.py --backend cudnn --json "$res/$name.json" "$@" >"$res/$name.txt" 2>&1
  echo "$name: exit $? at $((SECONDS - started)) s"
  grep -E "ms" "$res/$name.txt" | tail -8
}
nvidia-smi -L | tee "$res/gpus-$phase.txt"
nvidia-smi topo -m >"$res/topo.txt" 2>&1
[ -x "$bin" ] || bash scripts/device_build.sh flashlab_cmd >"$res/build.log" 2>&1 || { tail -40 "$res/build.log"; exit 1; }
one_gpu() {  # name N heads: the block kernel alone on GPU 0, forward and backward (flashlab bench)
  local name=$1 n=$2 heads=$3
  if (($(left) < 30)); then echo "$name: skipped, the call's time is spent"; return; fi
  CUDA_VISIBLE_DEVICES=0 timeout "$(left)" "$PWD/build-device/bin/flashlab" bench --device cuda --variants cuda-fa3-ws \
    --seq "$n" --batch 1 --heads "$heads" --head-dim 128 --causal bottom-right --dtype bf16 --backward --warmup 0 \
    --iters 1 --json "$res/$name.json" >"$res/$name.txt" 2>&1
  echo "$name: exit $? at $((SECONDS - started)) s"
  tail -4 "$res/$name.txt"
}
if [ "$phase" = long ]; then
  # One GPU on the whole 4M problem takes about 7 minutes with all 16 heads (forward and backward), more than the
  # ring and its peer together: it is timed with H = 4 and H = 16 at 1M (where both fit the call) and with H = 4
  # at 4M. Each head alone fills the GPU at these lengths (8k query tiles of 128 rows at 1M), so the time grows
  # with H in proportion; the 1M pair measures how closely (scripts/ring_tables.py scales by H / 4).
  one_gpu one-gpu-1m-h4 1048576 4
  one_gpu one-gpu-1m-h16 1048576 16
  one_gpu one-gpu-4m-h4 4194304 4
  ours ring4-zigzag-4m-fwdbwd 4 zigzag 4194304 0 1 --backward --no-one-shot
  ours ring4-contiguous-1m 4 contiguous 1048576 1 2 --backward --no-one-shot
  echo "measured in $((SECONDS - started)) s"
  exit 0
fi
if [ "$phase" = long2 ]; then
  # The same work per GPU takes longer in the ring at 4M than at 1M (0.87 against 0.94 of P x one GPU on 4 GPUs).
  # If clocks fall during long runs, the sampled clocks show it; if the loss grows with the bytes a hop carries
  # (H = 16 against H = 4 at the same N), the spans show it.
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 500 >"$res/clocks-long2.csv" 2>&1 &
  sampler=$!
  one_gpu_fwd() {  # name N heads
    CUDA_VISIBLE_DEVICES=0 timeout "$(left)" "$bin" bench --device cuda --variants cuda-fa3-ws --seq "$2" --batch 1 \
      --heads "$3" --head-dim 128 --causal bottom-right --dtype bf16 --warmup 0 --iters 1 --json "$res/$1.json" \
      >"$res/$1.txt" 2>&1
    echo "$1: exit $? at $((SECONDS - started)) s"; tail -3 "$res/$1.txt"
  }
  one_gpu_fwd one-gpu-4m-h4-fwd 4194304 4
  HEADS=4 ours ring2-zigzag-4m-h4 2 zigzag 4194304 0 1 --no-one-shot --timeline "$res/ring2-zigzag-4m-h4-timeline.json"
  ours ring2-zigzag-4m-h16 2 zigzag 4194304 0 1 --no-one-shot --timeline "$res/ring2-zigzag-4m-h16-timeline.json"
  one_gpu_fwd one-gpu-4m-h8-fwd 4194304 8
  kill "$sampler"
  echo "measured in $((SECONDS - started)) s"
  exit 0
fi
if [ "$phase" = power ]; then
  # Does a full (unmasked) block run at a lower clock than a causal one on one GPU, with no ring at all? Equal FLOPs:
  # causal 2M x 2M at H = 4 and unmasked 2M x 2M at H = 2. Each is run twice, causal first, then unmasked, then both
  # again, so a warming card does not favour either.
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 500 -i 0 >"$res/clocks-power.csv" 2>&1 &
  sampler=$!
  one_gpu_fwd() {  # name N heads causal
    echo "$1: starts at $(date +%H:%M:%S.%N | cut -c1-12)" | tee -a "$res/power-marks.txt"
    CUDA_VISIBLE_DEVICES=0 timeout "$(left)" "$bin" bench --device cuda --variants cuda-fa3-ws --seq "$2" --batch 1 \
      --heads "$3" --head-dim 128 --causal "$4" --dtype bf16 --warmup 0 --iters 1 --json "$res/$1.json" \
      >"$res/$1.txt" 2>&1
    echo "$1: exit $? at $((SECONDS - started)) s, ends at $(date +%H:%M:%S.%N | cut -c1-12)" | tee -a "$res/power-marks.txt"
    tail -3 "$res/$1.txt"
  }
  for round in 1 2; do
    one_gpu_fwd "one-gpu-2m-h4-causal-$round" 2097152 4 bottom-right
    one_gpu_fwd "one-gpu-2m-h2-unmasked-$round" 2097152 2 none
  done
  kill "$sampler"
  echo "measured in $((SECONDS - started)) s"
  exit 0
fi
if [ "$phase" = layouts ]; then
  ours ring2-striped-1m 2 striped 1048576 1 2 --backward --no-one-shot
  ours ring2-contiguous-1m 2 contiguous 1048576 1 2 --backward --no-one-shot
  peer cp2-allgather 2 --seq 262144 1048576 --rotate allgather --passes fwdbwd --warmup 1 --iters 2
  peer cp4-4m-fwdbwd 4 --seq 4194304 --rotate alltoall --passes fwdbwd --warmup 0 --iters 1
  echo "measured in $((SECONDS - started)) s"
  exit 0
fi
# The one-shot kernel on the whole problem (P x one GPU) is timed once per length, beside zigzag on 4 GPUs.
ours ring4-zigzag-256k 4 zigzag 262144 1 3 --backward --timeline "$res/ring4-zigzag-256k-timeline.json"
ours ring4-zigzag-1m 4 zigzag 1048576 1 2 --backward --timeline "$res/ring4-zigzag-1m-timeline.json"
peer cp4 4 --seq 262144 1048576 --rotate alltoall allgather --passes fwdbwd --warmup 1 --iters 2 --one-gpu \
  --one-gpu-max-seq 262144
ours ring4-striped-256k 4 striped 262144 1 3 --backward --no-one-shot
ours ring4-striped-1m 4 striped 1048576 1 2 --backward --no-one-shot
ours ring4-contiguous-256k 4 contiguous 262144 1 3 --backward --no-one-shot
ours ring2-zigzag-256k 2 zigzag 262144 1 3 --backward --no-one-shot
ours ring2-zigzag-1m 2 zigzag 1048576 1 2 --backward --no-one-shot
peer cp2 2 --seq 262144 1048576 --rotate alltoall --passes fwdbwd --warmup 1 --iters 2
ours ring2-striped-256k 2 striped 262144 1 3 --backward --no-one-shot
ours ring2-contiguous-256k 2 contiguous 262144 1 3 --backward --no-one-shot
ours ring4-zigzag-4m 4 zigzag 4194304 0 1 --no-one-shot
peer cp4-4m 4 --seq 4194304 --rotate alltoall --passes fwd --warmup 0 --iters 1
echo "measured in $((SECONDS - started)) s"
