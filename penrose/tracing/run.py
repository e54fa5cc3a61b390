"""`penrose.trace`: export, lower, write, check and verify."""

from __future__ import annotations

import logging
import os
import re
import traceback
import warnings
from contextlib import contextmanager

import torch

from penrose.errors import PenroseError, PenroseWarning
from penrose.loader import _caller_level
from penrose.tracing.errors import PenroseTraceError, span_at
from penrose.tracing.lower import BatchAxis, Lowerer, _in_torch
from penrose.tracing.moe import dense_experts
from penrose.tracing.write import Writer, made_init, ok_name


@contextmanager
def _quiet():
    """torch.export logs the graph of a failed trace, and prints it on stderr (`partial_fx_graph`);
    the error says what matters: the logs are muted, and what export writes on stderr is held back
    and written out after it, less the graph of a failure."""
    import io
    import sys

    names = ["torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export", "torch._dynamo", "torch._subclasses"]
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for lg, _ in saved:
        lg.setLevel(logging.CRITICAL)
    held, real = io.StringIO(), sys.stderr
    sys.stderr = held
    failed = None
    try:
        yield
    except Exception as e:
        failed = e
        raise
    finally:
        sys.stderr = real
        for lg, level in saved:
            lg.setLevel(level)
        text = held.getvalue()
        graph = str(getattr(failed, "partial_fx_graph", "") or "")
        if graph:
            text = text.replace(graph + "\n", "").replace(graph, "")
        if text.strip():
            real.write(text)


def _user_frame(exc):
    """The innermost frame of the user's code in an exception's traceback."""
    best = None
    stdlib = os.path.dirname(os.__file__)
    for fr in traceback.extract_tb(exc.__traceback__):
        if not _in_torch(fr.filename) and not fr.filename.startswith((os.path.dirname(__file__), stdlib + os.sep)) \
                and os.path.exists(fr.filename):
            best = fr
    return best


def _call_options(module) -> dict:
    """Keyword arguments trace calls the module with: `use_cache=False` where forward takes it
    (Hugging Face models return a key/value cache for generation by default, which no diagram holds;
    the other outputs are the same either way)."""
    import inspect

    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"use_cache": False} if "use_cache" in params else {}


def _export(module, inputs, options=None):
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        with _quiet():
            return torch.export.export(module, tuple(inputs), dict(options or {}), strict=False)
    except Exception as e:  # noqa: BLE001 - every failure of the trace is reported at the user's line
        fr = _user_frame(e)
        span = span_at(fr.filename, fr.lineno) if fr else None
        cache = re.search(r"Found <class '[\w.]*?(\w*Cache)'> in output", str(e))
        if isinstance(e, GuardOnDataDependentSymNode) or "data-dependent" in str(e):
            what = "control flow that depends on tensor values (a data-dependent branch or size)"
        elif cache:
            what = (f"a {cache.group(1)} in the module's outputs (a key/value cache for generation: "
                    "call the model with use_cache=False inside the module you trace)")
        else:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            what = f"an operation torch.export cannot trace ({type(e).__name__}: {first[:200]})"
        raise PenroseTraceError(f"{what} cannot be expressed in .pen", span) from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _hints(dims, inputs, module):
    """{(input, axis): name} from dims= (a mapping name -> axis or (input, axis)), every part
    type-checked: a clear PenroseTraceError, never an AttributeError."""
    from collections.abc import Mapping

    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise PenroseTraceError(f"dims= takes a mapping of dim names to axes, e.g. {{'b': 0, 't': 1}} or {{'t': (1, 0)}}, "
                                f"not a {type(dims).__name__} ({dims!r:.40})")
    out: dict = {}
    params = {k.rsplit(".", 1)[-1] for k in module.state_dict()}
    for name, where in dims.items():
        if not isinstance(name, str) or not ok_name(name):
            raise PenroseTraceError(f"dims=: {name!r} is not a usable dim name")
        if name in params:
            raise PenroseTraceError(f"dims=: {name!r} is the name of a parameter or buffer; a dim needs another")
        if _is_int(where):
            idx, axis = 0, where
        elif isinstance(where, (tuple, list)) and len(where) == 2 and all(_is_int(w) for w in where):
            idx, axis = where
        else:
            raise PenroseTraceError(f"dims=: {name!r} maps to {where!r}; expected an axis of the first input (an int) "
                                    "or (input, axis), two ints")
        if not 0 <= idx < len(inputs) or not -inputs[idx].dim() <= axis < inputs[idx].dim():
            raise PenroseTraceError(f"dims=: {name!r} names axis {axis} of input {idx}, which it does not have")
        key = (idx, axis % inputs[idx].dim())
        if key in out:
            raise PenroseTraceError(f"dims=: {out[key]!r} and {name!r} both name axis {key[1]} of input {key[0]}")
        out[key] = name
    return out


