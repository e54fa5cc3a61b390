"""The dense form of a sparse mixture of experts, for `penrose.trace`.

A sparse mixture of experts routes each token to the k experts its router scores highest: a loop
over the experts taking the tokens routed to each (`torch.where(expert_mask[i])`, `index_add_`) is
data-dependent, which no diagram says. The same values come from every expert computed on every
token, each weighted by its gate, the gates of the experts a token is not routed to zero: the
router's scores kept by the language's `topk` (`zeros_like(p).scatter(-1, i, v)` with `v, i =
p.topk(k)`), renormalised where the module renormalises them. That costs E/k times the experts'
FLOPs (E experts, k per token), which the traced header says.

While the module is exported, each mixture of experts found here has its forward replaced by its
dense form, once that form gives the module's own outputs on the example inputs (its router's
scoring, softmax or sigmoid, and renormalisation, read off by trying each): two shapes are known,

- Hugging Face's (`MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`, ...): a router module with a
  `weight[E, e]` and a `top_k` that returns `(logits, top_k_weights, top_k_index)`, and an
  experts module with stacked `gate_up_proj[E, 2i, e]`, `down_proj[E, e, i]` and an `act_fn`
  called as `experts(x, top_k_index, top_k_weights)`: the router returns the dense gates in place
  of the top-k weights, the experts read them (the block's own forward is kept, its shared expert
  too);
- a module that loops over a `ModuleList` of E experts, routed by a child `nn.Linear` with E
  outputs, with its k as an attribute (`top_k`, `num_experts_per_tok`, `k`): its forward is
  replaced whole, every expert called on every token.

A mixture none of this fits is traced as it is, and refused at its line.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import torch.nn.functional as F

_K_NAMES = ("top_k", "num_experts_per_tok", "n_experts_per_tok", "experts_per_token", "topk", "k")
_SCORES = ("softmax", "sigmoid")


def _k_of(module, experts: int):
    for name in _K_NAMES:
        k = getattr(module, name, None)
        if isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= experts:
            return k
    return None


def dense_gates(logits, k: int, score: str, renorm: bool):
    """The gates of a top-k router, every expert's: its scores where a token is routed, 0 elsewhere."""
    probs = logits.softmax(-1) if score == "softmax" else logits.sigmoid()
    top, index = probs.topk(k, dim=-1)
    gates = torch.zeros_like(probs).scatter(-1, index, top)
    if renorm:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates


def router_forward(router, k: int, score: str, renorm: bool):
    """A Hugging Face router's forward, returning the dense gates where it returned the top-k weights."""
    def forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, router.weight.shape[-1])
        router_logits = F.linear(hidden_states, router.weight, getattr(router, "bias", None))
        return router_logits, dense_gates(router_logits, k, score, renorm), None
    return forward


def experts_forward(experts):
    """Stacked experts (`gate_up_proj`, `down_proj`) computed for every token, weighted by dense gates."""
    def forward(hidden_states, top_k_index, gates):
        gate_up = torch.einsum("te,xfe->txf", hidden_states, experts.gate_up_proj)
        gate, up = gate_up.chunk(2, dim=-1)
        current = experts.act_fn(gate) * up
        return torch.einsum("txf,xef,tx->te", current, experts.down_proj, gates)
    # the block's formals: the tensors it is called with (the top-k index is None), named as the
    # module's own forward names them (Mixtral's `top_k_weights`)
    try:
        own = [n for n in inspect.signature(experts.forward).parameters if n != "self"]
    except (TypeError, ValueError):  # pragma: no cover - a forward inspect cannot read
        own = []
    names = (own[0], own[2]) if len(own) >= 3 and own[0] != own[2] else ("hidden_states", "gates")
    forward.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                               for n in names])
    return forward


def looped_forward(gate, experts, k: int, score: str, renorm: bool):
    """A looped mixture's forward: every expert on every token, each weighted by its gate."""
    def forward(x):
        gates = dense_gates(gate(x), k, score, renorm)
        out = torch.stack([expert(x) for expert in experts], dim=-2)
        return torch.einsum("...x,...xe->...e", gates, out)
    return forward


class Mixture:
    """One mixture of experts found in the module: how to make its dense form, and what it costs."""

    def __init__(self, fqn, kind, parts, n_experts, k):
        self.fqn, self.kind, self.parts, self.n_experts, self.k = fqn, kind, parts, n_experts, k
        self.variant = None  # (score, renorm) once checked

    def forwards(self, score, renorm) -> list:
        """[(module, dense forward)] for this variant."""
        if self.kind == "hf":
            router, experts = self.parts
            return [(router, router_forward(router, self.k, score, renorm)), (experts, experts_forward(experts))]
        owner, gate, experts = self.parts
        return [(owner, looped_forward(gate, experts, self.k, score, renorm))]


def notes(mixtures) -> list:
    """The header's lines: one for the mixtures of each size (E experts, k per token)."""
    by_size: dict = {}
    for mix in mixtures:
        by_size.setdefault((mix.n_experts, mix.k), []).append(mix.fqn or "the module")
    out = []
    for (e, k), where in by_size.items():
        out.append(f"# Dense mixture{'s' if len(where) > 1 else ''} of experts ({', '.join(where)}): every token goes "
                   f"through all {e} experts, the gates of those it is not routed to 0, so the experts cost {e / k:g}x "
                   f"the FLOPs of the sparse module's {k} per token (E/k = {e}/{k}; docs/trace.md, \"Mixtures of experts\").")
    return out


