"""`penrose steerling ...`: the Steerling commands (penrose.cli forwards its arguments here).

    penrose steerling init --out ckpt --tiny --seed 0          a tiny random checkpoint
    penrose steerling generate --checkpoint ckpt --prompt "Hello" --max-new-tokens 32
    penrose steerling info --checkpoint ckpt                   sizes and parameter count
    penrose steerling train --preset tiny --data fortunes --steps 200 --out run
    penrose steerling explain --checkpoint run --text "Some text" [--json] [--heatmap out.png]
    penrose steerling steer --checkpoint run --concept computers --scale 4 --prompt "The"
    penrose steerling steer --checkpoint run --inject computers=8 --prompt "The"     the release's recipes:
    penrose steerling steer --checkpoint run --unlearn computers=20 --prompt "The"   injection, unlearning
    penrose steerling evaluate --checkpoint run [--json]
    penrose steerling evaluate --checkpoint steerling-8b/ --data corpus/ --catalog concepts.parquet
    penrose steerling concepts --catalog labels.csv --search court   concept ids by name / description
    penrose steerling scaling --quick --out build/scaling [--json]   base vs concept models over sizes

A checkpoint is a folder with model.safetensors (the release's keys, tied embedding once) and
config.json (model_config / concept_config as differences from the release defaults,
vocab_size, variant); --checkpoint also reads the published layout (config.json with the model
fields at the top level, weights in model.safetensors or shards listed in
model.safetensors.index.json; Steerling.from_pretrained), memory-mapped, in --dtype.
Text goes through the tokenizer the checkpoint needs
(penrose_zoo.steerling.tokenizer.tokenizer_for): its tokenizer.json, else the release's
cl100k_base tokenizer for a vocabulary of 100,281 / 100,284, else bytes (260); a tokenizer whose
vocabulary is not the model's is refused. A concept (--concept, --intervene, --inject, --unlearn)
is an id, or a name: among the checkpoint's concept names, or in the labels file given by --catalog.

Steering (`generate` and `steer`, the release's SteeringConfig recipes, penrose_zoo.steerling.steer):
--inject CONCEPT=STRENGTH amplifies (SteeringConfig.injection: the concepts' summed direction
injected at the masked positions, STRENGTH in logit units, hard cutoff after --cutoff-tokens);
--unlearn CONCEPT=STRENGTH unlearns (SteeringConfig.injection_relu: negative injection of raw
alpha --unlearn-alpha, default -7, plus the relu logit mask of strength STRENGTH; --unlearn-group
adds the concept's catalog group to the direction); --inject-layer N (default: n_layers // 4 for
--inject, the preset's 8 of 32 layers; n_layers // 2 for --unlearn), --schedule fixed|hard_cutoff.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from penrose.cli import ascii_float, ascii_number  # ASCII digits only (argparse int() takes "٣")
from penrose_zoo.validate import (COUNT, NONNEGATIVE, POSITIVE, PROBABILITY, SEED, SEEDS, WEIGHT, cli_device, cli_number,
                                  cli_whole, json_text, printable)

# Every numeric option is checked as it is parsed (penrose_zoo.validate): ASCII digits, its range.
TOP_P = cli_number(0, 1, low_open=True)
VOCAB = cli_whole(260, 2**31)  # the byte tokenizer's 256 bytes and 4 special tokens at least
SEQ_LEN = cli_whole(2, 1 << 20)  # a bos and one token at least

TINY_MODEL = dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=64, block_size=256, diff_block_size=8,
                  intermediate_size=128)
TINY_CONCEPTS = dict(n_concepts=40, n_unknown_concepts=56, concept_dim=64, topk_known=4, topk_known_features=4,
                     factorize_rank=8, unknown_topk=6)


CHECKPOINT_HELP = ("checkpoint folder: one written by `init` or `train`, or the published layout (config.json with "
                   "the model fields at the top level, model.safetensors or shards listed in model.safetensors.index.json)")


def _steering_options(parser) -> None:
    """--inject / --unlearn CONCEPT=STRENGTH and the injection's layer and schedule."""
    parser.add_argument("--inject", action="append", default=[], metavar="CONCEPT=STRENGTH",
                        help="amplify a known concept by residual-stream injection (the release's "
                             "SteeringConfig.injection; STRENGTH in logit units, signed; repeatable, one strength: "
                             "the concepts' embeddings are summed into one direction)")
    parser.add_argument("--unlearn", action="append", default=[], metavar="CONCEPT=STRENGTH",
                        help="unlearn a known concept (SteeringConfig.injection_relu): negative injection plus a "
                             "relu logit mask of this strength (the release's default 20); repeatable")
    parser.add_argument("--unlearn-alpha", type=ascii_float, default=-7.0,
                        help="--unlearn: the raw injection alpha (default -7, the release's)")
    parser.add_argument("--unlearn-group", action="store_true",
                        help="--unlearn: inject along the concept's whole catalog group (needs --catalog)")
    parser.add_argument("--inject-layer", type=COUNT, default=None, metavar="N",
                        help="inject after layers N, N+1, ... (1-based; default n_layers // 4 for --inject, "
                             "n_layers // 2 for --unlearn)")
    parser.add_argument("--schedule", default=None, choices=["fixed", "hard_cutoff"],
                        help="injection schedule (default: hard_cutoff for --inject, fixed for --unlearn)")
    parser.add_argument("--cutoff-tokens", type=COUNT, default=None, metavar="N",
                        help="hard_cutoff: tokens generated with the injection on (default 32)")


def _checkpoint_option(parser, *, device: bool = False) -> None:
    """--checkpoint DIR (either layout, see Steerling.load), --dtype and, where the command can
    run off the CPU, --device."""
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help=CHECKPOINT_HELP)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="the weights' dtype (default: float32 for penrose checkpoints, as stored for the published layout)")
    if device:
        parser.add_argument("--device", type=cli_device, default=None, help="cpu (default), cuda, cuda:1, ...")


def _load_model(args):
    """The model of --checkpoint in --dtype on --device (memory-mapped, checked before anything is read)."""
    from penrose_zoo.steerling.model import Steerling
    from penrose_zoo.validate import device_here

    device_here(getattr(args, "device", None), "--device")
    return Steerling.load(args.checkpoint, dtype=args.dtype, device=getattr(args, "device", None))


