"""From a `torch.export` graph to penrose statements, one block per submodule call.

Every ATen node the language can say becomes a statement (or only a new view, for transposes
and permutes); everything else is a `PenroseTraceError` at the user's line. In batch mode the
leading axis of the inputs is the implicit batch of every penrose input; an op that would touch
it raises `BatchAxis`, and the tracer starts again with that axis as a named leg.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections import defaultdict

import torch

from penrose.ops import OPS
from penrose.trace.errors import PenroseTraceError, frames, span_at
from penrose.trace.model import (
    BATCH, BinOp, Call, CallStmt, Classes, Cls, Einsum, Leg, LegClash, LegList, Neg, Num, Pattern, PVal, Ref, Region,
    Stmt, Str, TensorList, View,
)

INT64_MAX = 2**63 - 1


class BatchAxis(Exception):
    """The leading axis is not a batch axis for this op: trace again with it as a named leg."""


_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)

# aten name -> .pen function: the element-wise rows of the table that name their ATen op (an
# op_NAME handler below takes precedence: gelu's approximate form, softplus's beta)
UNARY = {row.aten: name for name, row in OPS.items() if row.aten is not None and not row.keywords}
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
IDENTITY = {"contiguous", "clone", "alias", "lift_fresh_copy", "_to_copy", "to", "type_as", "view_as_real_noop"}
INPLACE_KEEP = {"index_put_", "fill_", "zero_", "copy_"}  # refused with their own reasons
VIEW_OPS = {"view", "reshape", "_unsafe_view", "transpose", "permute", "select", "slice", "expand", "unsqueeze", "squeeze",
            "t", "narrow", "split", "split_with_sizes", "chunk", "unbind", "alias", "diagonal", "as_strided", "unflatten",
            "flatten", "movedim", "swapaxes", "view_as", "expand_as", "getitem"}
# why an op the language lacks is refused, in words (the refusal names the op and the user's line too)
CAUSES = {
    **dict.fromkeys(("conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d", "_convolution"),
                    "a convolution: the language has no sliding windows (trace the layers after it, on its output)"),
    **dict.fromkeys(("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                     "max_pool2d_with_indices"), "pooling over a sliding window"),
    **dict.fromkeys(("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm", "instance_norm", "group_norm"),
                    "a norm over the batch or over groups of channels (layernorm and rmsnorm normalise one axis)"),
    **dict.fromkeys(("sort", "argsort", "argmax", "argmin", "kthvalue", "median"), "it orders values or returns indices"),
    **dict.fromkeys(("cumsum", "cumprod", "cummax", "logcumsumexp"), "a cumulative op (a running sum along an axis)"),
    **dict.fromkeys(("gather", "index", "index_put", "scatter_add", "take_along_dim"),
                    "indexing by a tensor of indices (only an embedding's rows are expressible: gather(table, ids))"),
    **dict.fromkeys(("sin", "cos", "tan", "atan", "erf", "floor", "ceil", "round", "sign"), "a function the language does not have"),
    **dict.fromkeys(("tril", "triu"), "a mask made in forward (register it as a buffer, or write causal(t, s))"),
    **dict.fromkeys(("pad", "constant_pad_nd", "reflection_pad1d", "replication_pad1d"), "padding (borders the language has no axis for)"),
    "maximum": "the element-wise maximum of two tensors (write where(a > b, a, b))",
    "minimum": "the element-wise minimum of two tensors (write where(a < b, a, b))",
}
SKIP = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_assert_async"}


def _packet(node) -> str:
    t = node.target
    name = getattr(t, "_overloadpacket", None)
    if name is not None:
        return t._overloadpacket.__name__
    return getattr(t, "__name__", str(t))


def _overload(node) -> str:
    return getattr(node.target, "_overloadname", "")


def torch_name(node) -> str:
    """How the user wrote the op: torch.sort, Tensor.chunk, F.gelu (else the ATen name)."""
    fn = node.meta.get("torch_fn")
    if fn and len(fn) == 2 and "." in fn[1]:
        owner, name = fn[1].rsplit(".", 1)
        if owner == "method-wrapper" or name.startswith("_"):
            return f"aten.{_packet(node)}"
        if owner == "method_descriptor":
            return f"Tensor.{name}"
        if owner == "function" and hasattr(torch.nn.functional, name):
            return f"F.{name}"
        if owner == "function" or owner.startswith("builtin"):
            return f"torch.{name}"
        return f"{owner}.{name}"
    return f"aten.{_packet(node)}"


class Lowerer:
    def __init__(self, ep, module, inputs, *, batch: bool, hints: dict):
        self.ep = ep
        self.module = module
        self.inputs = inputs
        self.batch = batch
        self.hints = hints  # (input index, axis) -> name
        self.C = Classes()
        self.values: dict = {}
        self.placeholders: dict = {}  # placeholder name -> (kind, target)
        self.state = dict(module.state_dict(keep_vars=True))
        # every param and buffer, non-persistent buffers too (rotary caches): the tensors forward reads
        self.tensors = {**dict(module.named_buffers(remove_duplicate=False)), **self.state}
        self.persistent = set(self.state)
        self.aliases = {}  # a state-dict name -> the other names of the same tensor (tied weights)
        by_tensor = {}
        for name, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
            by_tensor.setdefault(id(t), []).append(name)
        for names in by_tensor.values():
            for n in names:
                self.aliases[n] = [m for m in names if m != n]
        self.root = Region((), "", module, None, True)
        self.root.forward_range = _forward_range(module)
        self.regions: dict = {(): self.root}
        self.open: list = [self.root]
        self.cur = self.root
        self.node = None
        self.src = None
        self.outputs: list = []  # Views at the top level
        self.input_views: list = []
        self.batch_size = None
        self.masks: dict = {}  # a bool buffer read in a region: its `!= 0`, made once

    # ---- errors -------------------------------------------------------------------------------------
    def where(self, node=None):
        node = node or self.node
        fr = [f for f in frames(node.meta.get("stack_trace") if node is not None else None) if not _in_torch(f[0])]
        if fr:
            return span_at(fr[-1][0], fr[-1][1])
        return None

    def fail(self, message, node=None):
        node = node or self.node
        raise PenroseTraceError(message, self.deeper(node, self.where(node)))

    def deeper(self, node, span):
        """The line inside a helper function that made `node`, when export recorded only the line
        of forward that called the helper: forward runs again (eval, no grad) under a mode that
        records the Python stack of every call of the node's torch function, and the call made
        from `span`'s line names its innermost user frame."""
        fn = node.meta.get("torch_fn") if node is not None else None
        name = fn[1].rsplit(".", 1)[-1] if fn and len(fn) == 2 and isinstance(fn[1], str) else None
        if span is None or not name:
            return span
        import traceback

        from torch.overrides import TorchFunctionMode

        stacks = []

        class Record(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", None) == name:
                    stacks.append(traceback.extract_stack()[:-1])
                return func(*args, **(kwargs or {}))

        was = self.module.training
        self.module.eval()
        state = [(t, t.detach().clone()) for t in list(self.module.parameters()) + list(self.module.buffers())]
        try:
            with torch.no_grad(), Record():
                self.module(*self.inputs)
        except Exception:  # noqa: BLE001, S110 - only a better line is sought; the error stands either way
            pass
        finally:
            self.module.train(was)
            with torch.no_grad():  # what forward updated in place (a running count) is as it was
                for t, saved in state:
                    t.copy_(saved)
        for stack in stacks:
            user = [f for f in stack if _user_file(f.filename)]
            if any(f.filename == span.file and f.lineno == span.line for f in user):
                inner = user[-1]
                return span_at(inner.filename, inner.lineno) if (inner.filename, inner.lineno) != (span.file, span.line) else span
        return span

    def unsupported(self, what=None, why=""):
        name = what or torch_name(self.node)
        if not why and self.node is not None and self.node.op == "call_function":
            why = CAUSES.get(_packet(self.node), "")
        self.fail(f"{name} cannot be expressed in .pen{': ' + why if why else ''}")

    # ---- the walk -----------------------------------------------------------------------------------
    def run(self):
        sig = self.ep.graph_signature
        for spec in sig.input_specs:
            self.placeholders[spec.arg.name] = (spec.kind.name, spec.target)
        user = 0
        self.scan_containers(list(self.ep.graph.nodes))
        for node in self.ep.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                kind, target = self.placeholders.get(node.name, ("USER_INPUT", None))
                if kind == "USER_INPUT":
                    self.values[node] = self.input_view(node, user)
                    self.input_views.append(self.values[node])
                    user += 1
                else:
                    self.values[node] = ("state", kind, target, node)
            elif node.op == "call_function":
                self.enter(node)
                try:
                    self.values[node] = self.lower(node)
                except (PenroseTraceError, BatchAxis):
                    raise
                except Exception as e:  # noqa: BLE001 - a bug of the tracer, still shown at the user's line
                    self.fail(f"{torch_name(node)}: the tracer failed on this op ({type(e).__name__}: {e})")
            elif node.op == "output":
                self.enter_root()
                outs = node.args[0]
                outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
                kinds = [spec.kind.name for spec in sig.output_specs]
                if len(kinds) == len(outs):  # a mutated buffer or input is an output of export's graph, not the module's
                    outs = [o for o, k in zip(outs, kinds) if k == "USER_OUTPUT"]
                for o in outs:
                    if o is None or not hasattr(o, "op"):
                        self.fail("the module returns a non-tensor value; a diagram's outputs are tensors", node)
                    v = self.get(o)
                    if isinstance(v, tuple) and v and v[0] in ("topk_values", "topk_indices"):
                        self.node = o
                        self.view_arg(o)  # refused with the hint of what top-k is expressible as
                    if not isinstance(v, View):
                        self.fail("the module returns a non-tensor value; a diagram's outputs are tensors", o)
                    self.outputs.append(self.output_pval(v))
                self.declare_unused()
            elif node.op == "get_attr":
                pass  # a submodule of a higher-order op (cond, map): refused where it is used
        return self.root

    def output_pval(self, v: View) -> PVal:
        """An output as a tensor whose legs are the torch axes, in order (size-1 axes too)."""
        self.src = None
        v = self.materialize(v)
        if any(c is None for c in v.axes):
            axes = [c if c is not None else self.C.new(1, role="one", origin="an axis of size 1 of an output") for c in v.axes]
            p = self.emit(Call("repeat", [Ref(v.pval), Pattern(list(v.pval.legs), axes)]), axes, v.batched, v.pval.dtype)
            v = View(p, axes, v.batched)
        return v.pval

    def input_view(self, node, index):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            self.fail(f"example input {index + 1} ({node.name}) is not a tensor", node)
        shape = list(val.shape)
        batched = self.batch and len(shape) >= 1 and shape[0] == self.batch_size
        legs = []
        for j, s in enumerate(shape):
            if batched and j == 0:
                continue
            per = len(shape) - (1 if batched else 0)
            pos = j - (1 if batched else 0)
            role = "in_last" if pos == per - 1 and per > 1 else ("in_only" if per == 1 else "in_other")
            legs.append(self.C.new(s, role=role, origin=f"axis {j} of input {node.name}", hint=self.hints.get((index, j))))
        dtype = _dtype(val.dtype)
        if dtype is None:
            self.fail(f"example input {node.name} has dtype {val.dtype}; inputs are float, integer or bool tensors", node)
        if dtype == "int":  # token ids: their axes read as positions
            for c in legs:
                c.role = "in_other"
        p = PVal(legs, batched, dtype, self.root, "input", hint=node.name, node=node.name)
        self.C.register(p)
        return View(p, list(legs), batched)

    # ---- regions ------------------------------------------------------------------------------------
    def enter_root(self):
        for r in self.open[1:]:
            r.closed = True
        self.open = [self.root]
        self.cur = self.root

    def scan_containers(self, nodes):
        """Spans of the ModuleDicts that are never called but whose children are (nanoGPT's
        `transformer`): the nodes from the first child call to the last become one block, so
        their params keep names like `transformer.wte.weight`."""
        spans = {}
        for i, node in enumerate(nodes):
            stack = node.meta.get("nn_module_stack") or {}
            called = {fqn for _k, (fqn, _c) in stack.items()}
            for fqn in called:
                parts = fqn.split(".")
                for n in range(1, len(parts)):
                    prefix = ".".join(parts[:n])
                    if prefix in called or prefix in spans and spans[prefix] is None:
                        continue
                    try:
                        mod = self.module.get_submodule(prefix)
                    except AttributeError:
                        continue
                    if isinstance(mod, torch.nn.ModuleDict):
                        a, b = spans.get(prefix, (i, i))
                        spans[prefix] = (min(a, i), max(b, i))
        self.containers = spans
        self.index = {node: i for i, node in enumerate(nodes)}
        # every submodule some node runs inside (a call of its own)
        self.called = {fqn for node in nodes for _k, (fqn, _c) in (node.meta.get("nn_module_stack") or {}).items()}

    def container_region(self, fqn, parent):
        key = ("container", fqn)
        r = self.regions.get(key)
        if r is None:
            r = Region(key, fqn, self.module.get_submodule(fqn), parent, True)
            r.forward_range = parent.forward_range  # its code is the caller's
            self.regions[key] = r
        return r

    def uncalled_owner(self, node, stack):
        """The submodule whose params a node reads when that submodule is never called on its own
        but its parent's code uses them (nn.MultiheadAttention's out_proj: F.linear(y,
        out_proj.weight, out_proj.bias)): the node then runs as a call of it. None otherwise."""
        inside = [fqn for _k, (fqn, _c) in stack.items() if fqn]
        deepest = inside[-1] if inside else ""
        owners = set()
        for a in node.args:
            v = self.values.get(a) if hasattr(a, "op") else None
            if isinstance(v, tuple) and v and v[0] == "state" and v[1] in ("PARAMETER", "BUFFER"):
                owners.add(v[2].rpartition(".")[0])
        if len(owners) != 1:
            return None
        (owner,) = owners
        if not owner or owner in inside or not (deepest == "" or owner.startswith(deepest + ".")):
            return None
        if owner in self.called:  # called elsewhere: its params are its calls' own
            return None
        try:
            mod = self.module.get_submodule(owner)
        except AttributeError:
            return None
        return (owner, type(mod)) if _is_block(mod) else None

    def enter(self, node):
        stack = node.meta.get("nn_module_stack") or {}
        found = self.uncalled_owner(node, stack) if node.op == "call_function" else None
        if found is not None:
            stack = {**stack, ("uncalled", found[0]): found}
        i = self.index.get(node, -1)
        active = sorted((p for p, (a, b) in getattr(self, "containers", {}).items() if a <= i <= b), key=lambda p: p.count("."))
        path, chain = (), [self.root]
        parent = self.root

        def add_containers(until=None):
            nonlocal parent
            for pfx in active:
                r = self.regions.get(("container", pfx))
                if r is not None and r in chain:
                    continue
                inside_parent = parent is self.root or pfx.startswith(parent.fqn + ".")
                if inside_parent and (until is None or until.startswith(pfx + ".")):
                    r = self.container_region(pfx, parent)
                    r.parent = parent
                    chain.append(r)
                    parent = r

        for key, (fqn, _cls) in stack.items():
            if not fqn:
                continue
            add_containers(fqn)
            path = path + (key,)
            r = self.regions.get(path)
            if r is None:
                try:
                    mod = self.module.get_submodule(fqn)
                except AttributeError:
                    mod = None
                if mod is None or not _is_block(mod):
                    self.regions[path] = r = Region(path, fqn, mod, parent, False)
                else:
                    r = Region(path, fqn, mod, parent, True)
                    r.forward_range = _forward_range(mod)
                    self.regions[path] = r
            if r.is_block:
                r.parent = parent
                chain.append(r)
                parent = r
        add_containers()
        for r in self.open:
            if r not in chain:
                r.closed = True
        for r in chain[1:]:
            if r.closed:
                self.fail(f"the call of {r.fqn!r} is interleaved with other code; its nodes must run together", node)
            if r.call is None:
                r.call = CallStmt(r, src=self.naming_src(node, r.parent))
                r.parent.items.append(r.call)
                r.parent.children.append(r)
        self.open = chain
        self.cur = chain[-1]
        self.src = self.naming_src(node, self.cur)

    def naming_src(self, node, region):
        """The user's line in `region`'s own forward that made this node (None when not there)."""
        rng = region.forward_range
        if rng is None:
            return None
        for f, line, _fn in reversed(frames(node.meta.get("stack_trace"))):
            if f == rng[0] and rng[1] <= line <= rng[2]:
                return (f, line)
        return None

    # ---- values across blocks -------------------------------------------------------------------
    def get(self, x):
        """The view of an fx node (or a Python value) in the current region."""
        if hasattr(x, "op"):
            v = self.values.get(x)
            if isinstance(v, tuple) and v and v[0] == "state":
                return self.state_view(v)
            if isinstance(v, View):
                return self.lift(v, self.cur)
            return v
        return x

    def state_view(self, entry):
        _, kind, target, node = entry
        if kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            value = self.ep.constants.get(target) if kind == "CONSTANT_TENSOR" else None
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() == 0:  # torch.tensor(-1e4): a number
                return _scalar(value)
        if kind not in ("PARAMETER", "BUFFER"):
            self.fail(f"a constant tensor ({node.name}) is used; a diagram's tensors are inputs, params and buffers "
                      "(register it as a buffer)")
        owner, _, local = target.rpartition(".")
        region = next((r for r in self.cur.ancestors() if r.fqn == owner), None)
        if region is None:  # a tied weight: the name of the same tensor that this call owns
            for alias in self.aliases.get(target, ()):
                a_owner, _, a_local = alias.rpartition(".")
                found = next((r for r in self.cur.ancestors() if r.fqn == a_owner), None)
                if found is not None:
                    target, owner, local, region = alias, a_owner, a_local, found
                    break
        if region is None:
            self.fail(f"{'parameter' if kind == 'PARAMETER' else 'buffer'} {target!r} is used outside the call of its "
                      f"module {owner or '(top)'!r}; a block's params are reachable only inside its own calls")
        p = region.params.get(target)
        if p is None:
            tensor = self.tensors.get(target)
            p = self.declare_state(region, target, local, kind, node.meta.get("val") if tensor is None else tensor)
            p.span = self.where(self.node)
        v = self.lift(View(p, list(p.legs), False), self.cur)
        if p.value is not None and p.value.dtype == torch.bool:  # a bool buffer (a causal mask): loaded as 1 and 0
            key = ("mask", p.id, v.pval.id)
            if key not in self.masks:
                self.masks[key] = self.map_expr(v, lambda r: BinOp("!=", r, Num(0)), dtype="bool")
            return self.masks[key]
        return v

    def declare_state(self, region, target, local, kind, tensor) -> PVal:
        """The param (or buffer) `target` of `region`, declared with a leg per axis."""
        legs = []
        for j, s in enumerate(tensor.shape):
            role = "one" if s == 1 else ("out" if j == 0 else "in") if tensor.dim() == 2 else "feat"
            legs.append(self.C.new(s, role=role, origin=f"axis {j} of {target}"))
        dtype = _dtype(tensor.dtype)
        if dtype == "bool" and kind == "BUFFER":
            dtype = "float"  # a diagram's buffers are float: a bool mask loads as 1 and 0, read as `mask != 0`
        p = PVal(legs, False, dtype, region, "param" if kind == "PARAMETER" else "buffer", param=local, hint=local)
        real = isinstance(tensor, torch.Tensor) and not tensor.is_meta and type(tensor) in (torch.Tensor, torch.nn.Parameter)
        p.value = tensor.detach() if real else None
        p.persistent = target in self.persistent or kind == "PARAMETER"
        self.C.register(p)
        region.params[target] = p
        return p

    def declare_unused(self):
        """Params and buffers forward never reads, declared in the block of their module when that
        module is called (the top level included), so that the state dict still loads; those of a
        submodule never called are listed in `self.unused` (they cannot be declared)."""
        used = {t for r in self.regions.values() for t in r.params} | set(self.root.params)
        by_fqn = {r.fqn: r for r in [self.root, *self.regions.values()] if r.is_block}
        self.unused = []
        for target, tensor in self.state.items():  # the state dict (kept as Parameters): params and persistent buffers
            if target in used:
                continue
            owner, _, local = target.rpartition(".")
            region = by_fqn.get(owner)
            if region is None:
                self.unused.append(target)
            else:
                self.declare_state(region, target, local, "PARAMETER" if isinstance(tensor, torch.nn.Parameter) else "BUFFER", tensor)

    def lift(self, v: View, R: Region) -> View:
        D = v.pval.region
        if D is R:
            return v
        if R in list(D.ancestors())[1:]:  # made inside a block R calls: returned up to R
            C = next(r for r in D.ancestors() if r.parent is R)
            return self.export_from(C, self.lift(v, C))
        return self.import_into(R, self.lift(v, R.parent))

    def export_from(self, C: Region, inner: View) -> View:
        if inner.pval.kind == "formal" and inner.pval.region is C:  # the call's own argument (a no-op cast of it)
            outer = next(o for f, o in C.formals if f is inner.pval)
            return View(outer, list(inner.axes), inner.batched)
        inner = self.materialize(inner, region=C)
        out = C.return_of.get(inner.pval.id)
        if out is None:
            out = PVal(inner.pval.legs, inner.pval.batched, inner.pval.dtype, C.parent, "callout", src=C.call.src)
            out.stmt = C.call
            C.return_of[inner.pval.id] = out
            C.returns.append((inner.pval, out))
            C.call.outs.append(out)
        return View(out, list(inner.axes), inner.batched)

    def import_into(self, R: Region, outer: View) -> View:
        outer = self.materialize(outer, region=R.parent, before=R.call)
        f = R.formal_of.get(outer.pval.id)
        if f is None:
            f = PVal(outer.pval.legs, outer.pval.batched, outer.pval.dtype, R, "formal", hint=outer.pval.hint)
            R.formal_of[outer.pval.id] = f
            R.formals.append((f, outer.pval))
            R.call.args.append(outer.pval)
        return View(f, list(outer.axes), outer.batched)

    # ---- making statements ------------------------------------------------------------------------
    def emit(self, expr, legs, batched, dtype="float", *, region=None, before=None, hint=None, inline_ok=True, outs=None):
        region = region or self.cur
        src = self.src if region is self.cur else None
        pvals = []
        for lg in outs if outs is not None else [legs]:
            p = PVal(lg, batched, dtype, region, "stmt", src=src, hint=hint, node=self.node.name if self.node is not None else None)
            try:
                self.C.register(p)
            except LegClash:
                self.fail(f"{torch_name(self.node)}: a result would carry one index twice")
            pvals.append(p)
        st = Stmt(pvals, expr, src, inline_ok)
        for p in pvals:
            p.stmt = st
        if before is not None:
            region.items.insert(region.items.index(before), st)
        else:
            region.items.append(st)
        return pvals if outs is not None else pvals[0]

    def unify(self, a: Cls, b: Cls):
        try:
            self.C.union(a, b)
        except LegClash:
            self.fail(f"{torch_name(self.node)}: its operands' axes cannot be named consistently "
                      f"(sizes {a.size} and {b.size}, or one tensor would carry an index twice)")

    def materialize(self, v: View, region=None, before=None) -> View:
        """The same view on a penrose tensor whose leg order is the torch order."""
        present = [c for c in v.axes if c is not None]
        legs = v.pval.legs
        if len(present) == len(legs) and all(self.C.same(a, b) for a, b in zip(present, legs)):
            return v
        p = self.emit(Call("rearrange", [Ref(v.pval), Pattern(list(legs), present)]), present, v.batched, v.pval.dtype,
                      region=region, before=before)
        return View(p, list(v.axes), v.batched)

    def drop_ones(self, v: View, positions) -> View:
        """Drop size-1 legs at the given axes (they become absent axes of size 1)."""
        drop = {id(self.C.find(v.axes[j])) for j in positions}
        if not drop:
            return v
        left = ["1" if id(self.C.find(l)) in drop else l for l in v.pval.legs]
        right = [l for l in v.pval.legs if id(self.C.find(l)) not in drop]
        p = self.emit(Call("rearrange", [Ref(v.pval), Pattern(left, right)]), right, v.batched, v.pval.dtype)
        axes = [None if j in positions else c for j, c in enumerate(v.axes)]
        return View(p, axes, v.batched)

    def axis(self, v: View, dim: int) -> int:
        """The index into v.axes of torch dim `dim` (BatchAxis for the batch axis)."""
        full = len(v.axes) + (1 if v.batched else 0)
        if full == 0:
            self.unsupported(why="indexing a scalar")
        d = dim % full if -full <= dim < full else self.fail(f"{torch_name(self.node)}: dim {dim} out of range")
        if v.batched:
            if d == 0:
                raise BatchAxis
            return d - 1
        return d

    # ---- dispatch -----------------------------------------------------------------------------------
    def lower(self, node):
        if node.target is operator.getitem:
            seq, i = node.args
            got = self.values.get(seq)
            if isinstance(got, (list, tuple)) and not (got and got[0] == "state"):
                item = got[i]
                if item is None and not node.users:  # a second output nobody reads (max(dim).indices)
                    return None
                if item is None:
                    self.unsupported(why="this result (an index or a second output) is not a tensor of the diagram")
                return item
            self.unsupported("indexing a result")
        packet = _packet(node)
        if packet in SKIP:
            return None
        if packet.endswith("_") and not packet.startswith("_") and packet not in INPLACE_KEEP:
            return self.in_place(node, packet[:-1])
        moved = self.positions(node, packet)
        if moved is not None:
            return moved
        return self.dispatch(node, packet)

    def positions(self, node, packet):
        """Positions `torch.arange(T)` carried through what keeps them positions 0 .. T-1 shifted:
        `+ past` (a number), `unsqueeze(0)`, `expand(B, -1)`, casts and copies; None otherwise.
        (Hugging Face's `position_ids = torch.arange(T) + past_seen_tokens` then `.unsqueeze(0)`.)"""
        src = self.values.get(node.args[0]) if node.args and hasattr(node.args[0], "op") else None
        if not (isinstance(src, tuple) and src and src[0] == "arange"):
            return None
        _, start, end, step, made = src
        if packet == "add" and len(node.args) > 1 and isinstance(node.args[1], int) and not isinstance(node.args[1], bool):
            return ("arange", start + node.args[1], end + node.args[1], step, made)
        leading = self.out_shape() or []
        if packet in ("unsqueeze", "expand", "view", "reshape") and [s for s in leading if s != 1][-1:] == [len(range(start, end, step))] \
                and (packet != "expand" or len(leading) <= 2):
            return src  # leading axes of one size (or the batch's): the same positions for every row
        if packet in IDENTITY and _dtype(self.out_dtype()) == "int":
            return src
        return None

    def dispatch(self, node, packet):
        fn = getattr(self, f"op_{packet}", None)
        if fn is None:
            if packet in UNARY:
                return self.unary(UNARY[packet])
            if packet in COMPARE:
                return self.binary(COMPARE[packet], dtype="bool")
            if packet in IDENTITY:
                return self.identity()
            self.unsupported()
        return fn(node)

    def in_place(self, node, packet):
        """`x += y`, `x.relu_()`, `nn.ReLU(inplace=True)`, `masked_fill_`: functionalised, the update
        is the value it produces, and every later read of `x` reads that value. Refused where the
        update would be seen through another tensor (a view of it, a param or buffer, an input)."""
        target = node.args[0] if node.args else None
        name = torch_name(node)
        if not hasattr(target, "op"):
            self.unsupported(name, why="an in-place update of something that is not a tensor")
        entry = self.values.get(target)
        if isinstance(entry, tuple) and entry and entry[0] == "state":
            self.unsupported(name, why=f"it updates {entry[2]!r} in place (inplace=True on a parameter or buffer: "
                                       "state the diagram does not keep)")
        if target.op == "placeholder":
            self.unsupported(name, why="it updates an input in place (inplace=True on the module's input)")
        if target.op == "call_function" and _packet(target) in VIEW_OPS and any(
                u is not node and self.index.get(u, -1) > self.index.get(node, -1) for u in _base(target).users):
            self.unsupported(name, why="it updates a view in place (inplace=True), which changes the tensor it views")
        if getattr(self, f"op_{packet}", None) is None and packet not in UNARY and packet not in COMPARE:
            self.unsupported(name, why=f"{packet} (without inplace) cannot be expressed either")
        result = self.dispatch(node, packet)
        self.values[target] = result  # later reads of the updated tensor read its new value
        return result

    def args(self, node) -> dict:
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            return {}
        out = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                v = node.args[i]
            elif a.name in node.kwargs:
                v = node.kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                v = None
            out[a.name] = v
        return out

    def view_arg(self, x, what="operand"):
        v = self.get(x)
        if isinstance(v, View):
            return v
        if isinstance(v, tuple) and v and v[0] == "arange":
            self.unsupported("torch.arange", why="positions are expressible only as an embedding's ids (a slice of its table)")
        if isinstance(v, tuple) and v and v[0] in ("topk_values", "topk_indices"):
            self.unsupported("Tensor.topk", why="its values and indices are expressible only as "
                             "zeros_like(x).scatter(dim, indices, values), the language's topk(x, leg, k=K)")
        if isinstance(v, tuple) and v and v[0] == "not":
            if what == "condition":
                return ("not", self.lift(v[1], self.cur))
            self.unsupported("~ (logical not)", why="the negation of a mask is expressible only as a condition (where, masked_fill)")
        if isinstance(v, bool) or v is None:
            self.unsupported(why=f"its {what} is not a tensor")
        if isinstance(v, (int, float)):
            return v
        self.unsupported(why=f"its {what} is not a tensor")

    def out_shape(self, node=None):
        val = (node or self.node).meta.get("val")
        return list(val.shape) if isinstance(val, torch.Tensor) else None

    def out_dtype(self, node=None):
        val = (node or self.node).meta.get("val")
        return val.dtype if isinstance(val, torch.Tensor) else None

    # ---- element-wise ---------------------------------------------------------------------------------
    def identity(self):
        """contiguous, clone, alias, and conversions: the same tensor. A diagram has one float
        dtype (the model's), so a cast between float dtypes is the same tensor (`softmax(x,
        dtype=torch.float32).to(x.dtype)`, `.float()` in a float32 model); a bool mask made a
        number is `where(mask, 1, 0)`; a conversion between kinds (float to int, int to float)
        is refused."""
        x = self.get(self.node.args[0])
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return x  # torch.tensor(-1e4) and its copies: a number
        if not isinstance(x, View):
            self.unsupported()
        src = self.node.args[0].meta.get("val") if hasattr(self.node.args[0], "meta") else None
        want = self.out_dtype()
        if want is None or not isinstance(src, torch.Tensor) or src.dtype == want:
            return x
        if src.is_floating_point() and want.is_floating_point:
            return x
        if src.dtype == torch.bool and want.is_floating_point:
            return self.as_number(x)
        if _dtype(src.dtype) == _dtype(want):
            return x
        self.unsupported(why=f"it converts {src.dtype} to {want}; a diagram converts only bool masks to numbers "
                             "and one float dtype to another")

    def op_detach(self, node):
        x = self.view_arg(node.args[0])
        if not isinstance(x, View):
            return x  # a number has no gradient to stop
        return self.unary_call("detach", x)

    def unary(self, fn, **kw):
        x = self.view_arg(self.node.args[0])
        if not isinstance(x, View):
            self.unsupported(why="applied to a plain number")
        return self.unary_call(fn, x, **kw)

    def unary_call(self, fn, x: View, **kw):
        kwargs = [(k, Num(v)) for k, v in kw.items()]
        p = self.emit(Call(fn, [Ref(x.pval)], kwargs), x.pval.legs, x.batched, x.pval.dtype)
        return View(p, list(x.axes), x.batched)

    def map_expr(self, x: View, make, dtype="float"):
        """A new tensor with x's legs made by `make(Ref(x))`."""
        p = self.emit(make(Ref(x.pval)), x.pval.legs, x.batched, dtype)
        return View(p, list(x.axes), x.batched)

    def broadcast(self, operands):
        """Torch's broadcasting of element-wise operands, as penrose's alignment by name.

        Returns the operand expressions, the result's legs (penrose order), its view axes and
        whether it is batched."""
        tensors = [(i, v) for i, v in enumerate(operands) if isinstance(v, View)]
        if not tensors:
            self.unsupported(why="no tensor operand")
        fulls = {i: v.full for i, v in tensors}
        rank = max(len(f) for f in fulls.values())
        result = [None] * rank
        drops = defaultdict(list)
        for pos in range(1, rank + 1):
            entries = [(i, f[-pos]) for i, f in fulls.items() if len(f) >= pos]
            big = [(i, e) for i, e in entries if isinstance(e, Cls) and e.size != 1]
            if any(e is BATCH for _, e in entries):
                if big or rank - pos != 0:
                    raise BatchAxis
                result[0] = BATCH
                for i, e in entries:
                    if isinstance(e, Cls):
                        drops[i].append(len(operands[i].axes) - pos)
            elif big:
                first = big[0][1]
                for _, e in big[1:]:
                    self.unify(first, e)
                for i, e in entries:
                    if isinstance(e, Cls) and e.size == 1:
                        drops[i].append(len(operands[i].axes) - pos)
                result[rank - pos] = first
            else:
                ones = [e for _, e in entries if isinstance(e, Cls)]
                for e in ones[1:]:
                    self.unify(ones[0], e)
                result[rank - pos] = ones[0] if ones else None
        ops = list(operands)
        for i, positions in drops.items():
            ops[i] = self.drop_ones(ops[i], positions)
        batched = bool(result) and result[0] is BATCH
        axes = result[1:] if batched else result
        present = [c for c in axes if c is not None]
        tens = [(i, v) for i, v in enumerate(ops) if isinstance(v, View)]
        li, lead = max(tens, key=lambda iv: (len(iv[1].pval.legs), -iv[0]))
        have = {id(self.C.find(l)) for l in lead.pval.legs}
        if any(id(self.C.find(c)) not in have for c in present):
            left = list(lead.pval.legs)
            p = self.emit(Call("repeat", [Ref(lead.pval), Pattern(left, present)]), present, lead.batched, lead.pval.dtype)
            ops[li] = lead = View(p, list(lead.axes), lead.batched)
        exprs = [Ref(v.pval) if isinstance(v, View) else Num(v) for v in ops]
        return exprs, list(lead.pval.legs), axes, batched

    def binary(self, op, dtype="float", swap=False):
        a = self.args(self.node)
        names = list(a)
        x, y = self.view_arg(a[names[0]]), self.view_arg(a[names[1]])
        if swap:
            x, y = y, x
        return self.binop(op, x, y, dtype, alpha=a.get("alpha", 1))

    def binop(self, op, x, y, dtype="float", alpha=1):
        if op in ("*", "/") and isinstance(x, View) and isinstance(y, (int, float)) and not isinstance(y, bool) and y == 1:
            return x  # torch writes 1 / t as reciprocal(t) * 1
        if alpha not in (1, None):
            if isinstance(y, View):
                y = self.map_expr(y, lambda r: BinOp("*", r, Num(alpha)))
            else:
                y = y * alpha
        if op in ("+", "-", "*", "/", "//", "**") and dtype != "bool":  # torch promotes a bool mask to 1 and 0
            x, y = self.as_number(x), self.as_number(y)
        if not isinstance(x, View) and not isinstance(y, View):
            fold = {"+": lambda p, q: p + q, "-": lambda p, q: p - q, "*": lambda p, q: p * q}.get(op)
            if fold is not None and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
                return fold(x, y)  # two numbers (full_like(x, 2) * ones_like(x)): their value
            self.unsupported(why="both operands are plain numbers")
        (ex, ey), legs, axes, batched = self.broadcast([x, y])
        expr = self.scaled(op, x, y, ex, ey) or BinOp(op, ex, ey)
        p = self.emit(expr, legs, batched, dtype)
        return View(p, axes, batched)

    def scaled(self, op, x, y, ex, ey):
        """`einsum(...) * (1 / sqrt(n))` and `/ sqrt(n)`, n the size of a summed leg: `/ sqrt(d)`."""
        if not isinstance(x, View) or not isinstance(y, (int, float)) or isinstance(y, bool) or y <= 0:
            return None
        e = x.pval.stmt.expr if x.pval.stmt is not None and isinstance(x.pval.stmt, Stmt) else None
        if not isinstance(e, Einsum):
            return None
        summed = [c for k, cs in e.binds.items() if k not in e.out_cls for c in cs[:1]]
        for c in summed:
            n = c.size
            if op == "*" and math.isclose(y, 1 / math.sqrt(n), rel_tol=1e-12):
                return BinOp("/", ex, Call("sqrt", [Leg(c)]))
            if op == "/" and math.isclose(y, math.sqrt(n), rel_tol=1e-12):
                return BinOp("/", ex, Call("sqrt", [Leg(c)]))
        return None

    def op_add(self, node):
        return self.binary("+")

    def op_sub(self, node):
        return self.binary("-")

    def op_rsub(self, node):
        a = self.args(node)
        x, y = self.view_arg(a["self"]), self.view_arg(a["other"])
        alpha = a.get("alpha", 1)
        if alpha not in (1, None):
            x = self.map_expr(x, lambda r: BinOp("*", r, Num(alpha))) if isinstance(x, View) else x * alpha
        return self.binop("-", y, x)

    def op_mul(self, node):
        return self.binary("*")

    def op_div(self, node):
        a = self.args(node)
        mode = a.get("rounding_mode")
        if mode == "floor":
            return self.binary("//")
        if mode is not None:
            self.unsupported(why=f"rounding_mode={mode!r}")
        return self.binary("/")

    def op_floor_divide(self, node):
        return self.binary("//")

    def op_true_divide(self, node):
        return self.binary("/")

    def op_pow(self, node):
        a = self.args(node)
        if _overload(node) == "Scalar":
            base, x = a["self"], self.view_arg(a["exponent"])
            return self.binop("**", base, x)
        return self.binop("**", self.view_arg(a["self"]), self.view_arg(a["exponent"]))

    def op_neg(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: Neg(r))

    def op_rsqrt(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: BinOp("/", Num(1), Call("sqrt", [r])))

    def op_reciprocal(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: BinOp("/", Num(1), r))

    def op_square(self, node):
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: BinOp("**", r, Num(2)))

    def op_gelu(self, node):
        a = self.args(node)
        x = self.view_arg(a["self"])
        if a.get("approximate", "none") == "tanh":  # torch's tanh form, written out
            c = math.sqrt(2.0 / math.pi)
            return self.map_expr(x, lambda r: BinOp("*", BinOp("*", Num(0.5), r), BinOp(
                "+", Num(1), Call("tanh", [BinOp("*", Num(c), BinOp("+", r, BinOp("*", Num(0.044715), BinOp("**", r, Num(3)))))]))))
        return self.unary_call("gelu", x)

    def op_softplus(self, node):
        a = self.args(node)
        if a.get("beta", 1) != 1 or a.get("threshold", 20) != 20:
            self.unsupported(why="softplus with beta or threshold other than 1 and 20")
        return self.unary_call("softplus", self.view_arg(a["self"]))

    def op_leaky_relu(self, node):
        a = self.args(node)
        return self.unary_call("leaky_relu", self.view_arg(a["self"]), slope=float(a.get("negative_slope", 0.01)))

    def op_clamp(self, node):
        a = self.args(node)
        lo, hi = a.get("min"), a.get("max")
        if hasattr(lo, "op") or hasattr(hi, "op"):
            self.unsupported(why="tensor bounds")
        kw = {}
        if lo is not None:
            kw["min"] = float(lo)
        if hi is not None:
            kw["max"] = float(hi)
        return self.unary_call("clamp", self.view_arg(a["self"]), **kw)

    def op_clamp_min(self, node):
        a = self.args(node)
        return self.unary_call("clamp", self.view_arg(a["self"]), min=float(a["min"]))

    def op_clamp_max(self, node):
        a = self.args(node)
        return self.unary_call("clamp", self.view_arg(a["self"]), max=float(a["max"]))

    def op_dropout(self, node):
        a = self.args(node)
        x = self.view_arg(a["input"])
        p = float(a.get("p", 0.5))
        if p == 0:
            return x
        return self.unary_call("dropout", x, p=p)

    op_feature_dropout = None  # (refused: drops whole channels)

    def op_where(self, node):
        a = self.args(node)
        cond, x, y = self.view_arg(a["condition"], "condition"), self.view_arg(a["self"]), self.view_arg(a["other"])
        return self.where_(cond, x, y)

    def op_full(self, node):
        """torch.full / zeros / ones / scalar_tensor / new_full of a constant shape: the number,
        which every operation it meets broadcasts (`torch.full([], finfo.min)`, GPT-2's mask
        value). A filled tensor whose own axes a result keeps is refused."""
        fill = {"zeros": 0, "new_zeros": 0, "ones": 1, "new_ones": 1}.get(_packet(node))
        if fill is None:
            a = self.args(node)
            fill = a.get("fill_value", a.get("s"))
        if hasattr(fill, "op") or isinstance(fill, torch.SymInt) or not isinstance(fill, int | float):
            self.unsupported(why="the fill value is not a constant number")
        shape = self.out_shape() or []
        if any(not isinstance(s, int) for s in shape):
            self.unsupported(why="a shape known only at run time")
        if math.prod(shape) != 1:
            for u in node.users:  # a number only where the other operands carry every axis it has
                others = [a.meta.get("val") for a in u.args if hasattr(a, "meta") and a is not node]
                shapes = [list(v.shape) for v in others if isinstance(v, torch.Tensor)]
                out = self.out_shape(u)
                if out is None or not shapes or list(torch.broadcast_shapes(*shapes)) != out:
                    self.unsupported(why=f"a filled tensor of shape {tuple(shape)} whose axes the result keeps "
                                         "(a number broadcasts only where the other operands carry every axis)")
        dt = self.out_dtype()
        if dt == torch.bool:
            return bool(fill)
        return float(fill) if dt is None or dt.is_floating_point else int(fill)

    op_zeros = op_ones = op_scalar_tensor = op_new_full = op_new_zeros = op_new_ones = op_full

    def full_shape(self, v: View) -> list:
        return ([self.batch_size] if v.batched else []) + [1 if c is None else c.size for c in v.axes]

    def tile(self, x: View, dim: int, n: int, interleave: bool) -> View:
        """x copied n times along torch dim `dim`: a new leg of size n merged with the axis, outside
        it (`Tensor.repeat`, tiles) or inside it (`repeat_interleave`, each entry n times)."""
        full = self.full_shape(x)
        at = dim if not interleave else dim + 1
        y = self.unsqueezed(x, at)
        sizes = full[:at] + [n] + full[at:]
        y = self.expand(y, sizes)
        merged = full[:dim] + [full[dim] * n] + full[dim + 1:]
        return self.reshape(y, merged)

    def op_repeat(self, node):
        """Tensor.repeat(sizes): each axis tiled (a copy leg merged outside it); a size-1 axis expanded."""
        x = self.view_arg(node.args[0])
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        sizes = [int(s) for s in node.args[1]]
        while len(x.full) < len(sizes):
            x = self.unsqueezed(x, 0)
        for d in range(len(sizes) - 1, -1, -1):
            n = sizes[d]
            if n == 1:
                continue
            full = self.full_shape(x)
            if full[d] == 1:
                x = self.expand(x, full[:d] + [n] + full[d + 1:])
            else:
                x = self.tile(x, d, n, interleave=False)
        return x

    def op_repeat_interleave(self, node):
        """repeat_interleave(x, n, dim): each entry n times along dim (Mistral's grouped-query heads)."""
        a = self.args(node)
        x, n, dim = self.view_arg(a.get("self", node.args[0])), a.get("repeats"), a.get("dim")
        if not isinstance(x, View) or not isinstance(n, int) or isinstance(n, bool):
            self.unsupported(why="repeats that are not one whole number (a tensor of counts)")
        if dim is None:
            self.unsupported(why="no dim (it flattens the tensor first)")
        d = dim % len(x.full)
        return x if n == 1 else self.tile(x, d, n, interleave=True)

    def op_zeros_like(self, node):
        """zeros_like(x), ones_like(x), full_like(x, v): the number itself, which every operation it
        meets broadcasts (`torch.where(m, y, torch.zeros_like(y))` is `where(m, y, 0.0)`)."""
        x = self.view_arg(node.args[0])
        fill = {"zeros_like": 0, "ones_like": 1}.get(_packet(node))
        if fill is None:
            fill = self.get(node.args[1])
            if isinstance(fill, View) or isinstance(fill, bool) or not isinstance(fill, (int, float)):
                self.unsupported(why="the fill value is not a plain number")
        dtype = x.pval.dtype if isinstance(x, View) else "float"
        return float(fill) if dtype == "float" else int(fill)

    op_ones_like = op_full_like = op_zeros_like

    def op_topk(self, node):
        """`v, i = x.topk(k, dim)`: expressible as `zeros_like(x).scatter(dim, i, v)` (the k
        largest along dim kept, zeros elsewhere: a TopK sparsifier), the language's
        `topk(x, leg, k=K)`; op_scatter completes it."""
        a = self.args(node)
        x = self.view_arg(a["self"])
        if a.get("largest", True) is False:
            self.unsupported(why="the smallest k (largest=False)")
        self.leg_of(x, a.get("dim", -1))
        key = (x, self.axis(x, a.get("dim", -1)), int(a["k"]))
        return [("topk_values", *key), ("topk_indices", *key)]

    def op_scatter(self, node):
        a = self.args(node)
        base, index, src = self.get(a["self"]), self.get(a["index"]), self.get(a.get("src"))
        topk = (isinstance(index, tuple) and index and index[0] == "topk_indices" and isinstance(src, tuple) and src
                and src[0] == "topk_values" and index[1:] == src[1:])
        if not topk or base not in (0, 0.0) or isinstance(base, bool):
            self.unsupported(why="only as zeros_like(x).scatter(dim, i, v) with v, i = x.topk(k, dim) (topk in .pen)")
        _, x, axis, k = index
        if self.axis(x, a["dim"]) != axis:
            self.unsupported(why="scattered along another axis than the top-k's")
        p = self.emit(Call("topk", [Ref(x.pval), Leg(x.axes[axis])], [("k", Num(k))]), x.pval.legs, x.batched)
        return View(p, list(x.axes), x.batched)

    def op_bitwise_not(self, node):
        """~mask: only as a condition (where and masked_fill swap their branches)."""
        x = self.view_arg(node.args[0])
        if not isinstance(x, View) or x.pval.dtype != "bool":
            self.unsupported(why="only the negation of a bool mask, used as a condition")
        return ("not", x)

    op_logical_not = op_bitwise_not

    def where_(self, cond, x, y):
        if isinstance(cond, tuple) and cond and cond[0] == "not":
            cond, x, y = cond[1], y, x
        if not isinstance(cond, View) or cond.pval.dtype != "bool":
            self.unsupported(why="the condition is not a bool tensor")
        if not isinstance(x, View) and not isinstance(y, View):
            exprs, legs, axes, batched = self.broadcast([cond])
            exprs = exprs + [Num(x), Num(y)]
        else:
            exprs, legs, axes, batched = self.broadcast([cond, x, y])
        p = self.emit(Call("where", exprs), legs, batched)
        return View(p, axes, batched)

    def op_masked_fill(self, node):
        a = self.args(node)
        x, mask, value = self.view_arg(a["self"]), self.view_arg(a["mask"], "condition"), self.get(a["value"])
        if isinstance(value, View):
            self.unsupported(why="a tensor fill value")
        return self.where_(mask, value, x)

    # ---- contractions ---------------------------------------------------------------------------------
    def contract(self, ops, keys, out, hint=None, inline_ok=True):
        """An einsum over views: `keys[i]` names each torch axis of ops[i] (batch included)."""
        keys = [list(k) for k in keys]
        entries = defaultdict(list)
        for i, (v, ks) in enumerate(zip(ops, keys)):
            if len(ks) != len(v.full):
                self.fail(f"{torch_name(self.node)}: internal: {len(ks)} indices for {len(v.full)} axes")
            for j, (e, k) in enumerate(zip(v.full, ks)):
                entries[k].append((i, j, e))
        bkeys = {k for k, es in entries.items() if any(e is BATCH for _, _, e in es)}
        if len(bkeys) > 1:
            raise BatchAxis
        bk = next(iter(bkeys), None)
        if bk is not None:
            if not out or out[0] != bk:
                raise BatchAxis
            for i, j, e in entries[bk]:
                if isinstance(e, Cls):
                    if e.size != 1:
                        raise BatchAxis
                    keys[i][j] = ("summed-one", i, j)  # a size-1 axis against the batch: summed away
            entries = defaultdict(list)
            for i, (v, ks) in enumerate(zip(ops, keys)):
                for j, (e, k) in enumerate(zip(v.full, ks)):
                    entries[k].append((i, j, e))
        out_cls, binds, axes, used = {}, {}, [], set()
        for k in out:
            if k == bk:
                continue
            es = [e for _, _, e in entries.get(k, []) if isinstance(e, Cls)]
            cand = [e for e in es if e.size != 1] or es
            if not cand:
                axes.append(None)
                continue
            c = cand[0]
            for e in cand[1:]:
                if e.size == c.size:
                    self.C.wish(c, e)
            if id(self.C.find(c)) in used:
                c = self.C.new(c.size, role="key", origin=f"{c.origin} (a second leg of that size)" if c.origin else "")
            used.add(id(self.C.find(c)))
            out_cls[k] = c
            axes.append(c)
        for k, es in entries.items():
            cl = [e for _, _, e in es if isinstance(e, Cls)]
            binds[k] = ([out_cls[k]] if k in out_cls else []) + cl
            if k not in out_cls:
                big = [e for e in cl if e.size != 1]
                for e in big[1:]:
                    if e.size == big[0].size:
                        self.C.wish(big[0], e)
        terms = []
        for i, (v, ks) in enumerate(zip(ops, keys)):
            by_root = {}
            for e, k in zip(v.full, ks):
                if isinstance(e, Cls):
                    by_root[id(self.C.find(e))] = k
            terms.append([by_root[id(self.C.find(l))] for l in v.pval.legs])
        out_term = [k for k in out if k in out_cls]
        legs = [out_cls[k] for k in out_term]
        expr = Einsum([Ref(v.pval) for v in ops], terms, out_term, binds, out_cls)
        batched = bk is not None
        return expr, legs, axes, batched

    def einsum_view(self, ops, keys, out, extra=None, hint=None, inline_ok=True):
        expr, legs, axes, batched = self.contract(ops, keys, out)
        if extra is not None:
            expr = extra(expr)
        p = self.emit(expr, legs, batched, hint=hint, inline_ok=inline_ok)
        return View(p, axes, batched)

    def matmul_keys(self, a: View, b: View):
        ra, rb = len(a.full), len(b.full)
        if ra == 0 or rb == 0:
            self.unsupported(why="a scalar operand")
        ka = ["m", "k"] if ra >= 2 else ["k"]
        kb = ["k", "n"] if rb >= 2 else ["k"]
        nba, nbb = ra - len(ka), rb - len(kb)
        nb = max(nba, nbb)
        ba = [("b", nb - nba + j) for j in range(nba)]
        bb = [("b", nb - nbb + j) for j in range(nbb)]
        out = [("b", j) for j in range(nb)] + (["m"] if ra >= 2 else []) + (["n"] if rb >= 2 else [])
        return [ba + ka, bb + kb], out

    def matmul(self, a, b, hint=None, inline_ok=True):
        if not isinstance(a, View) or not isinstance(b, View):
            self.unsupported(why="a plain-number operand")
        keys, out = self.matmul_keys(a, b)
        return self.einsum_view([a, b], keys, out, hint=hint, inline_ok=inline_ok)

    def op_matmul(self, node):
        return self.matmul(self.view_arg(node.args[0]), self.view_arg(node.args[1]))

    op_mm = op_bmm = op_mv = op_dot = op_matmul

    def op_addmm(self, node):
        a = self.args(node)
        if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1:
            self.unsupported(why="beta or alpha other than 1")
        m = self.matmul(self.view_arg(a["mat1"]), self.view_arg(a["mat2"]))
        return self.binop("+", m, self.view_arg(a["self"]))

    def op_baddbmm(self, node):
        """beta * input + alpha * (batch1 @ batch2) (Bloom's, GPT-NeoX's scores): an einsum, scaled, plus input."""
        a = self.args(node)
        y = self.matmul(self.view_arg(a["batch1"]), self.view_arg(a["batch2"]))
        alpha, beta = a.get("alpha", 1), a.get("beta", 1)
        if alpha != 1:
            y = self.binop("*", y, alpha)
        if beta == 0:
            return y
        base = self.view_arg(a["self"])
        return self.binop("+", y, base if beta == 1 else self.binop("*", base, beta))

    def op_linear(self, node):
        a = self.args(node)
        x, w, b = self.view_arg(a["input"]), self.view_arg(a["weight"]), a.get("bias")
        if not isinstance(x, View) or not isinstance(w, View):
            self.unsupported(why="a plain-number operand")
        rx = len(x.full)
        kx = [("x", j) for j in range(rx - 1)] + ["k"]
        kw = ["o", "k"] if len(w.full) == 2 else ["k"]
        out = kx[:-1] + (["o"] if len(w.full) == 2 else [])
        if w.batched:
            self.unsupported(why="a weight with a batch axis")
        y = self.einsum_view([x, w], [kx, kw], out)
        if b is None:
            return y
        bias = self.view_arg(b)
        return self.fuse_add(y, bias)

    def fuse_add(self, y: View, bias: View) -> View:
        """y + bias, as one expression (the einsum of a linear map and its bias)."""
        (ex, eb), legs, axes, batched = self.broadcast([y, bias])
        if isinstance(ex, Ref) and ex.pval is y.pval and y.pval.stmt is not None and y.pval.stmt is self.cur.items[-1]:
            st = self.cur.items.pop()  # fold the einsum into the sum
            for l in y.pval.legs:
                self.C.find(l).vals.discard(y.pval.id)
            ex = st.expr
        p = self.emit(BinOp("+", ex, eb), legs, batched)
        return View(p, axes, batched)

    def op_einsum(self, node):
        a = self.args(node)
        spec, tensors = a["equation"], a["tensors"]
        ops = [self.view_arg(t) for t in tensors]
        if not all(isinstance(v, View) for v in ops):
            self.unsupported(why="a plain-number operand")
        keys, out = self.torch_spec(spec, [len(v.full) for v in ops])
        y = self.einsum_view(ops, keys, out)
        for v, ks in zip(ops, keys):  # the user's letters are the legs' names, where they can be
            for e, k in zip(v.full, ks):
                if isinstance(e, Cls) and isinstance(k, str) and self.C.find(e).pref is None:
                    self.C.find(e).pref = k
        e = y.pval.stmt.expr if isinstance(y.pval.stmt.expr, Einsum) else None
        if e is not None:
            for k, c in e.out_cls.items():
                if isinstance(k, str) and self.C.find(c).pref is None:
                    self.C.find(c).pref = k
        return y

    def op_bilinear(self, node):
        """nn.Bilinear, torch.bilinear(a, b, W, bias): einsum('...i,oij,...j->...o') + bias."""
        a = self.args(node)
        ops = [self.view_arg(a["input1"]), self.view_arg(a["weight"]), self.view_arg(a["input2"])]
        if not all(isinstance(v, View) for v in ops):
            self.unsupported(why="a plain-number operand")
        keys, out = self.torch_spec("...i,oij,...j->...o", [len(v.full) for v in ops])
        y = self.einsum_view(ops, keys, out)
        bias = self.view_arg(a["bias"]) if a.get("bias") is not None else None
        return y if bias is None else self.binop("+", y, bias)

    def torch_spec(self, spec: str, ranks):
        s = spec.replace(" ", "")
        lhs, arrow, rhs = s.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(ranks):
            self.unsupported(why=f"spec {spec!r} has {len(terms)} terms for {len(ranks)} operands")
        parsed, ell = [], 0
        for t, r in zip(terms, ranks):
            before, dots, after = t.partition("...")
            n = r - len(before) - len(after) if dots else 0
            if n < 0 or (not dots and len(t) != r):
                self.unsupported(why=f"spec {spec!r} does not fit the operands")
            ell = max(ell, n)
            parsed.append((before, bool(dots), n, after))
        keys = []
        for before, dots, n, after in parsed:
            ks = list(before) + [("...", ell - n + j) for j in range(n)] + list(after)
            keys.append(ks)
        if arrow:
            before, dots, after = rhs.partition("...")
            out = list(before) + ([("...", j) for j in range(ell)] if dots else []) + list(after)
        else:
            counts = defaultdict(int)
            for t in terms:
                for ch in t.replace("...", ""):
                    counts[ch] += 1
            out = [("...", j) for j in range(ell)] + sorted(ch for ch, n in counts.items() if n == 1)
        return keys, out

    def op_scaled_dot_product_attention(self, node):
        a = self.args(node)
        q, k, v = (self.view_arg(a[n]) for n in ("query", "key", "value"))
        if a.get("enable_gqa"):  # grouped-query heads: each key-value head serves h / g query heads
            hq, hk = self.full_shape(q)[-3], self.full_shape(k)[-3]
            if hq != hk:
                if len(k.full) < 3 or hq % hk:
                    self.unsupported(why="enable_gqa=True with query heads that are not a multiple of the key-value heads")
                k = self.tile(k, len(k.full) - 3, hq // hk, interleave=True)
                v = self.tile(v, len(v.full) - 3, hq // hk, interleave=True)
        mask, p, causal, scale = a.get("attn_mask"), a.get("dropout_p", 0.0), a.get("is_causal", False), a.get("scale")
        kk = [("b", j) for j in range(len(k.full) - 2)] + ["s", "e"]
        kq = [("b", j) for j in range(len(q.full) - 2)] + ["l", "e"]
        out = kq[:-1] + ["s"]
        e_cls = q.axes[-1]
        if scale is None:
            div = Call("sqrt", [Leg(e_cls)])
            scores = self.einsum_view([q, k], [kq, kk], out, extra=lambda ex: BinOp("/", ex, div), hint="scores", inline_ok=False)
        else:
            scores = self.einsum_view([q, k], [kq, kk], out, extra=lambda ex: BinOp("*", ex, Num(scale)), hint="scores", inline_ok=False)
        t_cls, s_cls = scores.axes[-2], scores.axes[-1]
        if causal:
            if mask is not None:
                self.unsupported(why="attn_mask together with is_causal")
            p_ = self.emit(Call("where", [Call("causal", [Leg(t_cls), Leg(s_cls)]), Ref(scores.pval), Num(float("-inf"))]),
                           scores.pval.legs, scores.batched, hint="scores", inline_ok=False)
            scores = View(p_, list(scores.axes), scores.batched)
        elif mask is not None:
            m = self.view_arg(mask)
            if not isinstance(m, View):
                self.unsupported(why="a plain-number mask")
            scores = self.where_(m, scores, float("-inf")) if m.pval.dtype == "bool" else self.binop("+", scores, m)
        probs = self.emit(Call("softmax", [Ref(scores.pval), Leg(s_cls)]), scores.pval.legs, scores.batched, hint="probs", inline_ok=False)
        probs = View(probs, list(scores.axes), scores.batched)
        if p:
            probs = self.unary_call("dropout", probs, p=float(p))
        kp = kq[:-1] + ["s"]
        kv = [("b", j) for j in range(len(v.full) - 2)] + ["s", "f"]
        return self.einsum_view([probs, v], [kp, kv], kq[:-1] + ["f"])

    # ---- legs: softmax, norms, reductions -------------------------------------------------------------
    def leg_of(self, v: View, dim: int) -> Cls:
        c = v.axes[self.axis(v, dim)]
        if c is None:
            self.unsupported(why="over an axis of size 1")
        return c

    def op_softmax(self, node):
        return self.over_leg("softmax", node)

    def op__softmax(self, node):
        return self.over_leg("softmax", node)

    def op_log_softmax(self, node):
        return self.over_leg("log_softmax", node)

    def op__log_softmax(self, node):
        return self.over_leg("log_softmax", node)

    def over_leg(self, fn, node):
        a = self.args(node)
        x = self.view_arg(a["self"])
        c = self.leg_of(x, a["dim"])
        p = self.emit(Call(fn, [Ref(x.pval), Leg(c)]), x.pval.legs, x.batched)
        return View(p, list(x.axes), x.batched)

    def norm_param(self, w, what):
        if w is None:
            return None
        v = self.view_arg(w)
        if not isinstance(v, View) or v.pval.kind not in ("param", "buffer") or v.pval.region is not self.cur or len(v.pval.legs) != 1:
            self.unsupported(why=f"its {what} is not a one-axis parameter of the module that calls it")
        return v

    def norm(self, fn, x, shape, weight, bias, eps):
        if len(shape) != 1:
            self.unsupported(why="normalising over more than one axis")
        c = self.leg_of(x, -1)
        kwargs = []
        for key, w in (("weight", weight), ("bias", bias)):
            if w is not None:
                self.unify(w.pval.legs[0], c)
                kwargs.append((key, Ref(w.pval)))
        kwargs.append(("eps", Num(float(eps))))
        p = self.emit(Call(fn, [Ref(x.pval), Leg(c)], kwargs), x.pval.legs, x.batched)
        return View(p, list(x.axes), x.batched)

    def op_layer_norm(self, node):
        a = self.args(node)
        x = self.view_arg(a["input"])
        w, b = self.norm_param(a.get("weight"), "weight"), self.norm_param(a.get("bias"), "bias")
        return self.norm("layernorm", x, a["normalized_shape"], w, b, a.get("eps", 1e-5))

    def op_rms_norm(self, node):
        a = self.args(node)
        x = self.view_arg(a["input"])
        w = self.norm_param(a.get("weight"), "weight")
        eps = a.get("eps")
        if eps is None:
            eps = torch.finfo(node.args[0].meta["val"].dtype).eps
        return self.norm("rmsnorm", x, a["normalized_shape"], w, None, eps)

    def as_number(self, x):
        """A bool mask as torch promotes it in arithmetic and sums: where(mask, 1, 0)."""
        if isinstance(x, View) and x.pval.dtype == "bool":
            p = self.emit(Call("where", [Ref(x.pval), Num(1), Num(0)]), x.pval.legs, x.batched)
            return View(p, list(x.axes), x.batched)
        return x

    def reduced_axes(self, x: View, dims) -> list[int]:
        """The indices into x.axes of torch's reduction dims (None or [] is every axis; the batch
        axis is BatchAxis, as `axis` says)."""
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(len(x.full)))
        if isinstance(dims, int):
            dims = [dims]
        return sorted({self.axis(x, d) for d in dims})

    @staticmethod
    def dropped(v: View, idx) -> View:
        """A keepdim reduction's view without its kept size-1 axes at `idx` (the same tensor)."""
        return View(v.pval, [c for j, c in enumerate(v.axes) if j not in idx], v.batched)

    def reduce(self, x: View, dims, keepdim, kind):
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        if kind in ("sum", "mean", "prod"):
            x = self.as_number(x)
        idx = self.reduced_axes(x, dims)
        gone = [x.axes[j] for j in idx if x.axes[j] is not None]
        axes = [None if j in idx else c for j, c in enumerate(x.axes)] if keepdim else [c for j, c in enumerate(x.axes) if j not in idx]
        if not gone:
            return View(x.pval, axes, x.batched)
        drop = {id(self.C.find(c)) for c in gone}
        legs = [l for l in x.pval.legs if id(self.C.find(l)) not in drop]
        if len(gone) == 1 and kind in ("sum", "mean", "max"):
            expr = Call(kind, [Ref(x.pval), Leg(gone[0])])
        else:
            expr = Call("reduce", [Ref(x.pval), Pattern(list(x.pval.legs), legs), Str(kind)])
        p = self.emit(expr, legs, x.batched)
        return View(p, axes, x.batched)

    def op_linalg_vector_norm(self, node):
        """The 2-norm over dims: sqrt(sum(x * x)) (F.normalize is this, clamp_min and a division)."""
        a = self.args(node)
        if float(a.get("ord", 2)) != 2.0 or a.get("dtype") is not None:
            self.unsupported(why="a norm other than the 2-norm")
        x = self.view_arg(a["self"])
        total = self.reduce(self.binop("*", x, x), a.get("dim"), a.get("keepdim", False), "sum")
        return self.unary_call("sqrt", total)

    def op_var(self, node):
        """Variance over dims with torch's correction (Bessel's by default): sum((x - mean)²) / (n - c)."""
        return self.variance(node, sqrt=False)

    def op_std(self, node):
        return self.variance(node, sqrt=True)

    def variance(self, node, sqrt: bool):
        a = self.args(node)
        x = self.view_arg(a["self"])
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        dims = a.get("dim")
        correction = a.get("correction")
        if correction is None:
            correction = 1 if a.get("unbiased", True) else 0
        n = math.prod(x.axes[j].size if x.axes[j] is not None else 1 for j in self.reduced_axes(x, dims))
        if n - float(correction) <= 0:
            self.unsupported(why="fewer entries than the correction")
        centred = self.binop("-", x, self.reduce(x, dims, True, "mean"))
        total = self.reduce(self.binop("*", centred, centred), dims, a.get("keepdim", False), "sum")
        var = self.binop("/", total, float(n - float(correction)))
        return self.unary_call("sqrt", var) if sqrt else var

    def op_logsumexp(self, node):
        """log Σ exp(x) over dims, as m + log(sum(exp(x - m))) with m the maximum (its value and its
        gradient, softmax, are logsumexp's)."""
        a = self.args(node)
        x = self.view_arg(a["self"])
        dims, keepdim = a.get("dim"), a.get("keepdim", False)
        m = self.map_expr(self.reduce(x, dims, True, "max"), lambda r: Call("detach", [r]))  # once, kept dims
        total = self.unary_call("log", self.reduce(self.unary_call("exp", self.binop("-", x, m)), dims, keepdim, "sum"))
        return self.binop("+", total, m if keepdim else self.dropped(m, self.reduced_axes(x, dims)))

    def op_log_sigmoid(self, node):
        """log σ(x) = -softplus(-x)."""
        x = self.view_arg(node.args[0])
        return self.map_expr(x, lambda r: Neg(Call("softplus", [Neg(r)])))

    def op_relu6(self, node):
        return self.unary_call("clamp", self.view_arg(node.args[0]), min=0.0, max=6.0)

    def op_hardtanh(self, node):
        a = self.args(node)
        return self.unary_call("clamp", self.view_arg(a["self"]), min=float(a.get("min_val", -1.0)), max=float(a.get("max_val", 1.0)))

    def op_sum(self, node):
        a = self.args(node)
        if a.get("dtype") is not None:
            self.unsupported(why="a dtype argument")
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "sum")

    def op_mean(self, node):
        a = self.args(node)
        if a.get("dtype") is not None:
            self.unsupported(why="a dtype argument")
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "mean")

    def op_amax(self, node):
        a = self.args(node)
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "max")

    def op_amin(self, node):
        a = self.args(node)
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "min")

    def op_prod(self, node):
        a = self.args(node)
        return self.reduce(self.view_arg(a["self"]), a.get("dim"), a.get("keepdim", False), "prod")

    def op_max(self, node):
        a = self.args(node)
        if "dim" in a and _overload(node) == "dim":
            return (self.reduce(self.view_arg(a["self"]), a["dim"], a.get("keepdim", False), "max"), None)
        if _overload(node) == "default":
            return self.reduce(self.view_arg(a["self"]), None, False, "max")
        self.unsupported(why="max of two tensors (use torch.maximum's formula: where(a > b, a, b))")

    # ---- shapes -------------------------------------------------------------------------------------
    def reshape(self, x: View, new_full) -> View:
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        new_full = [int(s) for s in new_full]
        if x.batched:
            if not new_full or new_full[0] != self.batch_size:
                raise BatchAxis
            new = new_full[1:]
        else:
            new = new_full
        old_big = [(j, c) for j, c in enumerate(x.axes) if c is not None and c.size != 1]
        ones = [c for c in x.axes if c is not None and c.size == 1]
        new_big = [(j, s) for j, s in enumerate(new) if s != 1]
        if math.prod(c.size for _, c in old_big) != math.prod(s for _, s in new_big):
            self.fail(f"{torch_name(self.node)}: internal: sizes do not match")
        groups, i, j = [], 0, 0
        while i < len(old_big) or j < len(new_big):
            if i >= len(old_big) or j >= len(new_big):
                self.fail(f"{torch_name(self.node)}: a reshape with an axis of size 0")
            go, gn = [old_big[i]], [new_big[j]]
            po, pn = old_big[i][1].size, new_big[j][1]
            i, j = i + 1, j + 1
            while po != pn:
                if po < pn:
                    go.append(old_big[i])
                    po *= old_big[i][1].size
                    i += 1
                else:
                    gn.append(new_big[j])
                    pn *= new_big[j][1]
                    j += 1
            groups.append((go, gn))
        if any(len(go) > 1 and len(gn) > 1 for go, gn in groups):  # regrouped: merge first, then split
            mid = []
            for go, gn in groups:
                mid += [math.prod(c.size for _, c in go)] if len(gn) > 1 else [c.size for _, c in go]
            x = self.reshape(x, ([self.batch_size] if x.batched else []) + mid)
            return self.reshape(x, new_full)
        axes = [None] * len(new)
        split_of, right, changed = {}, [], bool(ones)
        for go, gn in groups:
            if len(go) == 1 and len(gn) == 1:
                axes[gn[0][0]] = go[0][1]
                right.append(go[0][1])
            elif len(go) == 1:
                n = len(gn)
                roles = ["part"] * (n - 2) + ["head", "headdim"]  # (3, heads, head dim) of a fused qkv too
                src = go[0][1]
                merged = self.C.find(src).merge
                if merged and [self.C.find(f).size for f in merged] == [sz for _, sz in gn] and not any(
                        self.C.same(f, l) for f in merged for l in x.pval.legs):
                    parts = list(merged)  # a merge undone: the legs it was made of
                else:
                    parts = None
                parts = parts or [self.C.new(s, role=r, origin=f"{'first' if k == 0 else 'last' if k == n - 1 else 'middle'} factor of a view of {_describe(src)}")
                         for k, ((_, s), r) in enumerate(zip(gn, roles))]
                split_of[id(self.C.find(src))] = tuple(parts)
                for (jj, _), p in zip(gn, parts):
                    axes[jj] = p
                right.extend(parts)
                changed = True
            else:
                factors = tuple(c for _, c in go)
                m = self.C.new(gn[0][1], role="merge", merge=factors, origin="")
                axes[gn[0][0]] = m
                right.append(factors)
                changed = True
        if not changed:
            return View(x.pval, axes, x.batched)
        left = []
        for l in x.pval.legs:
            r = id(self.C.find(l))
            if l.size == 1:
                left.append("1")
            elif r in split_of:
                left.append(split_of[r])
            else:
                left.append(l)
        legs = [c for c in axes if c is not None]
        p = self.emit(Call("rearrange", [Ref(x.pval), Pattern(left, right)]), legs, x.batched, x.pval.dtype)
        return View(p, axes, x.batched)

    def reshape_node(self, node):
        return self.reshape(self.view_arg(node.args[0]), self.out_shape())

    op_view = op_reshape = op__unsafe_view = op_flatten = op_unflatten = op_view_as = op_reshape_as = reshape_node

    def permute(self, x: View, perm) -> View:
        full = x.full
        n = len(full)
        perm = [p % n for p in perm]
        new = [full[p] for p in perm]
        if x.batched:
            if new[0] is not BATCH:
                raise BatchAxis
            new = new[1:]
        return View(x.pval, new, x.batched)

    def op_permute(self, node):
        x = self.view_arg(node.args[0])
        return self.permute(x, list(node.args[1]))

    def op_transpose(self, node):
        x = self.view_arg(node.args[0])
        n = len(x.full)
        d0, d1 = node.args[1] % n, node.args[2] % n
        perm = list(range(n))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.permute(x, perm)

    op_swapaxes = op_swapdims = op_transpose

    def op_t(self, node):
        x = self.view_arg(node.args[0])
        return self.permute(x, list(range(len(x.full)))[::-1])

    op_numpy_T = op_t

    def op_mT(self, node):
        x = self.view_arg(node.args[0])
        n = len(x.full)
        perm = list(range(n))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return self.permute(x, perm)

    op_mH = op_adjoint = op_mT

    def op_movedim(self, node):
        x = self.view_arg(node.args[0])
        n = len(x.full)
        src, dst = node.args[1], node.args[2]
        src = [s % n for s in (src if isinstance(src, (list, tuple)) else [src])]
        dst = [d % n for d in (dst if isinstance(dst, (list, tuple)) else [dst])]
        order = [i for i in range(n) if i not in src]
        perm = [None] * n
        for s, d in zip(src, dst):
            perm[d] = s
        it = iter(order)
        perm = [p if p is not None else next(it) for p in perm]
        return self.permute(x, perm)

    op_moveaxis = op_movedim

    def op_unsqueeze(self, node):
        return self.unsqueezed(self.view_arg(node.args[0]), node.args[1])

    def unsqueezed(self, x: View, d: int) -> View:
        """x with a size-1 axis inserted at d (counted from the end when negative), as op_unsqueeze."""
        full = x.full
        d = d % (len(full) + 1)
        new = full[:d] + [None] + full[d:]
        if x.batched:
            if new[0] is not BATCH:
                raise BatchAxis
            new = new[1:]
        return View(x.pval, new, x.batched)

    def op_cdist(self, node):
        """torch.cdist(a (…, P, M), b (…, R, M)) with p = 2: sqrt(sum((a - b)², m)) between every
        row of a and every row of b (prototype distances)."""
        a = self.args(node)
        if float(a.get("p", 2.0)) != 2.0:
            self.unsupported(why="a p-norm distance other than p = 2")
        x1, x2 = self.view_arg(a["x1"]), self.view_arg(a["x2"])
        diff = self.binop("-", self.unsqueezed(x1, -2), self.unsqueezed(x2, -3))
        return self.unary_call("sqrt", self.reduce(self.binop("*", diff, diff), [-1], False, "sum"))

    def op_cosine_similarity(self, node):
        """F.cosine_similarity(a, b, dim, eps): sum(a/max(|a|, eps) * b/max(|b|, eps)) over dim."""
        a = self.args(node)
        x1, x2 = self.view_arg(a["x1"]), self.view_arg(a["x2"])
        dim, eps = a.get("dim", 1), float(a.get("eps", 1e-8))

        def unit(x):
            norm = self.unary_call("sqrt", self.reduce(self.binop("*", x, x), [dim], True, "sum"))
            return self.binop("/", x, self.unary_call("clamp", norm, min=eps))

        return self.reduce(self.binop("*", unit(x1), unit(x2)), [dim], False, "sum")

    def op_squeeze(self, node):
        x = self.view_arg(node.args[0])
        full = x.full
        n = len(full)
        dims = node.args[1] if len(node.args) > 1 else list(range(n))
        dims = [d % n for d in (dims if isinstance(dims, (list, tuple)) else [dims])] if n else []
        drop_present, remove = [], set()
        for d in dims:
            e = full[d]
            if e is BATCH:
                if self.batch_size == 1:
                    raise BatchAxis
                continue
            j = d - (1 if x.batched else 0)
            if e is None:
                remove.add(j)
            elif e.size == 1:
                drop_present.append(j)
                remove.add(j)
        if drop_present:
            x = self.drop_ones(x, drop_present)
        return View(x.pval, [c for j, c in enumerate(x.axes) if j not in remove], x.batched)

    def op_expand(self, node):
        return self.expand(self.view_arg(node.args[0]), list(node.args[1]))

    def op_expand_as(self, node):
        return self.expand(self.view_arg(node.args[0]), self.out_shape())

    def expand(self, x, sizes):
        if not isinstance(x, View):
            self.unsupported(why="a plain number")
        full = x.full
        pad = len(sizes) - len(full)
        if pad < 0:
            self.unsupported(why="expanding to fewer axes")
        if x.batched and pad:
            raise BatchAxis
        new_axes, drops, grown = [], [], False
        for pos, s in enumerate(sizes):
            e = full[pos - pad] if pos >= pad else None
            if e is BATCH:
                if s not in (-1, self.batch_size):
                    raise BatchAxis
                continue
            if s == -1 or (isinstance(e, Cls) and e.size == s) or (e is None and s == 1):
                new_axes.append(e)
                continue
            if isinstance(e, Cls) and e.size == 1:
                drops.append(pos - pad - (1 if x.batched else 0))
            new_axes.append(self.C.new(s, role="copy", origin="a copied axis (expand)"))
            grown = True
        if not grown:
            return View(x.pval, new_axes, x.batched)
        if drops:
            x = self.drop_ones(x, drops)
        present = [c for c in new_axes if c is not None]
        p = self.emit(Call("repeat", [Ref(x.pval), Pattern(list(x.pval.legs), present)]), present, x.batched, x.pval.dtype)
        return View(p, new_axes, x.batched)


    # ---- split, concat, select, slice --------------------------------------------------------------------
    def split(self, x: View, dim, sizes):
        j = self.axis(x, dim)
        c = x.axes[j]
        if c is None or len(sizes) == 1:
            return [x]
        parts = [self.C.new(s, role="piece", origin=f"a piece of {_describe(c)} (split)") for s in sizes]
        outs = [[p if self.C.same(l, c) else l for l in x.pval.legs] for p in parts]
        pvals = self.emit(Call("split", [Ref(x.pval), Leg(c), LegList(parts)]), None, x.batched, x.pval.dtype, outs=outs)
        return [View(pv, [p if a is c else a for a in x.axes], x.batched) for pv, p in zip(pvals, parts)]

    def split_node(self, node):
        x = self.view_arg(node.args[0])
        a = self.args(node)
        dim = a.get("dim", 0)
        vals = node.meta.get("val")
        sizes = [int(v.shape[dim]) for v in vals]
        return self.split(x, dim, sizes)

    op_split = op_split_with_sizes = op_chunk = op_tensor_split = split_node

    def op_unbind(self, node):
        x = self.view_arg(node.args[0])
        a = self.args(node)
        dim = a.get("dim", 0)
        n = len(node.meta["val"])
        return [self.select(x, dim, i) for i in range(n)]

    def concat(self, views, dim):
        views = [v for v in views]
        if not all(isinstance(v, View) for v in views):
            self.unsupported(why="a plain-number part")
        if len({v.batched for v in views}) > 1:
            raise BatchAxis
        parts = []
        for v in views:
            j = self.axis(v, dim)
            if v.axes[j] is None:
                one = self.C.new(1, role="one", origin="a size-1 axis (to stack along)")
                axes = list(v.axes)
                axes[j] = one
                present = [c for c in axes if c is not None]
                p = self.emit(Call("repeat", [Ref(v.pval), Pattern(list(v.pval.legs), present)]), present, v.batched, v.pval.dtype)
                v = View(p, axes, v.batched)
            parts.append(self.materialize(v))
        j0 = self.axis(parts[0], dim)
        first = parts[0]
        for v in parts[1:]:
            if [a is None for a in v.axes] != [a is None for a in first.axes]:
                self.unsupported(why="parts with size-1 axes in different places")
            for k, (c1, c2) in enumerate(zip(first.axes, v.axes)):
                if k != j0 and c1 is not None:
                    self.unify(c1, c2)
        total = sum(v.axes[j0].size for v in parts)
        into = self.C.new(total, role="joined", origin=f"{_describe(first.axes[j0])} joined with {len(parts) - 1} more (concat)")
        leg = first.axes[j0]
        legs = [into if self.C.same(l, leg) else l for l in first.pval.legs]
        p = self.emit(Call("concat", [TensorList([Ref(v.pval) for v in parts]), Leg(leg), Leg(into)]), legs, first.batched, first.pval.dtype)
        axes = list(first.axes)
        axes[j0] = into
        return View(p, axes, first.batched)

    def op_cat(self, node):
        a = self.args(node)
        tensors = [self.view_arg(t) for t in a["tensors"]]
        tensors = [t for t in tensors if not (isinstance(t, View) and any(c is not None and c.size == 0 for c in t.axes))]
        if len(tensors) == 1:
            return tensors[0]
        return self.concat(tensors, a.get("dim", 0))

    op_concat = op_concatenate = op_cat

    def op_stack(self, node):
        a = self.args(node)
        tensors = [self.view_arg(t) for t in a["tensors"]]
        dim = a.get("dim", 0)
        n = len(tensors[0].full) + 1
        d = dim % n
        ups = []
        for t in tensors:
            full = t.full
            new = full[:d] + [None] + full[d:]
            if t.batched:
                if new[0] is not BATCH:
                    raise BatchAxis
                new = new[1:]
            ups.append(View(t.pval, new, t.batched))
        return self.concat(ups, d)

    def select(self, x: View, dim, index):
        j = self.axis(x, dim)
        c = x.axes[j]
        axes = x.axes[:j] + x.axes[j + 1 :]
        if c is None:
            return View(x.pval, axes, x.batched)
        legs = [l for l in x.pval.legs if not self.C.same(l, c)]
        p = self.emit(Call("select", [Ref(x.pval), Leg(c), Num(int(index))]), legs, x.batched, x.pval.dtype)
        return View(p, axes, x.batched)

    def op_select(self, node):
        a = self.args(node)
        return self.select(self.view_arg(a["self"]), a["dim"], a["index"])

    def narrow(self, x: View, dim, start, end):
        full = x.full
        n = len(full)
        d = dim % n
        e = full[d]
        size = self.batch_size if e is BATCH else (1 if e is None else e.size)
        start = 0 if start is None else int(start)
        end = size if end is None else int(end)
        if start < 0:
            start += size
        if end < 0:
            end += size
        start, end = max(0, min(start, size)), max(0, min(end, size))
        if start == 0 and end == size:
            return x
        if e is BATCH:
            raise BatchAxis
        if e is None or end <= start:
            self.unsupported(why="an empty slice")
        j = self.axis(x, dim)
        new = self.C.new(end - start, role="slice", origin=f"indices {start} to {end - 1} of {_describe(e)}")
        legs = [new if self.C.same(l, e) else l for l in x.pval.legs]
        p = self.emit(Call("slice", [Ref(x.pval), Leg(e), Num(start), Leg(new)]), legs, x.batched, x.pval.dtype)
        axes = list(x.axes)
        axes[j] = new
        return View(p, axes, x.batched)

    def op_slice(self, node):
        a = self.args(node)
        if a.get("step", 1) not in (1, None):
            self.unsupported(why="a slice with a step")
        end = a.get("end")
        if end is not None and end >= INT64_MAX:
            end = None
        return self.narrow(self.view_arg(a["self"]), a.get("dim", 0), a.get("start"), end)

    def op_narrow(self, node):
        a = self.args(node)
        start = a["start"]
        return self.narrow(self.view_arg(a["self"]), a["dim"], start, start + a["length"])

    def op_arange(self, node):
        """Positions 0, 1, ... : only as an embedding's ids (rows start..end of the table: a slice)."""
        a = self.args(node)
        if _overload(node) == "default":
            start, end, step = 0, a.get("end"), 1
        else:
            start, end, step = a.get("start", 0), a.get("end"), a.get("step", 1) or 1
        if any(hasattr(v, "op") for v in (start, end, step)):
            self.unsupported(why="positions of a size known only at run time")
        return ("arange", int(start), int(end), int(step), node)

    def op_index_select(self, node):
        """table.index_select(0, ids): rows of a two-axis table, as an embedding is (gather)."""
        a = self.args(node)
        if a["dim"] % 2 != 0:
            self.unsupported(why="selecting along another axis than the table's first")
        return self.gather_rows(a["self"], a["index"])

    def op_embedding(self, node):
        a = self.args(node)
        return self.gather_rows(a["weight"], a["indices"])

    def gather_rows(self, weight, indices):
        w, ids = self.view_arg(weight), self.get(indices)
        if isinstance(ids, tuple) and ids and ids[0] == "arange":  # rows start..end of the table
            _, start, end, step, _n = ids
            if step != 1 or not isinstance(w, View):
                self.unsupported(why="an embedding of positions with a step")
            return self.narrow(self.materialize(w), 0, start, end)
        ids = self.view_arg(indices)
        if not isinstance(w, View) or w.batched or len(w.axes) != 2 or not isinstance(ids, View) or ids.pval.dtype != "int":
            self.unsupported(why="an embedding needs a two-axis table and integer ids")
        w = self.materialize(w)
        legs = list(ids.pval.legs) + [w.pval.legs[1]]
        p = self.emit(Call("gather", [Ref(w.pval), Ref(ids.pval)]), legs, ids.batched)
        return View(p, list(ids.axes) + [w.axes[1]], ids.batched)


