"""The ATen ops trace lowers, in one table: ATen op name -> handler `(lowerer, node) -> value`.

`Lowerer.dispatch` reads only this table (an op not in it is refused, with `common.CAUSES`'s reason
when there is one). A handler is a method of one of the lowerer's parts (`lower_elementwise`,
`lower_contract`, `lower_legs`, `lower_shapes`), or one made here for a family of ops that lower
alike: the element-wise functions the language has (`UNARY`), comparisons (`COMPARE`) and ops that
leave the tensor as it is (`IDENTITY`). Adding an op is one row here and, when it needs one, a
method. Keys are ATen names (`torch.ops.aten` has each; tested); an in-place form (`relu_`) is
lowered as its functional key (`relu`).
"""

from __future__ import annotations

import math

from penrose.ops import OPS
from penrose.tracing.lower_contract import Contractions as C
from penrose.tracing.lower_elementwise import Elementwise as E
from penrose.tracing.lower_legs import Reductions as R
from penrose.tracing.lower_shapes import Shapes as S
from penrose.tracing.model import BinOp, Call, Num

# aten name -> .pen function: the element-wise rows of `penrose.ops.OPS` that name their ATen op and
# take no keywords (a row of ATEN below takes precedence: gelu's approximate form, softplus's beta)
UNARY = {row.aten: name for name, row in OPS.items() if row.aten is not None and not row.keywords}
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
IDENTITY = {"contiguous", "clone", "alias", "lift_fresh_copy", "_to_copy", "to", "type_as"}


def _gelu(lowerer, node):
    """torch's gelu: the language's (exact, erf) gelu, or torch's tanh form (approximate='tanh')
    written out in the language's terms."""
    a = lowerer.args(node)
    x = lowerer.view_arg(a["self"])
    if a.get("approximate", "none") != "tanh":
        return lowerer.unary_call("gelu", x)
    c = math.sqrt(2.0 / math.pi)
    return lowerer.map_expr(x, lambda r: BinOp("*", BinOp("*", Num(0.5), r), BinOp(
        "+", Num(1), Call("tanh", [BinOp("*", Num(c), BinOp("+", r, BinOp("*", Num(0.044715), BinOp("**", r, Num(3)))))]))))


def _unary(fn: str):
    def handler(lowerer, node):
        return lowerer.unary(fn)

    handler.__qualname__ = handler.__name__ = f"unary[{fn}]"
    return handler


def _compare(op: str):
    def handler(lowerer, node):
        return lowerer.binary(op, dtype="bool")

    handler.__qualname__ = handler.__name__ = f"compare[{op}]"
    return handler


def _identity(lowerer, node):
    return lowerer.identity()


