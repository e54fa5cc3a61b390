"""The run-time helpers of generated modules: input checks, masks, RoPE, top-k, attention.

Generated modules call these functions. An in-memory module (`penrose.compile`) imports them
from here; standalone source (`penrose compile -o`) carries their text, from the marker line on,
so it imports only torch. They are ordinary functions: importable, linted and unit-tested.
"""

import torch

from penrose.errors import PenroseShapeError as ShapeError

# ---- inlined into standalone source from here on ----


def _check_inputs(spec, values, unexpected, extra=(), reference=None):
    """Check inputs against (name, legs, sizes, dtype) and return the sizes of free legs.
    Floating inputs share one dtype and device with each other and with `reference` (the
    module's first parameter or buffer); under torch.autocast the dtypes may differ."""
    if unexpected:
        names = ", ".join(sorted(unexpected))
        raise ShapeError(f"unexpected input(s): {names}; the diagram takes " + ", ".join(s[0] for s in spec))
    if extra:
        raise ShapeError(
            f"{len(spec) + len(extra)} positional inputs given but the diagram takes {len(spec)}: "
            + ", ".join(s[0] for s in spec)
        )
    free = {}
    batch, batch_of = (), None  # the batch dims seen so far (broadcast together) and who gave them
    dtype_of = None  # (dtype, input name) of the first floating input
    for (name, legs, sizes, kind), x in zip(spec, values):
        if x is None:
            raise ShapeError(f"missing input {name!r} with legs [{', '.join(legs)}]")
        if not isinstance(x, torch.Tensor):
            raise ShapeError(f"input {name!r} must be a tensor, got {type(x).__name__}")
        if x.dim() < len(legs):
            raise ShapeError(
                f"input {name!r} has {x.dim()} dimension(s) but needs at least {len(legs)} for legs [{', '.join(legs)}]"
            )
        floating = x.is_floating_point() or x.is_complex()
        if kind == "int" and x.dtype not in _ID_DTYPES:  # uint8 would index as a mask, bool is no id
            raise ShapeError(f"input {name!r} must hold integer ids, got {x.dtype} (ids are torch.int64 or torch.int32)")
        if kind == "bool" and x.dtype != torch.bool:
            raise ShapeError(f"input {name!r} must be a bool mask, got {x.dtype}")
        if kind == "float" and not floating:
            raise ShapeError(f"input {name!r} must be a floating-point tensor, got {x.dtype}")
        if reference is not None and x.device != reference.device:
            raise ShapeError(
                f"input {name!r} is on {x.device} but the model's parameters are on {reference.device}; move one with .to()"
            )
        if floating:
            if dtype_of is None:
                dtype_of = (x.dtype, name)
            elif x.dtype != dtype_of[0] and not _autocasting(x):
                raise ShapeError(
                    f"input {name!r} is {x.dtype} but input {dtype_of[1]!r} is {dtype_of[0]}; give both the same dtype"
                )
            if reference is not None and x.dtype != reference.dtype and not _autocasting(x):
                raise ShapeError(
                    f"input {name!r} is {x.dtype} but the model's parameters are {reference.dtype}; "
                    f"convert the input (x.to({reference.dtype})) or the model (model.to({x.dtype}))"
                )
        lead = tuple(x.shape[: x.dim() - len(legs)])
        if lead:
            n = max(len(lead), len(batch))
            a, b = (1,) * (n - len(lead)) + lead, (1,) * (n - len(batch)) + batch
            if any(u != v and u != 1 and v != 1 for u, v in zip(a, b)):
                raise ShapeError(
                    f"input {name!r} has batch dims {list(lead)} but input {batch_of!r} has {list(batch)}; they must broadcast"
                )
            batch, batch_of = tuple(v if u == 1 else u for u, v in zip(a, b)), batch_of or name
        shape = x.shape[x.dim() - len(legs):]
        for leg, want, got in zip(legs, sizes, shape):
            if isinstance(want, str):
                if want in free and free[want][0] != got:
                    first, size = free[want][1], free[want][0]
                    raise ShapeError(
                        f"input {name!r} leg {leg!r} has size {got} but input {first!r} gave it size {size}"
                    )
                free.setdefault(want, (got, name))
            elif want != got:
                raise ShapeError(f"input {name!r} leg {leg!r} must have size {want}, got {got}")
    return {k: v[0] for k, v in free.items()}


