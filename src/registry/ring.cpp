#include "registry/ring.hpp"

#include "registry/variants.hpp"
#ifdef FLASHLAB_HAVE_CUDA
#include "cuda/ring.hpp"
#endif

namespace flashlab {

BenchResult bench_ring_on_one_gpu(RingLayout layout, int ranks, const Problem& p, DType dtype,
                                  const BenchSettings& settings) {
#ifdef FLASHLAB_HAVE_CUDA
  check_supported(find_variant("cuda-fa3-ws"), p, dtype, settings.backward);  // a Hopper GPU, the dtype, the head dim
  const RingSchedule ring = ring_schedule(layout, ranks, p.shape.seq_q, p.shape.seq_k, p.options.causal);
  return cuda_ring_bench(ring, p, dtype, settings);
#else
  (void)layout, (void)ranks, (void)p, (void)dtype, (void)settings;
  throw InputError("this flashlab was built without CUDA, so it has no GPU ring to time");
#endif
}

}  // namespace flashlab
