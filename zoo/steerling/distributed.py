"""Steerling training under PyTorch's distributed engine: DDP, or FSDP2 (`fully_shard`), one
process per device, started by torchrun. penrose_zoo.steerling.train calls `setup()`; outside torchrun it
returns None and training is the single-process loop, untouched.

    torchrun --nproc_per_node 2 -m penrose.cli steerling train --preset tiny --data fortunes --steps 200 --out run
    torchrun --nproc_per_node 2 -m penrose.cli steerling train ... --fsdp      (parameters, gradients
                                                                               and AdamW moments sharded)

Backend: nccl with one CUDA device per process (LOCAL_RANK) when CUDA is available, else gloo on
the CPU; PENROSE_DIST_DEVICE=cpu forces the CPU (gloo).

Index legend: b batch, t position, v vocabulary, e embedding, n known concept, c chunk.

Equal to the single-process run. Every rank draws the same global batch of step s (the rows of
`train_rows(seed, s)`, the diffusion noise of (seed, s)) and takes a contiguous block of its rows
(`shard_sizes`: sizes differ by at most one, rank order = row order). DDP and FSDP average the
parameter gradients over ranks, so each rank's loss L_r is built such that mean_r ∇L_r = ∇L, L the
single-process loss of the global batch:

  token, rec   means over tokens: L_r = W · (sum over the rank's tokens) / (token count of the
               global batch); the count is all-reduced (no gradient), so unequal shards and
               unequal numbers of masked / non-pad tokens per shard are exact.
  concept      per chunk, log(1 − P) = Σ_t logσ(−z_t) over the chunk's tokens, which may lie on
               several ranks: the per-rank partial sums (c, n) are all-reduced, and every rank
               computes the same BCE from the global (c, n).
  indep        the cross-covariance of the batch's tokens: k̂ and û (b, t, e) are all-gathered
               (rank order = row order) and every rank computes the single-process formula.

For the all-reduced / all-gathered terms every rank computes the same value L from the same global
tensor X, so ∂L/∂X is the same on every rank; `_Replicated*`'s backward hands the rank its own
slice of it times W (what `torch.distributed.nn`'s all_gather backward would sum over the W
ranks, without the communication), and the averaging turns W · ∂L/∂X_r back into ∂L/∂X_r.
What remains are float32 reduction-order differences (sums per shard, DDP's bucketed
all-reduce): the test finds the weights of a 2-rank run within ~1e-6 of the single-process run.

The forward pass goes through one module call (`TrainForward`), since DDP and FSDP hook module
calls; Steerling's training forward (`forward_ids`) calls embed and forward_from_embeddings.

FSDP2: the whole model is one `fully_shard` unit. Parameters, gradients and AdamW moments are
sharded 1/W at rest; the forward / backward all-gather the full parameters (the embeddings diagram
behind forward_from_embeddings re-ties the parameters of `model.net` on each call, so per-layer
units of `model.net` would never see their hooks fire). Checkpoints gather each tensor to the CPU
and rank 0 writes the usual single-file checkpoint; resume scatters it again. So a checkpoint
written by a DDP, FSDP or single-process run resumes under any of the three.

Only rank 0 writes checkpoints, logs and the progress bar. Validation batches are dealt out to
the ranks round-robin (a rank without a batch left repeats one and discards it, so FSDP's
collectives stay in step) and the sums all-reduced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from penrose.errors import PenroseError

__all__ = ["Distributed", "TrainForward", "launched", "setup", "shard_sizes"]


def launched() -> bool:
    """Whether this process is one rank of a distributed run (torchrun's environment, or a process
    group already initialised by the caller)."""
    return dist.is_available() and (dist.is_initialized() or ("WORLD_SIZE" in os.environ and "RANK" in os.environ))


def shard_sizes(n: int, world: int) -> list[int]:
    """Rows per rank of an n-row batch: contiguous blocks in rank order, sizes differing by ≤ 1."""
    if n < world:
        raise PenroseError(f"a batch of {n} rows cannot be split over {world} processes; "
                           f"use --batch-size ≥ {world} (and a corpus with at least that many rows)")
    base, extra = divmod(n, world)
    return [base + 1 if r < extra else base for r in range(world)]


# ---------------------------------------------------------------------------------------------
# Collectives whose result every rank uses in the same way
# ---------------------------------------------------------------------------------------------


class _ReplicatedGather(torch.autograd.Function):
    """Concatenate every rank's rows (dim 0, sizes `sizes`) on every rank. Backward: the rank's
    own rows of the gradient, times W (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, sizes, rank, group):
        ctx.sizes, ctx.rank = sizes, rank
        m = max(sizes)
        buf = x.contiguous()
        if buf.shape[0] < m:
            buf = torch.cat([buf, buf.new_zeros((m - buf.shape[0], *buf.shape[1:]))])
        parts = [torch.empty_like(buf) for _ in sizes]
        dist.all_gather(parts, buf, group=group)
        return torch.cat([p[:s] for p, s in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad):
        start = sum(ctx.sizes[:ctx.rank])
        return grad[start:start + ctx.sizes[ctx.rank]] * len(ctx.sizes), None, None, None


class _ReplicatedSum(torch.autograd.Function):
    """All-reduce (sum) on every rank. Backward: the gradient times W (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, world, group):
        ctx.world = world
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.world, None, None


class _Local:
    """The same interface for one process holding the whole batch (validation)."""

    world = 1

    @staticmethod
    def sum(x):
        return x

    @staticmethod
    def gather(x, sizes):
        return x

    @staticmethod
    def reduce(x):
        return x


# ---------------------------------------------------------------------------------------------
# The forward pass as one module call
# ---------------------------------------------------------------------------------------------


class TrainForward(torch.nn.Module):
    """Steerling's training forward pass (penrose_zoo.steerling.attribution.forward_ids) as one module call,
    returning the fields the losses read as a dict of tensors, and k̂_gt = labels · K (b, t, e) of
    the chunk labels (fed to the LM head under teacher forcing; the reconstruction target)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, chunk_index, chunk_labels, teacher_forcing: float = 0.0) -> dict:
        from penrose_zoo.steerling.attribution import forward_ids
        from penrose_zoo.steerling.losses import known_gt_features

        kgt = known_gt_features(chunk_index, chunk_labels, self.model.concept_embeddings("known"))
        kw = dict(known_gt_features=kgt, teacher_forcing=teacher_forcing) if teacher_forcing > 0 else {}
        out = forward_ids(self.model, input_ids, **kw)
        return {"logits": out.logits, "hidden": out.hidden, "known_logits": out.known_logits,
                "known_features": out.known_features, "unknown_features": out.unknown_features,
                "known_gt": kgt.detach()}


