"""What the lowering of ATen ops shares: the ops refused (and why), the ops skipped, views, and
small helpers over `torch.fx` nodes and torch dtypes."""

from __future__ import annotations

import inspect
import os

import torch

from penrose.tracing.model import Cls

INT64_MAX = 2**63 - 1


class BatchAxis(Exception):
    """The leading axis is not a batch axis for this op: trace again with it as a named leg."""


_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)

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
    **dict.fromkeys(("one_hot", "nonzero", "index_add", "bincount", "unique"),
                    "it routes by indices (a sparse mixture of experts selects each expert's tokens: data-dependent)"),
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
    """How the user wrote the op: torch.sort, Tensor.chunk, F.silu (else the ATen name)."""
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
    if os.path.abspath(path) == _MOE_FILE:  # the dense form of a mixture of experts: forward's own code while traced
        return True
    return not _in_torch(path) and not os.path.abspath(path).startswith(own + os.sep) and os.path.exists(path)


_MOE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe.py")


def _is_block(mod) -> bool:
    """A submodule call that becomes a block (the rest is inlined into its caller)."""
    if isinstance(mod, _CONTAINERS):
        return False
    if type(mod).__module__.startswith("torch.nn"):
        return any(True for _ in mod.parameters()) or any(True for _ in mod.buffers())
    return True


_RANGES: dict = {}


def _forward_range(mod):
    own = mod.__dict__.get("forward")  # an instance's own forward (a mixture of experts' dense form)
    if own is not None:
        try:
            lines, first = inspect.getsourcelines(inspect.unwrap(own))
            return (inspect.getsourcefile(own), first, first + len(lines) - 1)
        except (OSError, TypeError):
            return None
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


def made_values(name: str, shape, base: float = 10000.0) -> torch.Tensor:
    """The float32 values of the inits a module computes for itself: `causal` (ones on and below
    the diagonal of the last two legs: torch.tril of ones), `arange` (each entry its index along
    the last leg: position ids), `rotary` (1 / base ** (i / n) along the last leg of size n: the
    inverse frequencies of rotary embeddings, computed as Hugging Face and lit-gpt compute them),
    `rotary_cos`, `rotary_sin` (the last two legs positions by head dim: cos and sin of position i
    times those frequencies, the frequencies twice over, as Hugging Face's rotary embedding makes them).
    What the generated module (penrose.compiler) and the interpreter make, each with its own code;
    the tracer matches a module's buffers and constants against it.

    >>> made_values("causal", (2, 2)).tolist(), made_values("arange", (1, 3)).tolist()
    ([[1.0, 0.0], [1.0, 1.0]], [[0.0, 1.0, 2.0]])
    """
    shape = tuple(int(n) for n in shape)
    n = shape[-1] if shape else 1
    if name == "causal":
        x = torch.ones(shape[-2:]).tril()
    elif name == "arange":
        x = torch.arange(n).float()
    elif name == "rotary":  # 1.0 / (base ** (torch.arange(0, 2n, 2).float() / 2n)), the same quotients as i / n
        x = 1.0 / (base ** (torch.arange(n).float() / n))
    else:  # rotary_cos, rotary_sin: row i the cos (sin) of i times the frequencies, twice over (Hugging Face's cos, sin)
        half = n // 2
        freqs = torch.arange(shape[-2]).float()[:, None] * (1.0 / (base ** (torch.arange(half).float() / half)))[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        x = emb.cos() if name == "rotary_cos" else emb.sin()
    return x.expand(shape).clone()
