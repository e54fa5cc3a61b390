"""Steerling training under torch.distributed (penrose_zoo.steerling.distributed): two ranks with the gloo
backend on the CPU end with identical weights, equal to the single-process run on the same data.

- the real CLI under torchrun (DDP), against `train()` in this process;
- two ranks by torch.multiprocessing.spawn: per-rank gradients and weights of DDP and FSDP2
  steps against single-process steps (uneven shards, every loss term carrying weight), then
  `train()` with FSDP interrupted (--stop-after) and resumed under DDP.

Tolerance: float32 reduction order differs (per-shard sums, the gradient all-reduce), so the
comparisons allow ~1e-6 relative (1e-5 for gradients); ranks must agree exactly.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from penrose.errors import PenroseError
from penrose_zoo.steerling.distributed import Local, setup, shard_sizes
from penrose_zoo.steerling.train import TrainConfig, train

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")

ROOT = Path(__file__).resolve().parents[2]
WORDS = {"cats": "cat meow purr whisker tail", "code": "python code bug loop compile", "sea": "wave ship salt tide fish"}
# The training runs compared (block-causal diffusion noise and teacher forcing included).
RUN = dict(preset="tiny", steps=6, seq_len=32, batch_size=4, variant="block_causal", teacher_forcing_steps=3)
CLI_RUN = ["--preset", "tiny", "--steps", "6", "--seq-len", "32", "--batch-size", "4", "--variant", "block_causal",
           "--teacher-forcing-steps", "3", "--val-every", "3", "--no-progress"]
ENV = dict(PENROSE_DIST_DEVICE="cpu", OMP_NUM_THREADS="1")


def write_corpus(root: Path, n: int = 24) -> Path:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for cat, words in WORDS.items():
        ws = words.split()
        entries = [" ".join(rng.choice(ws) for _ in range(rng.randint(3, 8))) + f" {i}" for i in range(n)]
        (root / cat).write_text("\n%\n".join(entries) + "\n")
    return root


def weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def assert_same_run(path, reference) -> None:
    """Weights within float32 reduction-order differences; the same history (to ~1e-5)."""
    a, b = weights(path), weights(reference)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=2e-6 * float(b[k].abs().max()), msg=k)
    ha, hb = (json.loads((Path(p) / "train.json").read_text()) for p in (path, reference))
    assert ha["step"] == hb["step"] and ha["config"] == hb["config"]
    for side in ("train", "val"):
        assert len(ha["history"][side]) == len(hb["history"][side])
        for x, y in zip(ha["history"][side], hb["history"][side]):
            assert x.keys() == y.keys() and all(x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-5) for k in x), (x, y)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The corpus and the single-process run of RUN on it."""
    root = tmp_path_factory.mktemp("dist")
    data = write_corpus(root / "corpus")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(TrainConfig(data=str(data), **RUN), root / "single", val_every=3, progress=False, log=lambda m: None)
    finally:
        torch.set_num_threads(threads)
    return root, data, root / "single"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# The CLI under torchrun
# ---------------------------------------------------------------------------------------------


def test_torchrun_cli_trains_with_ddp(reference):
    root, data, single = reference
    out = root / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "penrose.cli", "steerling", "train", "--data", str(data), "--out", str(out), *CLI_RUN]
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DDP: 2 processes (cpu)" in r.stderr
    reports = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1 and reports[0]["step"] == 6  # rank 0 alone reports
    assert_same_run(out, single)


# ---------------------------------------------------------------------------------------------
# Two ranks in this test: gradients, per-rank weights, train() with FSDP → DDP resume
# ---------------------------------------------------------------------------------------------


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _close(a: torch.Tensor, b: torch.Tensor, rel: float, what: str) -> None:
    err = float((a - b).abs().max())
    scale = float(b.abs().max())
    assert err <= rel * scale, f"{what}: max |Δ| {err:.3g} > {rel:g} · {scale:.3g}"


