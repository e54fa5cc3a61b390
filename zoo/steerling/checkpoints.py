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
import unicodedata
from pathlib import Path

import torch

from penrose.errors import PenroseError
from penrose_zoo.validate import is_invisible

__all__ = ["FORMAT", "VERSION", "check_steps", "concept_id", "config_differences", "load_checkpoint", "load_optimizer", "optimizer_state_tensors",
           "read_concept_names", "read_optimizer", "read_train_state", "save_checkpoint"]

FORMAT = "penrose-steerling-train"
#: train.json's version: 2 tags model.safetensors and optimizer.safetensors with their step
VERSION = 2

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

    from penrose.io import atomic_write_file, atomic_write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tag = {"step": str(step)}  # the weights and moments say which step they are (check_steps)
    model.save(out, metadata=tag)
    tok.save(out / "tokenizer.json")
    atomic_write_text(out / "concepts.json", json.dumps({"known": list(concept_names)}, indent=1) + "\n")
    if optimizer_tensors is None:
        optimizer_tensors = optimizer_state_tensors(opt, list(model.parameters()))
    atomic_write_file(out / "optimizer.safetensors", lambda tmp: save_file(optimizer_tensors, tmp, metadata=tag))
    state = {"format": FORMAT, "version": VERSION, "config": dataclasses.asdict(cfg), "step": step, "history": history}
    atomic_write_text(out / "train.json", json.dumps(state, indent=1) + "\n")  # last: the checkpoint is complete


def read_train_state(path: str | os.PathLike) -> dict:
    """train.json of a training checkpoint, checked (schema.read_json's limits; format, version,
    step, config fields of TrainConfig with their types, history lists) before anything uses it:
    every problem a CheckpointError naming the file and the field."""
    from penrose_zoo.steerling.schema import CheckpointError, read_json

    p = Path(path) / "train.json"
    if not p.is_file():
        raise CheckpointError(f"{path}: no train.json; not a checkpoint written by `penrose steerling train`")
    state = read_json(p, max_bytes=64 << 20)  # the history grows with the steps
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{p}: not a penrose steerling training state (no field 'format' = {FORMAT!r})")
    version = state.get("version", 1)
    if type(version) is not int or not 1 <= version <= VERSION:
        raise CheckpointError(f"{p}: field 'version' = {version!r}: expected 1 to {VERSION} (a newer penrose wrote it?)")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{p}: field 'step' = {step!r}: expected a whole number of at least 0")
    history = state.get("history")
    if not isinstance(history, dict) or not all(isinstance(history.get(k, []), list) for k in ("train", "val")):
        raise CheckpointError(f"{p}: field 'history' must be an object with lists 'train' and 'val'")
    history.setdefault("train", [])
    history.setdefault("val", [])
    config = state.get("config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{p}: field 'config' must be an object (the training configuration)")
    _check_train_config(p, config)
    return state


def _check_train_config(file: Path, config: dict) -> None:
    """Each field of a saved TrainConfig is a field of it, of its default's JSON type."""
    import math

    from penrose_zoo.steerling.schema import CheckpointError
    from penrose_zoo.steerling.train_config import TrainConfig

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise CheckpointError(f"{file}: unknown field(s) {', '.join(repr('config.' + k) for k in unknown)} (not TrainConfig fields)")
    for k, v in config.items():
        d = fields[k].default
        kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
        hint = str(fields[k].type)
        if v is None:
            ok = d is None or "None" in hint
        elif "dict" in hint:
            ok = isinstance(v, dict)
        elif "list" in hint:
            ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
        else:
            want = type(d) if d is not None else (float if "float" in hint else int if "int" in hint else str)
            ok = isinstance(v, kinds[want]) and (want is bool or not isinstance(v, bool))
            ok = ok and not (isinstance(v, float) and not math.isfinite(v))
            ok = ok and not (want is int and v < 0)
        if not ok:
            raise CheckpointError(f"{file}: field 'config.{k}' = {v!r}: expected {hint.replace('|', 'or')}"
                                  + (" (finite, not negative)" if isinstance(v, (int, float)) and not isinstance(v, bool) else ""))