def trace_module(module, inputs, *, dims=None, verify=True, notes=False, batch=None, title=None) -> str:
    if not isinstance(module, torch.nn.Module):
        raise PenroseTraceError(f"trace takes a torch.nn.Module, not {type(module).__name__}")
    if not inputs:
        raise PenroseTraceError("trace needs example inputs: penrose.trace(module, x, ...)")
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise PenroseTraceError(f"example input {i + 1} is a {type(x).__name__}; the inputs of a diagram are tensors")
    for flag, value in (("verify", verify), ("notes", notes)):
        if not isinstance(value, bool):
            raise PenroseTraceError(f"{flag}= takes True or False, not {value!r}")
    if batch is not None and not isinstance(batch, bool):
        raise PenroseTraceError(f"batch= takes None, True or False, not {batch!r}")
    if title is not None and not isinstance(title, str):
        raise PenroseTraceError(f"title= takes a string, not {type(title).__name__}")
    hints = _hints(dims, inputs, module)
    options = _call_options(module)
    was_training = module.training
    module.eval()
    try:
        with dense_experts(module, inputs, options) as moe_notes:
            text, unused = _trace_eval(module, inputs, options, moe_notes, hints=hints, notes=notes, batch=batch,
                                       title=title)
    finally:
        module.train(was_training)
    if verify:  # as the user calls it (without use_cache=False), its mixtures of experts sparse
        _verify(text, module, inputs, ignore=unused)
    return text


