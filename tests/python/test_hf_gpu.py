"""flashlab.hf on a CUDA device: FlashLab as the attention backend of a Hugging Face transformers Llama (CTest label
gpu; run_pytest.py reports the suite as skipped where there is no device). A small random Llama (2 layers, hidden
256, 4 query heads and 2 KV heads of d = 64, vocabulary 1000) is built with attn_implementation=flashlab.hf.NAME and
with "sdpa" from the same weights:
  * the name is taken by transformers once registered (not on import), and is read neither as a FlashAttention
    request nor as a hub kernel; set_attn_implementation switches a built model to it;
  * logits, a prefill against a KV cache (bottom-right causal), a decoding step, and five AdamW steps agree with
    SDPA's under one rule: FlashLab's model is at most twice as far from a float32 SDPA model as SDPA's bf16 model
    is, plus half a bf16 unit in the last place of the largest value (see within_twice_sdpas_error);
  * greedy generate() of 20 tokens (a prefill, then 19 decoding steps with one query against the cache) gives SDPA's
    tokens, on a model trained to recite a sequence, so that no step is a near-tie;
  * under torch.compile (backend aot_eager: dynamo's and AOT autograd's graphs, eager kernels), every layer's
    operator is in dynamo's graphs and the only graph breaks are the mask builder's comparison; a compiled training
    step agrees with SDPA's; packed sequences (position ids restarting in a row) fall back to SDPA with their mask,
    compiled and eager;
  * what FlashLab cannot run (a padded batch's mask, a head dim FlashLab lacks) falls back to PyTorch's SDPA with
    one FlashLabFallbackWarning per process saying why, bit-identical to the "sdpa" backend; a mask that is exactly
    the causal one runs on FlashLab, and one changed element (even in place) sends it back to SDPA.
Every FlashLab call is counted where flashlab.torch makes it (_attend), so a silent fallback fails.
"""
import copy
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import flashlab.hf as hf
import flashlab.torch as ft

assert torch.cuda.is_available(), ("this PyTorch has no CUDA, but the machine has a CUDA device: the GPU suite "
                                   "needs PyTorch with CUDA")
CUDA = torch.device("cuda")
hf.register()

VOCAB, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 1000, 2, 4, 2, 64
# Half a unit in the last place of bf16 (8 significant bits), relative: rounding a value to bf16 alone moves it this
# far, so two correct bf16 models may differ from the float32 one by this much whatever their attention.
BF16_HALF_ULP = 2.0 ** -8


def llama_config(head_dim=HEAD_DIM):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=HEADS * head_dim, intermediate_size=2 * HEADS * head_dim,
                       num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                       head_dim=head_dim, max_position_embeddings=1024)


