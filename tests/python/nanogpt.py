"""A small nanoGPT-style character model, its training loop and the corpus it learns, for the GPU suite:
the same model trained with PyTorch's scaled_dot_product_attention and with a FlashLab variant must
follow the same loss curve. Everything is deterministic in its seeds: the corpus, the initial weights
and the batches are the same for every attention backend."""
import contextlib
import math
import random

import torch
from torch import nn


def make_corpus(chars=60_000, seed=1234):
    """English-like sentences from a small grammar: enough structure for a few hundred steps to learn."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my friend", "the old man", "she", "he", "the children", "our teacher"]
    verbs = ["sees", "likes", "finds", "carries", "paints", "follows", "remembers", "wants"]
    objects = ["the red ball", "a small house", "the river", "an apple", "the moon", "a long letter", "the garden"]
    endings = [".", "!", " today.", " again.", " at night."]
    text = []
    while sum(map(len, text)) < chars:
        text.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(endings)}\n")
    return "".join(text)[:chars]


class Block(nn.Module):
    """Pre-norm transformer block; its attention line is nanoGPT's, with the attention function given."""

    def __init__(self, n_embd, n_head, attend):
        super().__init__()
        self.n_head, self.attend = n_head, attend
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    # Head dim 128 / 2 = 64, a size the backward of every GPU variant has.
    def __init__(self, vocab, attend, n_layer=3, n_head=2, n_embd=128, block_size=64):
        super().__init__()
        self.block_size = block_size
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, attend) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    def use_attention(self, attend):
        for block in self.blocks:
            block.attend = attend


def batches(data, block_size, batch_size, steps, seed, device):
    """The same (input, target) batches for every run."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
        x = torch.stack([data[s:s + block_size] for s in starts])
        y = torch.stack([data[s + 1:s + block_size + 1] for s in starts])
        yield x.to(device), y.to(device)


def encode(text):
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(vocab)


def precision(device, autocast_dtype):
    """autocast to autocast_dtype on `device`, or nothing (float32) when it is None."""
    if autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=autocast_dtype)


def train(attend, *, device, autocast_dtype=None, steps=300, batch_size=32, seed=0, lr=3e-3):
    """Trains a fresh model (weights from `seed`) with `attend` as its attention; returns the model and its
    loss at every step. autocast_dtype (e.g. torch.bfloat16) runs the forward under autocast, so attention
    sees q, k, v in that dtype; None trains in float32."""
    data, vocab = encode(make_corpus())
    torch.manual_seed(seed)
    model = GPT(vocab, attend).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for x, y in batches(data, model.block_size, batch_size, steps, seed=seed + 1, device=device):
        with precision(device, autocast_dtype):
            loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def evaluate(model, *, device, autocast_dtype=None, batches_to_average=8, seed=99):
    """Mean loss over fixed held-out batches (no gradients)."""
    data, _ = encode(make_corpus())
    total = 0.0
    with torch.no_grad():
        for x, y in batches(data, model.block_size, 32, batches_to_average, seed=seed, device=device):
            with precision(device, autocast_dtype):
                total += model(x, y).item()
    return total / batches_to_average


def windowed(losses, window):
    """Mean of each consecutive window of `window` steps."""
    return [sum(losses[i:i + window]) / window for i in range(0, len(losses) - window + 1, window)]


def math_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    """Standard attention written out (no fused kernel), for PyTorch builds without scaled_dot_product_attention."""
    assert attn_mask is None and dropout_p == 0.0
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v