_ID_DTYPES = (torch.int64, torch.int32)  # what torch.nn.functional.embedding takes


def _ids(ids, n, what):
    """ids, after checking that each is a row of a table of n rows (0 to n - 1: a negative id
    is refused, as torch's embedding does, not read from the end); `what` names the input and
    the leg in the error."""
    if ids.dtype not in _ID_DTYPES:
        raise ShapeError(f"{what}: ids must be torch.int64 or torch.int32, got {ids.dtype}")
    if ids.numel() and not ids.is_meta and not torch.compiler.is_compiling():  # meta and traced ids hold no values
        lo, hi = torch.aminmax(ids)
        if lo < 0 or hi >= n:
            bad = int(lo) if lo < 0 else int(hi)
            raise ShapeError(f"{what}: id {bad} is outside 0 to {n - 1}")
    return ids


def _positional(spec, args, given):
    """The inputs given by position bound to the diagram's inputs in order, with those given by
    name: an input given both ways, or more positions than inputs, is a ShapeError."""
    if len(args) > len(spec):
        raise ShapeError(
            f"{len(args)} positional inputs given but the diagram takes {len(spec)}: " + (", ".join(s[0] for s in spec) or "none")
        )
    values = list(given)
    for i, x in enumerate(args):
        if values[i] is not None:
            raise ShapeError(f"input {spec[i][0]!r} given twice (by position and by name)")
        values[i] = x
    return tuple(values)


def _on_meta(module):
    """Whether one of the module's own parameters or buffers is on the meta device (it has a
    shape but no values: there is nothing to initialise)."""
    return any(t.is_meta for t in module.parameters(recurse=False)) or any(t.is_meta for t in module.buffers(recurse=False))


def _autocasting(x):
    return torch.is_autocast_enabled(x.device.type)


def _topk_filter(x, k, dim):
    """Keep the k largest entries along dim and zero the rest."""
    values, indices = x.topk(k, dim=dim)
    return torch.zeros_like(x).scatter(dim, indices, values)


def _topk_keep(x, k, dim, fn):
    """fn of the k largest entries of x along dim, zero elsewhere (fn element-wise)."""
    values, indices = x.topk(k, dim=dim)
    return torch.zeros_like(x).scatter(dim, indices, fn(values))


def _topk_mask(x, k, dim):
    """True at the k largest entries along dim."""
    indices = x.topk(k, dim=dim).indices
    return torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter(dim, indices, True)


