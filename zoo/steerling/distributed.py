"""Steerling training under PyTorch's distributed engine: DDP, or FSDP2 (`fully_shard`), one
process per device, started by torchrun. penrose_zoo.steerling.train calls `setup()` for its
communicator: `Distributed` under torchrun, else the null communicator `Local` (one process), with
the same interface (all_reduce of partial sums, reduce / gather carrying gradients, rank, world,
barrier, wrap, checkpoint writing); the training loop and the loss are the same code for both.

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
single-process loss of the global batch (penrose_zoo.steerling.losses.reduced_loss, from partial
sums this communicator reduces):

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

The forward pass goes through one module call (penrose_zoo.steerling.train.TrainForward, which
`wrap` wraps), since DDP and FSDP hook module calls; Steerling's training forward (`forward_ids`)
calls embed and forward_from_embeddings.

FSDP2: the whole model is one `fully_shard` unit. Parameters, gradients and AdamW moments are
sharded 1/W at rest; the forward / backward all-gather the full parameters (the embeddings diagram
behind forward_from_embeddings re-ties the parameters of `model.net` on each call, so per-layer
units of `model.net` would never see their hooks fire). Checkpoints gather each tensor to the CPU
and rank 0 writes the usual single-file checkpoint; resume scatters it again. So a checkpoint
written by a DDP, FSDP or single-process run resumes under any of the three.

Only rank 0 writes checkpoints (penrose_zoo.steerling.checkpoints), logs and the progress bar.
Validation (train.validate) deals the batches out to the ranks round-robin (a rank without a batch
left repeats one and discards it, so FSDP's collectives stay in step) and all-reduces the sums.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from penrose.errors import PenroseError
from penrose_zoo.steerling.checkpoints import load_optimizer, save_checkpoint
from penrose_zoo.steerling.losses import LocalReduce

__all__ = ["Distributed", "Local", "launched", "setup", "shard_sizes"]


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


# ---------------------------------------------------------------------------------------------
# The communicators: one process, or one rank of several
# ---------------------------------------------------------------------------------------------


class Local(LocalReduce):
    """The communicator of a single process (the null communicator): the interface of
    `Distributed`, every collective an identity, the module unwrapped, this process writing."""

    rank = 0
    world = 1
    local_rank = 0
    device = None  # the model's own
    fsdp = False
    is_main = True

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass

    def describe(self, batch_size: int) -> str | None:
        return None

    def tokenizer(self, make):
        return make()

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    @staticmethod
    def unwrap(module: torch.nn.Module) -> torch.nn.Module:
        return module

    def settle(self, module) -> None:
        """After an evaluation pass (FSDP: reshard)."""

    def load_optimizer(self, opt, params, tensors: dict[str, torch.Tensor]) -> None:
        load_optimizer(opt, params, tensors)

    def save_checkpoint(self, out: Path, model, tok, concept_names, opt, cfg, step: int, history: dict) -> None:
        save_checkpoint(out, model, tok, concept_names, opt, cfg, step, history)


@dataclass
class Distributed:
    """This process's place in a run of several, and the collectives of the training steps
    (the interface of `Local`)."""

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

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """All-reduced sum of the ranks' partial sums, no gradient."""
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

    def describe(self, batch_size: int) -> str | None:
        return (f"{'FSDP2' if self.fsdp else 'DDP'}: {self.world} processes ({self.device.type}), "
                f"{batch_size} rows per step split over them")

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

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move the training forward module (penrose_zoo.steerling.train.TrainForward) to this rank's
        device and wrap it: DDP, or fully_shard (the model's parameters become sharded DTensors:
        read model.parameters() after this)."""
        module.to(self.device)
        if self.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            fully_shard(module, mesh=init_device_mesh(self.device.type, (self.world,)))
            return module
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    @staticmethod
    def unwrap(module: torch.nn.Module) -> torch.nn.Module:
        """DDP's inner module (its forward outside a backward needs no collectives); FSDP's as is."""
        from torch.nn.parallel import DistributedDataParallel

        return module.module if isinstance(module, DistributedDataParallel) else module

    def settle(self, module) -> None:
        """After an evaluation pass: FSDP keeps the root's parameters gathered after a forward
        (awaiting a backward); reshard them."""
        if self.fsdp:
            module.reshard()

    # -- optimizer state -----------------------------------------------------------------------
    def load_optimizer(self, opt, params, tensors: dict[str, torch.Tensor]) -> None:
        """As checkpoints.load_optimizer, onto this rank's device; sharded like the parameter (FSDP)."""
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
    def save_checkpoint(self, out: Path, model, tok, concept_names, opt, cfg, step: int, history: dict) -> None:
        """checkpoints.save_checkpoint from rank 0. FSDP: every rank takes part in gathering each
        parameter and optimizer tensor to the CPU; rank 0 writes them through an unsharded copy."""
        if not self.fsdp:
            if self.is_main:
                save_checkpoint(out, model, tok, concept_names, opt, cfg, step, history)
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
        save_checkpoint(out, host, tok, concept_names, opt, cfg, step, history, optimizer_tensors=opt_tensors)

    def _unsharded_copy(self, model):
        if self._host is None:
            from penrose_zoo.steerling.model import Steerling

            host = Steerling(model.model_config, model.concept_config, model.vocab_size,
                             causal=model.variant == "causal", large_concept_threshold=model.large_concept_threshold)
            host.mask_token_id = model.mask_token_id
            self._host = host
        return self._host


def setup(*, fsdp: bool = False) -> Distributed | Local:
    """The distributed context of this process, initialising the default process group from
    torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) unless the
    caller already did; outside a distributed launch the null communicator `Local` (one process)."""
    if not launched():
        if fsdp:
            raise PenroseError("--fsdp shards the model over several processes: start them with torchrun, e.g. "
                               "torchrun --nproc_per_node 2 -m penrose.cli steerling train ... --fsdp")
        return Local()
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