def initial_weights(config):
    """The float32 weights every model of a test starts from (seed 0, on the host)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def build(attn_implementation, weights, dtype=torch.bfloat16, config=None):
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config or llama_config()),
                                             attn_implementation=attn_implementation)
    model.load_state_dict(weights)
    return model.to(device=CUDA, dtype=dtype).eval()


@pytest.fixture(scope="module")
def weights():
    return initial_weights(llama_config())


class FlashLabCalls(list):
    """The FlashLab calls the backend made, one dict per call: the query and key lengths and the options; and
    backward_nodes, the autograd node of each output (None where no gradient flows through it)."""

    def __init__(self):
        super().__init__()
        self.backward_nodes = []


@pytest.fixture
def flashlab_calls(monkeypatch):
    calls = FlashLabCalls()
    counted = ft._attend  # where every FlashLab attention of flashlab.torch and flashlab.hf is made

    def counting(query, key, value, variant, is_causal, causal_align, *args):
        calls.append(dict(q_len=query.shape[2], k_len=key.shape[2], is_causal=is_causal, causal_align=causal_align,
                          enable_gqa=query.shape[1] != key.shape[1]))
        out = counted(query, key, value, variant, is_causal, causal_align, *args)
        calls.backward_nodes.append(None if out.grad_fn is None else type(out.grad_fn).__name__)
        return out

    monkeypatch.setattr(ft, "_attend", counting)
    return calls


def random_tokens(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, shape, generator=generator).to(CUDA)


def within_twice_sdpas_error(got, sdpa, reference, what):
    """got (FlashLab's bf16 model) against reference (the float32 SDPA model), held to SDPA's bf16 model: both bf16
    models compute everything but attention with the same bf16 kernels, so their distances to the float32 model
    differ by what their attention adds. FlashLab's may be at most twice SDPA's (the rule FlashAttention holds its
    kernels to against PyTorch's), plus half a bf16 ulp of the largest reference value (the rounding of the result
    to bf16, which either model may land on either side of)."""
    reference = torch.as_tensor(reference, dtype=torch.float64)
    error = (torch.as_tensor(got, dtype=torch.float64) - reference).abs().max().item()
    sdpa_error = (torch.as_tensor(sdpa, dtype=torch.float64) - reference).abs().max().item()
    limit = 2 * sdpa_error + BF16_HALF_ULP * reference.abs().max().item()
    print(f"{what}: FlashLab {error:.3g}, SDPA {sdpa_error:.3g} from float32; limit {limit:.3g}")
    assert error <= limit, f"{what}: FlashLab's bf16 model is {error:.3g} from float32, over the limit {limit:.3g}"


def fallback_warnings(caught):
    return [w for w in caught if issubclass(w.category, hf.FlashLabFallbackWarning)]


# --- The name ---------------------------------------------------------------------------------------------------

def test_the_name_is_taken_and_read_neither_as_flash_attention_nor_as_a_hub_kernel(weights, flashlab_calls):
    from transformers.utils.generic import is_flash_attention_requested
    assert "flash" not in hf.NAME and "/" not in hf.NAME and "sdpa" not in hf.NAME
    assert not is_flash_attention_requested(requested_attention_implementation=hf.NAME)
    assert hf.register() == hf.NAME and hf.register() == hf.NAME  # idempotent
    assert ALL_ATTENTION_FUNCTIONS[hf.NAME] is hf.attention_forward

    model = build(hf.NAME, weights)
    assert model.config._attn_implementation == hf.NAME
    with torch.no_grad():
        model(random_tokens((1, 32), seed=1))
    assert len(flashlab_calls) == LAYERS

    switched = build("sdpa", weights)
    switched.set_attn_implementation(hf.NAME)
    assert switched.config._attn_implementation == hf.NAME
    with torch.no_grad():
        switched(random_tokens((1, 32), seed=1))
    assert len(flashlab_calls) == 2 * LAYERS


def test_importing_registers_nothing_and_register_makes_the_name_valid():
    program = textwrap.dedent("""
        import flashlab.hf as hf
        from transformers import AutoModelForCausalLM, LlamaConfig
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        assert hf.NAME not in ALL_ATTENTION_FUNCTIONS.valid_keys(), "importing flashlab.hf registered the name"
        config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1)
        try:
            AutoModelForCausalLM.from_config(config, attn_implementation=hf.NAME)
        except ValueError:
            pass
        else:
            raise SystemExit("transformers took the name before register()")
        hf.register()
        model = AutoModelForCausalLM.from_config(config, attn_implementation=hf.NAME)
        assert model.config._attn_implementation == hf.NAME
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr


# --- The same numbers as SDPA -----------------------------------------------------------------------------------

def test_logits_agree_with_sdpa_within_its_own_bf16_error(weights, flashlab_calls):
    tokens = random_tokens((2, 256), seed=2)
    with torch.no_grad():
        reference = build("sdpa", weights, dtype=torch.float32)(tokens).logits
        sdpa = build("sdpa", weights)(tokens).logits
        got = build(hf.NAME, weights)(tokens).logits
    assert flashlab_calls == [dict(q_len=256, k_len=256, is_causal=True, causal_align="top-left",
                                   enable_gqa=True)] * LAYERS
    within_twice_sdpas_error(got, sdpa, reference, "logits")