def _trace_eval(module, inputs, options, moe_notes, *, hints, notes, batch, title) -> tuple[str, set]:
    """`trace_module` on a module in eval mode, its mixtures of experts in their dense form."""
    with _result_places(module) as places:
        ep = _export(module, inputs, options)
    out_names = _output_names(getattr(ep.call_spec, "out_spec", None))
    first = inputs[0]
    named_batch = any(axis == 0 for (_i, axis) in hints)
    try_batch = batch is not False and not named_batch and first.dim() >= 1
    if batch is True and not try_batch:
        raise PenroseTraceError("batch=True, but axis 0 is named by dims= (or the first input is a scalar)")
    low = None
    if try_batch:
        try:
            low = _lower(ep, module, inputs, True, hints, out_names)
        except BatchAxis:
            if batch is True:
                raise PenroseTraceError("batch=True, but the module mixes axis 0 of its inputs with other axes") from None
            low = None
    auto_batch = False  # the trace made axis 0 a leg itself: it must stay free
    if low is None:
        auto_batch = batch is None and not named_batch and first.dim() >= 1
        if not named_batch and first.dim() >= 1:
            hints = dict(hints)
            taken = set(hints.values()) | {k.rsplit(".", 1)[-1] for k in module.state_dict()}
            hints[(0, 0)] = next(n for n in ("b", "n", "batch", "nb", "bb") if n not in taken)
        try:
            low = _lower(ep, module, inputs, False, hints, out_names)
        except BatchAxis:  # pragma: no cover - explicit mode has no batch axis
            raise PenroseTraceError("internal: a batch axis in explicit mode") from None
    name = title or f"{type(module).__module__}.{type(module).__qualname__}"
    shapes = ", ".join("[" + ", ".join(str(s) for s in x.shape) + "]" for x in inputs)
    header = [f"# Traced from {name} by penrose.trace (example inputs {shapes})."]
    header += moe_notes
    dropped = _dropped(module, inputs) if options else []
    if dropped:
        header.append(f"# Not an output: {', '.join(dropped)} (a key/value cache for generation, which forward returns by "
                      "default): traced as called with use_cache=False, which gives the same other outputs.")
    if out_names:
        kind = ep.call_spec.out_spec.type.__name__
        header.append(f"# The outputs are the fields of the {kind} forward returns, in its order ({', '.join(out_names)}): "
                      "the compiled model returns them as a tuple.")
    if low.none_outputs:
        places = ", ".join(map(str, low.none_outputs))
        header.append(f"# Not an output: the None forward returns at place {places} of its tuple (the compiled model "
                      "returns the tensors only).")
    if low.batch:
        header.append("# Axis 0 of the inputs is their batch: every input takes leading batch dims.")
    inputs_legs = [c for v in low.input_views for c in v.pval.legs]
    for leg in low.position_legs:  # positions made in forward, from `~ arange` buffers, on an input's axis
        if any(low.C.same(leg, c) for c in inputs_legs):
            low.fixed_length.append((leg.size, None))
    if low.fixed_length:
        lengths = sorted({n for n, _ in low.fixed_length})
        tables = ", ".join(dict.fromkeys(t for _, t in low.fixed_length if t))
        made = any(t is None for _, t in low.fixed_length)
        why = " and ".join(([f"slices of position tables ({tables})"] if tables else [])
                           + (["positions made in forward (`~ arange` buffers)"] if made else []))
        header.append(f"# Takes {' or '.join(map(str, lengths))} tokens only: {why} fix the "
                      "token count to the example's (trace again for another length; docs/trace.md, \"Other limits\").")
    for model_dtype, cast, where, code in low.downcasts:
        header.append(f"# Computes in {model_dtype} where the module casts to {cast} at {where}{code}: its values differ "
                      f"from the module's by that rounding (docs/trace.md, \"Casts\").")
    if low.downcasts:  # one warning for them all
        model_dtype = low.downcasts[0][0]
        casts = "; ".join(f"{where}{code} casts to {cast}" for _, cast, where, code in low.downcasts)
        warnings.warn(f"penrose.trace: {casts}, below the model's {model_dtype}; the diagram computes in {model_dtype}, "
                      "so its values differ from the module's by that rounding", PenroseWarning,
                      stacklevel=_caller_level())  # the user's line that called penrose.trace
    if low.kept:
        shown = ", ".join(f"{k} (the same tensor as {a})" for k, a in low.kept[:4]) + (" ..." if len(low.kept) > 4 else "")
        header.append(f"# Tied: {shown}, of a submodule forward never calls, handed up unread by a call of it so that "
                      "the state dict loads strictly (the compiled model holds them as separate params).")
    if low.unused:
        shown = ", ".join(low.unused[:6]) + (f" ... ({len(low.unused)} in all)" if len(low.unused) > 6 else "")
        header.append(f"# Not in the diagram: {shown} (of submodules forward never calls; load with strict=False).")
        warnings.warn(f"penrose.trace: {shown} belong to submodules that forward never calls, so they are not in the "
                      "diagram: load the module's state dict with strict=False", PenroseWarning,
                      stacklevel=_caller_level())  # the user's line that called penrose.trace
    transient = sorted(t for r in low.regions.values() for t, p in r.params.items() if not p.persistent and p.made is None
                       and made_init(p.value) is None)
    if transient:  # registered with persistent=False, values no init makes: saved buffers of the diagram, not in module.state_dict()
        shown = ", ".join(transient[:6]) + (f" ... ({len(transient)} in all)" if len(transient) > 6 else "")
        header.append(f"# Buffers registered with persistent=False: {shown}; load them with the state dict: "
                      "{**module.state_dict(), **dict(module.named_buffers())}.")
    low.result_places = places
    text = Writer(low, name, notes=notes).write(header)
    text = _canonical(text)
    if (auto_batch or batch is False) and not named_batch and first.dim() >= 1 and not _batch_free(text):
        size = int(first.shape[0])
        if auto_batch:  # would refuse every other batch at run time: say so now, where it happens
            raise PenroseTraceError(
                f"the module merges its batch with other axes into one, which the diagram can write only as a leg of "
                f"the batch's size, so the traced diagram would run a batch of {size} only; trace with batch=False to "
                "accept that", low.fixed_batch[0] if low.fixed_batch else low.batch_fix_site())
        lines = text.split("\n")
        lines.insert(1, f"# Takes a batch of {size} only: the module merges its batch with other axes into one (batch=False).")
        text = _canonical("\n".join(lines))
    elif (auto_batch or batch is False) and not named_batch and first.dim() >= 1:
        fixed = _fixed_batch_elsewhere(text, module, inputs)
        if fixed is not None and auto_batch:  # would refuse every other batch at run time: say so now
            i, axis, size = fixed
            raise PenroseTraceError(
                f"the module's batch is axis {axis} of input {i + 1} (size {size}), not axis 0, which trace reads as the "
                f"batch; the diagram would fix it and run a batch of {size} only. Give the module its batch first (for "
                f"nn.MultiheadAttention, batch_first=True; or transpose before the call), or trace with batch=False to "
                "accept a fixed batch", _first_use(low, i))
        if fixed is not None:
            lines = text.split("\n")
            lines.insert(1, f"# Takes a batch of {fixed[2]} only: the module's batch is axis {fixed[1]} of input "
                            f"{fixed[0] + 1}, not axis 0 (batch=False).")
            text = _canonical("\n".join(lines))
    return text, set(low.unused)


