"""A small attention forward in Triton, written for docs/VERIFY.md's walk-through "Check your own kernel: a Triton
example": the kind of kernel someone brings to `flashlab.verify`, kept short enough to read in one sitting.

    from attention import attention
    o, lse = attention(q, k, v, is_causal=True, causal_align="bottom-right")   # (B, H, S, D) CUDA tensors

What it does: each program takes BLOCK_M query rows of one (batch, query head) and walks the keys in blocks of
BLOCK_N with an online softmax, so the S_q x S_k score matrix never exists in memory. It keeps, per row, the running
max m_i, the running sum l_i of exp(s - m_i) and the unnormalized output acc_i, and when a block moves the max it
multiplies l_i and acc_i by exp(m_old - m_new) before adding the block. Scores are kept in base 2 (the softmax scale
times log2(e) is folded into S), so each exponential is one exp2; the LSE is turned back to the natural log at the
end. It also handles:
  * causal masks in both alignments: query i sees keys j <= i + offset, offset 0 for top-left (PyTorch's
    is_causal) and S_k - S_q for bottom-right (FlashAttention's); key blocks past a row block's last visible key are
    never loaded, and a row that sees no key gets O = 0 and LSE = -inf;
  * grouped-query attention: query head h reads K/V head h // (H_q / H_kv);
  * any lengths: the last partial block of queries or keys is masked on load and on store.

There is no backward: autograd cannot differentiate a Triton kernel, so verify it with backward=None. It computes
in float16 and bfloat16 (tl.dot would round float32 inputs to TF32, short of the f32 rule) at power-of-two head dims
16..256; anything else raises NotImplementedError with the reason, which verify lists as a refusal.
"""
import math

import torch
import triton
import triton.language as tl

LOG2E = 1.0 / math.log(2.0)  # folded into the softmax scale: exp(x) = exp2(x log2(e))


@triton.jit
def _attention_forward(Q, K, V, O, LSE,
                       stride_qb, stride_qh, stride_qs, stride_qd,
                       stride_kb, stride_kh, stride_ks, stride_kd,
                       stride_vb, stride_vh, stride_vs, stride_vd,
                       stride_ob, stride_oh, stride_os, stride_od,
                       heads_q, group, seq_q, seq_k, causal_offset, qk_scale_log2,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Which rows: program (m, bh) takes query rows [m * BLOCK_M, (m + 1) * BLOCK_M) of batch b, query head h.
    block_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads_q
    h = bh % heads_q
    h_kv = h // group  # GQA: `group` query heads share one K/V head
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)

    # 64-bit offsets of this (batch, head) in each tensor.
    q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    o_base = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh

    # The query block stays in registers for the whole walk over the keys; rows past seq_q read zeros.
    row_in = rows[:, None] < seq_q
    q = tl.load(q_base + rows[:, None] * stride_qs + dims[None, :] * stride_qd, mask=row_in, other=0.0)

    # Running state per row, in base 2: m (max of the scores seen), l (sum of exp2(s - m)), acc (sum of exp2(s - m) v).
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # The keys to walk: all of them, or under the causal mask up to the last key this block's last row sees.
    if CAUSAL:
        end = tl.minimum(seq_k, (block_m + 1) * BLOCK_M + causal_offset)
    else:
        end = seq_k
    for start in range(0, end, BLOCK_N):
        keys = start + cols
        key_in = keys[:, None] < seq_k
        k = tl.load(k_base + keys[:, None] * stride_ks + dims[None, :] * stride_kd, mask=key_in, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vs + dims[None, :] * stride_vd, mask=key_in, other=0.0)

        # Scores of this block, scaled into base 2; keys past seq_k, or hidden by the mask, get -inf.
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        visible = keys[None, :] < seq_k
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
        s = tl.where(visible, s, float("-inf"))

        # The online softmax. A row that has seen no key yet keeps m = -inf; it is shifted by 0 instead, so that
        # exp2 gets -inf (giving 0) and never -inf - (-inf).
        m_new = tl.maximum(m, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        rescale = tl.exp2(m - shift)  # exp(m_old - m_new), in base 2: 1 when the max did not move
        p = tl.exp2(s - shift[:, None])
        l = l * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m = m_new

    # O = acc / l; the LSE back in natural log: log(sum exp(s)) = (m + log2(l)) ln 2 (a literal: a jit function reads
    # no Python globals). Rows that saw no key: O = 0, LSE = -inf.
    seen = l > 0
    l_safe = tl.where(seen, l, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(o_base + rows[:, None] * stride_os + dims[None, :] * stride_od, o.to(O.dtype.element_ty), mask=row_in)
    tl.store(LSE + bh.to(tl.int64) * seq_q + rows, lse, mask=rows < seq_q)


def _blocks(head_dim):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): larger head dims take smaller blocks, so that the query block, two
    stages of K and V and the accumulator fit in shared memory and registers."""
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        return 128, 64, 8, 2
    return 64, 32, 8, 2


def attention(q, k, v, *, is_causal=False, causal_align="top-left", scale=None):
    """O and the LSE of softmax(scale Q K^T [+ causal mask]) V: q (B, H_q, S_q, D), k and v (B, H_kv, S_k, D), CUDA
    tensors of float16 or bfloat16 (any strides), H_q a multiple of H_kv. Returns (O like q, LSE (B, H_q, S_q)
    float32). scale: None for 1 / sqrt(D). causal_align: "top-left" or "bottom-right"."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be 4-d, (batch, heads, seq, head_dim)")
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim or heads_q % heads_kv:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} do not fit: k and v must be "
                         "alike, with q's batch and head dim, and a number of heads that divides q's")
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        raise NotImplementedError("this Triton kernel runs on CUDA tensors only")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise NotImplementedError(f"this kernel computes in float16 and bfloat16, not {q.dtype} (tl.dot would round "
                                  "float32 to TF32)")
    if head_dim not in (16, 32, 64, 128, 256):
        raise NotImplementedError(f"this kernel takes head dims 16, 32, 64, 128 and 256, not {head_dim}")
    if causal_align not in ("top-left", "bottom-right"):
        raise ValueError(f"causal_align is top-left or bottom-right, not {causal_align!r}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    offset = seq_k - seq_q if is_causal and causal_align == "bottom-right" else 0

    o = torch.empty_like(q)
    lse = torch.empty(batch, heads_q, seq_q, device=q.device, dtype=torch.float32)
    if seq_q == 0:
        return o, lse
    block_m, block_n, num_warps, num_stages = _blocks(head_dim)
    grid = (triton.cdiv(seq_q, block_m), batch * heads_q)
    _attention_forward[grid](q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                             heads_q, heads_q // heads_kv, seq_q, seq_k, offset, scale * LOG2E,
                             HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(is_causal),
                             num_warps=num_warps, num_stages=num_stages)
    return o, lse
