"""Train a Steerling concept LM (the compiled diagrams) on a labelled corpus: the four losses of
the concept-module post, checkpoints that resume exactly, validation, and the metrics.

    penrose steerling train --preset tiny --data fortunes --steps 200 --out runs/tiny
    python -m penrose_zoo.steerling.train ...    (the same)

Index legend: b batch, t position, v vocabulary, e embedding, n known concept.

A checkpoint: the folder --out, rewritten every --save-every steps and at the end; its files and
their I/O are penrose_zoo.steerling.checkpoints (save_checkpoint, load_checkpoint, concept_id, ...
re-exported here).

One loop for one process and for many: `train` takes the communicator of
penrose_zoo.steerling.distributed.setup() (the null communicator `Local` outside torchrun), and
`batch_loss` / `validate` are the same code for both, the loss reduced from partial sums
(penrose_zoo.steerling.losses.reduced_loss).

Resume: when --out already holds train.json, training continues from its step. The training
configuration must be the same (else an error names the fields); --steps included, since the
learning-rate schedule depends on it. Every random draw is a function of (seed, step): the batch
order of epoch k is randperm(seed, k), the diffusion noise of step s uses a generator seeded
with (seed, s). So an interrupted run that resumes ends bit-identical to an uninterrupted one
(the test checks this with --stop-after).

Objective (penrose_zoo.steerling.losses.reduced_loss; steerling_loss in one process):
L_token + λ_concept L_concept + λ_indep L_indep + λ_rec L_rec; token loss next-token CE for the
causal variant, masked diffusion (mean over masked tokens, t ~ U(0,1) per diffusion block) for
the block-causal one. --epsilon keeps the
release's residual ε (the LM head reads h; the concept module is then a side branch); without
it the model is the pure bottleneck of the post (the head reads k̂ + û). Teacher forcing
(--teacher-forcing-steps N): the LM head reads α k̂_gt + (1 − α) k̂, α annealed 1 → 0 over N
steps; with ε on the LM head reads h whatever k̂ is, so there it acts through the h̄ loss
(--lambda-bottleneck), whose h̄ = α k̂_gt + (1 − α) k̂ + û: K_c learns what chunks labelled c make
likely (its own words), not only what follows wherever the presence loss fires c.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

from penrose.errors import PenroseError
from penrose_zoo.steerling.checkpoints import (FORMAT, check_steps, concept_id, config_differences, load_checkpoint,
                                               read_train_state, save_checkpoint)
from penrose_zoo.steerling.train_config import PRESETS, TrainConfig

__all__ = ["FORMAT", "PRESETS", "TrainConfig", "TrainForward", "batch_loss", "batch_of", "concept_id",
           "config_differences", "evaluate_checkpoint", "evaluate_model", "load_checkpoint", "load_corpus", "lr_at",
           "make_model", "make_tokenizer", "packed", "read_train_state", "save_checkpoint", "train", "train_rows",
           "validate"]

def data_dir(data: str) -> str:
    from penrose_zoo.data import FORTUNES_DIR

    return FORTUNES_DIR if data == "fortunes" else data


# ---------------------------------------------------------------------------------------------
# Data, tokenizer, model
# ---------------------------------------------------------------------------------------------


def load_corpus(cfg: TrainConfig):
    """The labelled corpus (penrose_zoo.steerling.lm_data), with max_chunks applied to the train side
    (a fixed sample by seed) and to the validation side (a quarter as many)."""
    from penrose_zoo.data import DataError
    from penrose_zoo.steerling.lm_data import ConceptCorpus, load_concept_corpus

    path = data_dir(cfg.data)
    if not Path(path).is_dir():
        raise DataError(f"--data: no directory {path!r} (give 'fortunes' or a directory of category files)", path)
    corpus = load_concept_corpus(path, cfg.categories)
    if cfg.max_chunks:
        rng = random.Random(cfg.seed)
        tr = rng.sample(list(corpus.train), min(cfg.max_chunks, len(corpus.train)))
        va = rng.sample(list(corpus.val), min(max(cfg.max_chunks // 4, 1), len(corpus.val)))
        corpus = ConceptCorpus(tuple(tr), tuple(va), corpus.concept_names, corpus.directory, corpus.n_unlabelled)
    return corpus


def make_tokenizer(cfg: TrainConfig, corpus):
    from penrose_zoo.steerling.tokenizer import BPETokenizer, ByteTokenizer

    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    return BPETokenizer.train((c.text for c in corpus.train), vocab_size=cfg.bpe_vocab)


def make_model(cfg: TrainConfig, n_concepts: int, vocab_size: int, mask_id: int):
    from penrose_zoo.steerling.model import Steerling

    p = PRESETS[cfg.preset]
    m = dict(p["model"], **(cfg.model_overrides or {}))
    m["block_size"] = max(m["block_size"], cfg.seq_len)
    c = dict(p["concepts"], **(cfg.concept_overrides or {}), n_concepts=n_concepts, concept_dim=m["n_embd"],
             use_epsilon_correction=cfg.epsilon)
    c["topk_known"] = c["topk_known_features"] = min(c["topk_known"], n_concepts)
    model = Steerling(m, c, vocab_size, causal=cfg.variant == "causal", seed=cfg.seed,
                      large_concept_threshold=n_concepts)  # known head dense, unknown head "large"
    model.mask_token_id = int(mask_id)
    return model


def packed(cfg: TrainConfig, corpus, tok):
    from penrose_zoo.steerling.lm_data import pack_chunks

    train = pack_chunks(corpus.train, tok, cfg.seq_len, n_concepts=corpus.n_concepts, shuffle_seed=cfg.seed)
    val = pack_chunks(corpus.val, tok, cfg.seq_len, n_concepts=corpus.n_concepts, shuffle_seed=0)
    return train, val


def batch_of(data, rows: torch.Tensor):
    """An LMBatch of the given rows of PackedData (chunk indices made local)."""
    from penrose_zoo.steerling.lm_data import PackedData, iterate_lm_batches

    sub = PackedData(data.input_ids[rows], data.chunk_index[rows], data.chunk_labels, pad_id=data.pad_id)
    batch = next(iterate_lm_batches(sub, len(rows)))
    return batch


def train_rows(n_rows: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The rows of training step `step`: epoch k = step // per_epoch is randperm(seed, k)."""
    per_epoch = max(n_rows // batch_size, 1)
    epoch, i = divmod(step, per_epoch)
    perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    return perm[i * batch_size:(i + 1) * batch_size]


def val_batches(val, cfg: TrainConfig, limit: int | None = None) -> list:
    from penrose_zoo.steerling.lm_data import iterate_lm_batches

    out = list(iterate_lm_batches(val, cfg.batch_size))
    return out if limit is None else out[:limit]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine to 10% of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    f = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(f, 1.0))))