def _open(args):
    """(model, tokenizer, known concept names) of --checkpoint: a training checkpoint (train.json)
    with its concepts.json names, or any other checkpoint folder (the published layout), its
    tokenizer by its vocabulary and its known concepts named by their ids (names: --catalog)."""
    from pathlib import Path

    import torch

    from penrose_zoo.steerling.checkpoints import load_checkpoint

    if (Path(args.checkpoint) / "train.json").is_file():
        model, tok, names, _ = load_checkpoint(args.checkpoint)
        return (model if args.dtype is None else model.to(getattr(torch, args.dtype))), tok, names
    from penrose_zoo.steerling.tokenizer import tokenizer_for

    model = _load_model(args)
    return model, tokenizer_for(args.checkpoint, vocab_size=model.vocab_size), [str(i) for i in range(model.sizes["c"])]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="penrose steerling", description="Steerling-8B from diagrams (zoo/steerling).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="sample text from a checkpoint")
    _checkpoint_option(g, device=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=COUNT, default=32)
    g.add_argument("--temperature", type=WEIGHT, default=1.0, help="0 = greedy")
    g.add_argument("--top-p", type=TOP_P, default=0.9, help="above 0, at most 1")
    g.add_argument("--steps-per-block", type=COUNT, default=8, help="block diffusion: unmasking steps per block")
    g.add_argument("--seed", type=SEED, default=0)
    g.add_argument("--intervene", action="append", default=[], metavar="CONCEPT=WEIGHT",
                   help="set a known concept's weight at every position (repeatable); CONCEPT is an id, "
                        "or a name with --catalog")
    g.add_argument("--catalog", default=None, metavar="FILE", help="concept labels (CSV or parquet) for names")
    g.add_argument("--show-concepts", action="store_true", help="print the top known concepts of the last position")
    _steering_options(g)

    i = sub.add_parser("init", help="write a randomly initialised checkpoint")
    i.add_argument("--out", required=True, help="a new or empty folder (an existing checkpoint only with --force)")
    i.add_argument("--force", action="store_true", help="replace what --out holds (a checkpoint, trained or not)")
    i.add_argument("--tiny", action="store_true", help="a tiny configuration (the default is the release's: 8B)")
    i.add_argument("--causal", action="store_true", help="the causal variant (autoregressive generation)")
    i.add_argument("--vocab-size", type=VOCAB, default=None,
                   help="at least 260 (the byte tokenizer's; default: 260 with --tiny, else the release's 100,281)")
    i.add_argument("--seed", type=SEED, default=0)

    n = sub.add_parser("info", help="print a checkpoint's sizes and parameter count")
    _checkpoint_option(n, device=True)

    t = sub.add_parser("train", help="train on a labelled corpus (fortunes or a folder of category files)")
    t.add_argument("--preset", default="tiny", help="tiny | small")
    t.add_argument("--data", default="fortunes", help="'fortunes' or a directory of category files")
    t.add_argument("--categories", default=None, help="comma-separated category files to read (default all)")
    t.add_argument("--max-chunks", type=NONNEGATIVE, default=0, help="use a fixed sample of this many training chunks (0 = all)")
    t.add_argument("--steps", type=COUNT, default=100)
    t.add_argument("--out", required=True, help="checkpoint folder (resumed if it holds one)")
    t.add_argument("--variant", default="causal", choices=["causal", "block_causal"],
                   help="causal: next-token loss; block_causal: masked diffusion loss")
    t.add_argument("--epsilon", action="store_true", help="keep the residual ε (default: pure bottleneck)")
    t.add_argument("--lambda-concept", type=WEIGHT, default=0.1)
    t.add_argument("--lambda-indep", type=WEIGHT, default=1.0)
    t.add_argument("--lambda-rec", type=WEIGHT, default=0.1)
    t.add_argument("--lambda-bottleneck", type=WEIGHT, default=0.0,
                   help="with --epsilon: also the token loss of h̄ = k̂ + û (the post's L_token), weighted; "
                        "without it the release form gives the known embeddings no gradient")
    t.add_argument("--negative-weight", type=WEIGHT, default=1.0, help="weight of unannotated concepts as negatives")
    t.add_argument("--teacher-forcing-steps", type=NONNEGATIVE, default=0, help="anneal teacher forcing 1 → 0 over N steps (with --epsilon it acts through the h̄ loss of --lambda-bottleneck)")
    t.add_argument("--tokenizer", default="byte", choices=["byte", "bpe"])
    t.add_argument("--bpe-vocab", type=VOCAB, default=1024, help="at least 260 (bytes and the special tokens)")
    t.add_argument("--seq-len", type=SEQ_LEN, default=None, help="tokens per row, at least 2")
    t.add_argument("--batch-size", type=COUNT, default=None)
    t.add_argument("--lr", type=POSITIVE, default=None)
    t.add_argument("--seed", type=SEED, default=0)
    t.add_argument("--val-every", type=COUNT, default=50)
    t.add_argument("--save-every", type=COUNT, default=100)
    t.add_argument("--stop-after", type=COUNT, default=None, help="stop after N steps of this call (resumable)")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--threads", type=COUNT, default=None, help="torch.set_num_threads")
    t.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard parameters, gradients and optimizer state (FSDP2) instead of DDP")

    x = sub.add_parser("explain", help="concepts per token, IG input attribution, heatmap")
    _checkpoint_option(x)
    x.add_argument("--text", required=True)
    x.add_argument("--json", action="store_true")
    x.add_argument("--heatmap", default=None,
                   help="PNG path (default: CHECKPOINT/explain.png for a training checkpoint, else explain.png here: "
                        "a downloaded checkpoint folder is left as it is); an existing file is replaced when it is "
                        "a PNG image (an earlier heatmap), any other only with --force")
    x.add_argument("--force", action="store_true", help="replace an existing --heatmap file that is not a PNG image")
    x.add_argument("--top", type=COUNT, default=3, help="concepts shown per token")
    x.add_argument("--ig-steps", type=COUNT, default=32)
    x.add_argument("--concept", default=None, metavar="NAME|ID",
                   help="also: this known concept's probability per token and its token attribution")
    x.add_argument("--catalog", default=None, metavar="FILE", help="concept labels (CSV or parquet) for --concept")

    s = sub.add_parser("steer", help="generate with a known concept rescaled (or set), or with the release's "
                                     "steering recipes (--inject, --unlearn), against the unsteered generation")
    _checkpoint_option(s)
    s.add_argument("--concept", default=None, metavar="NAME|ID", help="known concept name (or id) for --scale / --value")
    s.add_argument("--catalog", default=None, metavar="FILE",
                   help="concept labels (CSV or parquet) to read NAME in (default: the checkpoint's names)")
    s.add_argument("--scale", type=ascii_float, default=None, help="multiply the concept's weight by S")
    s.add_argument("--value", type=ascii_float, default=None, help="set the concept's weight to V instead")
    s.add_argument("--prompt", required=True)
    s.add_argument("--max-new-tokens", type=COUNT, default=40,
                   help="with --inject / --unlearn rounded up to a multiple of the diffusion block (the release's sampler)")
    s.add_argument("--json", action="store_true")
    _steering_options(s)
    s.add_argument("--temperature", type=WEIGHT, default=0.0,
                   help="--inject / --unlearn: 0 = greedy (default); above 0 temperature sampling with --top-p")
    s.add_argument("--top-p", type=TOP_P, default=0.8, help="above 0, at most 1")
    s.add_argument("--entropy-sampling", action="store_true",
                   help="--inject / --unlearn: the release's default entropy-adaptive sampler")
    s.add_argument("--repetition-penalty", type=cli_number(low=1), default=1.1,
                   help="at least 1 (no penalty); the release's default 1.1")
    s.add_argument("--seed", type=SEED, default=0)

    v = sub.add_parser("evaluate", help="validation loss and the interpretability metrics")
    _checkpoint_option(v)
    v.add_argument("--data", default=None, metavar="DIR",
                   help="a corpus of category files ('fortunes' or a folder); default for a checkpoint written by "
                        "`train`: its training corpus and config; needed for any other folder (the published layout)")
    v.add_argument("--catalog", default=None, metavar="FILE",
                   help="labels file (CSV or parquet) that names the known concepts the corpus categories are")
    v.add_argument("--concept", action="append", default=None, metavar="CATEGORY=ID|NAME", dest="concept_map",
                   help="the known concept of a corpus category (repeatable; else by --catalog name)")
    v.add_argument("--seq-len", type=SEQ_LEN, default=None, help="tokens per row (default: the tiny preset's)")
    v.add_argument("--max-chunks", type=NONNEGATIVE, default=0, help="a fixed sample of the corpus (0 = all)")
    v.add_argument("--json", action="store_true")
    v.add_argument("--max-batches", type=COUNT, default=16)

    c = sub.add_parser("concepts", help="look concepts up in a catalog (labels file)")
    c.add_argument("--catalog", default=os.environ.get("STEERLING_CONCEPTS_PATH"), metavar="FILE",
                   help="CSV or parquet labels file (default: $STEERLING_CONCEPTS_PATH)")
    c.add_argument("--search", default=None, metavar="TEXT", help="words to find in names and descriptions")
    c.add_argument("--id", default=None, metavar="NAME|ID", help="show one concept")
    c.add_argument("--group", type=NONNEGATIVE, default=None, metavar="GROUP_ID", help="the concepts of a group")
    c.add_argument("--head", default=None, choices=["known", "unknown"])
    c.add_argument("--steerable", action="store_true", help="steerable concepts only")
    c.add_argument("--limit", type=NONNEGATIVE, default=50, help="matches shown (0 = all)")
    c.add_argument("--json", action="store_true")

    pl = sub.add_parser("planted", help="write a planted-concept corpus (known answers; penrose_zoo.steerling.planted)")
    pl.add_argument("--out", required=True, help="new folder: one category file per labelled concept, .planted.json")
    pl.add_argument("--force", action="store_true", help="replace what --out holds")
    pl.add_argument("--seed", type=SEED, default=0)
    pl.add_argument("--chunks", type=COUNT, default=4000, help="chunks to write (at most 1,000,000)")
    pl.add_argument("--concepts", type=COUNT, default=8,
                    help="planted concepts, withheld and pattern ones included (2 to 24)")
    pl.add_argument("--words", type=COUNT, default=6, help="words per concept (at least 2)")
    pl.add_argument("--shared-words", type=NONNEGATIVE, default=1, help="words concept i shares with concept i + 1")
    pl.add_argument("--withheld", type=NONNEGATIVE, default=1, help="the last concepts: planted, never labelled")
    pl.add_argument("--rare", type=NONNEGATIVE, default=1, help="rare concepts (draw weight --rare-weight)")
    pl.add_argument("--rare-weight", type=POSITIVE, default=0.25)
    pl.add_argument("--co-occur", type=PROBABILITY, default=0.5, help="P(concept 2k brings its partner 2k + 1)")
    pl.add_argument("--extra-concept", type=PROBABILITY, default=0.3, help="P(one more random concept)")
    pl.add_argument("--no-pattern", action="store_true", help="no numbers (pattern) concept")

    ka = sub.add_parser("known-answer", help="on a checkpoint trained on a planted corpus: detection vs a linear probe, "
                                             "logit share, steering, attribution, unknown-concept recovery")
    ka.add_argument("--checkpoint", required=True, metavar="DIR", help="a `train` checkpoint whose --data is a planted corpus")
    ka.add_argument("--samples", type=COUNT, default=64, help="generations per concept and condition")
    ka.add_argument("--new-tokens", type=COUNT, default=48)
    ka.add_argument("--strength", type=ascii_float, default=1.0, help="injected weight of the concept (post-top-k)")
    ka.add_argument("--max-batches", type=COUNT, default=32, help="validation / training batches measured")
    ka.add_argument("--seed", type=SEED, default=0)
    ka.add_argument("--epsilon-off", action="store_true",
                    help="steer as the release's intervene_known does: ε switched off (the head reads k̂ + û); "
                         "default: the weight edited with ε held (steer.edit_keeping_epsilon)")
    ka.add_argument("--unlearn-strength", type=WEIGHT, default=20.0,
                    help="strength of the release's relu logit mask in the unlearning measurement (0: skip it)")
    ka.add_argument("--steer", default=None, metavar="A,B", help="the labelled concepts steered (default all)")
    ka.add_argument("--null", default=None, choices=["random_init", "shuffled_k"],
                    help="measure a null of the checkpoint: untrained from the seed, or K shuffled across concepts")
    ka.add_argument("--baselines", default=None, metavar="A,B",
                    help="steering baselines at the injection's KL: logit_bias, activation_addition, layer_injection "
                         "(or 'all')")
    ka.add_argument("--layer", type=NONNEGATIVE, default=None,
                    help="the residual-stream layer of activation_addition and layer_injection (default n_layers // 2)")
    ka.add_argument("--no-suppression", action="store_true", help="injection only (no clamp, no unlearning)")
    ka.add_argument("--threads", type=COUNT, default=None)
    ka.add_argument("--json", action="store_true")

    nu = sub.add_parser("nulls", help="train the model and its nulls over seeds on a planted corpus; print every "
                                      "known-answer figure beside its nulls and baselines (mean [95%% bootstrap CI])")
    nu.add_argument("--data", required=True, metavar="DIR", help="a planted corpus (penrose steerling planted)")
    nu.add_argument("--out", required=True, metavar="DIR", help="checkpoints, results and nulls.json (reused on rerun)")
    nu.add_argument("--seeds", type=SEEDS, default=(0, 1, 2), help="comma-separated training seeds (3 or more for an interval)")
    nu.add_argument("--steps", type=COUNT, default=600)
    nu.add_argument("--preset", default="small", help="tiny | small")
    nu.add_argument("--tokenizer", default="bpe", choices=["byte", "bpe"])
    nu.add_argument("--bpe-vocab", type=VOCAB, default=512)
    nu.add_argument("--no-teacher-forcing", action="store_true", help="train without teacher forcing of k̂_gt")
    nu.add_argument("--samples", type=COUNT, default=32, help="generations per concept and condition")
    nu.add_argument("--new-tokens", type=COUNT, default=32)
    nu.add_argument("--strength", type=ascii_float, default=2.0, help="injected weight of the concept")
    nu.add_argument("--max-batches", type=COUNT, default=8)
    nu.add_argument("--baselines", default="all", metavar="A,B", help="steering baselines: a list, all or none")
    nu.add_argument("--layer", type=NONNEGATIVE, default=None)
    nu.add_argument("--nulls", default="all", metavar="A,B",
                    help="shuffled_labels, lambda0, random_init, shuffled_k, all or none (default all)")
    nu.add_argument("--threads", type=COUNT, default=None)
    nu.add_argument("--json", action="store_true", help="print nulls.json's table instead of the text table")

    nt = sub.add_parser("nulls-table", help="combine `nulls` runs on several corpus draws: per-corpus figures, the "
                                            "prediction interval for a new corpus's seed mean (and the simultaneous "
                                            "one), the specificity matrices, and re-runs against them")
    nt.add_argument("runs", nargs="+", metavar="OUT",
                    help="`nulls` --out folders (or their nulls.json), one per corpus draw (at least 2); the first "
                         "one's nulls are shown beside its model")
    nt.add_argument("--rerun", metavar="OUT", action="append", default=[],
                    help="an independent `nulls` run (another corpus, the same settings and number of seeds): "
                         "which figures land inside the intervals; repeat for several re-runs")
    nt.add_argument("--level", type=cli_number(0, 1, low_open=True, high_open=True), default=0.95,
                    help="the prediction intervals' level (default 0.95)")
    nt.add_argument("--json", action="store_true", help="print the combined table as JSON")
    nt.add_argument("--markdown", action="store_true", help="print the tables as markdown (docs/experiments.md)")

    from penrose_zoo.steerling.scaling import add_arguments

    add_arguments(sub.add_parser("scaling", help="base vs concept-module models at several sizes: power-law fits "
                                 "of loss against compute, interpretability metrics per size"))
    return p