def _fixed_batch_elsewhere(text, module, inputs):
    """(input, axis, size) of an axis the diagram fixes that is the module's batch, or None. A batch's
    items are computed apart: changing item 0 of the float inputs along it changes item 0 of an output
    along an axis of that size and leaves the other items as they were. When axis 0 of the first input
    (the diagram's batch) is not so (the tokens of `nn.MultiheadAttention` with batch_first=False,
    which attention mixes) and an axis the diagram fixes is, that axis is the module's batch."""
    from penrose.checker import check
    from penrose.parser import parse

    checked = check(parse(text))
    decls = [d for d in checked.decls.values() if d.tensor.kind == "input"]
    if len(decls) != len(inputs) or any(len(d.type.cls) != x.dim() for d, x in zip(decls, inputs)):
        return None
    where: dict = {}  # leg -> [(input, axis)], in the order of the inputs
    for i, d in enumerate(decls):
        for axis, leg in enumerate(d.type.cls):
            where.setdefault(leg, []).append((i, axis))
    first = decls[0].type.cls[0]
    floats = [i for i, x in enumerate(inputs) if x.is_floating_point()]

    def apart(places) -> bool:
        size = int(inputs[places[0][0]].shape[places[0][1]])
        if size < 2 or not any(j in floats for j, _ in places):
            return False
        moved = list(inputs)
        for j, a in places:
            if j in floats:
                moved[j] = moved[j].clone()
                moved[j].select(a, 0).add_(1.0)
        try:
            out = [o for o in output_values(module(*moved)) if o.is_floating_point()]
        except Exception:  # noqa: BLE001 - not a change the module takes: not its batch
            return False
        return _apart(base, out, size)

    with torch.no_grad():
        try:
            base = [o for o in output_values(module(*inputs)) if o.is_floating_point()]
        except Exception:  # noqa: BLE001 - verify runs the module as well and reports what fails there
            return None
        if apart(where[first]):  # axis 0 is a batch: the diagram's is the module's
            return None
        for leg, places in where.items():
            if leg != first and not checked.sizes.is_free(leg) and apart(places):
                i, axis = places[0]
                return i, axis, int(inputs[i].shape[axis])
    return None


def _apart(base, out, size) -> bool:
    """Whether each output has an axis of `size` along which only item 0 changed."""
    if not base or len(base) != len(out):
        return False
    for b, o in zip(base, out):
        if b.shape != o.shape:
            return False
        found = False
        for a in range(b.dim()):
            if b.shape[a] != size:
                continue
            rest_b, rest_o = b.narrow(a, 1, size - 1), o.narrow(a, 1, size - 1)
            if torch.allclose(rest_b, rest_o, rtol=1e-5, atol=1e-6) and not torch.allclose(b.select(a, 0), o.select(a, 0)):
                found = True
                break
        if not found:
            return False
    return True


