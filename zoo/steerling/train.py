"""Train a Steerling concept LM (the compiled diagrams) on a labelled corpus: the four losses of
the concept-module post, checkpoints that resume exactly, validation, and the metrics.

    penrose steerling train --preset tiny --data fortunes --steps 200 --out runs/tiny
    python -m penrose_zoo.steerling.train ...    (the same)

Index legend: b batch, t position, v vocabulary, e embedding, n known concept.

A checkpoint (the folder --out, rewritten every --save-every steps and at the end):
  model.safetensors, config.json   Steerling.save (release keys; configs, variant, mask id)
  tokenizer.json                   penrose_zoo.steerling.tokenizer (byte-level or corpus BPE)
  concepts.json                    the known concept names, id order
  optimizer.safetensors            AdamW moments and step counts, one entry per parameter
  train.json                       the training configuration, the step reached, the history
                                   (train losses, validation losses); written last

Resume: when --out already holds train.json, training continues from its step. The training
configuration must be the same (else an error names the fields); --steps included, since the
learning-rate schedule depends on it. Every random draw is a function of (seed, step): the batch
order of epoch k is randperm(seed, k), the diffusion noise of step s uses a generator seeded
with (seed, s). So an interrupted run that resumes ends bit-identical to an uninterrupted one
(the test checks this with --stop-after).

Objective (penrose_zoo.steerling.losses.steerling_loss): L_token + λ_concept L_concept + λ_indep L_indep
+ λ_rec L_rec; token loss next-token CE for the causal variant, masked diffusion (mean over
masked tokens, t ~ U(0,1) per diffusion block) for the block-causal one. --epsilon keeps the
release's residual ε (the LM head reads h; the concept module is then a side branch); without
it the model is the pure bottleneck of the post (the head reads k̂ + û). Teacher forcing
(--teacher-forcing-steps N): the LM head reads α k̂_gt + (1 − α) k̂, α annealed 1 → 0 over N
steps (only has an effect with ε off).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from penrose.errors import PenroseError

FORMAT = "penrose-steerling-train"

# Model and concept-module sizes per preset; the known-concept count comes from the corpus.
PRESETS: dict[str, dict] = {
    "tiny": dict(
        model=dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=32, block_size=64, diff_block_size=8,
                   intermediate_size=64),
        concepts=dict(n_unknown_concepts=64, factorize_rank=8, topk_known=4, unknown_topk=4),
        seq_len=64, batch_size=8, lr=3e-3, warmup=10),
    "small": dict(
        model=dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=64, block_size=64, diff_block_size=16,
                   intermediate_size=192),
        concepts=dict(n_unknown_concepts=128, factorize_rank=16, topk_known=4, unknown_topk=8),
        seq_len=64, batch_size=16, lr=3e-3, warmup=50),
}


@dataclass
class TrainConfig:
    """What determines the trained weights (compared on resume)."""

    preset: str = "tiny"
    data: str = "fortunes"             # 'fortunes' or a directory of category files
    categories: list[str] | None = None  # category files to read (default: all)
    max_chunks: int = 0                # 0 = all; else a fixed random sample of training chunks
    variant: str = "causal"            # 'causal' (next-token) | 'block_causal' (masked diffusion)
    epsilon: bool = False              # keep ε (release form); False = pure bottleneck
    lambda_concept: float = 0.1
    lambda_indep: float = 1.0
    lambda_rec: float = 0.1
    negative_weight: float = 1.0
    teacher_forcing_steps: int = 0
    tokenizer: str = "byte"            # 'byte' | 'bpe'
    bpe_vocab: int = 1024
    steps: int = 100
    seed: int = 0
    seq_len: int | None = None         # default: the preset's
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    val_batches: int = 8               # validation batches used for the periodic validation loss
    unknown_detach: bool = True        # the release: the unknown head reads h.detach(); False = reads h
    model_overrides: dict | None = None    # model-config fields replacing the preset's (scaling sizes)
    concept_overrides: dict | None = None  # concept-config fields replacing the preset's

    def resolved(self) -> "TrainConfig":
        if self.preset not in PRESETS:
            raise PenroseError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        if self.variant not in ("causal", "block_causal"):
            raise PenroseError(f"variant must be 'causal' or 'block_causal', got {self.variant!r}")
        if self.tokenizer not in ("byte", "bpe"):
            raise PenroseError(f"tokenizer must be 'byte' or 'bpe', got {self.tokenizer!r}")
        if self.steps < 1:
            raise PenroseError(f"--steps must be at least 1, got {self.steps}")
        p = PRESETS[self.preset]
        return dataclasses.replace(self, **{k: p[k] for k in ("seq_len", "batch_size", "lr", "warmup")
                                           if getattr(self, k) is None})


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
    (hidden state, the heads of steerling[_causal].pen, readout), parameters shared."""
    args = model._concept_inputs(input_ids.shape, input_ids.device, None, None, None, True)
    h = model._stage("hidden")(ids=input_ids)
    net = model.intervention_net()
    kl, kw, kf = net.known_head(h, args["pos"], args["ksel"], args["kval"])
    ul, uw, uf = net.unknown_head(h, args["pos"], args["usel"], args["uval"])  # h, not h.detach()
    logits, z, eps = model._stage("readout")(h=h, kf=kf, uf=uf, ksel=args["ksel"], use_eps=args["use_eps"])
    return model._output(logits, h, eps, z, False, False, known_logits=kl, known_weights=kw, known_features=kf,
                         unknown_logits=ul, unknown_weights=uw, unknown_features=uf)