def main(argv=None) -> int:
    from penrose.errors import PenroseError

    p = _parser()
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not args.command:
        p.print_help()
        return 2
    stdout, sys.stdout = sys.stdout, _Escaped(sys.stdout)  # names from files print escaped
    try:
        return {"generate": _generate, "init": _init, "info": _info, "train": _train, "explain": _explain,
                "steer": _steer, "evaluate": _evaluate, "concepts": _concepts, "scaling": _scaling,
                "planted": _planted, "known-answer": _known_answer, "nulls": _nulls,
                "nulls-table": _nulls_table}[args.command](args)
    except PenroseError as e:
        print(printable(e.render(), keep="\n"), file=sys.stderr)
        return 1
    except ValueError as e:  # penrose_zoo.data.DataError (corpus problems) is a ValueError
        from penrose_zoo.data import DataError

        if not isinstance(e, DataError):
            raise
        print(printable(f"error: {e}", keep="\n"), file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


class _Escaped:
    """The commands' standard output: every control and invisible format character but line
    breaks and tabs written as an escape (penrose_zoo.validate.printable), so a concept name, a
    category file's name or generated text cannot move the cursor, retitle the terminal or erase
    lines. (JSON output is written with json_text, whose escapes are JSON's.)"""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text, keep="\n\t"))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _intervention(items, catalog: str | None = None) -> dict[int, float]:
    """--intervene CONCEPT=WEIGHT items; CONCEPT is an id, or a name in the --catalog file."""
    from penrose.errors import PenroseError

    cat = _catalog(catalog) if catalog and items else None
    out = {}
    for item in items:
        concept, eq, w = item.rpartition("=")
        weight = ascii_number(w)
        if weight is None or not eq or not concept:
            raise PenroseError(f"--intervene expects CONCEPT=WEIGHT (an id, or a name with --catalog; WEIGHT a finite "
                               f"number in ASCII digits), got {item!r}")
        weight = float(weight)
        if cat is not None:
            out[cat.resolve(concept, head="known")] = weight
        elif concept.strip().isascii() and concept.strip().isdigit():
            out[int(concept)] = weight
        else:
            raise PenroseError(f"--intervene {item!r}: {concept!r} is not a concept id; give --catalog FILE to use names")
    return out