def _first_use(low, i):
    """The user's line where input `i` is first read (where a refusal about it points)."""
    user = [n for n in low.ep.graph.nodes if n.op == "placeholder" and low.placeholders.get(n.name, ("USER_INPUT",))[0] == "USER_INPUT"]
    if i >= len(user):
        return None
    for node in low.ep.graph.nodes:
        if node.op == "call_function" and user[i] in node.all_input_nodes:
            span = low.where(node)
            if span is not None:
                return span
    return None


@contextmanager
def _result_places(module):
    """Yields {fqn: which places of the tuple a submodule's call returns hold a tensor} (its first
    call's), filled while torch.export runs forward: for the writer to name a call's one tensor as the
    user's line does (`_, top_k_weights, top_k_index = self.gate(x)`: `top_k_weights`, the one target
    at a tensor's place). No forward of its own: a module that updates its state is run once."""
    places: dict = {}

    def hook(fqn):
        def record(_mod, _args, out):
            if isinstance(out, (tuple, list)):
                places.setdefault(fqn, tuple(isinstance(v, torch.Tensor) for v in out))
        return record

    handles = [sub.register_forward_hook(hook(fqn)) for fqn, sub in module.named_modules() if fqn]
    try:
        yield places
    finally:
        for h in handles:
            h.remove()


def _dropped(module, inputs) -> list:
    """The fields of the module's output as called without use_cache=False that are not tensors
    (Hugging Face's past_key_values, a DynamicCache): what the diagram leaves out."""
    from collections.abc import Mapping

    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(*inputs)
    except Exception:  # noqa: BLE001 - only for the header's note; the trace itself called it with use_cache=False
        return []
    finally:
        module.train(was)
    if not isinstance(out, Mapping):
        return []
    return [f"{k} (a {type(v).__name__})" for k, v in out.items() if v is not None and not isinstance(v, torch.Tensor)]


def _output_names(spec):
    """The field names of a mapping the module returns (a Hugging Face ModelOutput, a dict), in its
    order, for the diagram's outputs; None for a tensor or a tuple of tensors. A ModelOutput holds no
    None fields; a field that is not a tensor (a cache, a tuple of hidden states) is refused."""
    kind = getattr(spec, "type", None)
    if kind is None or kind in (tuple, list):
        return None
    from collections.abc import Mapping

    keys = spec.context if isinstance(spec.context, (list, tuple)) else None
    if not (isinstance(kind, type) and issubclass(kind, Mapping)) or keys is None:
        raise PenroseTraceError(f"the module returns a {kind.__name__}; a diagram's outputs are a tensor, a tuple of tensors "
                                "or a mapping (a ModelOutput) of tensors")
    children = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs
    for key, child in zip(keys, children):
        if getattr(child, "type", None) is not None:
            raise PenroseTraceError(f"the module returns a {kind.__name__} whose field {key!r} is a "
                                    f"{child.type.__name__}, not a tensor; a diagram's outputs are tensors "
                                    "(output_hidden_states=False, output_attentions=False keep them out)")
    return [str(k) for k in keys]


def output_values(out) -> list:
    """A module's outputs as a list of tensors in the diagram's order: a tensor, a tuple, or the
    tensor fields of a mapping (a ModelOutput; its cache and None fields are not in the diagram)."""
    from collections.abc import Mapping

    if isinstance(out, Mapping):
        return [v for v in out.values() if isinstance(v, torch.Tensor)]
    return [v for v in out if v is not None] if isinstance(out, (tuple, list)) else [out]


def _lower(ep, module, inputs, batch, hints, out_names=None):
    low = Lowerer(ep, module, inputs, batch=batch, hints=hints)
    low.output_names = out_names
    low.batch_size = int(inputs[0].shape[0]) if batch else None
    low.run()
    return low


def _canonical(text: str) -> str:
    from penrose.checker import check
    from penrose.fmt import format_diagram
    from penrose.parser import parse

    try:
        out = format_diagram(parse(text))
        check(parse(out))
    except PenroseError as e:
        raise PenroseTraceError(f"internal: the traced diagram does not check: {e.message}\n--- the text ---\n{text}") from None
    return out