def training_forward(model, input_ids, cfg: TrainConfig, **kw):
    """The forward pass the losses read: forward_ids (the embeddings diagram; teacher forcing via
    kw), or with cfg.unknown_detach False `forward_unknown_attached` (no teacher forcing)."""
    from penrose_zoo.steerling.attribution import forward_ids

    if cfg.unknown_detach:
        return forward_ids(model, input_ids, **kw)
    if kw:
        raise PenroseError("unknown_detach=False does not combine with teacher forcing")
    return forward_unknown_attached(model, input_ids)


def batch_loss(model, batch, cfg: TrainConfig, *, step: int, noise_seed: int, tok=None, train: bool = True,
               device=None):
    """(loss, parts) of one batch; the token loss by the variant's objective. The batch moves to
    `device` (default: where the model is); the diffusion noise is drawn by a CPU generator
    whatever the device, so the draws do not depend on it."""
    from penrose_zoo.steerling.losses import (LossWeights, diffusion_noise, known_gt_features, steerling_loss,
                                              teacher_forcing_alpha)

    device = device or model.lm_head_weight().device
    if batch.input_ids.device != torch.device(device):
        batch = batch.to(device)

    weights = LossWeights(cfg.lambda_concept, cfg.lambda_indep, cfg.lambda_rec)
    K = model.concept_embeddings("known")
    kw = {}
    if train and cfg.teacher_forcing_steps > 0:
        alpha = teacher_forcing_alpha(step, cfg.teacher_forcing_steps)
        if alpha > 0:
            kw = dict(known_gt_features=known_gt_features(batch.chunk_index, batch.chunk_labels, K),
                      teacher_forcing=alpha)
    if cfg.variant == "causal":
        out = training_forward(model, batch.input_ids, cfg, **kw)
        return steerling_loss(out, batch, known_embeddings=K, weights=weights, objective="causal",
                              negative_weight=cfg.negative_weight)
    noise = diffusion_noise(batch.input_ids, mask_id=model.mask_token_id, block_size=model.sizes["blk"],
                            maskable=batch.valid, generator=torch.Generator().manual_seed(noise_seed))
    out = training_forward(model, noise.noisy_ids, cfg, **kw)
    return steerling_loss(out, batch, known_embeddings=K, weights=weights, objective="diffusion", noise=noise,
                          negative_weight=cfg.negative_weight)


@torch.no_grad()
def validate(model, batches, cfg: TrainConfig) -> dict[str, float]:
    """Mean loss parts over the validation batches (fixed diffusion noise per batch)."""
    was = model.training
    model.eval()
    sums: dict[str, float] = {}
    for i, b in enumerate(batches):
        _, parts = batch_loss(model, b, cfg, step=0, noise_seed=10_000 + i, train=False)
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + v
    model.train(was)
    return {k: v / max(len(batches), 1) for k, v in sums.items()}


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------

# Fields that do not change the trained weights (not compared on resume).
_FREE = ()


def _optimizer_tensors(opt, params) -> dict[str, torch.Tensor]:
    out = {}
    for i, p in enumerate(params):
        for k, v in opt.state.get(p, {}).items():
            out[f"{i}.{k}"] = (v if isinstance(v, torch.Tensor) else torch.tensor(v)).detach().contiguous().cpu()
    return out