def test_prefill_against_a_cache_and_a_decoding_step_agree_with_sdpa(weights, flashlab_calls):
    tokens = random_tokens((2, 129), seed=3)
    logits = {}
    for name, attn, dtype in (("reference", "sdpa", torch.float32), ("sdpa", "sdpa", torch.bfloat16),
                              ("flashlab", hf.NAME, torch.bfloat16)):
        model = build(attn, weights, dtype=dtype)
        with torch.no_grad():
            first = model(tokens[:, :96], use_cache=True)
            chunk = model(tokens[:, 96:128], past_key_values=first.past_key_values, use_cache=True)
            step = model(tokens[:, 128:], past_key_values=chunk.past_key_values, use_cache=True)
        logits[name] = (chunk.logits, step.logits)
    expected = ([dict(q_len=96, k_len=96, is_causal=True, causal_align="top-left", enable_gqa=True)] * LAYERS
                + [dict(q_len=32, k_len=128, is_causal=True, causal_align="bottom-right", enable_gqa=True)] * LAYERS
                + [dict(q_len=1, k_len=129, is_causal=False, causal_align="top-left", enable_gqa=True)] * LAYERS)
    assert flashlab_calls == expected
    for index, what in enumerate(("prefill of 32 against 96 cached", "decoding step against 128 cached")):
        within_twice_sdpas_error(logits["flashlab"][index], logits["sdpa"][index], logits["reference"][index], what)


def train_five_steps(model, tokens):
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_five_adamw_steps_agree_with_sdpa(weights, flashlab_calls):
    tokens = random_tokens((4, 128), seed=4)
    reference = train_five_steps(build("sdpa", weights, dtype=torch.float32), tokens)
    sdpa = train_five_steps(build("sdpa", weights), tokens)
    got = train_five_steps(build(hf.NAME, weights), tokens)
    assert len(flashlab_calls) == 5 * LAYERS
    # Each output's gradient goes back through FlashLab's own backward (its autograd node), not SDPA's.
    assert all(node is not None and "ScaledDotProduct" not in node for node in flashlab_calls.backward_nodes), \
        flashlab_calls.backward_nodes
    for step, (g, s, r) in enumerate(zip(got, sdpa, reference)):
        within_twice_sdpas_error([g], [s], [r], f"loss at step {step}")


# --- Generation -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reciting_weights(weights):
    """Weights trained (float32, SDPA) to continue one sequence of 64 distinct tokens, so that each greedy step
    picks its token by a wide margin and a bf16 rounding cannot turn a near-tie."""
    sequence = (torch.randperm(VOCAB - 3, generator=torch.Generator().manual_seed(5))[:64] + 3)[None].to(CUDA)
    model = build("sdpa", weights, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(400):
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=sequence, labels=sequence, use_cache=False).loss
        if loss.item() < 0.01:
            break
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.01, f"the model did not learn the sequence (loss {loss.item():.3g})"
    return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}, sequence


def test_greedy_generate_gives_sdpas_tokens(reciting_weights, flashlab_calls):
    trained, sequence = reciting_weights
    prompt = sequence[:, :8]
    generated = {}
    for attn in ("sdpa", hf.NAME):
        model = build(attn, trained)
        with torch.no_grad():
            generated[attn] = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                             max_new_tokens=20, min_new_tokens=20)
    assert torch.equal(generated["sdpa"][:, 8:], sequence[:, 8:28]), "the SDPA model does not recite its sequence"
    assert torch.equal(generated[hf.NAME], generated["sdpa"])
    prefill = [c for c in flashlab_calls if c["q_len"] > 1]
    decoding = [c for c in flashlab_calls if c["q_len"] == 1]
    assert prefill == [dict(q_len=8, k_len=8, is_causal=True, causal_align="top-left", enable_gqa=True)] * LAYERS
    assert len(decoding) == 19 * LAYERS and all(not c["is_causal"] for c in decoding)
    assert [c["k_len"] for c in decoding[::LAYERS]] == list(range(9, 28))


# --- Under torch.compile ----------------------------------------------------------------------------------------
# backend="aot_eager": dynamo's graphs and AOT autograd's forward and backward graphs, as the default backend makes
# them (so the graph breaks, the operators' Meta implementations and their autograd are those a real compile sees),
# run by PyTorch's eager kernels instead of code inductor generates, which takes far longer to build.