# ---------------------------------------------------------------------------------------------
# The distributed context
# ---------------------------------------------------------------------------------------------


@dataclass
class Distributed:
    """This process's place in the run, and the distributed halves of the training steps."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    fsdp: bool
    owns_group: bool  # init_process_group was called here (so destroy it in close)
    _host = None  # FSDP: rank 0's unsharded copy of the model for writing checkpoints

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- collectives ---------------------------------------------------------------------------
    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """All-reduced sum, no gradient."""
        out = x.detach().clone()
        dist.all_reduce(out)
        return out

    def gather(self, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        return _ReplicatedGather.apply(x, sizes, self.rank, None)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return _ReplicatedSum.apply(x, self.world, None)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # -- set-up --------------------------------------------------------------------------------
    def tokenizer(self, make):
        """make() on rank 0, broadcast (a BPE trained on the corpus is then the same everywhere)."""
        from penrose_zoo.steerling.tokenizer import BPETokenizer, ByteTokenizer

        box = [None]
        if self.is_main:
            tok = make()
            box = [tok._tok.to_str() if isinstance(tok, BPETokenizer) else None]
        dist.broadcast_object_list(box, src=0)
        if self.is_main:
            return tok
        if box[0] is None:
            return ByteTokenizer()
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_str(box[0]))

    def wrap(self, model) -> torch.nn.Module:
        """Move the model to this rank's device and wrap TrainForward(model): DDP, or fully_shard
        (the model's parameters become sharded DTensors: read model.parameters() after this)."""
        model.to(self.device)
        fwd = TrainForward(model)
        if self.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            fully_shard(fwd, mesh=init_device_mesh(self.device.type, (self.world,)))
            return fwd
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(fwd, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # -- optimizer state -----------------------------------------------------------------------
    def load_optimizer(self, opt, params, tensors: dict[str, torch.Tensor]) -> None:
        """As train._load_optimizer, onto this rank's device; sharded like the parameter (FSDP)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        for key, v in tensors.items():
            i, _, k = key.partition(".")
            p = params[int(i)]
            if k == "step":  # AdamW keeps its step count on the CPU
                opt.state[p][k] = v.clone()
            elif isinstance(p, DTensor):
                opt.state[p][k] = distribute_tensor(v.to(self.device), p.device_mesh, p.placements, src_data_rank=None)
            else:
                opt.state[p][k] = v.to(self.device).clone()

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, write, out: Path, model, tok, concept_names, opt, cfg, step: int, history: dict) -> None:
        """`write` (train.save_checkpoint, which calls this) from rank 0. FSDP: every rank takes part
        in gathering each parameter and optimizer tensor to the CPU; rank 0 writes them through an
        unsharded copy."""
        if not self.fsdp:
            if self.is_main:
                write(out, model, tok, concept_names, opt, cfg, step, history)
            return
        from torch.distributed.tensor import DTensor

        def full(v):
            v = v.full_tensor() if isinstance(v, DTensor) else v
            return v.detach().contiguous().cpu()

        weights = {name: full(p) for name, p in model.net.named_parameters()}
        params = [p for g in opt.param_groups for p in g["params"]]  # the order of train's `params`
        opt_tensors = {}
        for i, p in enumerate(params):
            for k, v in opt.state.get(p, {}).items():
                opt_tensors[f"{i}.{k}"] = full(v if isinstance(v, torch.Tensor) else torch.tensor(v))
        if not self.is_main:
            return
        host = self._unsharded_copy(model)
        for name, p in host.net.named_parameters():
            p.data.copy_(weights[name])
        write(out, host, tok, concept_names, opt, cfg, step, history, optimizer_tensors=opt_tensors)

    def _unsharded_copy(self, model):
        if self._host is None:
            from penrose_zoo.steerling.model import Steerling

            host = Steerling(model.model_config, model.concept_config, model.vocab_size,
                             causal=model.variant == "causal", large_concept_threshold=model.large_concept_threshold)
            host.mask_token_id = model.mask_token_id
            self._host = host
        return self._host

    # -- the loss ------------------------------------------------------------------------------
    def batch_loss(self, fwd, model, batch, cfg, *, step: int, noise_seed: int, train: bool = True,
                   local: bool = False):
        """(this rank's loss, parts of the global batch's loss) for a global LMBatch; the
        averaged gradient of the ranks' losses is the single-process gradient (module docstring).
        local=True: this process runs the whole batch alone (validation)."""
        from penrose_zoo.steerling.losses import (chunk_log_absence, diffusion_noise, independence_loss, presence_bce,
                                                  teacher_forcing_alpha)

        if not getattr(cfg, "unknown_detach", True):
            raise PenroseError("unknown_detach=False (the unknown head reading h) trains in one process only")
        comm = _Local if local else self
        W = comm.world
        n = batch.input_ids.shape[0]
        sizes = [n] if local else shard_sizes(n, W)
        start = 0 if local else sum(sizes[:self.rank])
        rows = slice(start, start + sizes[0 if local else self.rank])
        dev = self.device
        ids, cidx, labels = (t.to(dev) for t in (batch.input_ids, batch.chunk_index, batch.chunk_labels))
        alpha = 0.0
        if train and cfg.teacher_forcing_steps > 0:
            alpha = teacher_forcing_alpha(step, cfg.teacher_forcing_steps)
        if cfg.variant == "causal":
            inp, masked = ids, None
        else:  # the global batch's noise, drawn as in the single-process loop, then sliced
            noise = diffusion_noise(batch.input_ids, mask_id=model.mask_token_id, block_size=model.sizes["blk"],
                                    maskable=batch.valid, generator=torch.Generator().manual_seed(noise_seed))
            inp, masked = noise.noisy_ids.to(dev), noise.masked.to(dev)
        o = fwd(inp[rows], cidx[rows], labels, alpha)
        logits, mine, valid = o["logits"], ids[rows], cidx[rows] >= 0
        if masked is None:  # next-token CE, pad targets skipped
            target = mine[:, 1:]
            keep = target != batch.pad_id
            tok_sum = F.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="sum")
            tok_n = keep.sum()
        else:  # CE on the masked tokens
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), mine.reshape(-1),
                                 reduction="none").reshape(mine.shape)
            m = masked[rows].to(ce.dtype)
            tok_sum, tok_n = (ce * m).sum(), m.sum()
        n_tok, n_valid = comm.sum(torch.stack([tok_n.double(), valid.sum().double()])).clamp_min(1.0).unbind()
        total = tok_sum * (W / n_tok).to(tok_sum.dtype)
        report = [tok_sum.detach().double()]
        parts: dict[str, float] = {}
        if cfg.lambda_concept:
            c = labels.shape[0]
            if c:
                log_q = comm.reduce(chunk_log_absence(o["known_logits"], cidx[rows], c))
                lc = presence_bce(log_q, labels, negative_weight=cfg.negative_weight).sum(-1).mean()
            else:
                lc = o["known_logits"].sum() * 0.0
            total = total + cfg.lambda_concept * lc
            parts["concept"] = float(lc.detach())
        if cfg.lambda_indep:
            li = independence_loss(comm.gather(o["known_features"], sizes), comm.gather(o["unknown_features"], sizes),
                                   cidx >= 0)
            total = total + cfg.lambda_indep * li
            parts["indep"] = float(li.detach())
        if cfg.lambda_rec:
            target = (o["hidden"] - o["known_gt"]).detach()
            per = (o["unknown_features"] - target).pow(2).sum(-1)
            rec_sum = (per * valid.to(per.dtype)).sum()
            total = total + cfg.lambda_rec * rec_sum * (W / n_valid).to(rec_sum.dtype)
            report.append(rec_sum.detach().double())
        sums = comm.sum(torch.stack(report))
        out = {"token": float(sums[0] / n_tok)}
        for k in ("concept", "indep"):
            if k in parts:
                out[k] = parts[k]
        if cfg.lambda_rec:
            out["rec"] = float(sums[1] / n_valid)
        out["total"] = (out["token"] + cfg.lambda_concept * out.get("concept", 0.0)
                        + cfg.lambda_indep * out.get("indep", 0.0) + cfg.lambda_rec * out.get("rec", 0.0))
        return total, out

    @torch.no_grad()
    def validate(self, fwd, model, batches, cfg) -> dict[str, float]:
        """train.validate's mean loss parts, the batches dealt out round-robin to the ranks."""
        from torch.nn.parallel import DistributedDataParallel

        net = fwd.module if isinstance(fwd, DistributedDataParallel) else fwd  # DDP: no collectives needed
        was = net.training
        net.eval()
        n, keys, sums = len(batches), None, None
        for j in range(-(-n // self.world)):
            i = j * self.world + self.rank
            k = min(i, n - 1)  # past the end: repeat the last batch (FSDP's all-gathers stay in step)
            _, parts = self.batch_loss(net, model, batches[k], cfg, step=0, noise_seed=10_000 + k, train=False,
                                       local=True)
            if keys is None:
                keys, sums = list(parts), torch.zeros(len(parts), dtype=torch.float64, device=self.device)
            if i < n:
                sums += torch.tensor([parts[key] for key in keys], dtype=torch.float64, device=self.device)
        net.train(was)
        if self.fsdp:  # FSDP keeps the root's parameters gathered after a forward (awaiting a backward)
            net.reshard()
        if keys is None:
            return {}
        sums = self.sum(sums)
        return {key: float(s) / n for key, s in zip(keys, sums.tolist())}


def setup(*, fsdp: bool = False) -> Distributed | None:
    """The distributed context of this process, initialising the default process group from
    torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) unless the
    caller already did; None outside a distributed launch (single-process training)."""
    if not launched():
        if fsdp:
            raise PenroseError("--fsdp shards the model over several processes: start them with torchrun, e.g. "
                               "torchrun --nproc_per_node 2 -m penrose.cli steerling train ... --fsdp")
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    want = os.environ.get("PENROSE_DIST_DEVICE", "").strip().lower()
    if want not in ("", "cpu", "cuda"):
        raise PenroseError(f"PENROSE_DIST_DEVICE must be 'cpu' or 'cuda', got {want!r}")
    cuda = want == "cuda" or (want == "" and torch.cuda.is_available())
    if cuda:
        if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
            raise PenroseError(f"local rank {local_rank} has no CUDA device ({torch.cuda.device_count()} visible); "
                               "start at most one process per GPU, or set PENROSE_DIST_DEVICE=cpu (gloo)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return Distributed(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, device=device,
                       fsdp=fsdp, owns_group=owns)