def _load_optimizer(opt, params, tensors: dict[str, torch.Tensor]) -> None:
    for key, v in tensors.items():
        i, _, k = key.partition(".")
        opt.state[params[int(i)]][k] = v.clone()


def save_checkpoint(out: Path, model, tok, concept_names, opt, cfg: TrainConfig, step: int, history: dict, *,
                    optimizer_tensors: dict[str, torch.Tensor] | None = None) -> None:
    """optimizer_tensors: the entries of optimizer.safetensors when already gathered (FSDP);
    default: read from opt, indexed by model.parameters()."""
    from safetensors.torch import save_file

    from penrose.io import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    model.save(out)
    tok.save(out / "tokenizer.json")
    atomic_write_text(out / "concepts.json", json.dumps({"known": list(concept_names)}, indent=1) + "\n")
    tmp = out / "optimizer.safetensors.tmp"
    if optimizer_tensors is None:
        optimizer_tensors = _optimizer_tensors(opt, list(model.parameters()))
    save_file(optimizer_tensors, str(tmp))
    os.replace(tmp, out / "optimizer.safetensors")
    state = {"format": FORMAT, "version": 1, "config": dataclasses.asdict(cfg), "step": step, "history": history}
    atomic_write_text(out / "train.json", json.dumps(state, indent=1) + "\n")


def read_train_state(path: str | os.PathLike) -> dict:
    p = Path(path) / "train.json"
    if not p.is_file():
        raise PenroseError(f"{path}: no train.json; not a checkpoint written by `penrose steerling train`")
    state = json.loads(p.read_text())
    if state.get("format") != FORMAT:
        raise PenroseError(f"{p}: not a penrose steerling training state")
    return state


def config_differences(saved: dict, cfg: TrainConfig) -> list[str]:
    now = dataclasses.asdict(cfg)
    default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # fields newer than the checkpoint
    return [f"{k}: checkpoint {saved.get(k, default[k])!r}, now {now[k]!r}" for k in now
            if k not in _FREE and saved.get(k, default[k]) != now[k]]


def load_checkpoint(path: str | os.PathLike):
    """(model, tokenizer, concept names, train state) of a training checkpoint folder."""
    from penrose_zoo.steerling.model import Steerling
    from penrose_zoo.steerling.tokenizer import tokenizer_for

    path = Path(path)
    if not path.is_dir():
        raise PenroseError(f"--checkpoint: no folder {str(path)!r}")
    state = read_train_state(path)
    model = Steerling.load(path)
    tok = tokenizer_for(path, vocab_size=model.vocab_size)  # its tokenizer.json, vocabulary checked
    names = json.loads((path / "concepts.json").read_text())["known"]
    return model, tok, names, state


