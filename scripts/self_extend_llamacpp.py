"""How far llama.cpp's Self-Extend (a KV-cache position shift, `--grp-attn-n G --grp-attn-w W`) is from exact
Self-Extend (posenc's attention_extension={"type": "self_extend", ...}).

llama.cpp never scores a pair twice: before each batch it rewrites the positions of the cached keys
(llama_kv_cache_seq_add / seq_div, block by block of W tokens) and then runs ordinary attention. We emulate
that exactly: the positions each batch sees are simulated with llama.cpp's own arithmetic (examples/main),
then each batch's queries attend at those positions through posenc.attention. Printed: how many
(query, key) distances differ from exact Self-Extend and by how much, and the logit differences.

    .venv/bin/python scripts/self_extend_llamacpp.py                       # random tiny Llama
    .venv/bin/python scripts/self_extend_llamacpp.py --model smollm2 --length 2048 --group 4 --window 512
"""

from __future__ import annotations

import argparse

import torch

import posenc
from posenc.models.llama import Llama, LlamaConfig


def llamacpp_batches(t: int, ga_n: int, ga_w: int, n_batch: int) -> list[tuple[int, int, list[int], list[int]]]:
    """(start, end, query positions, positions of keys 0..end-1) per batch, as llama.cpp's main loop sets them."""
    cells: list[int] = []  # the cache's position of each token so far
    n_past = ga_i = 0
    out = []

    def add(p0: int, p1: int, delta: int) -> None:
        cells[:] = [p + delta if p0 <= p < p1 else p for p in cells]

    def div(p0: int, p1: int, d: int) -> None:
        cells[:] = [p // d if p0 <= p < p1 else p for p in cells]

    for start in range(0, t, n_batch):
        while n_past >= ga_i + ga_w:  # llama.cpp examples/main, "context extension via Self-Extend"
            ib = (ga_n * ga_i) // ga_w
            bd = (ga_w // ga_n) * (ga_n - 1)
            dd = (ga_w // ga_n) - ib * bd - ga_w
            add(ga_i, n_past, ib * bd)
            div(ga_i + ib * bd, ga_i + ib * bd + ga_w, ga_n)
            add(ga_i + ib * bd + ga_w, n_past + ib * bd, dd)
            n_past -= bd
            ga_i += ga_w // ga_n
        end = min(t, start + n_batch)
        new = list(range(n_past, n_past + end - start))
        cells.extend(new)
        out.append((start, end, new, list(cells)))
        n_past += end - start
    return out


def exact_distance(i: torch.Tensor, j: torch.Tensor, g: int, w: int) -> torch.Tensor:
    return torch.where(i - j < w, i - j, (i // g + w - w // g) - j // g)


def distance_table(t: int, g: int, w: int, n_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T,T) distances, exact and llama.cpp's, for j <= i."""
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    cpp = torch.zeros(t, t, dtype=torch.long)
    for start, end, q_pos, k_pos in llamacpp_batches(t, g, w, n_batch):
        cpp[start:end, :end] = torch.tensor(q_pos)[:, None] - torch.tensor(k_pos)[None, :]
    return exact_distance(i, j, g, w), cpp


def llamacpp_logits(model: Llama, ids: torch.Tensor, g: int, w: int, n_batch: int) -> torch.Tensor:
    """model's logits (1,T,V) with every batch attending at llama.cpp's shifted positions."""
    rope = model.schemes[0].inner if hasattr(model.schemes[0], "inner") else model.schemes[0]
    batches = llamacpp_batches(ids.shape[1], g, w, n_batch)
    x = model.embed_tokens(ids)
    for block in model.blocks:
        attn, h = block.attn, block.input_layernorm(x)
        t = h.shape[1]
        q = attn.q_proj(h).view(1, t, attn.n_head, -1).transpose(1, 2)
        k = attn.k_proj(h).view(1, t, attn.n_kv_head, -1).transpose(1, 2)
        v = attn.v_proj(h).view(1, t, attn.n_kv_head, -1).transpose(1, 2)
        parts = [posenc.attention(q[:, :, s:e], k[:, :, :e], v[:, :, :e], rope, torch.tensor([qp]),
                                  torch.tensor([kp])) for s, e, qp, kp in batches]
        x = x + attn.o_proj(torch.cat(parts, dim=2).transpose(1, 2).reshape(1, t, -1))
        x = x + block.mlp(block.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))


def tiny() -> Llama:
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=61, n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden_size=96,
                              max_seq_len=16, rotary_base=100.0)).eval().double()
    with torch.no_grad():
        for block in model.blocks:  # peaked attention, as in tests/position_maps/tiny.py
            block.attn.q_proj.weight.mul_(4.0)
            block.attn.k_proj.weight.mul_(4.0)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--batch", type=int, default=None, help="llama.cpp's n_batch (divides the window)")
    args = parser.parse_args()
    g, w, t = args.group, args.window, args.length
    n_batch = args.batch or w
    exact, cpp = distance_table(t, g, w, n_batch)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    differ = (exact != cpp) & causal
    gap = (exact - cpp).abs()[causal]
    true_distance = torch.arange(t)[:, None] - torch.arange(t)[None, :]
    kept = ((cpp == true_distance) & causal).sum(1)[w:]  # keys at their true distance, per query past the window
    kept_exact = ((exact == true_distance) & causal).sum(1)[w:]
    print(f"T={t} G={g} W={w} n_batch={n_batch}: {int(differ.sum())}/{int(causal.sum())} (query, key) distances "
          f"differ ({100 * differ.sum().item() / causal.sum().item():.1f}%), by at most {int(gap.max())}, "
          f"mean {gap.float().mean():.2f}; keys at their true distance per query: exact "
          f"{int(kept_exact.min())} to {int(kept_exact.max())}, "
          f"llama.cpp {int(kept.min())} to {int(kept.max())}")
    if args.model == "tiny":
        model = tiny()
        ids = torch.randint(0, 61, (1, t), generator=torch.Generator().manual_seed(1))
    else:
        from posenc.data.corpus import python_docs_text
        from posenc.models.gguf import builtin_smollm2_path

        model = Llama.from_gguf(builtin_smollm2_path())
        ids = torch.tensor([model.tokenizer(python_docs_text()[:20 * t])["input_ids"][:t]])  # real prose
    with torch.no_grad():
        plain = model(ids)
        model.set_attention_extension({"type": "self_extend", "group_size": g, "window": w})
        exact_logits = model(ids)
        cpp_logits = llamacpp_logits(model, ids, g, w, n_batch)
    for name, other in (("llama.cpp emulation", cpp_logits), ("plain RoPE", plain)):
        diff = (exact_logits - other).abs()
        same = (exact_logits.argmax(-1) == other.argmax(-1)).float().mean().item()
        print(f"exact Self-Extend vs {name}: max |logit diff| {diff.max():.4g}, mean {diff.mean():.4g}, "
              f"top-1 agreement {100 * same:.1f}%")


if __name__ == "__main__":
    main()
