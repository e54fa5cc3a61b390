"""Steerling from diagrams vs a hand-written torch Steerling: forward+backward time.

    python bench/steerling.py                  # tiny and small configs; PENROSE_REDUCED=1 for fewer rounds
    python bench/steerling.py --device cuda    # on a GPU (bench/gpu_steerling.sh)

For each config both sides get the same weights (the penrose model's, under the release's keys)
and the same token batch; the loss is the LM log-partition plus the squared concept features
(so that both concept heads run backward too). Prints the median of paired-run time ratios
penrose / hand-written (target <= 1.10 on CPU), both medians, and the largest output difference.

The hand-written side (`hand_forward`) is written directly from the release's math with
torch.nn.functional (fused SDPA attention with enable_gqa, as the release calls it; F.linear,
topk), independent of the diagrams.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TypedDict

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/ (which holds a zoo.py)
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))
from common import paired_ratio, reduced, threads_note  # noqa: E402

from penrose_zoo.steerling import Steerling  # noqa: E402
from penrose_zoo.steerling.cli import TINY_CONCEPTS, TINY_MODEL  # noqa: E402



class Config(TypedDict):
    model: dict  # Steerling's model config
    concept: dict  # its concept config
    vocab: int
    batch: int
    length: int


CONFIGS: dict[str, Config] = {
    "tiny": Config(model=TINY_MODEL, concept=TINY_CONCEPTS, vocab=260, batch=2, length=64),  # `penrose steerling init --tiny`
    "small": Config(
        model=dict(n_layers=4, n_head=8, n_kv_heads=2, n_embd=256, block_size=512, diff_block_size=64, intermediate_size=704),
        concept=dict(n_concepts=1000, n_unknown_concepts=3000, concept_dim=256, topk_known=32, topk_known_features=32,
                     factorize_rank=64, unknown_topk=128),
        vocab=4096, batch=2, length=256,
    ),
}


# ---------------------------------------------------------------------------------------------
# The hand-written side
# ---------------------------------------------------------------------------------------------


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def _rope_tables(T, D, base, device):
    inv = 1.0 / (base ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    ang = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def _rope(x, cos, sin):  # x (b, heads, t, d)
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def hand_forward(sd: dict, m: dict, c: dict, ids: torch.Tensor) -> dict:
    """The release's forward pass, hand-written: logits, hidden, features (b, t, ·)."""
    B, T = ids.shape
    E, H = m["n_embd"], m["n_head"]
    G = m["n_kv_heads"] or H
    D, eps, clip = E // H, m["norm_eps"], m["clip_qkv"]
    emb = sd["transformer.tok_emb.weight"]
    cos, sin = _rope_tables(T, D, m["rope_base"], ids.device)
    blk = m["diff_block_size"]
    pos = torch.arange(T, device=ids.device) // blk
    mask = pos[None, :] <= pos[:, None]
    x = F.embedding(ids, emb)
    for i in range(m["n_layers"]):
        p = f"transformer.blocks.{i}."
        qkv = F.linear(x, sd[p + "attn.c_attn.weight"]).clamp(-clip, clip)
        q, k, v = qkv.split([E, G * D, G * D], -1)
        q = _rms(q.view(B, T, H, D), sd[p + "attn.q_norm.weight"], eps).transpose(1, 2)
        k = _rms(k.view(B, T, G, D), sd[p + "attn.k_norm.weight"], eps).transpose(1, 2)
        v = v.view(B, T, G, D).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2).reshape(B, T, E)
        x = x + _rms(F.linear(y, sd[p + "attn.c_proj.weight"]), sd[p + "ln_1.weight"], eps)
        up, gate = F.linear(x, sd[p + "mlp.c_fc.weight"]).chunk(2, -1)
        x = x + _rms(F.linear(F.silu(gate) * up, sd[p + "mlp.c_proj.weight"]), sd[p + "ln_2.weight"], eps)
    h = _rms(x, sd["transformer.ln_f.weight"], eps)
    n, mu = c["n_concepts"], c["n_unknown_concepts"]
    # known head: sigmoid, top-k, embeddings
    kl = F.linear(h, sd["known_head.concept_predictor.weight"][:n]).clamp(-15, 15)
    s = torch.sigmoid(kl)
    kv, ki = s.topk(c["topk_known"], -1)
    kw = torch.zeros_like(s).scatter(-1, ki, kv)
    kf = kw @ sd["known_head.concept_embedding.weight"][:n]
    # unknown head on h.detach(): factorised, top-k by logit
    hr = F.linear(h.detach(), sd["unknown_head.predictor_down.weight"])
    ul = F.linear(hr, sd["unknown_head.predictor_up.weight"][:mu]).clamp(-15, 15)
    uv, ui = ul.topk(c["unknown_topk"], -1)
    uw = torch.zeros_like(ul).scatter(-1, ui, torch.sigmoid(uv))
    uf = F.linear(uw @ sd["unknown_head.embedding_coef.weight"][:mu], sd["unknown_head.embedding_basis.weight"])
    ud = uf.detach()
    epsilon = h - (ud + kf)
    logits = F.linear(ud + epsilon + kf, emb)
    return {"logits": logits, "hidden": h, "known_features": kf, "unknown_features": uf}


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


