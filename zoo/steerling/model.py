"""Steerling-8B as released (steerling 0.2.0), compiled from the diagrams in this folder.

    from penrose_zoo.steerling import Steerling
    model = Steerling.from_release(state_dict, model_config, concept_config, vocab_size)
    model = Steerling.from_pretrained("steerling-8b/", dtype=torch.bfloat16)   # a published folder
    out = model(input_ids)                      # out.logits, out.hidden, out.known_features, ...
    out = model(input_ids, intervene_known={concept_id: value})
    with torch.device("meta"):
        big = Steerling.from_release_config({}, {}, 100281)   # {} = release defaults

The model is one compiled module, `self.net` (penrose.compile with entries: one set of
parameters, a method per diagram). Its forward is `steerling_plain.pen`, run when nothing is
intervened on and ε is on (the release's default); `net.intervention` is `steerling.pen`, the
same model with intervention inputs; `net.embeddings` is `steerling_embeddings.pen`; `net.hidden`
and `net.readout` are the stages around a blocked head. The two variants are the same diagrams:
the attention mask is `block_causal(t, s, block=blk)`, made once and handed to every layer, and
the causal variant compiles with blk = 1 (`compile_sizes`). Sizes come from the configs through
`penrose.compile(..., **sizes)`. This wrapper only (1) checks configs, weights and inputs, (2)
picks the concept-head diagrams the config needs (`concept_parts`: concepts_known[_wide].pen,
concepts_unknown[_dense].pen, swapped in by `penrose.replace_includes`), (3) turns intervention
dicts into the diagram's mask inputs and (4) reads the top-k ids off the diagram's outputs.
Interventions themselves, and the rule that switches ε off while known concepts are intervened
on, are in the diagram.

A head with more concepts than `large_concept_threshold` (the release's 50,000: the 8B unknown
head) is run as the release runs it, blocked (blocked.py: a running top-k over blocks of
`concept_config["block_size"]` concepts, never a tokens × concepts matrix, with the release's
large-head intervention rule) — unless it fits one block and its diagram draws the rule it needs,
when the diagram computes the same thing. With a blocked head the model runs `net.hidden`
(steerling_hidden.pen: ids → h), the other head's block (`net.known_head.known_head`, ...), and
`net.readout` (steerling_readout.pen: ε and the LM head).

The pieces around the module live next to it: config.py (release fields and defaults → diagram
sizes and head files), release.py (parameter names ↔ release keys, state-dict checks, checkpoint
folders in penrose's and the published layout), outputs.py (`SteerlingOutput`). Every name they
define is importable from here as before.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import penrose
from penrose.errors import PenroseCompileError, PenroseShapeError
from penrose_zoo.steerling.config import (  # re-exported (__all__)
    BYTE_MASK_ID,
    CONCEPT_DEFAULTS,
    DEFAULT_HEADS,
    DIAGRAM,
    EMBEDDING_DIAGRAM,
    HERE,
    HIDDEN_DIAGRAM,
    LARGE_CONCEPT_THRESHOLD,
    MODEL_DEFAULTS,
    NORM_EPS,
    PLAIN_DIAGRAM,
    READOUT_DIAGRAM,
    RELEASE_INSTRUCT_VOCAB_SIZE,
    RELEASE_MASK_ID,
    RELEASE_VOCAB_SIZE,
    compile_sizes,
    concept_parts,
    diagram_sizes,
    full_configs,
    with_heads,
)
from penrose_zoo.steerling.outputs import OUTPUT_FIELDS, SteerlingOutput
from penrose_zoo.steerling.schema import PENROSE_SCHEMA, check_fields
from penrose_zoo.steerling.release import (
    EMBEDDING_KEY,
    RELEASE_NAMES,
    TIED_KEY,
    CheckpointError,
    check_release_state_dict,
    release_key,
    release_names,
)

# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def _default_device() -> torch.device:
    return torch.empty(0).device  # honours a `with torch.device(...)` context


@contextlib.contextmanager
def _skip_init():
    """Make torch.nn.init's in-place initialisers no-ops (for modules built on the meta device)."""
    names = ("normal_", "zeros_", "ones_", "constant_", "uniform_", "eye_")
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