def forward_unknown_attached(model, input_ids):
    """model.forward(input_ids) (no intervention, both heads dense) except that the unknown head
    reads h itself, not h.detach(): the same values, but L_rec, L_indep and (with ε off) the token
    loss then reach the backbone through û. The stages are the model's own compiled diagrams
    (entries hidden, the heads of steerling.pen, readout of one module), parameters shared."""
    args = model.concept_inputs(input_ids.shape, input_ids.device, None, None, None, True)
    net = model.net
    h = net.hidden(ids=input_ids)
    kl, kw, kf = net.known_head.known_head(h, args["pos"], args["ksel"], args["kval"])
    ul, uw, uf = net.unknown_head.unknown_head(h, args["pos"], args["usel"], args["uval"])  # h, not h.detach()
    logits, z, eps = net.readout(h=h, kf=kf, uf=uf, ksel=args["ksel"], use_eps=args["use_eps"])
    return model.output_record(logits, h, eps, z, False, False, known_logits=kl, known_weights=kw, known_features=kf,
                         unknown_logits=ul, unknown_weights=uw, unknown_features=uf)


def training_forward(model, input_ids, unknown_detach: bool = True, **kw):
    """The forward pass the losses read: forward_ids (the embeddings diagram; teacher forcing via
    kw), or with unknown_detach False (TrainConfig.unknown_detach) `forward_unknown_attached` (no
    teacher forcing)."""
    from penrose_zoo.steerling.attribution import forward_ids

    if unknown_detach:
        return forward_ids(model, input_ids, **kw)
    if kw:
        raise PenroseError("unknown_detach=False does not combine with teacher forcing")
    return forward_unknown_attached(model, input_ids)