def _catalog(path: str):
    from penrose_zoo.steerling.catalog import ConceptCatalog

    return ConceptCatalog.load(path)


def _concept_arg(args, names) -> tuple[int, str]:
    """(id, name) of --concept NAME|ID: looked up in --catalog when given, else among the
    checkpoint's known concept names; the id must be one of the checkpoint's known concepts."""
    from penrose.errors import PenroseError
    from penrose_zoo.steerling.checkpoints import concept_id

    if not args.catalog:
        cid = concept_id(names, args.concept)
        return cid, names[cid]
    concept = _catalog(args.catalog).lookup(args.concept, head="known")
    if concept.concept_id >= len(names):
        raise PenroseError(f"--concept {args.concept!r} is known concept {concept.concept_id} in {args.catalog}, but this "
                           f"checkpoint has {len(names)} known concepts (ids 0..{len(names) - 1})")
    return concept.concept_id, concept.name


def _known_names(checkpoint, model) -> list[str]:
    """The checkpoint's known concept names (concepts.json of a training checkpoint), else ids."""
    from pathlib import Path

    from penrose_zoo.steerling.checkpoints import read_concept_names

    if (Path(checkpoint) / "concepts.json").is_file():
        return read_concept_names(checkpoint, model.sizes["c"])
    return [str(i) for i in range(model.sizes["c"])]


def _concept_strengths(items, flag: str, args, names) -> list[tuple[int, float]]:
    """(id, strength) of CONCEPT=STRENGTH items: CONCEPT an id or a name (in --catalog when given,
    else among the checkpoint's names); STRENGTH a finite number."""

    from penrose.errors import PenroseError
    from penrose_zoo.steerling.checkpoints import concept_id

    out = []
    for item in items:
        concept, eq, w = item.rpartition("=")
        if not eq or not concept or not w.strip():
            raise PenroseError(f"{flag} expects CONCEPT=STRENGTH (an id, or a name), got {item!r}")
        strength = ascii_number(w)
        if strength is None:
            raise PenroseError(f"{flag} {item!r}: the strength {w!r} is not a finite number (in ASCII digits)")
        strength = float(strength)
        if args.catalog:
            c = _catalog(args.catalog).lookup(concept, head="known")
            if c.concept_id >= len(names):
                raise PenroseError(f"{flag} {item!r}: {concept!r} is known concept {c.concept_id} in {args.catalog}, but "
                                   f"this checkpoint has {len(names)} known concepts (ids 0..{len(names) - 1})")
            out.append((c.concept_id, strength))
        elif concept.strip().isascii() and concept.strip().isdigit() and concept.strip() not in names and int(concept) >= len(names):
            raise PenroseError(f"{flag} {item!r}: known concept id {int(concept)} is out of range; this checkpoint has "
                               f"{len(names)} known concepts (ids 0..{len(names) - 1})")
        else:
            out.append((concept_id(names, concept.strip()), strength))
    return out


