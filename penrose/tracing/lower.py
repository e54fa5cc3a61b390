"""From a `torch.export` graph to penrose statements, one block per submodule call.

Every ATen node the language can say becomes a statement (or only a new view, for transposes
and permutes); everything else is a `PenroseTraceError` at the user's line. In batch mode the
leading axis of the inputs is the implicit batch of every penrose input; an op that would touch
it raises `BatchAxis`, and the tracer starts again with that axis as a named leg.

Which handler lowers an ATen op is the table `penrose.tracing.aten.ATEN`; the handlers live in
`lower_elementwise`, `lower_contract`, `lower_legs` and `lower_shapes` (parts `Lowerer` is made of), and
this module keeps the walk, regions, values across blocks and the making of statements.
"""

from __future__ import annotations

import operator

import torch

from penrose.tracing.aten import ATEN, IDENTITY, VIRTUAL_OK
from penrose.tracing.common import (
    CAUSES, INPLACE_KEEP, SKIP, VIEW_OPS, BatchAxis, _base, _dtype, _forward_range, _in_torch, _is_block, _packet,
    _scalar, _user_file, torch_name,
)
from penrose.tracing.errors import PenroseTraceError, frames, span_at
from penrose.tracing.lower_consts import Constants
from penrose.tracing.lower_contract import Contractions
from penrose.tracing.lower_elementwise import Elementwise
from penrose.tracing.lower_legs import Reductions
from penrose.tracing.lower_shapes import Shapes
from penrose.tracing.model import (
    BinOp, Call, CallStmt, Classes, Cls, Leg, LegClash, Num, Pattern, PVal, Ref, Region, Stmt, View,
)