ATEN = {
    # element-wise: arithmetic and functions
    **{name: _unary(fn) for name, fn in UNARY.items()},
    **{name: _compare(op) for name, op in COMPARE.items()},
    **dict.fromkeys(sorted(IDENTITY), _identity),
    "detach": E.op_detach,
    "add": E.op_add, "sub": E.op_sub, "rsub": E.op_rsub, "mul": E.op_mul, "div": E.op_div,
    "floor_divide": E.op_floor_divide, "true_divide": E.op_true_divide, "pow": E.op_pow, "neg": E.op_neg,
    "rsqrt": E.op_rsqrt, "reciprocal": E.op_reciprocal, "square": E.op_square, "gelu": _gelu,
    "softplus": E.op_softplus, "leaky_relu": E.op_leaky_relu, "log_sigmoid": E.op_log_sigmoid, "relu6": E.op_relu6,
    "hardtanh": E.op_hardtanh, "elu": E.op_elu, "selu": E.op_selu, "celu": E.op_celu, "hardsigmoid": E.op_hardsigmoid,
    "threshold": E.op_threshold,
    "clamp": E.op_clamp, "clamp_min": E.op_clamp_min, "clamp_max": E.op_clamp_max,
    "dropout": E.op_dropout,  # (feature_dropout is refused: it drops whole channels)
    # masks, fills, top-k
    "pad": E.op_pad, "constant_pad_nd": E.op_pad, "where": E.op_where, "maximum": E.op_maximum, "minimum": E.op_minimum, "fmax": E.op_maximum, "fmin": E.op_minimum, "masked_fill": E.op_masked_fill,
    "bitwise_not": E.op_bitwise_not, "logical_not": E.op_bitwise_not,
    **dict.fromkeys(("__and__", "bitwise_and", "logical_and"), E.op_and),
    **dict.fromkeys(("full", "zeros", "ones", "scalar_tensor", "new_full", "new_zeros", "new_ones"), E.op_full),
    **dict.fromkeys(("zeros_like", "ones_like", "full_like"), E.op_zeros_like),
    "repeat": E.op_repeat, "repeat_interleave": E.op_repeat_interleave,
    "topk": E.op_topk, "scatter": E.op_scatter,
    # contractions
    **dict.fromkeys(("matmul", "mm", "bmm", "mv", "dot"), C.op_matmul),
    "outer": C.op_outer, **dict.fromkeys(("conv1d", "conv2d", "conv3d", "convolution"), C.op_conv), "ger": C.op_outer, "addmm": C.op_addmm, "baddbmm": C.op_baddbmm, "linear": C.op_linear, "einsum": C.op_einsum,
    "bilinear": C.op_bilinear, "scaled_dot_product_attention": C.op_scaled_dot_product_attention,
    # over one leg: softmax, norms, reductions
    "softmax": R.op_softmax, "_softmax": R.op__softmax, "log_softmax": R.op_log_softmax,
    "_log_softmax": R.op__log_softmax, "layer_norm": R.op_layer_norm, "rms_norm": R.op_rms_norm,
    "linalg_vector_norm": R.op_linalg_vector_norm, "var": R.op_var, "std": R.op_std, "logsumexp": R.op_logsumexp,
    "cdist": R.op_cdist, "cosine_similarity": R.op_cosine_similarity,  # distances: a sum over one leg
    "argmax": R.op_argmax, "cumsum": R.op_cumsum, "sum": R.op_sum, "mean": R.op_mean, "amax": R.op_amax, "amin": R.op_amin, "prod": R.op_prod, "max": R.op_max, "min": R.op_min,
    # shapes
    **dict.fromkeys(("view", "reshape", "_unsafe_view", "flatten", "unflatten", "view_as", "reshape_as"), S.reshape_node),
    "permute": S.op_permute, **dict.fromkeys(("transpose", "swapaxes", "swapdims"), S.op_transpose),
    "t": S.op_t, "numpy_T": S.op_t, **dict.fromkeys(("mT", "mH", "adjoint"), S.op_mT),
    "movedim": S.op_movedim, "moveaxis": S.op_movedim,
    "unsqueeze": S.op_unsqueeze, "squeeze": S.op_squeeze, "expand": S.op_expand, "broadcast_to": S.op_expand, "expand_as": S.op_expand_as,
    # split, concat, select, slice, gather
    **dict.fromkeys(("split", "split_with_sizes", "chunk", "tensor_split"), S.split_node),
    "unbind": S.op_unbind, **dict.fromkeys(("cat", "concat", "concatenate"), S.op_cat), "stack": S.op_stack,
    "select": S.op_select, "slice": S.op_slice, "narrow": S.op_narrow, "arange": S.op_arange,
    "index_select": S.op_index_select, "embedding": S.op_embedding, "index": S.op_index,
}

# the ops whose handlers read a virtual merge (the batch merged with other legs, kept apart: Lowerer.reshape)
# as it is; any other op gets it merged first (which fixes the diagram's batch)
VIRTUAL_OK = {
    *UNARY, *COMPARE, *IDENTITY, "detach", "add", "sub", "rsub", "mul", "div", "true_divide", "pow", "neg", "rsqrt",
    "reciprocal", "square", "gelu", "softplus", "leaky_relu", "clamp", "clamp_min", "clamp_max", "dropout", "where",
    "masked_fill", "view", "reshape", "_unsafe_view", "flatten", "unflatten", "view_as", "reshape_as", "permute",
    "transpose", "swapaxes", "swapdims", "t", "numpy_T", "mT", "movedim", "moveaxis", "unsqueeze", "squeeze", "expand",
    "broadcast_to", "expand_as", "matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "einsum",
    "scaled_dot_product_attention", "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "rms_norm",
    "select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "cat", "concat", "stack",
    "bitwise_not", "logical_not", "__and__", "bitwise_and", "logical_and", "repeat_interleave", "sum", "mean", "amax",
    "amin", "full", "zeros", "ones", "scalar_tensor", "new_full", "new_zeros", "new_ones", "zeros_like", "ones_like",
    "full_like", "floor_divide", "pad", "constant_pad_nd", "topk", "scatter",
}