class TrainForward(torch.nn.Module):
    """The training forward pass as one module call (DDP and FSDP hook module calls; the
    communicator's `wrap` wraps this): `training_forward` of some rows, returning the fields the
    losses read as a dict of tensors, and k̂_gt = labels · K (b, t, e) of the chunk labels (fed to
    the LM head under teacher forcing; the reconstruction target)."""

    def __init__(self, model, unknown_detach: bool = True, bottleneck: bool = False):
        super().__init__()
        self.model = model
        self.unknown_detach = unknown_detach
        self.bottleneck = bottleneck  # also return the logits of h̄ = k̂ + û (TrainConfig.lambda_bottleneck)

    def forward(self, input_ids, chunk_index, chunk_labels, teacher_forcing: float = 0.0) -> dict:
        from penrose_zoo.steerling.losses import known_gt_features

        kgt = known_gt_features(chunk_index, chunk_labels, self.model.concept_embeddings("known"))
        kw = dict(known_gt_features=kgt, teacher_forcing=teacher_forcing) if teacher_forcing > 0 else {}
        out = training_forward(self.model, input_ids, self.unknown_detach, **kw)
        res = {"logits": out.logits, "hidden": out.hidden, "known_logits": out.known_logits,
               "known_features": out.known_features, "unknown_features": out.unknown_features,
               "known_gt": kgt.detach()}
        if self.bottleneck:  # h̄ = k̂ + û, k̂ teacher forced as the LM head reads it with ε off
            from penrose_zoo.steerling.losses import teacher_forced_features

            k_read = teacher_forced_features(out.known_features, kgt, teacher_forcing) if teacher_forcing > 0 else out.known_features
            h_bar = k_read + out.unknown_features
            res["bottleneck_logits"] = h_bar @ self.model.lm_head_weight().t()
        return res


def _forward_module(fwd, cfg: TrainConfig, comm):
    """(the forward to call, the Steerling model) for a model, a TrainForward or a wrapped one."""
    inner = comm.unwrap(fwd)
    if isinstance(inner, TrainForward):
        return fwd, inner.model
    return TrainForward(fwd, cfg.unknown_detach, cfg.lambda_bottleneck > 0), fwd  # a bare model: one process


def batch_loss(fwd, batch, cfg: TrainConfig, *, step: int, noise_seed: int, tok=None, train: bool = True,
               device=None, comm=None):
    """(this process's loss, parts of the whole batch's loss) of one global LMBatch: the one loss
    path of training, one process or many. fwd: a Steerling model, or its TrainForward as the
    communicator wrapped it. comm (default: the null communicator, one process) shards the rows
    (`shard_sizes`, rank order) and reduces the partial sums of each term (losses.reduced_loss);
    the averaged gradient of the ranks' losses is the single-process gradient.

    The batch moves to `device` (default: the communicator's, else where the model is); the
    diffusion noise of the whole batch is drawn by a CPU generator whatever the device, then
    sliced, so the draws depend neither on the device nor on the number of ranks."""
    from penrose_zoo.steerling.distributed import Local, shard_sizes
    from penrose_zoo.steerling.losses import LossWeights, diffusion_noise, reduced_loss, teacher_forcing_alpha

    comm = comm or Local()
    fwd, model = _forward_module(fwd, cfg, comm)
    if comm.world > 1 and not cfg.unknown_detach:
        raise PenroseError("unknown_detach=False (the unknown head reading h) trains in one process only")
    sizes = shard_sizes(batch.input_ids.shape[0], comm.world)
    start = sum(sizes[:comm.rank])
    rows = slice(start, start + sizes[comm.rank])
    dev = device or comm.device or model.lm_head_weight().device
    ids, cidx, labels = (t.to(dev) for t in (batch.input_ids, batch.chunk_index, batch.chunk_labels))
    alpha = 0.0
    if train and cfg.teacher_forcing_steps > 0:
        alpha = teacher_forcing_alpha(step, cfg.teacher_forcing_steps)
    if cfg.variant == "causal":
        inp, masked = ids, None
    else:
        noise = diffusion_noise(batch.input_ids, mask_id=model.mask_token_id, block_size=model.sizes["blk"],
                                maskable=batch.valid, generator=torch.Generator().manual_seed(noise_seed))
        inp, masked = noise.noisy_ids.to(dev), noise.masked.to(dev)[rows]
    o = fwd(inp[rows], cidx[rows], labels, alpha)
    return reduced_loss(o, ids[rows], cidx[rows], labels, o["known_gt"],
                        weights=LossWeights(cfg.lambda_concept, cfg.lambda_indep, cfg.lambda_rec,
                                            cfg.lambda_bottleneck),
                        negative_weight=cfg.negative_weight, masked=masked, pad_id=batch.pad_id, comm=comm,
                        sizes=sizes, all_valid=cidx >= 0)