def explained(model, **inputs):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(**inputs)
    ops = [node.target for graph in explanation.graphs for node in graph.graph.nodes if node.op == "call_function"]
    return explanation, ops


def test_a_compiled_model_has_flashlab_in_its_graph_and_breaks_only_for_the_mask(weights):
    tokens = random_tokens((1, 128), seed=11)
    inputs = dict(input_ids=tokens, labels=tokens, use_cache=False)  # (with a cache, transformers ignores packing)
    ours, our_ops = explained(build(hf.NAME, weights).train(), **inputs)
    sdpa, _ = explained(build("sdpa", weights).train(), **inputs)
    reasons = [str(b.reason) for b in ours.break_reasons]
    print(f"graph breaks: {ours.graph_break_count} (SDPA's model: {sdpa.graph_break_count}):", reasons)
    assert our_ops.count(torch.ops.flashlab.attention.default) == LAYERS, "not every layer's attention is in a graph"
    # The one break of a forward pass, at the mask's comparison, counts once in each function between the model's
    # forward and the mask builder (dynamo resumes each of them after it); none is in a layer.
    assert 1 <= ours.graph_break_count <= sdpa.graph_break_count + 4, reasons
    assert [r for r in reasons if "_none_if_causal" not in r] == [str(b.reason) for b in sdpa.break_reasons], reasons


def test_a_compiled_training_step_agrees_with_sdpa(weights):
    tokens = random_tokens((2, 128), seed=12)
    results = {}
    for name, attn, dtype, compiled in (("reference", "sdpa", torch.float32, False), ("sdpa", "sdpa", torch.bfloat16,
                                        False), ("flashlab", hf.NAME, torch.bfloat16, True)):
        model = build(attn, weights, dtype=dtype).train()
        torch._dynamo.reset()
        run = torch.compile(model, backend="aot_eager") if compiled else model
        hf._warned_reasons.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            output = run(input_ids=tokens, labels=tokens, use_cache=False)
            output.loss.backward()
        assert fallback_warnings(caught) == [], [str(w.message) for w in caught]
        results[name] = (output.logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad)
    for index, what in enumerate(("compiled logits", "compiled gradient of layer 0's q_proj")):
        within_twice_sdpas_error(results["flashlab"][index], results["sdpa"][index], results["reference"][index], what)


def test_packed_sequences_fall_back_to_sdpa_with_their_mask_eager_and_compiled(weights):
    tokens = random_tokens((1, 128), seed=13)
    positions = torch.cat([torch.arange(64), torch.arange(64)])[None].to(CUDA)  # two sequences of 64 in one row
    # Without a cache: with one, transformers looks for no packed sequences and masks causally.
    packed = dict(input_ids=tokens, position_ids=positions, use_cache=False)
    hf._warned_reasons.clear()
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = torch.compile(build(hf.NAME, weights), backend="aot_eager")(**packed).logits
    assert len(fallback_warnings(caught)) == 1, [str(w.message) for w in caught]
    with torch.no_grad():
        sdpa = build("sdpa", weights)(**packed).logits
        reference = build("sdpa", weights, dtype=torch.float32)(**packed).logits
        alone = build("sdpa", weights, dtype=torch.float32)(input_ids=tokens[:, 64:], use_cache=False).logits
    # What the test holds FlashLab's model to is the packed attention: the second sequence as if it came alone.
    torch.testing.assert_close(reference[:, 64:], alone, atol=1e-3, rtol=1e-3)
    within_twice_sdpas_error(got, sdpa, reference, "logits of packed sequences, compiled")
    with torch.no_grad():
        eager = build(hf.NAME, weights)(**packed).logits
    within_twice_sdpas_error(eager, sdpa, reference, "logits of packed sequences, eager")


# --- Falling back -----------------------------------------------------------------------------------------------