class Lowerer(Elementwise, Contractions, Reductions, Shapes, Constants):
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
        by_tensor: dict[int, list[str]] = {}
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
        self.output_names: list | None = None  # the fields of a ModelOutput the module returns, in order
        self.downcasts: list = []  # (model dtype, cast dtype, file:line, code) of each float cast below the model's dtype
        self.model_dtype = next((t.dtype for t in list(module.parameters()) + list(module.buffers()) + list(inputs)
                                 if t.is_floating_point()), None)
        self.input_views: list = []
        self.batch_size = None
        self.masks: dict = {}  # a bool buffer read in a region: its `!= 0`, made once
        self.fixed_length: list = []  # the lengths slices of position tables fix (the diagram's header says so)
        self.position_legs: list = []  # the legs of `~ arange` buffers made for positions forward computes
        self.rebuilding = 0  # inside `rebuild`: the ops of a constant lowered as any other
        self.kept: list = []  # (a param of a submodule never called, the name of the same tensor the diagram reads)
        self.none_outputs: list = []  # the places of the Nones among the module's outputs (not the diagram's)
        self.batch_legs: list = []  # explicit mode: the legs of axis 0 of the inputs that carry the batch
        self.virtuals: dict = {}  # the legs a virtual merge keeps apart -> its class (one per group)
        self.fixed_batch: list = []  # where a merge of the batch became a leg (the diagram's batch is then fixed)
        self.keep_virtual = True  # the op being lowered reads virtual merges as they are (VIRTUAL_OK)
        self.slices: dict = {}  # (start, end, size) -> the legs slices cut so: one leg where they can be
        self.views_of: dict = {}  # (role, size, sizes) -> the legs a view first split a leg so into
        self._helper_lines: dict | None = None  # helper_lines(), made once when the writer asks
        # a submodule's fqn -> which places of the tuple its (first) call returns hold a tensor; run.py
        # fills it while torch.export runs forward, the writer names a call's one tensor from it
        self.result_places: dict[str, tuple[bool, ...]] = {}
        self.batch_ones: list = []  # size-1 axes the batch broadcasts (learned tokens copied over it): one letter
        self.joined: list = []  # (a concat's joined leg, the legs it joins), for the index legend

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

        stacks = []
        self.replay(lambda func: stacks.append(traceback.extract_stack()[:-2]) if getattr(func, "__name__", None) == name else None)
        for stack in stacks:
            user = [f for f in stack if _user_file(f.filename)]
            if any(f.filename == span.file and f.lineno == span.line for f in user):
                inner = user[-1]
                return span_at(inner.filename, inner.lineno) if (inner.filename, inner.lineno) != (span.file, span.line) else span
        return span

    def replay(self, on_call):
        """Forward run once more on the example inputs (eval, no grad; params and buffers as they were
        after), `on_call(func)` told of every torch function it calls, with the caller's stack live."""
        from torch.overrides import TorchFunctionMode

        class Record(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                on_call(func)
                return func(*args, **(kwargs or {}))

        was = self.module.training
        self.module.eval()
        state = [(t, t.detach().clone()) for t in list(self.module.parameters()) + list(self.module.buffers())]
        try:
            with torch.no_grad(), Record():
                self.module(*self.inputs)
        except Exception:  # noqa: BLE001, S110 - only lines and names are sought; without them the trace stands
            pass
        finally:
            self.module.train(was)
            with torch.no_grad():  # what forward updated in place (a running count) is as it was
                for t, saved in state:
                    t.copy_(saved)

    def helper_lines(self) -> dict:
        """{node name: (file, line)}: the line inside a helper function that made a node whose recorded
        stack stops at the line of forward that called the helper (export keeps only that one), for
        the names a helper's lines give (`attn_weights = torch.matmul(...)` in `eager_attention_forward`).
        Forward runs once more (eval, no grad) recording the user's stack of every torch call; the
        k-th node of a torch function at a line is the k-th such call made through that line."""
        if self._helper_lines is not None:
            return self._helper_lines
        import traceback
        from collections import defaultdict

        calls = defaultdict(list)  # (function, file, line) -> the user's stack of each call through it
        functions: dict = {}  # an innermost user frame -> the name of its function

        def record(func):
            name = getattr(func, "__name__", None)
            stack = [f for f in traceback.extract_stack()[:-2] if _user_file(f.filename)] if name else []
            user = [(f.filename, f.lineno) for f in stack]
            if stack:
                functions[user[-1]] = stack[-1].name
            for frame in dict.fromkeys(user):
                calls[(name, *frame)].append(tuple(user))

        self.replay(record)
        seen: dict = defaultdict(int)
        self._helper_lines, self._helper_stacks = {}, {}
        for node in self.ep.graph.nodes:
            fn = node.meta.get("torch_fn")
            user = [f[:2] for f in frames(node.meta.get("stack_trace")) if _user_file(f[0])]
            if node.op != "call_function" or not fn or len(fn) != 2 or not isinstance(fn[1], str) or not user:
                continue
            key = (fn[1].rsplit(".", 1)[-1], *user[-1])
            k = seen[key]
            seen[key] += 1
            if k < len(calls.get(key, ())) and calls[key][k][-1] != user[-1]:
                self._helper_lines[node.name] = calls[key][k][-1]
                self._helper_stacks[node.name] = calls[key][k]
        self._functions = functions
        return self._helper_lines

    def helper_result(self, name):
        """The helper function whose returned value node `name` is (the last node made on its `return`
        line in one module call), or None."""
        import linecache

        line = self.helper_lines().get(name)
        if line is None or not self.last_on_line(name) or not linecache.getline(*line).lstrip().startswith("return"):
            return None
        fn = self._functions.get(line)
        return None if fn in (None, "forward", "<lambda>") else fn

    def last_on_line(self, name):
        """Whether node `name` is the last (in graph order) that its helper's line made in one module call."""
        if not hasattr(self, "_last_on_line"):
            nodes = {n.name: n for n in self.ep.graph.nodes}
            self._last_on_line = {}
            for n in self.helper_lines():  # in graph order: the last one of a call stays
                stack = nodes[n].meta.get("nn_module_stack") or {}
                self._last_on_line[(self._helper_stacks[n], tuple(stack))] = n  # its keys: one a call (`@1` a second call of a shared module)
            self._last_names = set(self._last_on_line.values())
        return name in self._last_names

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
        self.fold_constants(list(self.ep.graph.nodes))
        for node in self.ep.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                kind, target = self.placeholders.get(node.name, ("USER_INPUT", None))
                if kind == "USER_INPUT" and user >= len(self.inputs) and not isinstance(node.meta.get("val"), torch.Tensor):
                    self.values[node] = ("const", node.meta.get("val"), node)  # a keyword trace passes (use_cache=False)
                elif kind == "USER_INPUT":
                    self.values[node] = self.input_view(node, user)
                    self.input_views.append(self.values[node])
                    user += 1
                else:
                    self.values[node] = ("state", kind, target, node)
            elif node.op == "call_function" and node in self.pure:
                self.values[node] = ("const", self.consts[node], node)  # read where a tensor of the diagram meets it
            elif node.op == "call_function":
                self.enter(node)
                saved = self.checkpoint() if node in self.consts else None
                try:
                    self.values[node] = self.lower(node)
                except PenroseTraceError:
                    if saved is None:
                        raise
                    self.restore(saved)  # what the attempt declared (buffers, masks) is not the diagram's
                    # made from constants alone (Hugging Face's masks from torch.arange): its values,
                    # read where a tensor of the diagram meets them (a causal mask, a number, positions)
                    self.values[node] = ("const", self.consts[node], node)
                except BatchAxis:
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
                self.none_outputs = [i + 1 for i, o in enumerate(outs) if o is None]  # `return logits, None` (nanoGPT's loss)
                outs = [o for o in outs if o is not None]
                if not outs:
                    raise PenroseTraceError("the module returns None; a diagram's outputs are tensors", self.return_span())
                for o in outs:
                    if not hasattr(o, "op"):
                        raise PenroseTraceError(f"the module returns a {type(o).__name__} ({o!r:.30}), not a tensor; a "
                                                "diagram's outputs are tensors", self.return_span())
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

    def batch_fix_site(self):
        """Where the diagram fixes its batch (explicit mode): the first statement that merges the batch
        leg with others, splits or joins along it, or repeats a tensor over it; None when none does."""
        from penrose.tracing.model import LegList, children

        def fixes(e) -> bool:
            if isinstance(e, Call) and e.fn in ("rearrange", "repeat") and len(e.args) > 1 and isinstance(e.args[1], Pattern):
                pat = e.args[1]
                left = {id(self.C.find(c)) for x in pat.left for c in (x if isinstance(x, tuple) else [x]) if not isinstance(c, str)}
                for x in pat.left + pat.right:
                    if isinstance(x, tuple) and any(self.batchy(c) for c in x):
                        return True
                if e.fn == "repeat" and any(not isinstance(x, (str, tuple)) and self.batchy(x) and id(self.C.find(x)) not in left
                                            for x in pat.right):
                    return True
            if isinstance(e, Call) and e.fn in ("concat", "split", "slice") and any(
                    isinstance(a, Leg) and self.batchy(a.cls) or isinstance(a, LegList) and any(self.batchy(c) for c in a.legs)
                    for a in e.args[1:]):
                return True
            return any(fixes(x) for x in children(e))

        nodes = {n.name: n for n in self.ep.graph.nodes}
        for r in self.regions.values():
            for it in r.items:
                if isinstance(it, Stmt) and fixes(it.expr):
                    node = nodes.get(it.outs[0].node) if it.outs and it.outs[0].node else None
                    return self.deeper(node, self.where(node)) if node is not None else None
        return None

    def return_span(self):
        """The last `return` of the module's forward (where a refused output is written)."""
        import linecache

        rng = self.root.forward_range
        if rng is None:
            return None
        for line in range(rng[2], rng[1] - 1, -1):
            if linecache.getline(rng[0], line).lstrip().startswith("return"):
                return span_at(rng[0], line)
        return None

    def checkpoint(self):
        return ({id(r): dict(r.params) for r in self.regions.values()}, dict(self.masks), len(self.position_legs),
                len(self.fixed_length))

    def restore(self, saved):
        params, masks, positions, fixed = saved
        for r in self.regions.values():
            if id(r) in params:
                r.params = params[id(r)]
        self.masks = masks
        del self.position_legs[positions:]
        del self.fixed_length[fixed:]

    def output_pval(self, v: View) -> PVal:
        """An output as a tensor whose legs are the torch axes, in order (size-1 axes too)."""
        self.src = None
        v = self.materialize(self.solid(v))
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
        if not self.batch and shape and legs and shape[0] == int(self.inputs[0].shape[0]) and self.inputs[0].dim():
            self.batch_legs.append(legs[0])  # the batch as a leg: merges with it are kept apart (virtual)
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

    def reader(self, owner):
        """The block of a submodule that forward never calls but whose params an ancestor's code
        reads (`x @ self.norm(self.rel.weight).T`: an embedding table used as a matrix): a call
        with no arguments that returns them, `rel_weight = embedding_rel() as rel`, made in the
        nearest block around the read that holds the submodule, so its params keep their names.
        None where the submodule cannot be a block."""
        try:
            mod = self.module.get_submodule(owner)
        except AttributeError:
            return None
        if not _is_block(mod):
            return None
        here = next((r for r in self.cur.ancestors() if r.is_block and (not r.fqn or owner.startswith(r.fqn + "."))), None)
        if here is None:
            return None
        key = ("read", owner, id(here))
        r = self.regions.get(key)
        if r is None:
            r = Region(key, owner, mod, here, True)
            r.closed = True
            r.call = CallStmt(r, src=self.naming_src(self.node, here))
            inside = next((c for c in self.cur.ancestors() if c.parent is here), None)
            at = here.items.index(inside.call) if inside is not None and inside.call in here.items else len(here.items)
            here.items.insert(at, r.call)
            here.children.append(r)
            self.regions[key] = r
        return r

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
            if isinstance(v, tuple) and v and v[0] == "const":
                return self.const_view(v)
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
            self.fail("torch.tensor cannot be expressed in .pen: a tensor forward makes from constants whose values the "
                      "diagram cannot say (a diagram's tensors are inputs, params and buffers: register it as a buffer)")
        owner, _, local = target.rpartition(".")
        region = next((r for r in self.cur.ancestors() if r.fqn == owner), None)
        if region is None:  # a tied weight: the name of the same tensor that this call owns
            for alias in self.aliases.get(target, ()):
                a_owner, _, a_local = alias.rpartition(".")
                found = next((r for r in self.cur.ancestors() if r.fqn == a_owner), None)
                if found is not None:
                    target, owner, local, region = alias, a_owner, a_local, found
                    break
        if region is None and owner and owner not in self.called and kind in ("PARAMETER", "BUFFER"):
            region = self.reader(owner)  # a submodule never called, its param read by an ancestor's code
        if region is None:
            self.fail(f"{'parameter' if kind == 'PARAMETER' else 'buffer'} {target!r} is used outside the call of its "
                      f"module {owner or '(top)'!r}; a block's params are reachable only inside its own calls")
        ids = self.made_ids(target, kind, node)
        if ids is not None:
            return ids
        p = region.params.get(target)
        if p is None and kind == "BUFFER" and target not in self.persistent:  # values no init makes: said another way
            table = self.unsaved_values(region, target, self.tensors.get(target))
            if table is not None:
                return table
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
            legs.append(self.C.new(s, role=role, origin=f"axis {j} of {'.'.join(target.split('.')[-2:])}"))
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
            if region is None and any(a in used for a in self.aliases.get(target, ())):
                region = self.keeper(owner, by_fqn)
                if region is not None:  # the same tensor as a param the diagram reads: kept, handed up unread
                    p = self.declare_state(region, target, local, "PARAMETER" if isinstance(tensor, torch.nn.Parameter)
                                           else "BUFFER", tensor)
                    twin = next(r.params[a] for r in self.regions.values() for a in self.aliases[target] if a in r.params)
                    for leg, other in zip(p.legs, twin.legs):
                        if self.C.can_union(leg, other):
                            self.C.union(leg, other)
                    self.kept.append((target, next(a for a in self.aliases[target] if a in used)))
                    self.export_from(region, View(p, list(p.legs), False))
                    continue
            if region is None:
                self.unused.append(target)
            else:
                self.declare_state(region, target, local, "PARAMETER" if isinstance(tensor, torch.nn.Parameter) else "BUFFER", tensor)

    def keeper(self, owner, by_fqn):
        """The block of a submodule forward never calls whose param is the same tensor as one the diagram
        reads (T5's `shared.weight`, its encoder's `embed_tokens.weight`): a call with no arguments
        that hands it up, ``shared_weight = embedding() as `shared` ``, first in the nearest called block
        that holds the submodule, so the state dict loads strictly. None where it cannot be a block."""
        try:
            mod = self.module.get_submodule(owner)
        except AttributeError:
            return None
        parts = owner.split(".")
        here = next((by_fqn[f] for f in (".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)) if f in by_fqn), None)
        if here is None or not _is_block(mod) or not owner:
            return None
        r = Region(("keep", owner), owner, mod, here, True)
        r.closed = True
        r.call = CallStmt(r, keep=True)
        here.items.insert(0, r.call)
        here.children.append(r)
        self.regions[r.key] = r
        return r

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
        assert C.call is not None  # a region below the top is entered by its call
        if out is None:
            out = PVal(inner.pval.legs, inner.pval.batched, inner.pval.dtype, C.parent, "callout", src=C.call.src)
            out.stmt = C.call
            if C.key[0] in ("read", "keep") and inner.pval.param:  # a param handed up by its module's reader: rel_weight
                out.hint = f"{C.fqn.rpartition('.')[2]}_{inner.pval.param}"
            C.return_of[inner.pval.id] = out
            C.returns.append((inner.pval, out))
            C.call.outs.append(out)
        return View(out, list(inner.axes), inner.batched)

    def import_into(self, R: Region, outer: View) -> View:
        assert R.call is not None  # a region below the top is entered by its call
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
        present = [l for c in v.axes for l in self.flat(c)]  # a virtual merge's legs, side by side
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
        if isinstance(src, tuple) and src and src[0] == "state":  # a buffer the module made: position ids, a fill of ids
            src = self.made_ids(src[2], src[1], src[3])
        if isinstance(src, tuple) and src and src[0] == "ids_fill":  # one id everywhere, whatever its shape
            if packet in ("unsqueeze", "expand", "view", "reshape", "slice", "gather") or packet in IDENTITY:
                return src
            return None
        if not (isinstance(src, tuple) and src and src[0] == "arange"):
            return None
        _, start, end, step, made = src
        if packet == "slice" and step == 1:  # position_ids[:, a:b]: a leading axis whole, or the positions a..b
            a = self.args(node)
            dim, lo, hi = a.get("dim", 0), a.get("start") or 0, a.get("end")
            shape = list(node.args[0].meta["val"].shape) if "val" in node.args[0].meta else None
            if shape is None or any(hasattr(v, "op") for v in (lo, hi)):
                return None
            n = end - start
            hi = n if hi is None or hi >= n else hi
            if dim % len(shape) != len(shape) - 1:
                return src if shape[dim] == 1 else None
            lo, hi = (lo + n if lo < 0 else lo), (hi + n if hi < 0 else hi)
            return ("arange", start + lo, start + max(lo, hi), 1, made)
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
        """The op's handler in `penrose.tracing.aten.ATEN`; an op not in the table is refused."""
        handler = ATEN.get(packet)
        if handler is None:
            self.unsupported()
        self.keep_virtual = packet in VIRTUAL_OK
        return handler(self, node)

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
        if packet not in ATEN or packet in IDENTITY:
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
            return v if self.keep_virtual else self.solid(v)
        if isinstance(v, tuple) and v and v[0] == "front":
            raise BatchAxis  # a permute that moved the batch, read other than one entry of axis 0 at a time
        if isinstance(v, tuple) and v and v[0] == "arange":
            self.unsupported("torch.arange", why="positions are expressible only as an embedding's ids (a slice of its table)")
        if isinstance(v, tuple) and v and v[0] in ("topk_values", "topk_indices"):
            self.fail(f"{torch_name(v[-1])} cannot be expressed in .pen: its values and indices are expressible only as "
                      "zeros_like(x).scatter(dim, indices, values), the language's topk(x, leg, k=K) (a mixture of "
                      "experts routed by them is data-dependent: no diagram selects the tokens of each expert)", v[-1])
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