def _batch_free(text) -> bool:
    """Whether the compiled diagram reads the size of axis 0 of its first input at run time."""
    from penrose.checker import check
    from penrose.parser import parse

    checked = check(parse(text))
    first = next(d for d in checked.decls.values() if d.tensor.kind == "input")
    return not first.type.cls or checked.sizes.is_free(first.type.cls[0])


def _verify(text, module, inputs, ignore=frozenset()):
    from penrose.compiler import build
    from penrose.loader import load_entries

    model = build(load_entries(None, text=text)[0])  # quiet: the traced text's own warnings are no PenroseWarning here
    ref = next((t for t in list(module.parameters()) + list(module.buffers()) + list(inputs) if t.is_floating_point()), None)
    if ref is not None:
        model = model.to(dtype=ref.dtype, device=ref.device)
    missing, unexpected = model.load_state_dict(module.state_dict(), strict=False)
    unexpected = [k for k in unexpected if k not in ignore]  # never read by forward: not in the diagram
    if unexpected or missing:
        state = dict(module.named_buffers())
        missing = [k for k in missing if k not in state]
        if missing or unexpected:
            raise PenroseTraceError(
                "the traced diagram does not hold the module's state: "
                + (f"missing {', '.join(missing[:5])}" if missing else "")
                + (f"; unexpected {', '.join(unexpected[:5])}" if unexpected else ""))
        model.load_state_dict({**module.state_dict(), **{k: v for k, v in state.items()}}, strict=False)
    was = module.training
    module.eval()
    model.eval()
    try:
        with torch.no_grad():
            want = module(*inputs)
            got = model(*inputs)
    finally:
        module.train(was)
    want = output_values(want)
    got = output_values(got)
    if len(want) != len(got):
        raise PenroseTraceError(f"internal: the diagram has {len(got)} outputs, the module {len(want)}")
    for i, (w, g) in enumerate(zip(want, got)):
        if tuple(w.shape) != tuple(g.shape):
            raise PenroseTraceError(f"internal: output {i + 1} has shape {tuple(g.shape)} in the diagram, {tuple(w.shape)} in the module")
        if w.is_floating_point():
            w, g = _where_the_module_has_values(w, g.to(w.dtype), i)
            tol = 1e-4 if w.dtype in (torch.float32, torch.float64) else 1e-2
            scale = max(1.0, float(w[torch.isfinite(w)].abs().max())) if bool(torch.isfinite(w).any()) else 1.0
            if not torch.allclose(w, g, rtol=tol, atol=tol * scale, equal_nan=True):
                err = (w - g).abs().max().item()
                raise PenroseTraceError(f"internal: output {i + 1} of the traced diagram differs from the module's (max error {err:.3g})")
        elif not torch.equal(w, g):
            raise PenroseTraceError(f"internal: output {i + 1} of the traced diagram differs from the module's")


def _where_the_module_has_values(want, got, i):
    """The module's output and the diagram's at the values the module defines. Where the module's
    own arithmetic gives NaN and the diagram's a number (regression, issue 38: OPT in float64 with a
    left-padded row fills its mask with float64's minimum and takes the softmax in float32, where
    that fill is -inf; a query that sees no key is 0/0, and the next layer spreads it to every token),
    there is nothing to compare: a warning says how many, and the rest is verified. A module with
    no value at all verifies nothing: refused, naming the module, not the diagram."""
    theirs = torch.isnan(want) & ~torch.isnan(got)
    if not bool(theirs.any()):
        return want, got
    n, total = int(theirs.sum()), want.numel()
    if n == total:
        raise PenroseTraceError(f"output {i + 1} of the module is NaN at every value (the module's own arithmetic, "
                                "not the diagram's): nothing to verify the diagram against; trace with other example "
                                "inputs, or with verify=False")
    warnings.warn(f"penrose.trace: output {i + 1} of the module is NaN at {n} of its {total} values, where the traced "
                  "diagram has numbers (the module's own arithmetic: a float cast noted above, or a row its mask "
                  f"hides entirely); the diagram is verified at the other {total - n}", PenroseWarning,
                  stacklevel=_caller_level())  # the user's line that called penrose.trace
    keep = ~theirs
    return want[keep], got[keep]