def _loss(logits, kf, uf):
    return logits.logsumexp(-1).mean() + kf.pow(2).mean() + uf.pow(2).mean()


def bench(name: str, device: str, rounds: int) -> dict:
    cfg = CONFIGS[name]
    model = Steerling.from_release_config(cfg["model"], cfg["concept"], cfg["vocab"], seed=0).to(device)
    with torch.no_grad():  # larger weights than the init, so that clip, clamp and top-k matter
        for p in model.net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in model.release_state_dict().items()}
    m, c = model.model_config, model.concept_config
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["length"]), generator=gen).to(device)
    model(ids)  # checks once; the timed calls below skip nothing

    def run_penrose():
        for p in model.parameters():
            p.grad = None
        out = model(ids)
        _loss(out.logits, out.known_features, out.unknown_features).backward()

    def run_hand():
        for t in sd.values():
            t.grad = None
        out = hand_forward(sd, m, c, ids)
        _loss(out["logits"], out["known_features"], out["unknown_features"]).backward()

    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)

    def timed(fn):
        def run():
            fn()
            sync()
        return run

    with torch.no_grad():
        a, b = model(ids), hand_forward(sd, m, c, ids)
        diff = max(float((a.logits - b["logits"]).abs().max()), float((a.hidden - b["hidden"]).abs().max()),
                   float((a.known_features - b["known_features"]).abs().max()),
                   float((a.unknown_features - b["unknown_features"]).abs().max()))
    ratio, tp, th = paired_ratio(timed(run_penrose), timed(run_hand), rounds=rounds, warmup=3)
    return {"config": name, "ratio": ratio, "penrose_ms": tp * 1e3, "hand_ms": th * 1e3, "max_diff": diff,
            "params": model.num_parameters(), "tokens": cfg["batch"] * cfg["length"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (6 if reduced() else 20)
    print(f"Steerling forward+backward, penrose / hand-written ({threads_note()}, {args.device}, {rounds} paired rounds)")
    worst = worst_diff = 0.0
    for name in args.configs:
        r = bench(name, args.device, rounds)
        worst, worst_diff = max(worst, r["ratio"]), max(worst_diff, r["max_diff"])
        print(f"  {name:6s} {r['params']:>11,} params, {r['tokens']:>5} tokens: ratio {r['ratio']:.3f}  "
              f"(penrose {r['penrose_ms']:.2f} ms, hand-written {r['hand_ms']:.2f} ms; max output diff {r['max_diff']:.1e})")
    target = 1.10
    print(f"worst median ratio {worst:.3f} (target <= {target:.2f} on CPU)")
    return 0 if worst_diff <= 1e-4 else 1  # the two sides must compute the same function


if __name__ == "__main__":
    sys.exit(main())