def _steps(ctx, data: str, fsdp: bool, n_steps: int, **overrides) -> None:
    """n_steps AdamW steps of a single-process model and of a DDP / FSDP one from the same init
    on the same global batches; gradients, loss parts and weights compared, ranks compared."""
    from penrose_zoo.steerling.train import (TrainForward, batch_loss, batch_of, load_corpus, lr_at, make_model,
                                             make_tokenizer, packed, train_rows)

    ctx.fsdp = fsdp
    cfg = TrainConfig(preset="tiny", data=data, seq_len=32, steps=n_steps, **overrides).resolved()
    corpus = load_corpus(cfg)
    tok = make_tokenizer(cfg, corpus)
    rows, _ = packed(cfg, corpus, tok)
    one = make_model(cfg, corpus.n_concepts, tok.vocab_size, tok.mask_id)
    many = make_model(cfg, corpus.n_concepts, tok.vocab_size, tok.mask_id)
    fwd = ctx.wrap(TrainForward(many))
    p1, pn = list(one.parameters()), list(many.parameters())
    o1, on = (torch.optim.AdamW(p, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay) for p in (p1, pn))
    what = f"{'FSDP' if fsdp else 'DDP'} {overrides}"
    for step in range(n_steps):
        batch = batch_of(rows, train_rows(rows.n_rows, cfg.batch_size, cfg.seed, step))
        for o in (o1, on):
            for g in o.param_groups:
                g["lr"] = lr_at(step, cfg)
        l1, parts1 = batch_loss(one, batch, cfg, step=step, noise_seed=step)  # the null communicator
        ln, partsn = batch_loss(fwd, batch, cfg, step=step, noise_seed=step, comm=ctx)  # the same code, 2 ranks
        assert parts1.keys() == partsn.keys()
        for k in parts1:
            assert partsn[k] == pytest.approx(parts1[k], rel=1e-5, abs=1e-15), (what, step, k, parts1, partsn)
        for o, loss in ((o1, l1), (on, ln)):
            o.zero_grad(set_to_none=True)
            loss.backward()
        g1, gn = _flat(p.grad for p in p1), _flat(_full(p.grad) for p in pn)
        _close(gn, g1, 1e-5, f"{what} step {step} gradient")
        for params, o in ((p1, o1), (pn, on)):
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            o.step()
    w1, wn = _flat(p1), _flat(_full(p) for p in pn)
    _close(wn, w1, 2e-6, f"{what} weights")
    ranks = [torch.empty_like(wn) for _ in range(ctx.world)]
    dist.all_gather(ranks, wn)
    assert all(torch.equal(r, ranks[0]) for r in ranks), f"{what}: the ranks' weights differ"


def _worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    os.environ.update(ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        ctx = setup()
        assert ctx is not None and ctx.world == world and not ctx.owns_group
        # every loss term's gradient of the order of the token loss's (k̂, û ~1e-2 at initialisation, so
        # L_indep ~1e-11); 5 rows: shards of 3 and 2
        strong = dict(lambda_concept=0.01, lambda_indep=1e9, lambda_rec=1.0)
        _steps(ctx, data, False, 3, batch_size=5, variant="causal", epsilon=True, **strong)
        _steps(ctx, data, False, 2, batch_size=4, variant="block_causal", teacher_forcing_steps=2, **strong)
        _steps(ctx, data, True, 2, batch_size=5, variant="block_causal", teacher_forcing_steps=2, **strong)
        # the training loop: FSDP interrupted after 3 steps, resumed under DDP
        cfg = TrainConfig(data=data, **RUN)
        st = train(cfg, out, val_every=3, stop_after=3, progress=False, log=lambda m: None, fsdp=True)
        assert st["step"] == 3
        st = train(cfg, out, val_every=3, progress=False, log=lambda m: None)
        assert st["step"] == 6
        assert dist.is_initialized()  # train() leaves a group it did not create
    finally:
        dist.destroy_process_group()


def test_two_ranks_equal_one(reference, monkeypatch):
    import torch.multiprocessing as mp

    for k, v in ENV.items():  # in the children's environment from the start (one OpenMP thread)
        monkeypatch.setenv(k, v)

    root, data, single = reference
    out = root / "spawned"
    mp.spawn(_worker, args=(2, free_port(), str(data), str(out)), nprocs=2, join=True)
    assert_same_run(out, single)


# ---------------------------------------------------------------------------------------------
# Without a launch
# ---------------------------------------------------------------------------------------------


def test_single_process_and_errors(monkeypatch, tmp_path):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    local = setup()  # the null communicator: one process, the interface of Distributed
    assert isinstance(local, Local) and (local.rank, local.world, local.is_main) == (0, 1, True)
    x = torch.arange(3.0)
    assert torch.equal(local.all_reduce(x), x) and local.gather(x, [3]) is x and local.barrier() is None
    # the training loop calls the same names on either communicator
    from penrose_zoo.steerling.distributed import Distributed

    import dataclasses

    public = ({k for k in dir(Distributed) if not k.startswith("_")}
              | {f.name for f in dataclasses.fields(Distributed)}) - {"owns_group"}
    assert public <= {k for k in dir(Local) if not k.startswith("_")}, public - set(dir(Local))
    assert {"all_reduce", "reduce", "gather", "barrier", "rank", "world", "wrap", "save_checkpoint"} <= public
    with pytest.raises(PenroseError, match="torchrun"):
        train(TrainConfig(data=str(write_corpus(tmp_path / "c")), steps=1), tmp_path / "o", fsdp=True,
              progress=False, log=lambda m: None)
    assert shard_sizes(5, 2) == [3, 2] and shard_sizes(8, 2) == [4, 4] and shard_sizes(7, 3) == [3, 2, 2]
    with pytest.raises(PenroseError, match="batch of 1 rows cannot be split over 2"):
        shard_sizes(1, 2)
