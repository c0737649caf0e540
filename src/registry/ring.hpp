#pragma once
// Ring attention as the command line reaches it: model/ring.hpp's schedule run on a transport, with the problem
// checked first. On one GPU the P ranks are P streams and the hops device-to-device copies (cuda/ring.hpp);
// the block kernel is cuda-fa3-ws, so a problem must be one cuda-fa3-ws runs.
#include "core/bench.hpp"
#include "core/problem.hpp"
#include "model/ring.hpp"

namespace flashlab {

// Times the ring of P ranks in `layout` on the current GPU: whole forward (and, with settings.backward,
// backward) passes on random inputs, as Variant::bench times a kernel. Throws InputError, in one sentence, when
// built without CUDA, for what cuda-fa3-ws refuses (GPU, dtype, head dim), for what the schedule refuses (a
// length the layout cannot share out) and for what the GPU ring refuses (dropout; diagonal blocks that would
// need their rows split), and when the device runs out of memory.
BenchResult bench_ring_on_one_gpu(RingLayout layout, int ranks, const Problem& p, DType dtype,
                                  const BenchSettings& settings);

}  // namespace flashlab