def _steering(args, model, names):
    """The SteeringConfig of --inject / --unlearn (None without either)."""
    import dataclasses

    from penrose.errors import PenroseError
    from penrose_zoo.steerling.steer import SteeringConfig

    inject = _concept_strengths(args.inject, "--inject", args, names)
    unlearn = _concept_strengths(args.unlearn, "--unlearn", args, names)
    if not inject and not unlearn:
        if args.unlearn_group or args.inject_layer is not None or args.schedule or args.cutoff_tokens is not None:
            raise PenroseError("--inject-layer, --schedule, --cutoff-tokens and --unlearn-group need --inject or --unlearn")
        return None
    if inject and unlearn:
        raise PenroseError("give --inject or --unlearn, not both: the release steers along one direction")
    L = model.model_config["n_layers"]
    if args.inject_layer is not None and args.inject_layer > L:  # (the release would inject nowhere)
        raise PenroseError(f"--inject-layer {args.inject_layer}: this model has {L} layers (1..{L})")
    if inject:
        strengths = {s for _, s in inject}
        if len(strengths) > 1:
            raise PenroseError(f"--inject: one strength for all concepts (their embeddings make one direction), got {sorted(strengths)}")
        cfg = SteeringConfig.injection([c for c, _ in inject], mai_lm_target=strengths.pop(),
                                       inject_layer=args.inject_layer if args.inject_layer is not None else max(1, L // 4))
    else:
        focal = [c for c, _ in unlearn]
        group = []
        if args.unlearn_group:
            if not args.catalog:
                raise PenroseError("--unlearn-group reads the concept's group in --catalog FILE")
            cat = _catalog(args.catalog)
            group = [g for c in focal for g in cat.group_of(c, head="known") if g < len(names)]
        ids = list(dict.fromkeys(focal + group))
        cfg = SteeringConfig(concept_ids=ids, mai_lm_target=args.unlearn_alpha, normalize_mai_lm_target=False,
                             inject_layer=args.inject_layer, inject_alpha_schedule="fixed",
                             relu_logit_mask=dict(unlearn))  # one --unlearn: exactly SteeringConfig.injection_relu
    changes = {}
    if args.schedule:
        changes["inject_alpha_schedule"] = args.schedule
    if args.cutoff_tokens is not None:
        changes["cutoff_tokens"] = args.cutoff_tokens
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _generate(args) -> int:
    import torch

    from penrose_zoo.steerling.generate import generate
    from penrose_zoo.steerling.tokenizer import tokenizer_for

    model = _load_model(args).eval()
    tok = tokenizer_for(args.checkpoint, vocab_size=model.vocab_size)  # the checkpoint's own
    gen = torch.Generator().manual_seed(args.seed)
    prompt = tok.prompt_ids(args.prompt)
    banned = [tok.pad_id, tok.bos_id, tok.mask_id]
    intervene = _intervention(args.intervene, args.catalog)
    steering = _steering(args, model, _known_names(args.checkpoint, model))
    kw = dict(temperature=args.temperature, top_p=args.top_p, generator=gen, banned=banned,
              steps_per_block=args.steps_per_block)
    if intervene:
        kw["intervene_known"] = intervene
    if steering is not None:
        kw["steering"] = steering
    if model.variant == "causal":
        kw["eos_id"] = tok.eos_id
    ids = generate(model, prompt, args.max_new_tokens, mask_id=tok.mask_id, **kw)
    print(tok.decode(ids[len(prompt):], skip_special_tokens=True))
    if args.show_concepts:
        with torch.no_grad():
            out = model(ids[None])
        pairs = zip(out.known_topk_indices[0, -1].tolist(), out.known_topk_weights[0, -1].tolist())
        print("known concepts (last position): " + ", ".join(f"{i}:{w:.3f}" for i, w in pairs))
    return 0


def _init(args) -> int:
    from pathlib import Path

    from penrose.io import atomic_write_folder
    from penrose_zoo.steerling.model import RELEASE_VOCAB_SIZE, Steerling

    m, c = (TINY_MODEL, TINY_CONCEPTS) if args.tiny else ({}, {})
    vocab = args.vocab_size or (260 if args.tiny else RELEASE_VOCAB_SIZE)
    out = Path(args.out)
    _refuse_to_replace(out, CHECKPOINT_FILES, "a checkpoint", args.force)  # before the model is built
    model = Steerling.from_release_config(m, c, vocab, causal=args.causal, seed=args.seed)
    # the whole folder at once: a trained checkpoint's train.json, optimizer and tokenizer never
    # stay beside new weights
    atomic_write_folder(out, model.save, replace=args.force)
    print(f"wrote {printable(out)} ({model.num_parameters():,} parameters, {model.variant})")
    return 0


#: what a checkpoint folder holds (`init`, `train`, `explain`'s default heatmap)
CHECKPOINT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
                    "concepts.json", "optimizer.safetensors", "train.json", "explain.png")


def _refuse_to_replace(out, known: tuple[str, ...], what: str, force: bool) -> None:
    """A PenroseError unless the folder `out` is new or empty, or holds only `known` files (and
    shards `model-*.safetensors`) and `force` is given: --force replaces a checkpoint, never a
    folder of other files."""
    from penrose.errors import PenroseError

    if out.exists() and not out.is_dir():
        raise PenroseError(f"--out {printable(out)} is a file, not a folder")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not held:
        return
    if not force:
        raise PenroseError(f"--out {printable(out)} exists and is not empty ({printable(', '.join(held[:5]))}"
                           f"{', ...' if len(held) > 5 else ''}); give --force to replace {what} there, or a new folder")
    others = [n for n in held if n not in known and not (n.startswith("model-") and n.endswith(".safetensors"))]
    if others:
        raise PenroseError(f"--out {printable(out)} holds files that are not {what}'s ({printable(', '.join(others[:5]))}"
                           f"{', ...' if len(others) > 5 else ''}): --force replaces {what} only; give a new folder")


def _info(args) -> int:
    model = _load_model(args)
    p = next(model.parameters())
    print(json.dumps({"variant": model.variant, "parameters": model.num_parameters(), "sizes": model.sizes,
                      "layout": model.checkpoint_layout, "dtype": str(p.dtype).removeprefix("torch."),
                      "device": str(p.device), **model.config_dict()}, indent=2))
    return 0


def _train(args) -> int:
    import torch

    from penrose_zoo.steerling.train import TrainConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    cats = [c for c in args.categories.split(",") if c] if args.categories else None
    cfg = TrainConfig(preset=args.preset, data=args.data, categories=cats, max_chunks=args.max_chunks,
                      variant=args.variant, epsilon=args.epsilon, lambda_concept=args.lambda_concept,
                      lambda_indep=args.lambda_indep, lambda_rec=args.lambda_rec,
                      lambda_bottleneck=args.lambda_bottleneck,
                      negative_weight=args.negative_weight, teacher_forcing_steps=args.teacher_forcing_steps,
                      tokenizer=args.tokenizer, bpe_vocab=args.bpe_vocab, steps=args.steps, seed=args.seed,
                      seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr)
    state = train(cfg, args.out, val_every=args.val_every, save_every=args.save_every, stop_after=args.stop_after,
                  progress=not args.no_progress, fsdp=args.fsdp)
    last = state["history"]["val"][-1] if state["history"]["val"] else {}
    if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 reports
        print(json_text({"out": args.out, "step": state["step"], "val": last}))
    return 0


def _prompt_ids(tok, text: str, model):
    import torch

    ids = tok.prompt_ids(text)  # [bos] + ids (the release's tokenizer: no bos, as its generator)
    if len(ids) > model.model_config["block_size"]:
        from penrose.errors import PenroseError

        raise PenroseError(f"the text is {len(ids)} tokens; the context is {model.model_config['block_size']}")
    return torch.tensor([ids])


def _heatmap_target(heat, *, force: bool) -> None:
    """explain's heatmap file may be written: its folder exists, it is not a folder, FIFO or
    read-only file (penrose.io.writable_target), and an existing file is a PNG image (an earlier
    heatmap, replaced) — any other file is replaced only with --force."""
    from penrose.errors import PenroseError
    from penrose.io import writable_target

    writable_target(heat)
    if not heat.is_file() or force:
        return
    with open(heat, "rb") as f:
        if f.read(8) == b"\x89PNG\r\n\x1a\n":
            return
    raise PenroseError(f"--heatmap {printable(heat)} exists and is not a PNG image (an earlier heatmap); give --force "
                       "to replace it, or another --heatmap")


def _explain(args) -> int:
    from pathlib import Path

    import torch

    from penrose.io import atomic_write_file

    from penrose_zoo.steerling.attribution import (ConceptTarget, LogitTarget, concept_attribution, forward_ids,
                                                   integrated_gradients)

    model, tok, names = _open(args)
    model.eval()
    focus = _concept_arg(args, names) if args.concept is not None else None
    own = (Path(args.checkpoint) / "train.json").is_file()
    heat = Path(args.heatmap) if args.heatmap else (Path(args.checkpoint) if own else Path.cwd()) / "explain.png"
    _heatmap_target(heat, force=args.force)  # before the work
    ids = _prompt_ids(tok, args.text, model)
    if model.variant == "block_causal":  # the next token is predicted at an appended [MASK]
        ids = torch.cat([ids, torch.tensor([[tok.mask_id]])], 1)
    T = ids.shape[1]
    with torch.no_grad():
        out = forward_ids(model, ids)
    probs = torch.sigmoid(out.known_logits[0].float())  # (t, n), before the top-k cut; float32 for numpy (a bf16 checkpoint)
    w = out.known_weights[0]
    pieces = [tok.decode([i], skip_special_tokens=False) for i in ids[0].tolist()]
    tokens: list[dict[str, Any]] = []
    for t in range(T):
        top = w[t].topk(min(args.top, w.shape[-1]))
        tokens.append({"token": pieces[t], "concepts": [{"name": names[int(i)], "weight": round(float(v), 4)}
                                                        for v, i in zip(top.values, top.indices) if v > 0]})
    pred = int(out.logits[0, -1].argmax())
    pred_text = tok.decode([pred], skip_special_tokens=False)
    with torch.no_grad():
        attr = concept_attribution(model, out, torch.full((1, T), pred))
        kid, kval = attr.top_known(args.top)
    ig = integrated_gradients(model, ids, LogitTarget(T - 1, pred), steps=args.ig_steps, chunk_size=8)
    shown = probs.max(0).values.topk(min(12, probs.shape[1])).indices
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 0.35 * T + 2), 0.35 * len(shown) + 1.5))
    ax.imshow(probs[:, shown].T.numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_yticks(range(len(shown)), [names[int(i)] for i in shown], fontsize=7)
    ax.set_xticks(range(T), [repr(p)[1:-1] for p in pieces], fontsize=6, rotation=90)
    ax.set_title("σ(known concept logit) per token")
    fig.tight_layout()
    try:
        atomic_write_file(heat, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)
    result: dict[str, Any] = {
        "tokens": tokens,
        "prediction": {"token": pred_text, "logit": float(attr.logit[0, -1, 0]),
                       "known": [{"name": names[int(i)], "contribution": round(float(v), 5)}
                                 for i, v in zip(kid[0, -1, 0], kval[0, -1, 0])],
                       "known_total": float(attr.known_total[0, -1, 0]),
                       "unknown_total": float(attr.unknown_total[0, -1, 0]),
                       "epsilon": float(attr.epsilon[0, -1, 0]), "attribution_error": attr.error},
        "integrated_gradients": {"target": f"logit of {pred_text!r} at the last position",
                                 "per_token": [{"token": p, "attribution": round(float(a), 5)}
                                               for p, a in zip(pieces, ig.attributions[0])],
                                 "completeness_error": ig.max_completeness_error,
                                 "f_input": float(ig.f_input[0]), "f_baseline": float(ig.f_baseline[0]),
                                 "steps": ig.steps},
        "heatmap": str(heat),
    }
    if focus is not None:  # --concept: σ(its logit) per token, its share of the prediction, IG token → concept
        cid, cname = focus
        cig = integrated_gradients(model, ids, ConceptTarget(T - 1, cid), steps=args.ig_steps, chunk_size=8)
        share = (attr.known[0, -1, 0] * (attr.known_ids[0, -1] == cid)).sum()
        result["concept"] = {"name": cname, "id": cid, "contribution": round(float(share), 5),
                             "probability_per_token": [{"token": p, "probability": round(float(q), 4)}
                                                       for p, q in zip(pieces, probs[:, cid])],
                             "integrated_gradients": {"target": f"σ(logit of {cname!r}) at the last position",
                                                      "per_token": [{"token": p, "attribution": round(float(a), 5)}
                                                                    for p, a in zip(pieces, cig.attributions[0])],
                                                      "completeness_error": cig.max_completeness_error}}
    if args.json:
        print(json_text(result, indent=1))
        return 0
    for row in tokens:
        print(f"{row['token']!r:>10}  " + ", ".join(f"{c['name']} {c['weight']:.2f}" for c in row["concepts"]))
    p = result["prediction"]
    print(f"next token {p['token']!r} (logit {p['logit']:.3f} = known {p['known_total']:.3f} + unknown "
          f"{p['unknown_total']:.3f} + ε {p['epsilon']:.3f}; error {p['attribution_error']:.1e})")
    print("  top known contributions: " + ", ".join(f"{c['name']} {c['contribution']:+.3f}" for c in p["known"]))
    g = result["integrated_gradients"]
    print(f"integrated gradients ({g['steps']} steps, completeness error {g['completeness_error']:.2e}):")
    print("  " + " ".join(f"{a['token']!r}:{a['attribution']:+.3f}" for a in g["per_token"]))
    if focus is not None:
        c = result["concept"]
        print(f"concept {c['name']!r} (id {c['id']}): contribution to the next token {c['contribution']:+.3f}; σ per token")
        print("  " + " ".join(f"{q['token']!r}:{q['probability']:.2f}" for q in c["probability_per_token"]))
        print("  integrated gradients to it: "
              + " ".join(f"{a['token']!r}:{a['attribution']:+.3f}" for a in c["integrated_gradients"]["per_token"]))
    print(f"heatmap: {heat}")
    return 0


def _steer(args) -> int:
    import torch

    from penrose.errors import PenroseError
    from penrose_zoo.steerling.attribution import forward_ids
    from penrose_zoo.steerling.steer import Intervention, concept_top_tokens, intervention_kwargs

    if args.inject or args.unlearn:
        if args.concept is not None or args.scale is not None or args.value is not None:
            raise PenroseError("--inject / --unlearn name their concepts themselves; --concept, --scale and --value "
                               "are the other kind of steering (a concept's weight)")
        return _steer_recipe(args)
    if args.concept is None:
        raise PenroseError("give --concept NAME|ID with --scale S or --value V, or --inject / --unlearn CONCEPT=STRENGTH")
    if (args.scale is None) == (args.value is None):
        raise PenroseError("give exactly one of --scale S or --value V")
    model, tok, names = _open(args)
    model.eval()
    _steering(args, model, names)  # refuses injection options without --inject / --unlearn
    cid, cname = _concept_arg(args, names)
    spec = (Intervention(known_scale={cid: args.scale}) if args.scale is not None
            else Intervention(known_set={cid: args.value}))
    banned = torch.tensor([tok.pad_id, tok.bos_id, tok.mask_id])
    top = concept_top_tokens(model, cid, 10)

    def run(steered: bool):
        ids = _prompt_ids(tok, args.prompt, model)
        mass = []
        with torch.no_grad():
            for _ in range(args.max_new_tokens):
                if ids.shape[1] + 1 > model.model_config["block_size"]:
                    break
                x = torch.cat([ids, torch.tensor([[tok.mask_id]])], 1) if model.variant == "block_causal" else ids
                kw = {}
                if steered:
                    kw = intervention_kwargs(spec, tuple(x.shape), forward_ids(model, x) if spec.needs_current_weights else None)
                logits = forward_ids(model, x, **kw).logits[0, -1].clone()
                mass.append(float(torch.softmax(logits, -1)[top].sum()))
                logits[banned] = -float("inf")
                nxt = int(logits.argmax())
                ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
                if nxt in (tok.eoc_id, tok.eos_id):
                    break
        n0 = len(tok.prompt_ids(args.prompt))
        return tok.decode(ids[0, n0:].tolist(), skip_special_tokens=False), sum(mass) / max(len(mass), 1)

    base, m0 = run(False)
    steered, m1 = run(True)
    res = {"concept": cname, "id": cid, "scale": args.scale, "value": args.value,
           "top_tokens": [tok.decode([int(i)], skip_special_tokens=False) for i in top],
           "unsteered": base, "steered": steered,
           "top_token_mass_unsteered": m0, "top_token_mass_steered": m1}
    if args.json:
        print(json_text(res, indent=1))
    else:
        print(f"concept {cname!r} (id {cid}); its top tokens: {res['top_tokens']}")
        print(f"unsteered: {args.prompt}{base!s}")
        print(f"steered:   {args.prompt}{steered!s}")
        print(f"mass on the concept's top tokens (greedy path mean): {m0:.4f} -> {m1:.4f}")
    return 0


def _steer_recipe(args) -> int:
    """`steer --inject / --unlearn`: the release's sampler (generate_full) without and with the
    steering, the concepts' top tokens, and the concept attribution of the steered generation."""
    from penrose_zoo.steerling.attribution import attribute_generation
    from penrose_zoo.steerling.generate import GenerationConfig, generate_full
    from penrose_zoo.steerling.steer import concept_top_token_scores, prepare_steering

    model, tok, names = _open(args)
    model.eval()
    steering = _steering(args, model, names)
    blk = model.sizes["blk"]
    n_new = -(-max(args.max_new_tokens, 1) // blk) * blk
    prompt = tok.prompt_ids(args.prompt)
    cfg = GenerationConfig(max_new_tokens=n_new, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                           repetition_penalty=args.repetition_penalty, use_entropy_sampling=args.entropy_sampling)
    base = generate_full(model, prompt, cfg, tokenizer=tok)
    fa = attribute_generation(model, prompt, cfg, steering=steering, tokenizer=tok,
                              catalog=_catalog(args.catalog) if args.catalog else None)
    prep = prepare_steering(model, steering)
    concepts = list(dict.fromkeys([*steering.concept_ids, *(steering.relu_logit_mask or {})]))
    top = {c: concept_top_token_scores(model, c, 10) for c in concepts}
    top_ids = {i for pairs in top.values() for i, _ in pairs}

    def share(ids) -> float:
        return sum(i in top_ids for i in ids) / max(len(ids), 1)

    v = fa.attribution.verify()
    res = {
        "steering": steering.to_dict(), "base_alpha": prep.base_alpha, "inject_layer": prep.inject_layer,
        "concepts": [{"id": c, "name": names[c] if c < len(names) else str(c),
                      "top_tokens": [{"token": tok.decode([i], skip_special_tokens=False), "alignment": round(a, 5)}
                                     for i, a in top[c]]} for c in concepts],
        "max_new_tokens": n_new,
        "unsteered": tok.decode(base.generated, skip_special_tokens=True),
        "steered": tok.decode(fa.output.generated, skip_special_tokens=True),
        "top_token_share_unsteered": share(base.generated), "top_token_share_steered": share(fa.output.generated),
        "commit_order": fa.trace.commit_order,
        "attribution": {"verified": v.passed, "max_abs_error": v.max_abs_error, "coverage": fa.attribution.coverage,
                        "chunks": [{"concepts": [{k: e[k] for k in ("label", "type", "contribution")} for e in entries[:5]],
                                    "epsilon_percent": eps} for entries, eps in fa.chunks]},
    }
    if args.json:
        print(json_text(res, indent=1))
        return 0
    for c in res["concepts"]:
        print(f"concept {c['name']!r} (id {c['id']}); its top tokens: {[t['token'] for t in c['top_tokens']]}")
    print(f"steering: {steering.to_dict()} (alpha {prep.base_alpha:.4g}, layers >= {prep.inject_layer})")
    print(f"unsteered: {args.prompt}{res['unsteered']}")
    print(f"steered:   {args.prompt}{res['steered']}")
    print(f"share of the generated tokens among the concepts' top tokens: {res['top_token_share_unsteered']:.3f} -> "
          f"{res['top_token_share_steered']:.3f}")
    a = res["attribution"]
    print(f"concept attribution of the steered generation: verified {a['verified']} (max error {a['max_abs_error']:.1e}), "
          f"coverage {a['coverage']:.2f}")
    for i, ch in enumerate(a["chunks"]):
        print(f"  chunk {i}: " + ", ".join(f"{e['label']} {e['contribution']:+.3f}" for e in ch["concepts"])
              + f"; ε {ch['epsilon_percent']:.1f}%")
    return 0


def _scaling(args) -> int:
    from penrose_zoo.steerling.scaling import run_args

    return run_args(args)


def _planted(args) -> int:
    from penrose.errors import PenroseError
    from penrose_zoo.steerling.planted import PlantedConfig, generate_planted, write_planted

    try:
        cfg = PlantedConfig(n_concepts=args.concepts, words_per_concept=args.words, shared_words=args.shared_words,
                            pattern_concept=not args.no_pattern, withheld=args.withheld, rare=args.rare,
                            rare_weight=args.rare_weight, co_occur=args.co_occur, extra_concept=args.extra_concept,
                            n_chunks=args.chunks, seed=args.seed)
        corpus = generate_planted(cfg)
    except ValueError as e:
        if isinstance(e, PenroseError):  # (a field out of range: main prints it)
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = write_planted(corpus, args.out, replace=args.force)
    print(f"{printable(out)}: {len(corpus.chunks)} chunks; labelled concepts {', '.join(corpus.labelled_names)}"
          + (f"; withheld {', '.join(cfg.withheld_names)}" if cfg.withheld else "")
          + (f"; pattern (numbers) {cfg.pattern_name}" if cfg.pattern_name else ""))
    return 0


def _known_answer(args) -> int:
    import torch

    from penrose_zoo.steerling.known_answer import format_report, known_answer
    from penrose_zoo.steerling.nulls import BASELINES

    if args.threads:
        torch.set_num_threads(args.threads)
    r = known_answer(args.checkpoint, samples=args.samples, new_tokens=args.new_tokens, strength=args.strength,
                     max_batches=args.max_batches, seed=args.seed,
                     concepts=[c for c in args.steer.split(",") if c] if args.steer else None,
                     epsilon_off=args.epsilon_off, unlearn_strength=args.unlearn_strength, null=args.null,
                     baselines=_names_list(args.baselines, "--baselines", BASELINES), layer=args.layer,
                     suppression=not args.no_suppression)
    print(json_text(r, indent=1) if args.json else format_report(r))
    return 0


def _names_list(text: str | None, flag: str, choices) -> list[str]:
    """A comma-separated list of choices ('all': every one; 'none', None or '': none), or a PenroseError."""
    from penrose.errors import PenroseError

    if not text or text == "none":
        return []
    if text == "all":
        return list(choices)
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in choices]
    if bad:
        raise PenroseError(f"{flag}: {', '.join(map(repr, bad))} not among {', '.join(choices)}")
    return items


def _nulls(args) -> int:
    import torch

    from penrose_zoo.steerling import nulls as nl
    from penrose_zoo.steerling.known_answer import run_nulls

    if args.threads:
        torch.set_num_threads(args.threads)
    res = run_nulls(args.data, args.out, seeds=args.seeds, steps=args.steps, preset=args.preset, tokenizer=args.tokenizer,
                    bpe_vocab=args.bpe_vocab, teacher_forcing=not args.no_teacher_forcing, samples=args.samples,
                    new_tokens=args.new_tokens, strength=args.strength, max_batches=args.max_batches,
                    baselines=_names_list(args.baselines, "--baselines", nl.BASELINES), layer=args.layer,
                    nulls=_names_list(args.nulls, "--nulls", (*nl.TRAINED_NULLS, *nl.NULLS)),
                    log=lambda m: print(m, file=sys.stderr))
    print(json_text(res["table"], indent=1) if args.json else nl.format_nulls(res["table"]))
    return 0


def _nulls_table(args) -> int:
    from penrose_zoo.steerling import nulls as nl

    runs = [nl.load_run(r) for r in args.runs]
    c = nl.combine_runs(runs, [nl.load_run(r) for r in args.rerun], level=args.level)
    print(json_text(c, indent=1) if args.json else nl.format_combined(c, markdown=args.markdown))
    return 0


def _evaluate(args) -> int:
    from pathlib import Path

    from penrose.errors import PenroseError
    from penrose_zoo.steerling.train import evaluate_checkpoint, evaluate_pretrained

    own = (Path(args.checkpoint) / "train.json").is_file()
    if own and args.data is None:
        if args.catalog or args.concept_map:
            raise PenroseError("--catalog and --concept map a corpus (--data) to the model's concepts; a training "
                               "checkpoint is evaluated on its own corpus")
        r = evaluate_checkpoint(args.checkpoint, max_batches=args.max_batches)
    elif args.data is None:
        raise PenroseError(f"{args.checkpoint}: not a checkpoint written by `penrose steerling train` (no train.json), so "
                           "there is no training corpus to evaluate on: give --data DIR (category files) and name "
                           "their concepts (--catalog FILE or --concept CATEGORY=ID)")
    else:
        mapping = {}
        for item in args.concept_map or ():
            cat, eq, target = item.partition("=")
            if not eq or not cat.strip() or not target.strip():
                raise PenroseError(f"--concept takes CATEGORY=ID|NAME, got {item!r}")
            target = target.strip()
            mapping[cat.strip()] = int(target) if target.isascii() and target.isdigit() else target
        r = evaluate_pretrained(args.checkpoint, args.data, catalog=args.catalog, concepts=mapping, dtype=args.dtype,
                                seq_len=args.seq_len, max_chunks=args.max_chunks, max_batches=args.max_batches)
    if args.json:
        print(json_text(r, indent=1))
        return 0
    for k, v in r.items():
        if k in ("concept_auc_per_concept", "steering", "val_parts", "concepts_scored"):
            continue
        print(f"{k:>22}: {v:.4f}" if isinstance(v, float) else f"{k:>22}: {v}")
    per = {k: v for k, v in r["concept_auc_per_concept"].items() if v is not None}
    print("  detection AUC per concept: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items())))
    print("  steering (suppress / boost vs null): " + ", ".join(
        f"{k} {v['suppress']:+.4f}/{v['boost']:+.4f}" for k, v in r["steering"].items()))
    return 0


def _concepts(args) -> int:
    """`concepts --catalog FILE [--search TEXT | --id NAME|ID | --group G]`: print the matches."""
    from dataclasses import asdict

    from penrose.errors import PenroseError

    if not args.catalog:
        raise PenroseError("give --catalog FILE (a CSV or parquet concept labels file) or set STEERLING_CONCEPTS_PATH")
    cat = _catalog(args.catalog)
    if args.id is not None:
        hits = [cat.lookup(args.id, head=args.head)]
    elif args.group is not None:
        hits = cat.group(args.group)
    elif args.search is not None:
        hits = cat.search(args.search, head=args.head, steerable_only=args.steerable)
    else:
        hits = list(cat)
    hits = [c for c in hits if (args.head is None or c.head == args.head) and (c.is_steerable or not args.steerable)]
    shown = hits[: args.limit] if args.limit > 0 else hits
    if args.json:
        print(json_text({"matches": len(hits), "concepts": [asdict(c) for c in shown]}, indent=1))
        return 0 if hits else 1
    if not hits:
        what = f" matches {args.search!r}" if args.search is not None else " is listed"
        print(f"no concept{what} in {args.catalog}", file=sys.stderr)
        return 1
    for c in shown:
        flags = [f[3:] for f in ("is_steerable", "is_tone", "is_alignment", "is_demographic") if getattr(c, f)]
        group = f", group {c.group_id} {c.group_name or ''}".rstrip() if c.group_id is not None else ""
        print(f"{c.concept_id:>7}  {c.name}  [{c.head}{group}{', ' + ', '.join(flags) if flags else ''}]"
              + (f"  {c.description}" if c.description else ""))
    if len(shown) < len(hits):
        print(f"... {len(hits) - len(shown)} more (--limit)", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