def find(module) -> list:
    """The mixtures of experts in `module` whose dense form this file knows (not yet checked)."""
    found = []
    for fqn, mod in module.named_modules():
        children = dict(mod.named_children())
        router, experts = children.get("gate"), children.get("experts")
        if router is not None and experts is not None and _hf_shapes(router, experts):
            k = _k_of(router, router.weight.shape[0])
            if k is not None:
                found.append(Mixture(fqn, "hf", (router, experts), router.weight.shape[0], k))
                continue
        lists = [c for c in children.values() if isinstance(c, torch.nn.ModuleList) and len(c) >= 2
                 and len({type(m) for m in c}) == 1]
        if len(lists) != 1:
            continue
        n = len(lists[0])
        gates = [c for c in children.values() if isinstance(c, torch.nn.Linear) and c.out_features == n]
        k = _k_of(mod, n)
        if len(gates) == 1 and k is not None:
            found.append(Mixture(fqn, "looped", (mod, gates[0], lists[0]), n, k))
    return found


def _hf_shapes(router, experts) -> bool:
    w = getattr(router, "weight", None)
    gu, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not (isinstance(w, torch.Tensor) and isinstance(gu, torch.Tensor) and isinstance(down, torch.Tensor)):
        return False
    if w.dim() != 2 or gu.dim() != 3 or down.dim() != 3 or not callable(getattr(experts, "act_fn", None)):
        return False
    n, e = w.shape
    return gu.shape[0] == n and down.shape[0] == n and gu.shape[2] == e and down.shape[1] == e \
        and gu.shape[1] == 2 * down.shape[2]


def _close(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return False
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    # float32 precision at most: routers compute their softmax in float32 in a float64 model (Mixtral's)
    return bool(torch.allclose(a.to(b.dtype), b, rtol=1e-4, atol=1e-5 * scale))


def _check(mix, calls) -> bool:
    """Pick the variant whose dense form gives the module's outputs on the calls recorded; False if none."""
    for score in _SCORES:
        for renorm in (True, False):
            ok = True
            forwards = mix.forwards(score, renorm)
            if mix.kind == "hf":
                (_router, dense_router), (_experts, dense_experts) = forwards
                ok = len(calls["router"]) == len(calls["experts"])
                for (args, kwargs, out), (eargs, ekwargs, eout) in zip(calls["router"], calls["experts"]):
                    if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], torch.Tensor)):
                        return False  # not a router returning (logits, top-k weights, top-k index)
                    logits, scores, index = out
                    want = torch.zeros_like(logits).scatter(-1, index, scores.to(logits.dtype))
                    got = dense_router(*args, **kwargs)[1]
                    x = eargs[0] if eargs else ekwargs.get("hidden_states")
                    ok = ok and _close(got, want) and _close(dense_experts(x, None, got), eout)
            else:
                ok = all(_close(forwards[0][1](*args, **kwargs), out) for args, kwargs, out in calls["owner"])
            if ok and (calls.get("router") or calls.get("owner")):
                mix.variant = (score, renorm)
                return True
    return False


def _record(module, inputs, options, mixtures) -> list:
    """Run forward once (eval, no grad), recording each mixture's calls; the mixtures whose dense form
    gives the module's outputs there."""
    calls: list[dict] = [{"router": [], "experts": [], "owner": []} for _ in mixtures]
    handles = []

    def hook(store):
        def fn(_mod, args, kwargs, out):
            store.append((args, kwargs, out))
        return fn

    for mix, rec in zip(mixtures, calls):
        if mix.kind == "hf":
            router, experts = mix.parts
            handles.append(router.register_forward_hook(hook(rec["router"]), with_kwargs=True))
            handles.append(experts.register_forward_hook(hook(rec["experts"]), with_kwargs=True))
        else:
            handles.append(mix.parts[0].register_forward_hook(hook(rec["owner"]), with_kwargs=True))
    try:
        with torch.no_grad():
            module(*inputs, **options)
    except Exception:  # noqa: BLE001 - the trace itself reports what fails
        return []
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        return [mix for mix, rec in zip(mixtures, calls) if _safely(_check, mix, rec)]


def _safely(check, mix, rec) -> bool:
    """`check`, False where the dense form fails to run on the module's calls (a module that only
    looks like a mixture: a `ModuleList`, a linear layer and a `k` of other uses)."""
    try:
        return check(mix, rec)
    except Exception:  # noqa: BLE001 - not a mixture this file knows: traced as it is
        return False


@contextmanager
def dense_experts(module, inputs, options):
    """While in it, each mixture of experts in `module` (eval mode) that this file knows computes its
    dense form; yields the header's notes, one for each."""
    mixtures = find(module)
    mixtures = _record(module, inputs, options, mixtures) if mixtures else []
    patched = []
    try:
        for mix in mixtures:
            for mod, forward in mix.forwards(*mix.variant):
                patched.append((mod, mod.__dict__.get("forward")))
                mod.forward = forward
        yield notes(mixtures)
    finally:
        for mod, was in reversed(patched):
            if was is None:
                del mod.forward
            else:
                mod.forward = was