def test_a_padded_batch_falls_back_with_one_warning_and_matches_sdpa(weights, flashlab_calls):
    hf._warned_reasons.clear()
    tokens = random_tokens((2, 64), seed=6)
    attention_mask = torch.ones_like(tokens)
    attention_mask[1, :16] = 0  # the second row left-padded
    model = build(hf.NAME, weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = model(tokens, attention_mask=attention_mask).logits
            model(tokens, attention_mask=attention_mask)  # a second pass: no second warning
    with torch.no_grad():
        sdpa = build("sdpa", weights)(tokens, attention_mask=attention_mask).logits
    said = fallback_warnings(caught)
    assert len(said) == 1, [str(w.message) for w in said]
    assert "attention mask other than the causal one" in str(said[0].message)
    assert flashlab_calls == []
    real = attention_mask.bool()
    assert torch.isfinite(got[real]).all() and torch.equal(got[real], sdpa[real])


def unsupported_head_dim():
    """A head dim FlashLab cannot run, with flashlab.torch.supports' sentence, or (None, None)."""
    for head_dim in (8, 24, 40, 48, 80, 160, 192, 512):
        q = torch.randn(1, HEADS, 16, head_dim, device=CUDA, dtype=torch.bfloat16)
        k = torch.randn(1, KV_HEADS, 16, head_dim, device=CUDA, dtype=torch.bfloat16)
        reason = ft.supports(q, k, k, is_causal=True, dropout_p=0.0, backward=False)
        if reason is not None:
            return head_dim, reason
    return None, None


def test_a_problem_flashlab_cannot_run_falls_back_with_supports_sentence(flashlab_calls):
    head_dim, reason = unsupported_head_dim()
    if head_dim is None:
        pytest.skip("flashlab.torch.supports accepts every head dim probed, so there is no problem to fall back on")
    hf._warned_reasons.clear()
    config = llama_config(head_dim)
    weights = initial_weights(config)
    tokens = random_tokens((1, 48), seed=7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = build(hf.NAME, weights, config=config)(tokens).logits
    with torch.no_grad():
        sdpa = build("sdpa", weights, config=config)(tokens).logits
    said = fallback_warnings(caught)
    assert len(said) == 1 and reason in str(said[0].message), [str(w.message) for w in said]
    assert flashlab_calls == []
    assert torch.equal(got, sdpa)


class AttentionLayer(torch.nn.Module):
    """What transformers' attention functions read from the layer that calls them."""
    is_causal = True
    num_key_value_groups = HEADS // KV_HEADS


def test_an_exact_causal_mask_runs_on_flashlab_and_any_other_falls_back(flashlab_calls):
    torch.manual_seed(8)
    q = torch.randn(2, HEADS, 64, HEAD_DIM, device=CUDA, dtype=torch.bfloat16)
    k, v = (torch.randn(2, KV_HEADS, 96, HEAD_DIM, device=CUDA, dtype=torch.bfloat16) for _ in range(2))
    layer, scale = AttentionLayer(), HEAD_DIM ** -0.5
    # What transformers builds while tracing: (B, 1, S_q, S_k) booleans, query i seeing keys j <= i + 32.
    mask = torch.ones(64, 96, dtype=torch.bool, device=CUDA).tril(32)[None, None].expand(2, 1, 64, 96).clone()

    got, _ = hf.attention_forward(layer, q, k, v, mask, scaling=scale)
    assert flashlab_calls == [dict(q_len=64, k_len=96, is_causal=True, causal_align="bottom-right", enable_gqa=True)]
    sdpa, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=scale)
    reference, _ = sdpa_attention_forward(layer, q.double(), k.double(), v.double(), mask, scaling=scale)
    within_twice_sdpas_error(got, sdpa, reference, "attention under an explicit causal mask")

    hf._warned_reasons.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mask[1, 0, 40, 3] = False  # in place: the same tensor, one key fewer for one query
        got, _ = hf.attention_forward(layer, q, k, v, mask, scaling=scale)
    assert len(flashlab_calls) == 1, "a mask changed in place still ran on FlashLab"
    assert len(fallback_warnings(caught)) == 1
    assert torch.equal(got, sdpa_attention_forward(layer, q, k, v, mask, scaling=scale)[0])