# ---- `penrose trace MODULE:CLASS --input SHAPE ...` ---------------------------------------------------------
def load_class(target: str):
    """The class named by MODULE:CLASS, MODULE a dotted import path or a .py file."""
    import importlib
    import importlib.util
    import sys

    mod_name, sep, cls_name = target.rpartition(":")
    if not sep or not mod_name or not cls_name:
        raise PenroseTraceError(f"trace: expected MODULE:CLASS (a dotted module or a .py file, then the class), got {target!r}")
    if mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name:
        path = os.path.abspath(mod_name)
        if not os.path.isfile(path):
            raise PenroseTraceError(f"trace: cannot read {mod_name}: No such file")
        name = os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(path)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"no importer for {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file failing to import is reported, not a traceback
            raise PenroseTraceError(f"trace: importing {mod_name} failed: {type(e).__name__}: {e}") from None
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except Exception as e:  # noqa: BLE001
            raise PenroseTraceError(f"trace: cannot import {mod_name}: {type(e).__name__}: {e}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise PenroseTraceError(f"trace: {mod_name} has no {cls_name!r}")
    return cls


MAX_EXAMPLE_ENTRIES = 1 << 26  # the largest example input `penrose trace --input` makes (256 MiB as float32)


def parse_shape(text: str):
    """SHAPE: `4,16` or `4x16`, optionally `:int` or `:bool` (integer ids, a mask)."""
    body, _, dtype = text.partition(":")
    parts = [p for p in body.replace("x", ",").replace("X", ",").split(",") if p.strip()]
    import math
    import re

    ok = all(re.fullmatch(r"[0-9]+", p.strip()) for p in parts)  # ASCII digits only: int() would read "٣" as 3
    shape = [int(p) for p in parts] if ok else None
    if shape is None or dtype not in ("", "float", "int", "long", "bool"):
        raise PenroseTraceError(f"--input expects a shape such as 4,16 or 4x16 (optionally :int or :bool), got {text!r}")
    if math.prod(shape) > MAX_EXAMPLE_ENTRIES:
        raise PenroseTraceError(f"--input {text!r}: an example input of {math.prod(shape):,} entries is over the limit of "
                                f"{MAX_EXAMPLE_ENTRIES:,}; trace with a small example (sizes are read from it)")
    g = torch.Generator().manual_seed(0)
    if dtype in ("int", "long"):
        return torch.randint(0, 2, shape, generator=g)
    if dtype == "bool":
        return torch.rand(shape, generator=g) > 0.5
    return torch.randn(shape, generator=g)


def trace_command(target: str, shapes, dims=(), verify=True, notes=False) -> str:
    cls = load_class(target)
    try:
        module = cls()
    except Exception as e:  # noqa: BLE001
        raise PenroseTraceError(f"trace: {target} cannot be constructed without arguments: {type(e).__name__}: {e}") from None
    if not isinstance(module, torch.nn.Module):
        raise PenroseTraceError(f"trace: {target} is not a torch.nn.Module")
    if not shapes:
        raise PenroseTraceError("trace: give the example inputs' shapes with --input SHAPE (one per input)")
    inputs = [parse_shape(s) for s in shapes]
    hints: dict[str, int] = {}
    for item in dims or ():
        import re

        name, _, axis = item.partition("=")
        if not re.fullmatch(r"-?[0-9]+", axis.strip()):
            raise PenroseTraceError(f"--dim expects NAME=AXIS (an axis of the first input, ASCII digits), got {item!r}")
        if name.strip() in hints and hints[name.strip()] != int(axis):
            raise PenroseTraceError(f"--dim {name.strip()} is given twice, as axes {hints[name.strip()]} and {int(axis)}")
        hints[name.strip()] = int(axis)
    mod_name, _, cls_name = target.rpartition(":")
    title = f"{os.path.basename(mod_name)}:{cls_name}" if mod_name.endswith(".py") else target
    return trace_module(module, inputs, dims=hints, verify=verify, notes=notes, title=title)