def concept_id(names, name: str) -> int:
    """The id of a known concept by name (or a number); a clear error for an unknown one."""
    if name in names:
        return list(names).index(name)
    if name.isdigit() and int(name) < len(names):
        return int(name)
    import difflib

    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise PenroseError(f"unknown concept {name!r}{hint} (this checkpoint has {len(names)} known concepts: "
                       f"{', '.join(names[:12])}{' ...' if len(names) > 12 else ''})")


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
    reduction order. Only rank 0 writes the checkpoint, the log and the progress bar."""
    from penrose_zoo.steerling import distributed

    ddp = distributed.setup(fsdp=fsdp)  # None: one process (the loop below, unchanged)
    try:
        return _train(cfg, out, val_every=val_every, save_every=save_every, stop_after=stop_after,
                      progress=progress, log=log, ddp=ddp)
    finally:
        if ddp is not None:
            ddp.close()


def _train(cfg: TrainConfig, out, *, val_every, save_every, stop_after, progress, log, ddp) -> dict:
    from tqdm import tqdm

    from penrose_zoo.steerling.model import Steerling
    from penrose_zoo.steerling.tokenizer import load_tokenizer

    log = log or (lambda msg: print(msg, file=sys.stderr))
    main = ddp is None or ddp.is_main
    if not main:
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
        tok = load_tokenizer(out / "tokenizer.json")
    else:
        if out.exists() and any(out.iterdir()):
            raise PenroseError(f"--out {out} exists and is not empty (and holds no training state to resume)")
        step, history = 0, {"train": [], "val": []}
        tok = make_tokenizer(cfg, corpus) if ddp is None else ddp.tokenizer(lambda: make_tokenizer(cfg, corpus))
        model = make_model(cfg, corpus.n_concepts, tok.vocab_size, tok.mask_id)
    if ddp is not None:
        ddp.barrier()  # every rank has read --out before rank 0 writes to it
    train_data, val_data = packed(cfg, corpus, tok)
    vb = val_batches(val_data, cfg, cfg.val_batches)
    n_params = model.num_parameters()
    fwd = None if ddp is None else ddp.wrap(model)  # DDP / FSDP around the training forward pass
    params = list(model.parameters())  # (after wrap: FSDP's sharded parameters)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    if resume:
        from safetensors.torch import load_file

        load = _load_optimizer if ddp is None else ddp.load_optimizer
        load(opt, params, load_file(str(out / "optimizer.safetensors")))
        log(f"resuming {out} at step {step}/{cfg.steps}")
    else:
        log(f"training {n_params:,} parameters ({cfg.preset}, {cfg.variant}, "
            f"{'ε on' if cfg.epsilon else 'pure bottleneck'}); {corpus.n_concepts} concepts, "
            f"{len(corpus.train)} train / {len(corpus.val)} val chunks, {train_data.n_rows} rows of {cfg.seq_len}")
    if ddp is not None:
        log(f"{'FSDP2' if ddp.fsdp else 'DDP'}: {ddp.world} processes ({ddp.device.type}), "
            f"{cfg.batch_size} rows per step split over them")
    # under DDP/FSDP the ranks gather the weights and rank 0 writes them with save_checkpoint
    save = save_checkpoint if ddp is None else functools.partial(ddp.save_checkpoint, save_checkpoint)
    model.train()
    end = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc="train", dynamic_ncols=True, file=sys.stderr)
    t0 = time.time()
    while step < end:
        batch = batch_of(train_data, train_rows(train_data.n_rows, cfg.batch_size, cfg.seed, step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        if ddp is None:
            loss, parts = batch_loss(model, batch, cfg, step=step, noise_seed=cfg.seed * 1_000_003 + step)
        else:  # this rank's rows of the global batch; parts are the global batch's
            loss, parts = ddp.batch_loss(fwd, model, batch, cfg, step=step, noise_seed=cfg.seed * 1_000_003 + step)
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
            v = validate(model, vb, cfg) if ddp is None else ddp.validate(fwd, model, vb, cfg)
            history["val"].append({"step": step, **{k: round(x, 6) for k, x in v.items()}})
            post["val"] = f"{v['token']:.3f}"
            if main:
                bar.write(f"step {step}: train {parts['token']:.4f}  val token {v['token']:.4f}  "
                      + "  ".join(f"{k} {x:.4f}" for k, x in v.items() if k not in ("token", "total")))
        bar.set_postfix(post)
        bar.update(1)
        if step % save_every == 0 and step < end:
            save(out, model, tok, corpus.concept_names, opt, cfg, step, history)
    bar.close()
    save(out, model, tok, corpus.concept_names, opt, cfg, step, history)
    log(f"{'stopped' if step < cfg.steps else 'done'} at step {step}/{cfg.steps} in {time.time() - t0:.1f}s; checkpoint {out}")
    if ddp is not None:
        ddp.barrier()  # rank 0 has written the checkpoint
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


def evaluate_model(model, cfg: TrainConfig, train_data, val_data, names, *, max_batches: int = 16,
                   steering_concepts: int = 5, device=None) -> dict:
    """evaluate_checkpoint's numbers for a model in memory (train_data, val_data: `packed`);
    steering_concepts=0 skips the steering effect. Batches move to `device` (default: the model's)."""
    import numpy as np

    from penrose_zoo.steerling import measure
    from penrose_zoo.steerling.attribution import forward_ids
    from penrose_zoo.steerling.steer import steering_effect

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
        top = [int(i) for i in freq.argsort(descending=True)[:steering_concepts] if freq[i] > 0]
        prompts = vb[0].input_ids[:4]
        effects = [steering_effect(model, prompts, c, positions=vb[0].valid[:4]) for c in top]
    model.train(was)

    def fin(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x

    return {
        "val_loss": val["token"], "val_parts": val,
        "concept_auc": fin(mean_auc),
        "concept_auc_per_concept": {n: fin(float(a)) for n, a in zip(names, np.asarray(aucs))},
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