def _wide(dtype):
    """The dtype RMSNorm and RoPE compute in: float64 stays float64, the rest (half, bfloat16)
    computes in float32 and is cast back."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rms_norm(x, weight, eps, dim):
    """RMSNorm over one leg, computed in float32 (float64 in a float64 model) and cast back."""
    wide = _wide(x.dtype)
    xf = x if x.dtype == wide else x.to(wide)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim, keepdim=True) + eps)
    if weight is not None:
        w = weight if weight.dtype == wide else weight.to(wide)
        y = y * (w if dim == -1 else w.reshape([1] * (x.dim() + dim) + [-1] + [1] * (-dim - 1)))
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _causal_mask(n_t, n_p, device):
    """True where query t may see key p (p <= t)."""
    key = ("causal", n_t, n_p, device)
    mask = _remembered(key)
    if mask is None:
        t = torch.arange(n_t, device=device)
        p = torch.arange(n_p, device=device)
        mask = _remember(key, p[None, :] <= t[:, None])
    return mask


def _block_causal_mask(n_t, n_p, block, device):
    """True where key p's block is not after query t's block (bidirectional inside a block)."""
    key = ("block_causal", n_t, n_p, block, device)
    mask = _remembered(key)
    if mask is None:
        t = torch.arange(n_t, device=device) // block
        p = torch.arange(n_p, device=device) // block
        mask = _remember(key, p[None, :] <= t[:, None])
    return mask


def _rope(x, pos_dim, dim, base):
    """Rotate-half RoPE in float32 (float64 in a float64 model): entry i pairs with i + n/2;
    position p turns it by p * base**(-2i/n)."""
    n, length = x.shape[dim], x.shape[pos_dim]
    transposed = (pos_dim % x.dim()) > (dim % x.dim())
    shape = [1] * x.dim()
    shape[pos_dim], shape[dim] = length, n
    wide = _wide(x.dtype)
    key = ("rope", length, n, base, transposed, tuple(shape), x.device, wide)
    tables = _remembered(key)
    if tables is None:  # cos and sin of every angle, computed once per (length, n, base, layout, device)
        inv_freq = 1.0 / (base ** (torch.arange(0, n, 2, device=x.device, dtype=wide) / n))
        angle = torch.arange(length, device=x.device, dtype=wide)[:, None] * inv_freq[None, :]
        angle = torch.cat([angle, angle], dim=-1)  # (positions, n)
        angle = (angle.T if transposed else angle).reshape(shape)
        tables = _remember(key, (angle.cos(), angle.sin()))
    cos, sin = tables
    xf = x if x.dtype == wide else x.to(wide)
    first, second = xf.chunk(2, dim=dim)
    y = xf * cos + torch.cat([-second, first], dim=dim) * sin
    return y if y.dtype == x.dtype else y.to(x.dtype)


_CONSTANTS: dict[tuple, object] = {}  # masks and RoPE tables: constants of their sizes, shared by every call


def _remembered(key):
    """The constant remembered under `key`, or None; none while tracing, where a size in the key
    may be symbolic (torch.export's SymInt is no dict key) and the constant is traced afresh."""
    return None if torch.compiler.is_compiling() else _CONSTANTS.get(key)


def _remember(key, value):
    # traced values (export's fake tensors) must not outlive the trace, nor inference tensors reach autograd
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
        return value
    if len(_CONSTANTS) >= 64:
        _CONSTANTS.clear()
    _CONSTANTS[key] = value
    return value


def _broadcast_lead(parts, n):
    """The broadcast shape of the parts' leading legs, all but their last n (torch.broadcast_shapes is slow)."""
    lead = [1] * (max(x.dim() for x in parts) - n)
    for x in parts:
        for i, m in enumerate(x.shape[: max(x.dim() - n, 0)], len(lead) + n - x.dim()):
            lead[i] = m if m != 1 else lead[i]
    return lead


def _concat(parts, dim, n):
    """torch.cat along `dim` (counted from the end) after broadcasting the parts' batch legs
    (all but their last n), which torch.cat does not do."""
    lead = _broadcast_lead(parts, n)
    return torch.cat([x.expand(*lead, *x.shape[x.dim() - n:]) for x in parts], dim=dim)


def _batch_first(x, n):
    """x with its batch legs (all but its last n) flattened into one leading leg, of size 1 when
    there are none: a reduction over the batch legs then reduces that one leg."""
    lead = x.shape[: x.dim() - n]
    return x.reshape(lead.numel(), *x.shape[x.dim() - n:])


def _nonempty(x, dims, what):
    """x, after checking that legs about to be reduced hold entries (a maximum or minimum of
    nothing has no value): `dims` a tuple of legs counted from the end, or an int n for the
    batch legs, all but the last n."""
    empty = x.shape[: x.dim() - dims].numel() == 0 if isinstance(dims, int) else any(x.shape[d] == 0 for d in dims)
    if empty:
        raise ShapeError(f"{what} reduces legs with no entries (size 0)")
    return x


def _within(x, dim, start, length, what):
    """x, after checking that indices start .. start + length - 1 of leg `dim` exist."""
    n = x.shape[dim]
    first = start + n if start < 0 else start
    if first < 0 or first + length > n:
        span = f"index {start}" if length == 1 else f"indices {start} to {start + length - 1}"
        raise ShapeError(f"{what}: {span} outside a leg of size {n}")
    return x


def _expand_legs(x, sizes):
    """x.expand over its last len(sizes) legs (-1 keeps a leg), its batch legs kept."""
    return x.expand(*x.shape[: x.dim() - len(sizes)], *sizes)


def _plain_mask(mask):
    """A mask whose leading legs are all size 1 (a (t, s) mask aligned to the heads) as (t, s):
    the same broadcast, and the kernels take their (t, s) path."""
    if mask is not None and mask.dim() > 2 and all(n == 1 for n in mask.shape[:-2]):
        return mask.reshape(mask.shape[-2:])
    return mask


def _hides_a_row(q, k, v, mask):
    """A float mask with a query row that hides every key (at or below -1e30: left padding under
    a causal mask, Hugging Face's minimum), in a call that will be differentiated. There
    scaled_dot_product_attention's backward is not that of its own values (its logsumexp loses
    the row's log n beside -3.4e38: each key gets weight 1, not 1/n), so such a call is written
    out instead; its values are right, so without gradients the mask is not even read."""
    if mask is None or not mask.is_floating_point() or not torch.is_grad_enabled():
        return False
    if not (q.requires_grad or k.requires_grad or v.requires_grad or mask.requires_grad):
        return False
    return bool((mask.amax(-1) <= -1e30).any())


def _written_out(q, k, v, mask, scale, causal):
    """softmax(q kᵀ · scale + mask) v as the diagram writes it, k and v one head per query head."""
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v


def _attention(q, k, v, mask, scale, causal):
    """softmax(q kᵀ · scale + mask) v over the last two legs, via scaled_dot_product_attention.
    q, k, v (and a mask with batch legs) carry the same leading legs, or size-1 ones."""
    mask = _plain_mask(mask)
    if _hides_a_row(q, k, v, mask):
        return _written_out(q, k, v, mask, scale, causal)
    batch = _broadcast_lead((q, k, v) if mask is None else (q, k, v, mask), 2)
    q = q.expand(*batch, *q.shape[-2:])
    k = k.expand(*batch, *k.shape[-2:])
    v = v.expand(*batch, *v.shape[-2:])
    if len(batch) != 2:  # the fused (flash) kernels take (batch, heads, t, d): fold the rest in
        q, k, v = (x.reshape(1, -1, *x.shape[-2:]) for x in (q, k, v))
        if mask is not None and mask.dim() > 2:
            mask = mask.expand(*batch, *mask.shape[-2:]).reshape(1, -1, *mask.shape[-2:])
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
        return y.reshape(*batch, *y.shape[-2:])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def _gqa_attention(q, k, v, mask, scale, causal):
    """Grouped-query attention: q (..., g·r, t, d), k (..., g, s, d), v (..., g, s, e); query
    head g·r + i reads key/value head g (scaled_dot_product_attention's enable_gqa: no copies of
    k and v). A mask is (t, s) or (..., 1, t, s)."""
    mask = _plain_mask(mask)
    if _hides_a_row(q, k, v, mask):
        r = q.shape[-3] // k.shape[-3]
        return _written_out(q, k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3), mask, scale, causal)
    if q.dim() == k.dim() == v.dim() == 4 and q.shape[0] == k.shape[0] == v.shape[0]:  # the kernels' layout
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                                enable_gqa=True)
    lead = _broadcast_lead((q, k, v) if mask is None else (q, k, v, mask), 3)
    q, k, v = (x.expand(*lead, *x.shape[-3:]).reshape(-1, *x.shape[-3:]) for x in (q, k, v))
    if mask is not None and mask.dim() > 3:
        mask = mask.expand(*lead, *mask.shape[-3:]).reshape(-1, *mask.shape[-3:])
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                         enable_gqa=True)
    return y.reshape(*lead, *y.shape[-3:])


class _Container(torch.nn.Module):
    """A submodule that only holds others: the path to an instance named with dots (`as net.0`
    makes `net` a container holding `0`), so that state-dict names are the path."""

    def reset_parameters(self, generator=None, recurse=True):
        for module in self.children():
            for sub in (module if isinstance(module, torch.nn.ModuleList) else [module]):
                sub.reset_parameters(generator)


def _chain(blocks, x, *fixed, method=None):
    """Feed x through each block in turn (a repeated block); `fixed` reach every block unchanged.
    `method`: the blocks' method to run instead of forward (a module with several entries)."""
    for block in blocks:
        x = (getattr(block, method) if method else block)(x, *fixed)
    return x
