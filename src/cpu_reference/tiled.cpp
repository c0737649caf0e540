// The public entry points of tiled.hpp: check the input, then run the one loop nest of the algorithm
// and pass (tiled_forward.cpp, tiled_backward.cpp, standard_walk.cpp), with arithmetic or count-only.
#include "cpu_reference/tiled.hpp"

#include <string>

#include "cpu_reference/tiled_nests.hpp"

namespace flashlab {

using detail::Blocks;
using detail::TileTrace;

namespace {

void check_tiling(Tiling t, int bytes_per_element) {
  if (t.Br < 1 || t.Bc < 1)
    throw InputError("block sizes must be positive, got Br = " + std::to_string(t.Br) +
                     " and Bc = " + std::to_string(t.Bc));
  if (bytes_per_element < 1)
    throw InputError("bytes per element must be positive, got " + std::to_string(bytes_per_element));
}

// Standard attention has no tiled loop nest with arithmetic: its numbers are naive.cpp's.
void check_tiled_algorithm(Algorithm algorithm) {
  if (algorithm == Algorithm::Standard)
    throw InputError("the tiled loop nests are FA1 and FA2; standard attention's numbers come from "
                     "naive_forward and naive_backward (its traffic from count_traffic)");
}

void check_forward_out(const Shape& s, const ForwardOut& fwd) {
  if (fwd.o.dims != q_dims(s) || fwd.lse.dims != lse_dims(s))
    throw InputError("the forward outputs have shapes O " + fwd.o.dims_string() + " and LSE " +
                     fwd.lse.dims_string() + ", which do not match the problem");
}

}  // namespace

template <class T>
ForwardOut tiled_forward(Algorithm algorithm, const Problem& p, const Qkv& in, Tiling t, TrafficObserver* observer,
                         int bytes_per_element) {
  check_tiled_algorithm(algorithm);
  validate(p);
  check_dims(p.shape, in);
  check_tiling(t, bytes_per_element);
  ForwardOut out{HostTensor(q_dims(p.shape)), HostTensor(lse_dims(p.shape))};
  TileTrace tr(observer, algorithm, Pass::Forward, bytes_per_element);
  detail::forward_nest<T, true>(algorithm, p, Blocks(p.shape, t), {&in, &out}, tr);
  return out;
}

template <class T>
Grads tiled_backward(Algorithm algorithm, const Problem& p, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO,
                     Tiling t, TrafficObserver* observer, int bytes_per_element) {
  check_tiled_algorithm(algorithm);
  validate(p);
  check_dims(p.shape, in, &dO);
  check_forward_out(p.shape, fwd);
  check_tiling(t, bytes_per_element);
  Grads g{HostTensor(q_dims(p.shape)), HostTensor(kv_dims(p.shape)), HostTensor(kv_dims(p.shape))};
  TileTrace tr(observer, algorithm, Pass::Backward, bytes_per_element);
  detail::backward_nest<T, true>(algorithm, p, Blocks(p.shape, t), {&in, &fwd, &dO, &g}, tr);
  return g;
}

template ForwardOut tiled_forward<double>(Algorithm, const Problem&, const Qkv&, Tiling, TrafficObserver*, int);
template ForwardOut tiled_forward<float>(Algorithm, const Problem&, const Qkv&, Tiling, TrafficObserver*, int);
template Grads tiled_backward<double>(Algorithm, const Problem&, const Qkv&, const ForwardOut&, const HostTensor&,
                                      Tiling, TrafficObserver*, int);
template Grads tiled_backward<float>(Algorithm, const Problem&, const Qkv&, const ForwardOut&, const HostTensor&,
                                     Tiling, TrafficObserver*, int);

void count_traffic(Algorithm algorithm, Pass pass, const Problem& p, Tiling t, int bytes_per_element,
                   TrafficObserver& observer) {
  validate(p);
  check_tiling(t, bytes_per_element);
  TileTrace tr(&observer, algorithm, pass, bytes_per_element);
  const Blocks bk(p.shape, t);
  if (algorithm == Algorithm::Standard)
    detail::standard_walk(pass, p, bk, tr);
  else if (pass == Pass::Forward)
    detail::forward_nest<double, false>(algorithm, p, bk, {}, tr);
  else
    detail::backward_nest<double, false>(algorithm, p, bk, {}, tr);
}

void count_part_traffic(Algorithm algorithm, const Problem& p, Tiling t, int bytes_per_element, const NestPart& part,
                        TrafficObserver& observer) {
  validate(p);
  check_tiling(t, bytes_per_element);
  const Blocks bk(p.shape, t);
  const int bh_count = p.shape.batch * p.shape.heads_q;
  if (part.bh < -1 || part.bh >= bh_count)
    throw InputError("part of a loop nest: bh " + std::to_string(part.bh) + " is outside 0.." +
                     std::to_string(bh_count - 1));
  if (part.i < -1 || part.i >= bk.Tr)
    throw InputError("part of a loop nest: query block " + std::to_string(part.i) + " is outside 0.." +
                     std::to_string(bk.Tr - 1));
  if (algorithm != Algorithm::Standard && part.phase != NestPhase::All)
    throw InputError("part of a loop nest: only standard attention has phases (its three kernels)");
  if (algorithm == Algorithm::FA1 && part.i != -1)
    throw InputError("part of a loop nest: FA1's query-block loop is inside its K/V loop, so a part is a whole "
                     "(batch, head)");
  detail::NestRange range;
  if (part.bh >= 0) range.bh_begin = part.bh, range.bh_end = part.bh + 1;
  if (part.i >= 0) range.i_begin = part.i, range.i_end = part.i + 1;
  range.phase = part.phase;
  TileTrace tr(&observer, algorithm, Pass::Forward, bytes_per_element);
  if (algorithm == Algorithm::Standard)
    detail::standard_walk(Pass::Forward, p, bk, tr, range);
  else
    detail::forward_nest<double, false>(algorithm, p, bk, {}, tr, range);
}

}  // namespace flashlab
