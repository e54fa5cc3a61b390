"""Steerling training checkpoints: the folder `penrose steerling train --out` writes and resumes.

  model.safetensors, config.json   Steerling.save (release keys; configs, variant, mask id)
  tokenizer.json                   penrose_zoo.steerling.tokenizer (byte-level or corpus BPE)
  concepts.json                    the known concept names, id order
  optimizer.safetensors            AdamW moments and step counts, one entry per parameter
                                   ("i.key", i the index in model.parameters())
  train.json                       the training configuration, the step reached, the history
                                   (train losses, validation losses); written last

One process writes (rank 0 of a distributed run, penrose_zoo.steerling.distributed gathering the
tensors first), so a checkpoint of any run resumes under any other.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from penrose.errors import PenroseError

__all__ = ["FORMAT", "concept_id", "config_differences", "load_checkpoint", "load_optimizer", "optimizer_state_tensors",
           "read_train_state", "save_checkpoint"]

FORMAT = "penrose-steerling-train"

# Fields that do not change the trained weights (not compared on resume).
_FREE = ()


def optimizer_state_tensors(opt, params) -> dict[str, torch.Tensor]:
    """The entries of optimizer.safetensors: opt's state per parameter of `params`, on the CPU."""
    out = {}
    for i, p in enumerate(params):
        for k, v in opt.state.get(p, {}).items():
            out[f"{i}.{k}"] = (v if isinstance(v, torch.Tensor) else torch.tensor(v)).detach().contiguous().cpu()
    return out


def load_optimizer(opt, params, tensors: dict[str, torch.Tensor]) -> None:
    """The inverse of optimizer_state_tensors (one process; the tensors stay where they were loaded)."""
    for key, v in tensors.items():
        i, _, k = key.partition(".")
        opt.state[params[int(i)]][k] = v.clone()


def save_checkpoint(out: Path, model, tok, concept_names, opt, cfg, step: int, history: dict, *,
                    optimizer_tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Write the checkpoint folder `out`. optimizer_tensors: the entries of optimizer.safetensors
    when already gathered (FSDP); default: read from opt, indexed by model.parameters()."""
    from safetensors.torch import save_file

    from penrose.io import atomic_write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out)
    tok.save(out / "tokenizer.json")
    atomic_write_text(out / "concepts.json", json.dumps({"known": list(concept_names)}, indent=1) + "\n")
    tmp = out / "optimizer.safetensors.tmp"
    if optimizer_tensors is None:
        optimizer_tensors = optimizer_state_tensors(opt, list(model.parameters()))
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


def config_differences(saved: dict, cfg) -> list[str]:
    """'field: checkpoint …, now …' for each field of the dataclass cfg that differs from the
    saved configuration (fields newer than the checkpoint compare with their default)."""
    now = dataclasses.asdict(cfg)
    default = {f.name: f.default for f in dataclasses.fields(cfg)}
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
