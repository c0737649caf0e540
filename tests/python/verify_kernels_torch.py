"""Small attention functions in PyTorch for flashlab.verify's GPU tests, the torch twins of verify_kernels.py: a
correct one (an online softmax over blocks of 64 keys, differentiable by autograd, O returned in the inputs' dtype),
with a backward written out by hand too; and the same with one bug planted, one per diagnosis verify knows. The GQA sum is planted in the autograd path itself: K and V reach the query heads
through SharedHeads, whose backward sums each group's gradients, or with the bug keeps one head's share.
q is (B, S_q, H_q, D), k and v (B, S_k, H_kv, D), on any device.

Both compute in float64 whatever the inputs' dtype. Where a row sees a single key, dS = P (dP - rowsum(dO O)) is
exactly zero, and so are that case's dQ and dK; in float32, dP and the row sum come out of different summation
orders and leave noise of about 1e-6, which FlashLab's rule, against an exact zero, does not allow.
"""
import math

import torch

BLOCK = 64
BUGS = ("mask", "alignment", "tail", "rescale", "lse_base2", "group_sum", "scale")


class SharedHeads(torch.autograd.Function):
    """K or V (B, S_k, H_kv, D) as the (B, H_q, S_k, D) its query heads read: each K/V head repeated for the `group`
    query heads that share it. The gradient of a shared head is the sum over its group (planted: the last query
    head's share alone)."""

    @staticmethod
    def forward(ctx, x, group, planted):
        ctx.group, ctx.planted = group, planted
        return x.transpose(1, 2).repeat_interleave(group, dim=1)

    @staticmethod
    def backward(ctx, grad):
        b, hq, s, d = grad.shape
        per_group = grad.reshape(b, hq // ctx.group, ctx.group, s, d)
        summed = per_group[:, :, -1] if ctx.planted else per_group.sum(dim=2)
        return summed.transpose(1, 2), None, None


def _visible(sq, sk, is_causal, causal_align, bug, device):
    """(S_q, S_k) booleans: which keys each query sees."""
    if not is_causal or bug == "mask":  # planted: the mask is ignored
        return torch.ones(sq, sk, dtype=torch.bool, device=device)
    offset = sk - sq if causal_align == "bottom-right" and bug != "alignment" else 0  # planted: BR read as TL
    rows = torch.arange(sq, device=device)[:, None]
    return torch.arange(sk, device=device)[None, :] <= rows + offset


def _scale(scale, d, bug):
    return 1.0 / d if bug == "scale" else scale  # planted: 1/d, not the scale asked for


def forward(q, k, v, *, is_causal, causal_align, scale, bug=None):
    """(O in q's dtype, LSE in float64)."""
    b, sq, hq, d = q.shape
    sk, group = k.shape[1], hq // k.shape[2]
    qh = q.double().transpose(1, 2)  # (B, H_q, S_q, D)
    kh, vh = (SharedHeads.apply(x.double(), group, bug == "group_sum") for x in (k, v))
    seen = _visible(sq, sk, is_causal, causal_align, bug, q.device)
    m = torch.full((b, hq, sq), -math.inf, dtype=torch.float64, device=q.device)
    l = torch.zeros(b, hq, sq, dtype=torch.float64, device=q.device)
    acc = torch.zeros(b, hq, sq, d, dtype=torch.float64, device=q.device)
    end = sk // BLOCK * BLOCK if bug == "tail" and sk >= BLOCK else sk  # planted: the partial last block is skipped
    for j0 in range(0, end, BLOCK):
        j1 = min(j0 + BLOCK, end)
        s = (qh @ kh[:, :, j0:j1].transpose(-1, -2)) * _scale(scale, d, bug)
        s = s.masked_fill(~seen[:, j0:j1], -math.inf)
        # The running max only keeps exp() in range: O does not depend on it, so no gradient goes through it.
        m_new = torch.maximum(m, s.detach().amax(dim=-1))
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # rows that saw no key yet
        correction = torch.exp(m - safe)
        p = torch.exp(s - safe[..., None])
        l = l * correction + p.sum(dim=-1)
        if bug != "rescale":  # planted: O_i keeps its old scale when the max moves
            acc = acc * correction[..., None]
        acc = acc + p @ vh[:, :, j0:j1]
        m = m_new
    seen_some = l > 0
    ones = torch.ones_like(l)
    o = torch.where(seen_some[..., None], acc / torch.where(seen_some, l, ones)[..., None], torch.zeros_like(acc))
    lse = torch.where(seen_some, m + torch.log(torch.where(seen_some, l, ones)), torch.full_like(l, -math.inf))
    if bug == "lse_base2":  # planted: log2 of the row sum
        lse = lse * math.log2(math.e)
    return o.transpose(1, 2).to(q.dtype), lse


def backward(q, k, v, out, lse, grad_out, *, is_causal, causal_align, scale, bug=None):
    """(dq, dk, dv) in the inputs' dtypes from O and the LSE, without autograd: P = exp(scale S - LSE),
    dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q, summed over each group."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    qh, oh, doh = (x.double().transpose(1, 2) for x in (q, out, grad_out))
    kh, vh = (x.double().transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
    sc = _scale(scale, d, bug)
    seen = _visible(sq, sk, is_causal, causal_align, bug, q.device)
    lse = lse.double()
    finite = torch.isfinite(lse)[..., None]
    s = (qh @ kh.transpose(-1, -2)) * sc
    p = torch.exp(s - torch.where(finite, lse[..., None], torch.zeros_like(lse[..., None])))
    p = torch.where(seen & finite, p, torch.zeros_like(p))
    dv_h = p.transpose(-1, -2) @ doh
    ds = p * (doh @ vh.transpose(-1, -2) - (doh * oh).sum(dim=-1, keepdim=True))
    dq = (ds @ kh) * sc
    dk_h = (ds.transpose(-1, -2) @ qh) * sc
    per_group = [x.reshape(b, hkv, group, sk, d) for x in (dk_h, dv_h)]
    if bug == "group_sum":  # planted: a shared K/V head keeps its last query head's share only
        dk, dv = (x[:, :, -1] for x in per_group)
    else:
        dk, dv = (x.sum(dim=2) for x in per_group)
    return dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype)
