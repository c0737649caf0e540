"""flashlab.hf: FlashLab as an attention backend of Hugging Face transformers (version 5).

    import flashlab.hf
    flashlab.hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=flashlab.hf.NAME)
    model.set_attn_implementation(flashlab.hf.NAME)   # or switch a model built with another backend

Importing this module registers nothing; register() does (calling it again changes nothing). It adds NAME to
transformers' AttentionInterface (the attention function every model that follows the attention interface
calls) and to its AttentionMaskInterface (what builds the mask that function receives).

What runs where, for q (B, H_q, S_q, D) and k, v (B, H_kv, S_k, D):
  * no mask and S_q > 1 (a causal prefill, or training): FlashLab with is_causal=True; when S_q < S_k (a prefill
    against a KV cache) with causal_align="bottom-right", so that query i sees the keys up to i + S_k - S_q;
  * S_q == 1 (a decoding step) with nothing masked: FlashLab with is_causal=False (the one query sees every key);
  * H_q != H_kv: enable_gqa=True, with no copy of K and V per query head;
  * a mask that is exactly the causal one (transformers builds it as a tensor while torch.compile traces the model,
    since it cannot look at the data there): recognized, and run as the first case;
  * any other mask (padding in the batch, packed sequences, a sliding window, a static cache), or a problem
    FlashLab cannot run (flashlab.torch.supports gives the sentence why): PyTorch's scaled_dot_product_attention,
    as transformers' own "sdpa" backend computes it, with a FlashLabFallbackWarning saying why, once per process
    for each distinct reason.

The mask builder is transformers' SDPA one, except that it returns None (no mask: is_causal does it) wherever the
mask is exactly the causal one with nothing padded: also for a prefill against a cache, where the SDPA builder makes
a tensor, and while torch.compile traces the model.

Under torch.compile the attention function is traced into the model's graph, with the operator in it. The mask
costs one graph break per forward pass, not one per layer: while tracing, transformers cannot look at the position
ids, so it always asks for the causal mask combined with a packed-sequence mask (one sequence per row or several),
and only the values tell which. The builder makes that mask as the SDPA builder would, then hands it to a function
that runs outside the graph (torch.compiler.disable), once per forward pass, and compares it with the causal
pattern: None when it is that, and every layer runs FlashLab; the mask itself when it is not (packed sequences), and
every layer falls back to SDPA with it. So torch.compile(model) works, and fullgraph=True stops at that break (which
dynamo reports once for each function between the model's forward and the mask builder, as it resumes each).
"""
import threading
import warnings
import weakref

try:
    import torch
    import torch.fx
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask
    from transformers.modeling_utils import AttentionInterface
except ImportError as error:
    raise ImportError("flashlab.hf needs PyTorch and Hugging Face transformers 5, which this Python cannot import "
                      f"({error}); the rest of flashlab works without them") from error

import flashlab.torch as _flashlab_torch

__all__ = ["NAME", "register", "attention_forward", "mask_for_flashlab", "FlashLabFallbackWarning"]

# The name models take in attn_implementation. transformers reads some names as requests for other machinery, so
# this one has none of their marks:
#   * "flash" anywhere: utils.generic.is_flash_attention_requested is true for any name containing "flash", and
#     PreTrainedModel._check_and_adjust_attn_implementation then imports that FlashAttention build, from the
#     `kernels` hub when it is not installed;
#   * "org/repo" (integrations.hub_kernels.is_kernel: two parts around a "/", with optional "@revision" and
#     ":function"): a kernel repository on the hub, downloaded;
#   * "sdpa" or "flex_attention" anywhere: get_correct_attn_implementation runs the SDPA or FlexAttention
#     availability checks of the model for it;
#   * a "paged|" prefix: the paged (continuous batching) variant of the name after it.
NAME = "lab_attention"


class FlashLabFallbackWarning(UserWarning):
    """PyTorch's scaled_dot_product_attention computed an attention call of the NAME backend instead of FlashLab."""


_warned_reasons = set()  # the reasons warned about in this process (each once)
_warned_lock = threading.Lock()


def _warn_once(reason):
    with _warned_lock:
        if reason in _warned_reasons:
            return
        _warned_reasons.add(reason)
    warnings.warn(f"attn_implementation={NAME!r}: PyTorch's scaled_dot_product_attention computes this attention "
                  f"instead of FlashLab, because {reason} (said once per process)", FlashLabFallbackWarning,
                  stacklevel=3)


def register():
    """Make attn_implementation=NAME work in transformers: the attention function and its mask builder. Returns
    NAME. Idempotent: a second call registers the same two functions again, which changes nothing."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_for_flashlab)
    return NAME


# --- The mask -------------------------------------------------------------------------------------------------------

def _tracing(tensor):
    """Whether tensor's values cannot be read now (dynamo, torch.jit or torch.fx tracing, CUDA graph capture)."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.cuda.is_current_stream_capturing()
            or isinstance(tensor, torch.fx.Proxy))