def _base(node):
    """The tensor a chain of views is a view of."""
    while node.op == "call_function" and _packet(node) in VIEW_OPS and node.args and hasattr(node.args[0], "op"):
        node = node.args[0]
    return node


def _scalar(t):
    """A one-element tensor's value as a Python number (bool masks as 1 and 0)."""
    v = t.item()
    return float(v) if t.is_floating_point() else int(v)


def _describe(c) -> str:
    return c.origin.split(" (")[0] if isinstance(c, Cls) and c.origin else "an axis"


def _dtype(dt):
    if dt is None:
        return None
    if dt.is_floating_point:
        return "float"
    if dt == torch.bool:
        return "bool"
    if dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return "int"
    return None


_TORCH_DIR = None


def _in_torch(path: str) -> bool:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import os

        _TORCH_DIR = os.path.dirname(torch.__file__)
    return path.startswith(_TORCH_DIR)


def _user_file(path: str) -> bool:
    """A frame of the user's code: not torch's, not penrose's own, a file that exists."""
    import os

    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return not _in_torch(path) and not os.path.abspath(path).startswith(own + os.sep) and os.path.exists(path)


def _is_block(mod) -> bool:
    """A submodule call that becomes a block (the rest is inlined into its caller)."""
    if isinstance(mod, _CONTAINERS):
        return False
    if type(mod).__module__.startswith("torch.nn"):
        return any(True for _ in mod.parameters()) or any(True for _ in mod.buffers())
    return True


_RANGES: dict = {}


def _forward_range(mod):
    cls = type(mod)
    if cls in _RANGES:
        return _RANGES[cls]
    rng = None
    try:
        fn = inspect.unwrap(cls.forward)  # a decorated forward (Hugging Face's): the user's own function
        lines, first = inspect.getsourcelines(fn)
        rng = (inspect.getsourcefile(fn), first, first + len(lines) - 1)
    except (OSError, TypeError):
        rng = None
    _RANGES[cls] = rng
    return rng
