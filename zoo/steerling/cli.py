"""`penrose steerling ...`: the Steerling commands (penrose.cli forwards its arguments here).

    penrose steerling init --out ckpt --tiny --seed 0          a tiny random checkpoint
    penrose steerling generate --checkpoint ckpt --prompt "Hello" --max-new-tokens 32
    penrose steerling info --checkpoint ckpt                   sizes and parameter count

A checkpoint is a folder with model.safetensors (the release's keys, tied embedding once) and
config.json (model_config / concept_config as differences from the release defaults,
vocab_size, variant). Text goes through a byte-level tokenizer (bytes, then pad, bos,
end-of-chunk and mask ids 256..259), so the vocabulary must have at least 260 entries.
"""

from __future__ import annotations

import argparse
import json
import sys

TINY_MODEL = dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=64, block_size=256, diff_block_size=8,
                  intermediate_size=128)
TINY_CONCEPTS = dict(n_concepts=40, n_unknown_concepts=56, concept_dim=64, topk_known=4, topk_known_features=4,
                     factorize_rank=8, unknown_topk=6)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="penrose steerling", description="Steerling-8B from diagrams (zoo/steerling).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="sample text from a checkpoint")
    g.add_argument("--checkpoint", required=True, help="folder with model.safetensors and config.json")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=0.9)
    g.add_argument("--steps-per-block", type=int, default=8, help="block diffusion: unmasking steps per block")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--intervene", action="append", default=[], metavar="ID=WEIGHT",
                   help="set known concept ID's weight at every position (repeatable)")
    g.add_argument("--show-concepts", action="store_true", help="print the top known concepts of the last position")

    i = sub.add_parser("init", help="write a randomly initialised checkpoint")
    i.add_argument("--out", required=True)
    i.add_argument("--tiny", action="store_true", help="a tiny configuration (the default is the release's: 8B)")
    i.add_argument("--causal", action="store_true", help="the causal variant (autoregressive generation)")
    i.add_argument("--vocab-size", type=int, default=None)
    i.add_argument("--seed", type=int, default=0)

    n = sub.add_parser("info", help="print a checkpoint's sizes and parameter count")
    n.add_argument("--checkpoint", required=True)
    return p


def main(argv=None) -> int:
    from penrose.errors import PenroseError

    p = _parser()
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not args.command:
        p.print_help()
        return 2
    try:
        return {"generate": _generate, "init": _init, "info": _info}[args.command](args)
    except PenroseError as e:
        print(e.render(), file=sys.stderr)
        return 1


def _intervention(items) -> dict[int, float]:
    from penrose.errors import PenroseError

    out = {}
    for item in items:
        cid, _, w = item.partition("=")
        try:
            out[int(cid)] = float(w)
        except ValueError:
            raise PenroseError(f"--intervene expects ID=WEIGHT, got {item!r}") from None
    return out


def _generate(args) -> int:
    import torch

    from penrose.errors import PenroseError
    from zoo.steerling.generate import ByteTokenizer, generate
    from zoo.steerling.model import Steerling

    model = Steerling.load(args.checkpoint).eval()
    tok = ByteTokenizer()
    if model.vocab_size < tok.vocab_size:
        raise PenroseError(f"the byte tokenizer needs vocab_size >= {tok.vocab_size}; the checkpoint has {model.vocab_size}")
    gen = torch.Generator().manual_seed(args.seed)
    prompt = tok.encode(args.prompt)
    banned = [tok.pad_id, tok.bos_id, tok.mask_id] + list(range(tok.vocab_size, model.vocab_size))
    intervene = _intervention(args.intervene)
    kw = dict(temperature=args.temperature, top_p=args.top_p, generator=gen, banned=banned,
              steps_per_block=args.steps_per_block)
    if intervene:
        kw["intervene_known"] = intervene
    if model.variant == "causal":
        kw["eos_id"] = tok.eos_id
    ids = generate(model, prompt, args.max_new_tokens, mask_id=tok.mask_id, **kw)
    print(tok.decode(ids[len(prompt):]))
    if args.show_concepts:
        with torch.no_grad():
            out = model(ids[None])
        pairs = zip(out.known_topk_indices[0, -1].tolist(), out.known_topk_weights[0, -1].tolist())
        print("known concepts (last position): " + ", ".join(f"{i}:{w:.3f}" for i, w in pairs))
    return 0


def _init(args) -> int:
    from zoo.steerling.model import RELEASE_VOCAB_SIZE, Steerling

    m, c = (TINY_MODEL, TINY_CONCEPTS) if args.tiny else ({}, {})
    vocab = args.vocab_size or (260 if args.tiny else RELEASE_VOCAB_SIZE)
    model = Steerling.from_release_config(m, c, vocab, causal=args.causal, seed=args.seed)
    path = model.save(args.out)
    print(f"wrote {path} ({model.num_parameters():,} parameters, {model.variant})")
    return 0


def _info(args) -> int:
    from zoo.steerling.model import Steerling

    model = Steerling.load(args.checkpoint)
    print(json.dumps({"variant": model.variant, "parameters": model.num_parameters(), "sizes": model.sizes,
                      **model.config_dict()}, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
