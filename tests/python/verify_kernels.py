"""Small attention functions in NumPy for flashlab.verify's tests: a correct one (an online softmax over blocks
of 64 keys, and a backward), and the same with one bug planted, one per diagnosis verify knows. q is
(B, S_q, H_q, D), k and v (B, S_k, H_kv, D)."""
import numpy as np

BLOCK = 64
BUGS = ("mask", "alignment", "tail", "rescale", "lse_base2", "group_sum", "scale")


def _visible(sq, sk, is_causal, causal_align, bug):
    """(S_q, S_k) booleans: which keys each query sees."""
    if not is_causal or bug == "mask":  # planted: the mask is ignored
        return np.ones((sq, sk), dtype=bool)
    offset = sk - sq if causal_align == "bottom-right" and bug != "alignment" else 0  # planted: BR read as TL
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset


def _scale(scale, d, bug):
    return 1.0 / d if bug == "scale" else scale  # planted: 1/d, not the scale asked for


def forward(q, k, v, *, is_causal, causal_align, scale, bug=None):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, group = k.shape[1], hq // k.shape[2]
    kh, vh = (np.repeat(x, group, axis=2).transpose(0, 2, 1, 3) for x in (k, v))  # (B, H_q, S_k, D)
    qh = q.transpose(0, 2, 1, 3)
    seen = _visible(sq, sk, is_causal, causal_align, bug)
    m = np.full((b, hq, sq), -np.inf)
    l = np.zeros((b, hq, sq))
    acc = np.zeros((b, hq, sq, d))
    end = sk // BLOCK * BLOCK if bug == "tail" and sk >= BLOCK else sk  # planted: the partial last block is skipped
    for j0 in range(0, end, BLOCK):
        j1 = min(j0 + BLOCK, end)
        s = np.einsum("bhqd,bhkd->bhqk", qh, kh[:, :, j0:j1]) * _scale(scale, d, bug)
        s = np.where(seen[None, None, :, j0:j1], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        corr = np.where(np.isfinite(m), np.exp(m - safe), 0.0)
        p = np.exp(s - safe[..., None])
        l = l * corr + p.sum(axis=-1)
        if bug != "rescale":  # planted: O_i keeps its old scale when the max moves
            acc = acc * corr[..., None]
        acc = acc + np.einsum("bhqk,bhkd->bhqd", p, vh[:, :, j0:j1])
        m = m_new
    o = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1.0)[..., None], 0.0)
    lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    if bug == "lse_base2":  # planted: log2 of the row sum
        lse = lse * np.log2(np.e)
    return o.transpose(0, 2, 1, 3), lse


def backward(q, k, v, out, lse, grad_out, *, is_causal, causal_align, scale, bug=None):
    q, k, v, out, grad_out = (np.asarray(x, dtype=np.float64) for x in (q, k, v, out, grad_out))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    kh, vh = (np.repeat(x, group, axis=2).transpose(0, 2, 1, 3) for x in (k, v))
    qh, oh, doh = (x.transpose(0, 2, 1, 3) for x in (q, out, grad_out))
    sc = _scale(scale, d, bug)
    seen = _visible(sq, sk, is_causal, causal_align, bug)
    lse = np.asarray(lse, dtype=np.float64)
    finite = np.isfinite(lse)[..., None]
    s = np.einsum("bhqd,bhkd->bhqk", qh, kh) * sc
    p = np.where(seen[None, None] & finite, np.exp(s - np.where(finite, lse[..., None], 0.0)), 0.0)
    dv_h = np.einsum("bhqk,bhqd->bhkd", p, doh)
    dp = np.einsum("bhqd,bhkd->bhqk", doh, vh)
    ds = p * (dp - (doh * oh).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhqk,bhkd->bhqd", ds, kh) * sc
    dk_h = np.einsum("bhqk,bhqd->bhkd", ds, qh) * sc
    if bug == "group_sum":  # planted: a shared K/V head keeps its last query head's share only
        dk_g, dv_g = (x.reshape(b, hkv, group, sk, d)[:, :, -1] for x in (dk_h, dv_h))
    else:
        dk_g, dv_g = (x.reshape(b, hkv, group, sk, d).sum(axis=2) for x in (dk_h, dv_h))
    return dq.transpose(0, 2, 1, 3), dk_g.transpose(0, 2, 1, 3), dv_g.transpose(0, 2, 1, 3)