class Steerling(torch.nn.Module):
    """Steerling-8B from its diagrams. `self.net` is one compiled module (parameters under their
    diagram names: net.layers.0.attn.c_attn, net.known_head.concept_predictor, ...): its forward
    is steerling_plain.pen, run when nothing is intervened on; `net.intervention` is steerling.pen
    on the same parameters, run when something is; `net.embeddings`, `net.hidden`, `net.readout`
    the other entries."""

    net: Any  # the compiled diagram: its entries and parameters are made at run time (penrose.compile)

    def __init__(self, model_config: dict | None = None, concept_config: dict | None = None,
                 vocab_size: int = RELEASE_VOCAB_SIZE, *, causal: bool = False,
                 large_concept_threshold: int = LARGE_CONCEPT_THRESHOLD, seed: int | None = None):
        super().__init__()
        model_config, concept_config = dict(model_config or {}), dict(concept_config or {})
        self.sizes = diagram_sizes(model_config, concept_config, vocab_size)
        self.model_config, self.concept_config = full_configs(model_config, concept_config)
        self.vocab_size = int(vocab_size)
        self.variant = "causal" if causal else "block_causal"
        check_fields("Steerling", {"large_concept_threshold": large_concept_threshold},
                     PENROSE_SCHEMA, "", error=PenroseCompileError)
        self.large_concept_threshold = int(large_concept_threshold)
        self.concept_parts = concept_parts(model_config, concept_config, vocab_size)
        self.concept_block = int(self.concept_config["block_size"])  # concepts per block of a blocked head
        # one module, one set of parameters, an entry point per diagram (its methods)
        diagram = with_heads(PLAIN_DIAGRAM, self.concept_parts)
        entries = {"intervention": with_heads(DIAGRAM, self.concept_parts), "hidden": HIDDEN_DIAGRAM,
                   "readout": READOUT_DIAGRAM, "embeddings": with_heads(EMBEDDING_DIAGRAM, self.concept_parts)}
        sizes = compile_sizes(self.sizes, causal)
        if _default_device().type == "meta":
            with _skip_init():  # initialising meta tensors means nothing (and imports torch._dynamo)
                self.net = penrose.compile(diagram, entries=entries, **sizes)
        else:
            self.net = penrose.compile(diagram, entries=entries, seed=seed, **sizes)
        self._names = release_names(self.sizes["L"])
        self._none: dict = {}  # the inputs meaning "no intervention", per device
        self.mask_token_id: int | None = BYTE_MASK_ID if self.vocab_size > BYTE_MASK_ID else None
        self.instruct = False  # config.json's `instruct` (chat tokens), for a loaded published checkpoint
        self.checkpoint_layout: str | None = None  # "penrose" or "published" when read by load / from_pretrained

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_release_config(cls, model_config: dict, concept_config: dict, vocab_size: int, **kw) -> "Steerling":
        """A randomly initialised model (seed=N for determinism); honours torch.device('meta')."""
        return cls(model_config, concept_config, vocab_size, **kw)

    @classmethod
    def from_release(cls, state_dict: dict[str, Tensor], model_config: dict, concept_config: dict,
                     vocab_size: int, **kw) -> "Steerling":
        """The model with the release's weights (state_dict under the release's key names).

        Every key, shape and dtype is checked before anything is built, and every tensor for NaN
        and ±inf (unless allow_nonfinite=True); the tensors are used as they are (no copy) when
        already float32."""
        allow_nonfinite = kw.pop("allow_nonfinite", False)
        sizes = diagram_sizes(model_config, concept_config, vocab_size)  # config errors first
        with torch.device("meta"):
            model = cls(model_config, concept_config, vocab_size, **kw)
        tensors = model._check_release_state_dict(state_dict, sizes)
        if not allow_nonfinite:  # as loading a folder: a NaN or inf weight is named, not sampled from
            from penrose_zoo.steerling.release import _check_finite

            for key, t in tensors.items():
                _check_finite("state_dict", model._names.get(key, key), t.detach())
        model.net.load_state_dict(tensors, strict=True, assign=True)
        return model

    def expected_release_shapes(self) -> dict[str, tuple[int, ...]]:
        """{release key: shape} of the weights this model stores (the tied LM head once)."""
        return {self._names[n]: tuple(p.shape) for n, p in self.net.named_parameters()}

    def _check_release_state_dict(self, state_dict, sizes) -> dict[str, Tensor]:
        return check_release_state_dict(state_dict, self.expected_release_shapes(), self._names)

    def release_state_dict(self) -> dict[str, Tensor]:
        """The weights under the release's keys; the tied embedding once (as tok_emb)."""
        return {self._names[n]: p.detach() for n, p in self.net.named_parameters()}

    # -- checkpoints ---------------------------------------------------------------------------
    def config_dict(self) -> dict:
        changed_m = {k: v for k, v in self.model_config.items() if MODEL_DEFAULTS[k] != v}
        changed_c = {k: v for k, v in self.concept_config.items() if CONCEPT_DEFAULTS[k] != v}
        out = {"model_config": changed_m, "concept_config": changed_c, "vocab_size": self.vocab_size,
               "variant": self.variant, "large_concept_threshold": self.large_concept_threshold}
        if self.mask_token_id is not None:
            out["mask_token_id"] = int(self.mask_token_id)
        return out

    def save(self, path: str | os.PathLike, *, metadata: dict[str, str] | None = None) -> Path:
        """Write `path/model.safetensors` (release keys, tied embedding once) and
        `path/config.json` (the configs as differences from the release defaults). `metadata`:
        more entries of the safetensors header (a training checkpoint's step)."""
        from safetensors.torch import save_file

        from penrose.io import atomic_write_file, atomic_write_text

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous().cpu() for k, v in self.release_state_dict().items()}
        header = {**(metadata or {}), "format": "pt", "producer": "penrose_zoo.steerling"}
        # one mode rule for both files (penrose.io: an existing file keeps its mode, a new one 0666 less the umask)
        atomic_write_file(path / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata=header))
        atomic_write_text(path / "config.json", json.dumps(self.config_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, dtype: torch.dtype | str | None = None, device=None,
             strict: bool = True, allow_nonfinite: bool = False, **kw) -> "Steerling":
        """Read a checkpoint folder: one written by `save`, or the published layout (see
        `from_pretrained`). dtype None: float32 for `save`'s layout, as stored for the published
        one. `kw` (causal, large_concept_threshold) overrides what config.json says. A weight
        holding NaN or ±inf is a CheckpointError naming it, unless `allow_nonfinite=True`."""
        from penrose_zoo.steerling.release import load_directory

        return load_directory(cls, path, dtype=dtype, device=device, strict=strict, allow_nonfinite=allow_nonfinite, **kw)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | str | None = torch.bfloat16, device=None,
                        *, strict: bool = True, allow_nonfinite: bool = False, **kw) -> "Steerling":
        """The model of a checkpoint folder in the published layout (steerling 0.2.0's
        `SteerlingGenerator.from_pretrained`): config.json with the model fields at the top level
        plus `interpretable`, `concept`, `vocab_size`, `instruct` (the hub's keys are ignored), and
        model.safetensors or shards listed in model.safetensors.index.json, the tied embedding once
        under either name. A folder written by `save` loads too.

        Everything (config, index, every shard's keys, shapes and dtypes) is checked before a
        weight is read; errors are `CheckpointError` naming the file and the field or key. The
        model is built on the meta device and its parameters are the files' memory-mapped tensors
        (converted to `dtype` / moved to `device` one tensor at a time when they differ), so
        loading holds one copy of the weights. Unknown weights raise, or with strict=False are
        ignored with a warning. dtype None keeps the stored dtype. A weight holding NaN or ±inf is
        a CheckpointError naming it, unless `allow_nonfinite=True`."""
        from penrose_zoo.steerling.release import load_directory

        return load_directory(cls, path, dtype=dtype, device=device, strict=strict, allow_nonfinite=allow_nonfinite, **kw)

    # -- forward -------------------------------------------------------------------------------
    @property
    def known_large(self) -> bool:
        return self.sizes["c"] > self.large_concept_threshold

    @property
    def unknown_large(self) -> bool:
        return self.sizes["u"] > self.large_concept_threshold

    @property
    def weight_dtype(self) -> torch.dtype:
        """The parameters' dtype (float32, or what from_pretrained / .to() made them): the dtype of
        the intervention values the diagrams take."""
        return self.net.tok_emb.dtype

    def _selection(self, spec, n: int, what: str, device) -> tuple[Tensor, Tensor]:
        dtype = self.weight_dtype
        if not spec:  # no intervention: constant inputs, made once per device and dtype
            key = (what, n, device, dtype)
            if key not in self._none:
                self._none[key] = (torch.zeros(n, dtype=torch.bool, device=device), torch.zeros(n, dtype=dtype, device=device))
            return self._none[key]
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        val = torch.zeros(n, dtype=dtype, device=device)
        if not isinstance(spec, dict):
            raise PenroseShapeError(f"intervene_{what} must be a dict {{concept id: weight}}, got {type(spec).__name__}")
        ids, vals = [], []
        for cid, value in spec.items():
            if isinstance(cid, bool) or not isinstance(cid, int) and not (isinstance(cid, Tensor) and cid.numel() == 1):
                raise PenroseShapeError(f"intervene_{what}: concept id {cid!r} is not an integer")
            cid = int(cid)
            if not 0 <= cid < n:
                raise PenroseShapeError(f"intervene_{what}: concept id {cid} is out of range; the {what} head has {n} concepts (0..{n - 1})")
            value = float(value)
            if value != value or abs(value) == math.inf:  # not math.isfinite: torch.compile traces comparisons
                raise PenroseShapeError(f"intervene_{what}: the weight for concept {cid} is {value}, not a finite number")
            ids.append(cid)
            vals.append(value)
        idx = torch.tensor(ids, dtype=torch.long, device=device)
        sel[idx] = True
        val[idx] = torch.tensor(vals, dtype=dtype, device=device)
        return sel, val

    def check_input_ids(self, input_ids) -> None:
        if not isinstance(input_ids, Tensor):
            raise PenroseShapeError(f"input_ids must be a tensor of token ids, got {type(input_ids).__name__}")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise PenroseShapeError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
        if input_ids.dim() not in (1, 2):
            raise PenroseShapeError(f"input_ids must be (t,) or (b, t), got shape {tuple(input_ids.shape)}")
        T = input_ids.shape[-1]
        if T == 0:
            raise PenroseShapeError("input_ids is empty: the sequence needs at least one token")
        if T > self.model_config["block_size"]:
            raise PenroseShapeError(f"input_ids has {T} tokens, longer than the context (block_size = {self.model_config['block_size']})")
        if torch.compiler.is_compiling():  # no host sync in a captured graph: the check runs with it
            torch._assert_async(((input_ids >= 0) & (input_ids < self.vocab_size)).all(),
                                f"input_ids: a token id is out of range for vocab_size {self.vocab_size}")
        elif not input_ids.is_meta and input_ids.numel():
            lo, hi = (int(x) for x in torch.aminmax(input_ids))
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise PenroseShapeError(f"input_ids: token id {bad} is out of range for vocab_size {self.vocab_size} (0..{self.vocab_size - 1})")

    @property
    def unknown_factorised(self) -> bool:
        return bool(self.concept_config["factorize_unknown"])

    def _draws_large_rule(self, head: str) -> bool:
        """Whether the head's diagram draws the release's large-head (sparse) intervention rule:
        only the factorised unknown head (concepts_unknown.pen) does."""
        return head == "unknown" and self.unknown_factorised

    def _head(self, head: str) -> tuple[bool, int]:
        """(large, number of concepts) of the 'known' or 'unknown' head."""
        return (self.known_large, self.sizes["c"]) if head == "known" else (self.unknown_large, self.sizes["u"])

    def _blocked(self, head: str, intervened: bool, dense_heads: bool) -> bool:
        """Whether `forward` runs this head blocked (blocked.py), with the release's rules for its
        size class: every head wider than one block (concept_block, the release's block_size) —
        both 8B heads, so no tokens × concepts matrix is ever made — and a head that is intervened
        on while its diagram draws the other size class's intervention rule. A head that fits one
        block otherwise runs through its diagram: one block is that whole matrix anyway.
        `dense_heads`: every head through its diagram."""
        if dense_heads:
            return False
        large, n = self._head(head)
        return n > self.concept_block or (intervened and self._draws_large_rule(head) != large)

    def _rule_check(self, known: bool, unknown: bool, known_blocked: bool, unknown_blocked: bool) -> None:
        """Interventions follow the release's rule for the head's size class: small heads the dense
        rule (override), large heads the sparse one (add value − σ(logit)). A blocked head applies
        its class's rule; a head computed by its diagram applies the rule the diagram draws
        (known head: dense; factorised unknown head: sparse; dense unknown head: dense)."""
        lim = self.large_concept_threshold
        for head, on, blocked in (("known", known, known_blocked), ("unknown", unknown, unknown_blocked)):
            large, n = self._head(head)
            if not on or blocked or self._draws_large_rule(head) == large:
                continue
            field = "n_concepts" if head == "known" else "n_unknown_concepts"
            drawn = {"known": "the known head's diagram", "unknown": "concepts_unknown_dense.pen" if large else "concepts_unknown.pen"}[head]
            raise PenroseCompileError(
                f"{head}-concept interventions on a {'large' if large else 'small'} {head} head ({field} = {n} "
                f"{'>' if large else '<='} large_concept_threshold = {lim}) follow the release's {'sparse' if large else 'dense'} "
                f"rule, which {drawn} does not draw; `forward` runs such a head blocked (dense_heads=False)")

    def forward(self, input_ids: Tensor, intervene_known: dict | None = None,
                intervene_unknown: dict | None = None, positions: Tensor | None = None, *,
                dense_heads: bool = False) -> SteerlingOutput:
        """One forward pass. `intervene_known` / `intervene_unknown`: {concept id: weight},
        applied at `positions` (bool, shaped like input_ids; default: every position).

        Large heads (more concepts than large_concept_threshold) run blocked (blocked.py) as the
        release runs them, unless `dense_heads`: then the whole compiled diagram runs, every head
        dense (a tokens × concepts matrix per head)."""
        self.check_input_ids(input_ids)
        args = self.concept_inputs(input_ids.shape, input_ids.device, intervene_known, intervene_unknown, positions, dense_heads)
        if args["known_blocked"] or args["unknown_blocked"]:
            return self._from_hidden(self.net.hidden(ids=input_ids), **args)
        if not (args["known_on"] or args["unknown_on"]) and self.concept_config["use_epsilon_correction"]:
            o = self.net(ids=input_ids)
        else:
            pos, ksel, kval, usel, uval = (args[k] for k in ("pos", "ksel", "kval", "usel", "uval"))
            o = self.net.intervention(ids=input_ids, kpos=pos, ksel=ksel, kval=kval, upos=pos, usel=usel, uval=uval,
                                      use_eps=args["use_eps"])
        return self.output_record(o.logits, o.h, o.eps, o.z, args["known_on"], args["unknown_on"],
                            known_logits=o.kl, known_weights=o.kw, known_features=o.kf,
                            unknown_logits=o.ul, unknown_weights=o.uw, unknown_features=o.uf)

    def concepts_from_hidden(self, h: Tensor, intervene_known: dict | None = None,
                             intervene_unknown: dict | None = None, positions: Tensor | None = None, *,
                             dense_heads: bool = False) -> SteerlingOutput:
        """Everything `forward` computes after the hidden state h (b, t, e) or (t, e): the two
        concept heads (a large one blocked, as in forward), ε and the LM head. With
        `dense_heads`, both heads run their diagrams (what the compiled steerling.pen does)."""
        if not isinstance(h, Tensor) or not h.is_floating_point() or h.dim() not in (2, 3) or h.shape[-1] != self.sizes["e"]:
            raise PenroseShapeError(f"h must be float (t, {self.sizes['e']}) or (b, t, {self.sizes['e']}), got "
                                    f"{tuple(h.shape) if isinstance(h, Tensor) else type(h).__name__}")
        args = self.concept_inputs(h.shape[:-1], h.device, intervene_known, intervene_unknown, positions, dense_heads)
        return self._from_hidden(h, **args)

    def concept_inputs(self, shape, device, intervene_known, intervene_unknown, positions, dense_heads) -> dict:
        """The diagram's intervention inputs (pos, ksel, kval, usel, uval), ε switch (use_eps)
        and which heads are on and run blocked, for token ids of `shape` on `device`: what the
        entries of `self.net` take (train.forward_unknown_attached runs them itself)."""
        shape = tuple(shape)
        known_on, unknown_on = bool(intervene_known), bool(intervene_unknown)
        kb, ub = self._blocked("known", known_on, dense_heads), self._blocked("unknown", unknown_on, dense_heads)
        self._rule_check(known_on, unknown_on, kb, ub)
        ksel, kval = self._selection(intervene_known, self.sizes["c"], "known", device)
        usel, uval = self._selection(intervene_unknown, self.sizes["u"], "unknown", device)
        if positions is None:
            key = ("everywhere", shape, device)
            if key not in self._none:
                self._none[key] = torch.ones(shape, dtype=torch.bool, device=device)
            pos = self._none[key]
        else:
            if not isinstance(positions, Tensor) or positions.dtype != torch.bool or tuple(positions.shape) != shape:
                raise PenroseShapeError(f"positions must be a bool tensor shaped like input_ids {shape}")
            pos = positions.to(device)
        eps_key = ("use_eps", device)
        if eps_key not in self._none:
            self._none[eps_key] = torch.tensor(bool(self.concept_config["use_epsilon_correction"]), device=device)
        return {"pos": pos, "ksel": ksel, "kval": kval, "usel": usel, "uval": uval, "use_eps": self._none[eps_key],
                "known_on": known_on, "unknown_on": unknown_on, "known_blocked": kb, "unknown_blocked": ub}

    def _from_hidden(self, h, *, pos, ksel, kval, usel, uval, use_eps, known_on, unknown_on, known_blocked,
                     unknown_blocked) -> SteerlingOutput:
        heads = self._concepts(h, pos, ksel, kval, usel, uval, known_on, unknown_on, known_blocked, unknown_blocked)
        logits, z, eps = self.net.readout(h=h, kf=heads["known_features"], uf=heads["unknown_features"], ksel=ksel,
                                          use_eps=use_eps)
        return self.output_record(logits, h, eps, z, known_on, unknown_on, **heads)

    def output_record(self, logits, h, eps, z, known_on, unknown_on, **heads) -> SteerlingOutput:
        """The SteerlingOutput of a pass's tensors (ε reported only while it is on)."""
        eps_on = bool(self.concept_config["use_epsilon_correction"]) and not known_on
        return SteerlingOutput(
            logits=logits, hidden=h, epsilon=eps if eps_on else None, composed=z,
            topk_known=self.sizes["kc"], topk_unknown=self.sizes["ku"],
            known_intervened=known_on, unknown_intervened=unknown_on,
            known_large=self.known_large, unknown_large=self.unknown_large,
            unknown_by_sigmoid=not self.unknown_factorised, **heads,
        )

    def _concepts(self, h: Tensor, pos: Tensor, ksel: Tensor, kval: Tensor, usel: Tensor, uval: Tensor,
                  known_on: bool, unknown_on: bool, known_blocked: bool, unknown_blocked: bool) -> dict:
        """Both concept heads on the hidden state h: a blocked head by blocked.large_head (the
        release's rules for its size class), the other by its block of the compiled diagram
        (net.known_head.known_head / unknown_head.unknown_head). Returns SteerlingOutput's head fields:
        dense logits and weights (a diagram's), features, and for a blocked head its reported
        top-k (logits, ids), the (ids, weights) its features are built from, and (unknown head)
        a function k -> its top-k (logits, ids)."""
        from penrose_zoo.steerling.blocked import large_head, select_topk

        sz, blk = self.sizes, self.concept_block
        kh, uh = self.net.known_head, self.net.unknown_head
        out: dict[str, Any] = {}
        if known_blocked:  # ranked by σ(logit): a dense head
            kf, k_log, k_idx, active = large_head(
                h, kh.concept_predictor[:sz["c"]], kh.concept_embedding[:sz["c"]], sz["kcf"], sz["kc"], block=blk,
                by_sigmoid=True, shift=(pos, ksel, kval) if known_on else None, small_rule=not self.known_large)
            out.update(known_features=kf, known_top=(k_log, k_idx), known_active=active)
        else:
            out.update(zip(("known_logits", "known_weights", "known_features"), kh.known_head(h, pos, ksel, kval)))
        hd = h.detach()  # the unknown head reads h.detach() (steerling.pen, step 5)
        if unknown_blocked:
            shift = (pos, usel, uval) if unknown_on else None
            small = not self.unknown_large
            if self.unknown_factorised:  # through the rank space, ranked by logit (concepts_unknown.pen)
                x, pred, by_sigmoid = hd @ uh.predictor_down.mT, uh.predictor_up[:sz["u"]], False
                r, u_log, u_idx, active = large_head(x, pred, uh.embedding_coef[:sz["u"]], sz["ku"], sz["ku"], block=blk,
                                                     shift=shift, small_rule=small)
                uf = r @ uh.embedding_basis.mT
            else:  # dense, ranked by σ(logit) (concepts_unknown_dense.pen)
                x, pred, by_sigmoid = hd, uh.concept_predictor[:sz["u"]], True
                uf, u_log, u_idx, active = large_head(x, pred, uh.concept_embedding[:sz["u"]], sz["ku"], sz["ku"],
                                                      block=blk, by_sigmoid=True, shift=shift, small_rule=small)
            out.update(unknown_features=uf, unknown_top=(u_log, u_idx), unknown_active=active,
                       unknown_select=functools.partial(select_topk, x, pred, block=blk, by_sigmoid=by_sigmoid))
        else:
            out.update(zip(("unknown_logits", "unknown_weights", "unknown_features"), uh.unknown_head(hd, pos, usel, uval)))
        return out

    # -- the ConceptLM protocol (penrose_zoo.steerling.attribution) -----------------------------------
    def embed(self, input_ids: Tensor) -> Tensor:
        """Token embeddings (rows of the tied table), the backbone's input: (..., t) -> (..., t, e)."""
        self.check_input_ids(input_ids)
        return self.net.tok_emb[input_ids]

    def lm_head_weight(self) -> Tensor:
        """The LM head (v, e): the token embedding table (tied); logits = composed · Wᵀ."""
        return self.net.tok_emb

    def concept_embeddings(self, kind: str, ids: Tensor | None = None) -> Tensor:
        """Rows of the concept tables: known K (n, e); unknown U = coef · basisᵀ (m, e) (a dense
        unknown head: its own table), built only for `ids` (any shape) when given."""
        if kind == "known":
            K = self.net.known_head.concept_embedding[: self.sizes["c"]]
            return K if ids is None else K[ids]
        if kind == "unknown":
            uh = self.net.unknown_head
            if not self.unknown_factorised:  # concepts_unknown_dense.pen: one embedding per concept
                U = uh.concept_embedding[: self.sizes["u"]]
                return U if ids is None else U[ids]
            C = uh.embedding_coef[: self.sizes["u"]]
            return (C if ids is None else C[ids]) @ uh.embedding_basis.T
        raise ValueError(f"kind must be 'known' or 'unknown', got {kind!r}")

    def _positional(self, spec, n: int, what: str, shape, device) -> tuple[Tensor, Tensor]:
        """(chosen (n,) bool, values (*shape, n)) from {id: float | (*shape) tensor}."""
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        val = torch.zeros(*shape, n, dtype=self.weight_dtype, device=device)
        if not spec:
            return sel, val
        if not isinstance(spec, dict):
            raise PenroseShapeError(f"intervene_{what} must be a dict {{concept id: weight}}, got {type(spec).__name__}")
        for cid, value in spec.items():
            if isinstance(cid, bool) or not isinstance(cid, int) and not (isinstance(cid, Tensor) and cid.numel() == 1):
                raise PenroseShapeError(f"intervene_{what}: concept id {cid!r} is not an integer")
            cid = int(cid)
            if not 0 <= cid < n:
                raise PenroseShapeError(f"intervene_{what}: concept id {cid} is out of range; the {what} head has {n} concepts (0..{n - 1})")
            if isinstance(value, Tensor) and value.numel() != 1:
                if tuple(value.shape) != tuple(shape):
                    raise PenroseShapeError(f"intervene_{what}: values for concept {cid} have shape {tuple(value.shape)}, expected {tuple(shape)} (the tokens)")
                v = value.detach().to(device=device, dtype=self.weight_dtype)
                if not torch.isfinite(v).all():
                    raise PenroseShapeError(f"intervene_{what}: the weights for concept {cid} are not all finite")
                val[..., cid] = v
            else:
                w = float(value)
                if not math.isfinite(w):
                    raise PenroseShapeError(f"intervene_{what}: the weight for concept {cid} is {w}, not a finite number")
                val[..., cid] = w
            sel[cid] = True
        return sel, val

    def forward_from_embeddings(self, x: Tensor, intervene_known: dict | None = None,
                                intervene_unknown: dict | None = None, positions: Tensor | None = None,
                                known_gt_features: Tensor | None = None,
                                teacher_forcing: float = 1.0) -> SteerlingOutput:
        """The forward pass from token embeddings x (b, t, e) or (t, e), differentiable in x
        (the diagram steerling[_causal]_embeddings.pen). Interventions as in `forward`, but a
        value may also be a per-position tensor shaped like the tokens. known_gt_features
        (b, t, e): the LM head reads teacher_forcing · k̂_gt + (1 − teacher_forcing) · k̂ (this
        matters only with ε off: with ε on the head reads h whatever k̂ is)."""
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() not in (2, 3) or x.shape[-1] != self.sizes["e"]:
            raise PenroseShapeError(f"x must be float embeddings (t, {self.sizes['e']}) or (b, t, {self.sizes['e']}), got "
                                    f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        shape, device = tuple(x.shape[:-1]), x.device
        if shape[-1] > self.model_config["block_size"]:
            raise PenroseShapeError(f"x has {shape[-1]} tokens, longer than the context (block_size = {self.model_config['block_size']})")
        self._rule_check(bool(intervene_known), bool(intervene_unknown), False, False)  # every head dense here
        ksel, kval = self._positional(intervene_known, self.sizes["c"], "known", shape, device)
        usel, uval = self._positional(intervene_unknown, self.sizes["u"], "unknown", shape, device)
        if positions is None:
            pos = torch.ones(shape, dtype=torch.bool, device=device)
        else:
            if not isinstance(positions, Tensor) or positions.dtype != torch.bool or tuple(positions.shape) != shape:
                raise PenroseShapeError(f"positions must be a bool tensor shaped like the tokens {shape}")
            pos = positions.to(device)
        if known_gt_features is None:
            kgt, tf = torch.zeros(*shape, self.sizes["e"], device=device, dtype=x.dtype), 0.0
        else:
            if tuple(known_gt_features.shape) != tuple(x.shape):
                raise PenroseShapeError(f"known_gt_features has shape {tuple(known_gt_features.shape)}, expected {tuple(x.shape)}")
            kgt, tf = known_gt_features.to(device=device, dtype=x.dtype), float(teacher_forcing)
        use_eps = torch.tensor(bool(self.concept_config["use_epsilon_correction"]), device=device)
        o = self.net.embeddings(x=x, kpos=pos, ksel=ksel, kval=kval, upos=pos, usel=usel, uval=uval,
                                  use_eps=use_eps, kgt=kgt, tf=torch.tensor(tf, device=device, dtype=x.dtype))
        known_on = bool(intervene_known)
        eps_on = bool(self.concept_config["use_epsilon_correction"]) and not known_on
        return SteerlingOutput(
            logits=o.logits, hidden=o.h,
            known_logits=o.kl, known_weights=o.kw, known_features=o.kf,
            unknown_logits=o.ul, unknown_weights=o.uw, unknown_features=o.uf,
            epsilon=o.eps if eps_on else None, composed=o.z,
            topk_known=self.sizes["kc"], topk_unknown=self.sizes["ku"],
            known_intervened=known_on, unknown_intervened=bool(intervene_unknown),
            known_large=self.known_large, unknown_large=self.unknown_large,
        )

    def num_parameters(self) -> int:
        """Distinct parameters (the tied embedding once)."""
        return sum(p.numel() for p in self.net.parameters())


__all__ = [  # the module's own names and those it re-exports from config, release and outputs
    "BYTE_MASK_ID", "CONCEPT_DEFAULTS", "DEFAULT_HEADS", "DIAGRAM", "EMBEDDING_DIAGRAM", "EMBEDDING_KEY", "HERE",
    "HIDDEN_DIAGRAM", "LARGE_CONCEPT_THRESHOLD", "MODEL_DEFAULTS", "NORM_EPS", "OUTPUT_FIELDS", "PLAIN_DIAGRAM",
    "READOUT_DIAGRAM", "RELEASE_INSTRUCT_VOCAB_SIZE", "RELEASE_MASK_ID", "RELEASE_NAMES", "RELEASE_VOCAB_SIZE",
    "TIED_KEY", "CheckpointError", "Steerling", "SteerlingOutput", "check_release_state_dict", "concept_parts",
    "diagram_sizes", "full_configs", "release_key", "release_names", "with_heads",
]