def check_steps(path: str | os.PathLike, state: dict) -> None:
    """The weights and the optimizer state are the step train.json says (a version-2 checkpoint
    tags both files with it): a save interrupted between its files, or weights written over the
    checkpoint by something else (`Steerling.save`), would otherwise resume or evaluate silently
    with weights train.json does not describe. A CheckpointError naming the file otherwise."""
    from safetensors import safe_open

    from penrose_zoo.steerling.schema import CheckpointError

    if state.get("version", 1) < 2:
        return  # (written before the tags)
    for name in ("model.safetensors", "optimizer.safetensors"):
        file = Path(path) / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing; a training checkpoint holds it")
        try:
            with safe_open(str(file), framework="pt") as f:
                tag = (f.metadata() or {}).get("step")
        except Exception as e:  # noqa: BLE001 - safetensors' own error: a damaged header
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
        if tag != str(state["step"]):
            raise CheckpointError(f"{file}: holds {'no step' if tag is None else f'step {tag}'} but train.json says step "
                                  f"{state['step']}: the checkpoint was interrupted while it was written, or the file "
                                  "was replaced; its weights are not the ones train.json describes")


def read_optimizer(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """optimizer.safetensors of a training checkpoint: its tensors, every one finite (a NaN moment
    would carry on into every later step) and keyed "i.name"; a CheckpointError naming the file and
    the tensor otherwise."""
    from safetensors.torch import load_file

    from penrose_zoo.steerling.release import _check_finite
    from penrose_zoo.steerling.schema import CheckpointError

    file = Path(path) / "optimizer.safetensors"
    try:
        tensors = load_file(str(file))
    except Exception as e:  # noqa: BLE001 - safetensors' own error, OSError: a damaged or missing file
        raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
    for key, t in tensors.items():
        i, dot, _ = key.partition(".")
        if not dot or not i.isascii() or not i.isdigit():
            raise CheckpointError(f"{file}: tensor {key!r} is not named 'i.state' (i the parameter's index)")
        if t.is_floating_point():
            _check_finite(file, key, t)
    return tensors


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
    check_steps(path, state)
    tok = tokenizer_for(path, vocab_size=model.vocab_size)  # its tokenizer.json, vocabulary checked
    names = read_concept_names(path, model.sizes["c"])
    return model, tok, names, state


def read_concept_names(path: str | os.PathLike, n: int | None = None) -> list[str]:
    """concepts.json's known names: a list of distinct, non-empty strings (`n` of them when given);
    a CheckpointError naming the file and the entry otherwise."""
    from penrose_zoo.steerling.schema import CheckpointError, read_json

    file = Path(path) / "concepts.json"
    doc = read_json(file, max_bytes=64 << 20)
    names = doc.get("known") if isinstance(doc, dict) else None
    if not isinstance(names, list):
        raise CheckpointError(f"{file}: expected an object with a list 'known' (the known concept names)")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or is_invisible(name) or any(unicodedata.category(ch) == "Cc" for ch in name):
            raise CheckpointError(f"{file}: field 'known[{i}]' = {name!r}: expected a concept name (visible text, "
                                  "no control characters)")
        norm = unicodedata.normalize("NFC", name)  # (one name in NFC and NFD is one name)
        if norm in seen:
            raise CheckpointError(f"{file}: field 'known[{i}]' = {name!r} repeats known[{seen[norm]}]")
        seen[norm] = i
    if n is not None and len(names) != n:
        raise CheckpointError(f"{file}: field 'known' has {len(names)} names, but the model has {n} known concepts")
    return names


def concept_id(names, name: str) -> int:
    """The id of a known concept by name (or a number); a clear error for an unknown one."""
    if name in names:
        return list(names).index(name)
    if name.isascii() and name.isdigit() and int(name) < len(names):
        return int(name)
    import difflib

    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise PenroseError(f"unknown concept {name!r}{hint} (this checkpoint has {len(names)} known concepts: "
                       f"{', '.join(names[:12])}{' ...' if len(names) > 12 else ''})")