def _is_size(x):
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def _causal_needs_no_mask(kwargs):
    """Whether the mask transformers asks for is exactly the bottom-right causal one with nothing padded, which
    is_causal with causal_align="bottom-right" computes: the plain causal mask function, no local window, offsets
    that put the last query on the last key, and a 2-D padding mask (if any) that masks none of the keys."""
    if not kwargs.get("allow_is_causal_skip", True) or kwargs.get("local_size") is not None:
        return False
    if kwargs.get("mask_function", causal_mask_function) is not causal_mask_function:
        return False  # a sliding window, chunks, packed sequences, or a model's own overlay
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    if not all(_is_size(x) for x in (q_length, kv_length, q_offset, kv_offset)):
        return False  # a static cache hands its offsets as tensors
    if not (1 <= q_length <= kv_length and q_offset - kv_offset == kv_length - q_length):
        return False
    padding = kwargs.get("attention_mask")
    if padding is None:
        return True
    if _tracing(padding) or padding.dim() != 2 or padding.shape[-1] < kv_offset + kv_length:
        return False  # (a shorter 2-D mask is padded with masked keys by transformers)
    return bool(padding[:, kv_offset:kv_offset + kv_length].all())


def mask_for_flashlab(*args, **kwargs):
    """The mask builder registered for NAME: transformers' sdpa_mask, which returns None where is_causal does the
    mask (causal with S_q == S_k or S_q == 1, nothing padded, not tracing), and None also for a causal prefill
    against a cache (1 < S_q < S_k) with nothing padded, which the attention function runs bottom-right aligned.
    While tracing, the mask sdpa_mask makes is compared with the causal pattern outside the graph (one graph break
    per forward pass), and None stands for it when it is that."""
    if not args and _causal_needs_no_mask(kwargs):
        return None
    mask = sdpa_mask(*args, **kwargs)
    if isinstance(mask, torch.Tensor) and torch.compiler.is_compiling():
        return _none_if_causal(mask)
    return mask


@torch.compiler.disable
def _none_if_causal(mask):
    """None if mask (B or 1, 1, S_q, S_k), boolean, is exactly the bottom-right causal pattern, else mask. Runs
    outside a compiled graph, where the values can be read."""
    q_len, k_len = mask.shape[-2], mask.shape[-1]
    return None if _is_causal_mask(mask, q_len, k_len) else mask


# --- The attention function -------------------------------------------------------------------------------------

class _CausalMaskVerdict:
    """Whether a mask tensor is exactly the bottom-right causal pattern, remembered for the last mask seen: every
    layer of one forward pass receives the same tensor, which is then compared once. The tensor is held by a weak
    reference and its version counter is compared, so a new or modified mask is always compared again."""

    def __init__(self):
        self._lock = threading.Lock()
        self._mask, self._version, self._verdict = None, None, False

    def __call__(self, mask, q_len, k_len):
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
            return False
        if tuple(mask.shape[-2:]) != (q_len, k_len) or q_len > k_len:
            return False  # (more queries than keys: the call below would align such a mask top-left)
        with self._lock:
            if self._mask is not None and self._mask() is mask and self._version == mask._version:
                return self._verdict
        # Query i sees keys j <= i + k_len - q_len, in every batch row and head the mask has.
        pattern = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril_(k_len - q_len)
        verdict = bool(torch.equal(mask, pattern.expand(mask.shape)))
        with self._lock:
            self._mask, self._version, self._verdict = weakref.ref(mask), mask._version, verdict
        return verdict


_is_causal_mask = _CausalMaskVerdict()


def _bottom_right_mask(q_len, k_len, device):
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril_(k_len - q_len)[None, None]


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """The attention function registered for NAME, called by each attention layer as transformers calls its
    "sdpa" one: query (B, H_q, S_q, D), key and value (B, H_kv, S_k, D), attention_mask None or a 4-D boolean mask
    from mask_for_flashlab. Returns (attn_output (B, S_q, H_q, D), None): there are no attention weights to return.

    Causal exactly where transformers' sdpa function is: the call's is_causal (else the module's, else True), with
    S_q > 1 and no mask; a mask that is exactly the causal pattern counts as no mask (outside torch.compile: the
    builder already turned such masks into None while tracing). Traced into the graph under torch.compile wherever
    FlashLab runs the call; a fallback to SDPA runs outside it."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is not None:
        if (torch.compiler.is_compiling() or not (q_len > 1 and is_causal)
                or not _is_causal_mask(attention_mask, q_len, k_len)):
            return _sdpa_fallback("transformers passed an attention mask other than the causal one (padding in the "
                                  "batch, packed sequences, a sliding window or a static cache), and FlashLab's "
                                  "kernels take only the causal mask", module, query, key, value, attention_mask,
                                  dropout, scaling, is_causal, kwargs)

    causal = bool(is_causal) and q_len > 1
    variant, refusal = _flashlab_torch._choice(query, key, value, causal, dropout,
                                               _flashlab_torch._needs_backward(query, key, value))
    if variant is None:
        return _sdpa_fallback(f"FlashLab cannot run this problem: {refusal}", module, query, key, value,
                              _bottom_right_mask(q_len, k_len, query.device) if causal and q_len < k_len else None,
                              dropout, scaling, is_causal, kwargs)

    out = _flashlab_torch._attend(query, key, value, variant, causal,
                                  "bottom-right" if causal and q_len < k_len else "top-left", scaling, dropout, False)
    # O has q's memory layout; q is a (B, H, S, D) view of (B, S, H, D) rows in transformers' models, so this
    # transpose is contiguous already and .contiguous() copies nothing there.
    return out.transpose(1, 2).contiguous(), None


@torch.compiler.disable
def _sdpa_fallback(reason, module, query, key, value, mask, dropout, scaling, is_causal, kwargs):
    """transformers' sdpa attention function on this call, after the once-per-reason warning (outside any compiled
    graph: the warning's lock and set are Python state)."""
    _warn_once(reason)
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)