@torch.no_grad()
def validate(fwd, batches, cfg: TrainConfig, comm=None) -> dict[str, float]:
    """Mean loss parts over the validation batches (fixed diffusion noise per batch: seed
    10_000 + its index). Each process runs whole batches, dealt out round-robin over the ranks
    (a rank past the end repeats the last batch and discards it, so FSDP's collectives stay in
    step); the sums are all-reduced. fwd: as batch_loss's."""
    from penrose_zoo.steerling.distributed import Local

    comm = comm or Local()
    net = comm.unwrap(fwd)  # DDP: the inner module (no collectives needed)
    was = net.training
    net.eval()
    n = len(batches)
    keys: list[str] = []
    sums: torch.Tensor | None = None  # made at the first batch (its loss parts name the sums)
    for j in range(-(-n // comm.world)):
        i = j * comm.world + comm.rank
        k = min(i, n - 1)
        _, parts = batch_loss(net, batches[k], cfg, step=0, noise_seed=10_000 + k, train=False, device=comm.device)
        if sums is None:
            keys, sums = list(parts), torch.zeros(len(parts), dtype=torch.float64)
        if i < n:
            sums += torch.tensor([parts[key] for key in keys], dtype=torch.float64)
    net.train(was)
    comm.settle(net)
    if sums is None:
        return {}
    sums = comm.all_reduce(sums.to(comm.device or "cpu")).cpu()
    return {key: float(s) / n for key, s in zip(keys, sums.tolist())}


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def train(cfg: TrainConfig, out: str | os.PathLike, *, val_every: int = 50, save_every: int = 100,
          stop_after: int | None = None, progress: bool = True, log=None, fsdp: bool = False) -> dict:
    """Train (or resume) into the folder `out`; returns the train state (config, step, history).
    stop_after: stop (with a checkpoint) after this many steps of this call, as an interruption.

    Under torchrun (or in a process group the caller initialised) every process is one rank of a
    data-parallel run (penrose_zoo.steerling.distributed): DDP, or FSDP2 with fsdp=True; each global
    batch is split over the ranks, and the weights equal the single-process run's up to float32
    reduction order. Only rank 0 writes the checkpoint, the log and the progress bar. One process
    runs the same loop with the null communicator."""
    from penrose_zoo.steerling import distributed
    from penrose_zoo.validate import flag, whole

    val_every, save_every = whole(val_every, "val_every", low=1), whole(save_every, "save_every", low=1)
    if stop_after is not None:
        stop_after = whole(stop_after, "stop_after", low=1)
    progress = flag(progress, "progress")
    cfg.resolved()  # (its fields checked before a process group is set up)
    comm = distributed.setup(fsdp=fsdp)
    try:
        return _train(cfg, out, val_every=val_every, save_every=save_every, stop_after=stop_after,
                      progress=progress, log=log, comm=comm)
    finally:
        comm.close()


def _train(cfg: TrainConfig, out, *, val_every, save_every, stop_after, progress, log, comm) -> dict:
    from tqdm import tqdm

    from penrose_zoo.steerling.model import Steerling
    from penrose_zoo.steerling.tokenizer import load_tokenizer

    log = log or (lambda msg: print(msg, file=sys.stderr))
    if not comm.is_main:
        log, progress = (lambda msg: None), False
    cfg = cfg.resolved()
    out = Path(out)
    corpus = load_corpus(cfg)
    resume = (out / "train.json").is_file()
    if resume:
        state = read_train_state(out)
        diffs = config_differences(state["config"], cfg)
        if diffs:
            raise PenroseError(f"{out} holds a checkpoint from a different configuration ("
                               + "; ".join(diffs) + "); use another --out, or the same options to resume")
        step, history = int(state["step"]), state["history"]
        if step >= cfg.steps:
            log(f"{out}: already trained for {step} steps")
            return state
        model = Steerling.load(out)
        check_steps(out, state)  # the weights are the step it resumes from
        tok = load_tokenizer(out / "tokenizer.json")
    else:
        if out.exists() and not out.is_dir():
            raise PenroseError(f"--out {out} is a file, not a folder")
        if out.exists() and any(out.iterdir()):
            raise PenroseError(f"--out {out} exists and is not empty (and holds no training state to resume)")
        step, history = 0, {"train": [], "val": []}
        tok = comm.tokenizer(lambda: make_tokenizer(cfg, corpus))  # several ranks: rank 0's, broadcast
        model = make_model(cfg, corpus.n_concepts, tok.vocab_size, tok.mask_id)
    comm.barrier()  # every rank has read --out before rank 0 writes to it
    train_data, val_data = packed(cfg, corpus, tok)
    vb = val_batches(val_data, cfg, cfg.val_batches)
    n_params = model.num_parameters()
    fwd = comm.wrap(TrainForward(model, cfg.unknown_detach, cfg.lambda_bottleneck > 0))  # DDP / FSDP (or nothing) around the forward
    params = list(model.parameters())  # (after wrap: FSDP's sharded parameters)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    if resume:
        from penrose_zoo.steerling.checkpoints import read_optimizer

        comm.load_optimizer(opt, params, read_optimizer(out))  # every moment finite, named by parameter
        log(f"resuming {out} at step {step}/{cfg.steps}")
    else:
        log(f"training {n_params:,} parameters ({cfg.preset}, {cfg.variant}, "
            f"{'ε on' if cfg.epsilon else 'pure bottleneck'}); {corpus.n_concepts} concepts, "
            f"{len(corpus.train)} train / {len(corpus.val)} val chunks, {train_data.n_rows} rows of {cfg.seq_len}")
    if (banner := comm.describe(cfg.batch_size)) is not None:
        log(banner)
    model.train()
    end = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc="train", dynamic_ncols=True, file=sys.stderr)
    t0 = time.time()
    while step < end:
        batch = batch_of(train_data, train_rows(train_data.n_rows, cfg.batch_size, cfg.seed, step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        # this rank's rows of the global batch; parts are the global batch's
        loss, parts = batch_loss(fwd, batch, cfg, step=step, noise_seed=cfg.seed * 1_000_003 + step, comm=comm)
        if not math.isfinite(parts["total"]):
            raise PenroseError(f"step {step}: the loss is {parts['total']} ({parts}); lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        history["train"].append({"step": step, **{k: round(v, 6) for k, v in parts.items()}})
        post = {"loss": f"{parts['total']:.3f}", "tok": f"{parts['token']:.3f}"}
        if step % val_every == 0 or step == cfg.steps:
            v = validate(fwd, vb, cfg, comm)
            history["val"].append({"step": step, **{k: round(x, 6) for k, x in v.items()}})
            post["val"] = f"{v['token']:.3f}"
            if comm.is_main:
                bar.write(f"step {step}: train {parts['token']:.4f}  val token {v['token']:.4f}  "
                          + "  ".join(f"{k} {x:.4f}" for k, x in v.items() if k not in ("token", "total")),
                          file=sys.stderr)  # progress on stderr: stdout carries the command's result
        bar.set_postfix(post)
        bar.update(1)
        if step % save_every == 0 and step < end:
            comm.save_checkpoint(out, model, tok, corpus.concept_names, opt, cfg, step, history)
    bar.close()
    comm.save_checkpoint(out, model, tok, corpus.concept_names, opt, cfg, step, history)
    log(f"{'stopped' if step < cfg.steps else 'done'} at step {step}/{cfg.steps} in {time.time() - t0:.1f}s; checkpoint {out}")
    comm.barrier()  # rank 0 has written the checkpoint
    return read_train_state(out)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def evaluate_checkpoint(path: str | os.PathLike, *, max_batches: int = 16, steering_concepts: int = 5) -> dict:
    """Validation loss and the metrics of penrose_zoo.steerling.measure on a training checkpoint:
    detection AUC per concept and mean, token control, HSIC (linear, RBF), probing gap, logit
    share, and the steering effect (suppress / boost) of the most frequent concepts."""
    model, tok, names, state = load_checkpoint(path)
    cfg = TrainConfig(**state["config"]).resolved()
    corpus = load_corpus(cfg)
    if list(corpus.concept_names) != list(names):
        raise PenroseError(f"the corpus {cfg.data!r} now has other concepts than the checkpoint")
    train_data, val_data = packed(cfg, corpus, tok)
    return {"step": state["step"], **evaluate_model(model, cfg, train_data, val_data, names, max_batches=max_batches,
                                                    steering_concepts=steering_concepts)}


def evaluate_pretrained(path: str | os.PathLike, data: str, *, catalog: str | None = None, concepts: dict | None = None,
                        dtype=None, seq_len: int | None = None, batch_size: int | None = None, max_chunks: int = 0,
                        max_batches: int = 16, steering_concepts: int = 5) -> dict:
    """evaluate_checkpoint's numbers for any checkpoint folder (the published layout too) on a
    corpus of category files `data` ('fortunes' or a folder): each category is matched to one of
    the model's known concepts — `concepts` {category: concept id or catalog name}, else by its
    name in the labels file `catalog`, else a category named by a number is that id. The model's
    other known concepts count as not annotated for the validation's concept term; detection AUC,
    the probing gap and the steering effects are over the matched concepts only."""
    from penrose_zoo.steerling.lm_data import PackedData
    from penrose_zoo.steerling.model import Steerling
    from penrose_zoo.steerling.tokenizer import tokenizer_for

    model = Steerling.load(path, dtype=dtype)
    tok = tokenizer_for(path, vocab_size=model.vocab_size)
    cfg = TrainConfig(data=data, variant=model.variant, seq_len=seq_len, batch_size=batch_size,
                      max_chunks=max_chunks).resolved()
    corpus = load_corpus(cfg)
    own = Path(path) / "concepts.json"  # a training checkpoint names its known concepts
    known = json.loads(own.read_text())["known"] if own.is_file() else None
    ids = corpus_concept_ids(corpus.concept_names, model.sizes["c"], catalog=catalog, concepts=concepts, known=known)
    train_data, val_data = packed(cfg, corpus, tok)

    def widened(d):  # labels over the model's known concepts: a matched category's column is its concept's
        labels = d.chunk_labels.new_zeros(d.chunk_labels.shape[0], model.sizes["c"])
        labels[:, ids] = d.chunk_labels
        return PackedData(d.input_ids, d.chunk_index, labels, d.texts, d.pad_id)

    names = [str(i) for i in range(model.sizes["c"])]
    for name, i in zip(corpus.concept_names, ids):
        names[i] = name
    out = evaluate_model(model, cfg, widened(train_data), widened(val_data), names, max_batches=max_batches,
                         steering_concepts=steering_concepts, scored=ids)
    return {"checkpoint": str(path), "concepts_scored": dict(zip(corpus.concept_names, ids)), **out}


def corpus_concept_ids(categories, n_known: int, *, catalog: str | None = None, concepts: dict | None = None,
                       known: list | None = None) -> list[int]:
    """The known concept id of each corpus category (see evaluate_pretrained; `known`: the
    checkpoint's own concept names, matched first); a PenroseError names every category that
    matches none, and an id outside the model."""
    from penrose_zoo.steerling.catalog import CatalogError, ConceptCatalog

    cat = ConceptCatalog.load(catalog) if catalog else None
    concepts = dict(concepts or {})
    ids, missing = [], []
    for name in categories:
        want = concepts.get(name, name)
        if known is not None and want in known:
            cid = list(known).index(want)
        elif isinstance(want, int) and not isinstance(want, bool):
            cid = want
        elif str(want).strip().isascii() and str(want).strip().isdigit():  # (not "٣": int() reads it as 3)
            cid = int(want)
        elif cat is not None:
            try:
                cid = cat.lookup(want, head="known").concept_id
            except CatalogError as e:
                missing.append(f"{name!r} ({e.message})")
                continue
        else:
            missing.append(repr(name))
            continue
        if not 0 <= cid < n_known:
            raise PenroseError(f"category {name!r} is known concept {cid}, but the model has {n_known:,} known concepts")
        ids.append(cid)
    if missing:
        raise PenroseError(f"corpus categories without a known concept: {'; '.join(missing)}. Name them in a "
                           "labels file (--catalog FILE) or map them (--concept CATEGORY=ID|NAME)")
    if len(set(ids)) != len(ids):
        raise PenroseError("two corpus categories map to one known concept: " + ", ".join(
            f"{n}={i}" for n, i in zip(categories, ids) if ids.count(i) > 1))
    return ids


def evaluate_model(model, cfg: TrainConfig, train_data, val_data, names, *, max_batches: int = 16,
                   steering_concepts: int = 5, device=None, scored=None) -> dict:
    """evaluate_checkpoint's numbers for a model in memory (train_data, val_data: `packed`);
    steering_concepts=0 skips the steering effect. Batches move to `device` (default: the model's).
    `scored`: the concept ids the AUC, probing gap and steering are computed over (default all)."""
    import numpy as np

    from penrose_zoo.steerling import measure
    from penrose_zoo.steerling.attribution import forward_ids
    from penrose_zoo.steerling.steer import steering_effect
    from penrose_zoo.validate import whole

    max_batches = whole(max_batches, "max_batches", low=1)
    steering_concepts = whole(steering_concepts, "steering_concepts", low=0)
    cfg = cfg.resolved()
    device = device or model.lm_head_weight().device
    was = model.training
    model.eval()
    vb = [b.to(device) for b in val_batches(val_data, cfg, max_batches)]
    tb = [batch_of(train_data, torch.arange(i, min(i + cfg.batch_size, train_data.n_rows))).to(device)
          for i in range(0, min(train_data.n_rows, max_batches * cfg.batch_size), cfg.batch_size)]
    val = validate(model, vb, cfg)
    with torch.no_grad():
        tr = measure.collect_chunk_stats(model, tb)
        va = measure.collect_chunk_stats(model, vb)
        if scored is not None:  # only the concepts the corpus labels
            tr, va = (dataclasses.replace(x, presence=x.presence[:, scored], labels=x.labels[:, scored]) for x in (tr, va))
        scored = list(range(len(names))) if scored is None else list(scored)
        aucs, mean_auc = measure.concept_detection_auc(va.presence, va.labels)
        tc = measure.token_control(model)
        hs = measure.pathway_hsic(va.k_tokens, va.u_tokens)
        pg = measure.probing_gap(tr, va)
        shares, errors = [], []
        for b in vb:
            ls = measure.logit_share(model, forward_ids(model, b.input_ids), valid=b.valid)
            shares.append((ls["mean_share_concept"], ls["mean_share_known"]))
            errors.append(ls["error"])
        freq = va.labels.sum(0)
        top = [scored[int(i)] for i in freq.argsort(descending=True)[:steering_concepts] if freq[i] > 0]
        prompts = vb[0].input_ids[:4]
        effects = [steering_effect(model, prompts, c, positions=vb[0].valid[:4]) for c in top]
    model.train(was)

    def fin(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x

    return {
        "val_loss": val["token"], "val_parts": val,
        "concept_auc": fin(mean_auc),
        "concept_auc_per_concept": {names[i]: fin(float(a)) for i, a in zip(scored, np.asarray(aucs))},
        "token_control": float(tc.mean()),
        **hs,
        "probe_auc_concept": fin(pg["probe_auc_concept"]), "probe_auc_residual": fin(pg["probe_auc_residual"]),
        "probing_gap": fin(pg["probing_gap"]),
        "logit_share_concept": float(np.mean([s[0] for s in shares])),
        "logit_share_known": float(np.mean([s[1] for s in shares])),
        "attribution_error": float(max(errors)),
        "steering": {names[e.concept]: {"suppress": e.suppress_effect, "boost": e.boost_effect,
                                        "null_mass": e.mass_null} for e in effects},
        "steer_suppress_mean": float(np.mean([e.suppress_effect for e in effects])) if effects else None,
        "steer_boost_mean": float(np.mean([e.boost_effect for e in effects])) if effects else None,
    }


if __name__ == "__main__":  # pragma: no cover
    from penrose_zoo.steerling.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
