"""Sampling from Steerling: autoregressive for the causal variant, block diffusion for the
block-causal (released) one. Text goes through the checkpoint's tokenizer
(penrose_zoo.steerling.tokenizer; `tokenizer_for(folder)` picks it):

    tok = tokenizer_for("ckpt")
    ids = generate(model, tok.prompt_ids("Hello"), max_new_tokens=64, mask_id=tok.mask_id)
    print(tok.decode(ids, skip_special_tokens=True))

`ByteTokenizer()` here is the byte tokenizer of penrose_zoo.steerling.tokenizer with
generation's defaults (encode prepends bos, decode drops special ids).

Block diffusion (the release's generation order): the sequence is cut into blocks of
`diff_block_size` positions, counted from the start of the sequence. The blocks after the prompt
are filled left to right; a block starts fully masked (the prompt's own last block keeps its
prompt tokens), and each of `steps_per_block` steps runs the model on everything up to the end of
the block (block-causal attention makes later blocks irrelevant), samples a token for every still
masked position (temperature, top-p) and unmasks the most confident ones — the positions whose
distribution has the largest maximum probability, as the release does — so that the block is
complete after the last step.

The release's own sampler (`generate_full`, steerling 0.2.0's `SteerlingGenerator.generate_full`,
`GenerationConfig` with its defaults): the whole sequence (prompt + max_new_tokens masks) runs
through the model at every step; blocks of diff_block_size positions are counted from the end of
the prompt; each block's steps unmask a linear schedule of positions (max_new_tokens and `steps`
must divide into the blocks); every step takes the still-masked positions of the block, subtracts
the relu logit mask, applies the repetition penalty (over every id in the sequence), bans eos,
mask and pad, commits the `k` most confident positions (largest softmax maximum), and samples each
(greedy at temperature 0 without entropy sampling; the release's entropy-adaptive temperature by
default); generation stops after a block holding a stop token. Steering (`steering=SteeringConfig`,
penrose_zoo.steerling.steer) injects at the masked positions with the schedule's α. The result
records the trace: the order in which diffusion committed the tokens (`DiffusionTrace`, as the
release's attribution records it), on which penrose_zoo.steerling.attribution.attribute_generation
computes concept attribution.

    out = generate_full(model, ids, GenerationConfig(max_new_tokens=64, temperature=0.0,
                        use_entropy_sampling=False), steering=SteeringConfig.injection(3), tokenizer=tok)
    out.tokens, out.generated, out.trace.groups
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from penrose.errors import PenroseError, PenroseShapeError
from penrose_zoo.steerling import tokenizer as _tokenizer


def ByteTokenizer(**kw) -> _tokenizer.ByteTokenizer:  # noqa: N802 - the name callers import
    """penrose_zoo.steerling.tokenizer.ByteTokenizer with generation's defaults: encode prepends
    bos, decode drops the special ids (keywords override them). There is one byte tokenizer;
    this is it, configured."""
    kw.setdefault("add_special_tokens", True)
    kw.setdefault("skip_special_tokens", True)
    return _tokenizer.ByteTokenizer(**kw)


def _check_logits(logits: Tensor) -> None:
    """A clear error, not torch.multinomial's, when a row of logits cannot be sampled: a NaN or
    +inf (a model with non-finite weights, loaded with allow_nonfinite=True), or every token banned."""
    bad = torch.isnan(logits).any(dim=-1) | torch.isposinf(logits).any(dim=-1) | torch.isneginf(logits).all(dim=-1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        what = "NaN or +inf" if bool(torch.isnan(logits[row]).any() | torch.isposinf(logits[row]).any()) else "only -inf"
        raise PenroseError(f"cannot sample: the logits of row {row} hold {what} (non-finite weights, loaded with "
                           "allow_nonfinite=True? or every token banned)")


def sample_logits(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0,
                  generator: torch.Generator | None = None, banned: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """Sample one token per row of `logits` (n, v). Returns (tokens, confidence): the confidence
    of a row is the largest probability of its tempered, top-p-truncated distribution (the
    release's unmasking score, "softmax maximum"); temperature 0 is greedy."""
    logits = logits.float().clone()
    if banned:
        logits[:, banned] = -math.inf
    _check_logits(logits)
    if temperature <= 0:
        probs = torch.softmax(logits, dim=-1)
        conf, tok = probs.max(dim=-1)
        return tok, conf
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each entry
        sorted_p = torch.where(before < top_p, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, probs.max(dim=-1).values


def _check(model, prompt: list[int] | Tensor, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """The prompt as ids, and the sampling arguments checked (penrose_zoo.validate): max_new_tokens
    a whole number of at least 0 that fits the context, temperature finite and at least 0 (0:
    greedy), top_p above 0 and at most 1."""
    from penrose_zoo.validate import number, whole

    max_new_tokens = whole(max_new_tokens, "max_new_tokens", low=0)
    number(temperature, "temperature", low=0)
    number(top_p, "top_p", low=0, high=1, low_open=True)
    ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
    if ids.numel() == 0:
        raise PenroseShapeError("the prompt is empty; give at least one token (a bos token will do)")
    context = model.model_config["block_size"]
    if ids.numel() + max_new_tokens > context:
        raise PenroseShapeError(f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) exceed the context (block_size = {context})")
    model.check_input_ids(ids)
    return ids


def _prepared(model, steering):
    """steering.prepare(model) (a penrose_zoo.steerling.steer.SteeringConfig; not imported here,
    so that steer, attribution and generate import one another in one direction only)."""
    if steering is None:
        return None
    if not callable(getattr(steering, "prepare", None)):
        raise PenroseShapeError(f"steering must be a penrose_zoo.steerling.steer.SteeringConfig, got {type(steering).__name__}")
    return steering.prepare(model)


@torch.no_grad()
def generate_autoregressive(model, prompt, max_new_tokens: int, *, temperature: float = 1.0, top_p: float = 1.0,
                            eos_id: int | None = None, banned: list[int] | None = None,
                            generator: torch.Generator | None = None, steering=None, **intervene) -> Tensor:
    """Left-to-right sampling (the causal variant): one full forward pass per new token (the
    diagrams have no key/value cache). `intervene`: intervene_known / intervene_unknown dicts.
    `steering` (a SteeringConfig): its relu logit mask only — the injection needs masked positions."""
    ids = _check(model, prompt, max_new_tokens, temperature, top_p)
    prep = _prepared(model, steering)
    if prep is not None and prep.direction is not None:
        raise PenroseShapeError("residual-stream injection is the release's block-diffusion recipe (it injects at the "
                                "still-masked positions); the causal variant takes only a relu_logit_mask")
    device = next(model.parameters()).device
    ids = ids.to(device)
    for _ in range(max_new_tokens):
        logits = model(ids[None], **intervene).logits[0, -1:]
        if prep is not None and prep.relu_suppression is not None:
            logits = logits.float() - prep.relu_suppression
        tok, _ = sample_logits(logits, temperature, top_p, generator, banned)
        ids = torch.cat([ids, tok])
        if eos_id is not None and int(tok) == eos_id:
            break
    return ids


@torch.no_grad()
def generate_block_diffusion(model, prompt, max_new_tokens: int, *, mask_id: int, steps_per_block: int = 8,
                             temperature: float = 1.0, top_p: float = 1.0, banned: list[int] | None = None,
                             generator: torch.Generator | None = None, steering=None, **intervene) -> Tensor:
    """Block-by-block masked diffusion (the block-causal variant); see the module docstring.
    `steering` (a SteeringConfig): the release's injection at the still-masked positions of each
    pass (α by its schedule, tokens committed counted over the generation) and its relu logit mask
    subtracted before sampling."""
    from penrose_zoo.validate import whole

    ids = _check(model, prompt, max_new_tokens, temperature, top_p)
    if not 0 <= whole(mask_id, "mask_id") < model.vocab_size:
        raise PenroseShapeError(f"mask_id {mask_id} is out of range for vocab_size {model.vocab_size}")
    whole(steps_per_block, "steps_per_block", low=1)
    prep = _prepared(model, steering)
    device = next(model.parameters()).device
    blk = model.sizes["blk"]
    P, total = ids.numel(), ids.numel() + max_new_tokens
    seq = torch.cat([ids, torch.full((max_new_tokens,), mask_id, dtype=torch.long)]).to(device)
    banned = sorted(set(banned or []) | {mask_id})
    start = (P // blk) * blk  # the first block with a position to fill
    while start < total:
        end = min(start + blk, total)
        for step in range(steps_per_block):
            masked = (seq[start:end] == mask_id).nonzero().squeeze(-1) + start
            masked = masked[masked >= P]
            if masked.numel() == 0:
                break
            window = seq[None, :end]
            logits = _steered_logits(model, window, prep, int((seq[P:] == mask_id).sum()), max_new_tokens, mask_id,
                                     **intervene)[0, masked]
            if prep is not None and prep.relu_suppression is not None:
                logits = logits.float() - prep.relu_suppression
            tok, conf = sample_logits(logits, temperature, top_p, generator, banned)
            n = math.ceil(masked.numel() / (steps_per_block - step))  # the rest on the last step
            pick = conf.topk(n).indices
            seq[masked[pick]] = tok[pick]
        start = end
    return seq


def _steered_logits(model, x: Tensor, prep, masked_remaining: int, max_new_tokens: int, mask_id: int, **intervene) -> Tensor:
    """The logits of one pass on x (b, t), with the steering injection at its masked positions."""
    return _steered_pass(model, x, prep, masked_remaining, max_new_tokens, mask_id, **intervene)[0].logits


def _steered_pass(model, x: Tensor, prep, masked_remaining: int, max_new_tokens: int, mask_id: int, **intervene):
    """(output, α) of one forward pass on x: α from the schedule (0 when off), the injection
    α · direction at the masked positions after the layers from inject_layer on."""
    if prep is None:
        return model(x, **intervene), 0.0
    alpha = prep.alpha(masked_remaining, max_new_tokens)
    return prep.forward(model, x, alpha, mask_id, **intervene), alpha


def generate(model, prompt, max_new_tokens: int, *, mask_id: int | None = None, **kw) -> Tensor:
    """Autoregressive for a causal model, block diffusion otherwise (mask_id defaults to the
    last vocabulary id, where the release puts its mask token)."""
    if model.variant == "causal":
        if "steps_per_block" in kw:  # (block diffusion's; checked all the same)
            from penrose_zoo.validate import whole

            whole(kw.pop("steps_per_block"), "steps_per_block", low=1)
        return generate_autoregressive(model, prompt, max_new_tokens, **kw)
    if mask_id is None:
        mask_id = model.vocab_size - 1
    kw.pop("eos_id", None)
    return generate_block_diffusion(model, prompt, max_new_tokens, mask_id=mask_id, **kw)


# ---------------------------------------------------------------------------------------------
# The release's sampler (steerling 0.2.0 inference/causal_diffusion.py) and its commit trace
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationConfig:
    """The release's `GenerationConfig` (configs/generation.py), fields and defaults as there.
    Greedy: temperature=0.0, use_entropy_sampling=False."""

    max_new_tokens: int = 1024
    steps: int | None = None
    temperature: float = 1.2
    cfg_scale: float = 0.0
    seed: int | None = None
    top_p: float = 0.8
    repetition_penalty: float = 1.1
    use_entropy_sampling: bool = True
    stop_tokens: tuple[int, ...] | None = None

    def __post_init__(self):
        def whole(name, lo, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise PenroseShapeError(f"GenerationConfig.{name} must be a whole number >= {lo}, got {v!r}")

        def number(name, lo, hi=math.inf):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
                raise PenroseShapeError(f"GenerationConfig.{name} must be a finite number in [{lo}, {hi}], got {v!r}")

        whole("max_new_tokens", 1)
        whole("steps", 1, allow_none=True)
        whole("seed", -(2 ** 63), allow_none=True)
        number("temperature", 0.0)
        number("cfg_scale", 0.0)
        number("top_p", 0.0, 1.0)
        number("repetition_penalty", 1.0)
        if self.stop_tokens is not None:
            object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["stop_tokens"] = None if self.stop_tokens is None else list(self.stop_tokens)
        return d


@dataclass(frozen=True)
class GenerationStepInfo:
    """What a step callback receives each time tokens are committed (the release's): the step, the
    pass's logits (1, t, v) and output (a SteerlingOutput), and the committed positions and ids."""

    step: int
    logits: Tensor
    outputs: object
    committed_positions: Tensor
    committed_token_ids: Tensor
    alpha: float = 0.0


@dataclass(frozen=True)
class CommitRecord:
    """Tokens committed together in one denoising step (the release's CommitRecord): commit_order
    (0, 1, ...), denoising_step, positions (p,), token_ids (p,), and, when recorded for concept
    attribution, target_logits (p,) and the known / unknown top-k (p, k) ids and logits."""

    commit_order: int
    denoising_step: int
    positions: Tensor
    token_ids: Tensor
    target_logits: Tensor | None = None
    known_indices: Tensor | None = None
    known_logits: Tensor | None = None
    unk_indices: Tensor | None = None
    unk_logits: Tensor | None = None


@dataclass(frozen=True)
class DiffusionTrace:
    """The commit schedule of one generation (the release's DiffusionTrace): enough to rebuild the
    input the model saw at every step. `reconstruct(order)`: prompt and masks with the tokens of
    the commits before `order` revealed; `committed_tokens()`: the sequence with every commit;
    `commit_step`: per position the denoising step that committed it (−1 prompt, −2 never);
    `position_types()`: prompt / generated / generated_masked per position."""

    prompt_ids: Tensor
    prompt_len: int
    seq_length: int
    mask_id: int
    eos_id: int | None
    groups: list[CommitRecord] = field(default_factory=list)

    def __post_init__(self):
        orders = sorted(g.commit_order for g in self.groups)
        if orders != list(range(len(orders))):
            raise PenroseShapeError(f"commit orders must be contiguous from 0, got {orders}")
        seen = [int(p) for g in self.groups for p in g.positions]
        if len(seen) != len(set(seen)):
            raise PenroseShapeError("a position was committed more than once")

    def _base(self) -> Tensor:
        x = torch.full((self.seq_length,), self.mask_id, dtype=torch.long, device=self.prompt_ids.device)
        x[: self.prompt_len] = self.prompt_ids
        return x

    def _order_at(self) -> Tensor:
        order = torch.full((self.seq_length,), torch.iinfo(torch.long).max, dtype=torch.long, device=self.prompt_ids.device)
        order[: self.prompt_len] = -1
        for g in self.groups:
            order[g.positions] = g.commit_order
        return order

    def committed_tokens(self) -> Tensor:
        x = self._base()
        for g in self.groups:
            x[g.positions] = g.token_ids.to(x.device)
        return x

    def reconstruct(self, order: int) -> Tensor:
        """The input the model saw when producing commit group `order`."""
        return torch.where(self._order_at() < order, self.committed_tokens(), self._base())

    @property
    def commit_step(self) -> Tensor:
        step = torch.full((self.seq_length,), -2, dtype=torch.long)
        step[: self.prompt_len] = -1
        for g in self.groups:
            step[g.positions.cpu()] = g.denoising_step
        return step

    @property
    def commit_order(self) -> list[int]:
        """The generated positions in the order diffusion committed them."""
        return [int(p) for g in self.groups for p in g.positions]

    def position_types(self) -> list[str]:
        never = torch.iinfo(torch.long).max
        order = self._order_at()
        return ["prompt" if p < self.prompt_len else "generated_masked" if int(order[p]) == never else "generated"
                for p in range(self.seq_length)]


@dataclass(frozen=True)
class GenerationOutput:
    """tokens (prompt_len + max_new_tokens,): the final sequence (masks where generation stopped
    early); generated: the release's final tokens (masks and eos dropped, cut at a stop token or
    eot); trace: the commits; alphas: the injection α of every forward pass."""

    tokens: Tensor
    prompt_tokens: int
    generated: list[int]
    trace: DiffusionTrace
    alphas: list[float]

    @property
    def generated_tokens(self) -> int:
        return len(self.generated)


def _num_transfer_tokens(mask_index: Tensor, steps: int) -> Tensor:
    """Tokens to unmask at each step of a block (linear schedule, the remainder first)."""
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, remainder = mask_num // steps, mask_num % steps
    num = base.new_zeros(mask_num.size(0), steps) + base
    for i in range(mask_num.size(0)):
        num[i, : remainder[i]] += 1
    return num


def _sample_top_p(probs: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    sorted_probs, sorted_indices = torch.sort(probs, descending=True)
    keep = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) <= top_p
    keep[0] = True
    filtered = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    filtered = filtered / filtered.sum()
    return sorted_indices[torch.multinomial(filtered, 1, generator=generator)]


def sample_token(logits_1d: Tensor, config: GenerationConfig, generator: torch.Generator | None = None) -> Tensor:
    """One token from one position's logits, as the release's `_sample_token`: entropy sampling
    (temperature 0.3 + 0.4 · normalised entropy, then top-p), else temperature + top-p when both
    are above 0, else the argmax."""
    _check_logits(logits_1d.reshape(1, -1))
    if config.use_entropy_sampling:
        probs_raw = torch.softmax(logits_1d, dim=-1)
        sorted_probs, _ = torch.sort(probs_raw, descending=True)
        effective_k = max(int((torch.cumsum(sorted_probs, dim=-1) <= config.top_p).sum().item()) + 1, 2)
        entropy = -torch.sum(probs_raw * torch.log(probs_raw + 1e-10))
        temperature = 0.3 + 0.4 * min(1.0, entropy.item() / math.log(effective_k))
        return _sample_top_p(torch.softmax(logits_1d / temperature, dim=-1), config.top_p, generator).squeeze(0)
    if config.top_p > 0.0 and config.temperature > 0.0:
        return _sample_top_p(torch.softmax(logits_1d / config.temperature, dim=-1), config.top_p, generator).squeeze(0)
    return torch.argmax(logits_1d)


def _special_ids(model, tokenizer, mask_id, eos_id, pad_id, eot_id) -> tuple[int, int, int, int | None]:
    if tokenizer is None and None in (mask_id, eos_id, pad_id):
        tokenizer = _tokenizer.tokenizer_for(model, vocab_size=model.vocab_size)
    if tokenizer is not None:
        mask_id = tokenizer.mask_id if mask_id is None else mask_id
        eos_id = tokenizer.eos_id if eos_id is None else eos_id
        pad_id = tokenizer.pad_id if pad_id is None else pad_id
        eot_id = getattr(tokenizer, "eot_id", None) if eot_id is None else eot_id
    for name, v in (("mask_id", mask_id), ("eos_id", eos_id), ("pad_id", pad_id), ("eot_id", eot_id)):
        if v is not None and not 0 <= int(v) < model.vocab_size:
            raise PenroseShapeError(f"{name} {v} is out of range for vocab_size {model.vocab_size}")
    return int(mask_id), int(eos_id), int(pad_id), None if eot_id is None else int(eot_id)


@torch.no_grad()
def generate_full(model, prompt, config: GenerationConfig | None = None, *, steering=None, tokenizer=None,
                  mask_id: int | None = None, eos_id: int | None = None, pad_id: int | None = None,
                  eot_id: int | None = None, step_callback: Callable[[GenerationStepInfo], None] | None = None,
                  ) -> GenerationOutput:
    """The release's `SteerlingGenerator.generate_full` (block-causal variant): see the module
    docstring. prompt: token ids (p,) or (1, p), as the release's generator encodes a prompt (no
    special tokens). Special ids from `tokenizer` (default: the model's, tokenizer_for) or given:
    mask, eos (never sampled, dropped from `generated`), pad (never sampled), eot (an instruct
    model's end of turn: fills the rest with eos and stops). `steering`: a SteeringConfig.
    `step_callback(GenerationStepInfo)` runs at every commit (not under classifier-free guidance,
    as in the release)."""
    config = GenerationConfig() if config is None else config
    if not isinstance(config, GenerationConfig):
        raise PenroseShapeError(f"config must be a GenerationConfig, got {type(config).__name__}")
    if model.variant != "block_causal":
        raise PenroseShapeError("generate_full is the release's block-diffusion sampler; the causal variant generates "
                                "with generate_autoregressive")
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] != 1:
        raise PenroseShapeError(f"generate_full takes one prompt, got a batch of {ids.shape[0]}")
    ids = _check(model, ids.reshape(-1), config.max_new_tokens)
    mask, eos, pad, eot = _special_ids(model, tokenizer, mask_id, eos_id, pad_id, eot_id)
    blk = model.sizes["blk"]
    gen_length = config.max_new_tokens
    steps = config.steps if config.steps is not None else gen_length
    if gen_length % blk:
        raise PenroseShapeError(f"max_new_tokens ({gen_length}) must be a multiple of the diffusion block "
                                f"(diff_block_size = {blk}), as in the release")
    num_blocks = gen_length // blk
    if steps % num_blocks:
        raise PenroseShapeError(f"steps ({steps}) must be a multiple of the number of blocks ({num_blocks} = "
                                f"max_new_tokens / diff_block_size), as in the release")
    steps_per_block = steps // num_blocks
    prep = _prepared(model, steering)
    device = next(model.parameters()).device
    generator = None
    if config.seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(config.seed)

    P = ids.numel()
    x = torch.full((1, P + gen_length), mask, dtype=torch.long, device=device)
    x[0, :P] = ids.to(device)
    prompt_index = x != mask
    stop_tokens = list(config.stop_tokens or [])
    banned = torch.tensor([mask, pad], dtype=torch.long, device=device)
    relu = None if prep is None or prep.relu_suppression is None else prep.relu_suppression.to(device)
    groups: list[CommitRecord] = []
    alphas: list[float] = []
    done = False
    global_step = 0

    def forward(inp: Tensor, alpha: float):
        return model(inp) if prep is None else prep.forward(model, inp, alpha, mask)

    for block in range(num_blocks):
        if done:
            break
        start, end = P + block * blk, P + (block + 1) * blk
        num_transfer = _num_transfer_tokens(x[:, start:end] == mask, steps_per_block)
        for step in range(steps_per_block):
            alpha = prep.alpha(int((x == mask).sum()), gen_length) if prep is not None else 0.0
            alphas.append(alpha)
            if config.cfg_scale > 0.0:
                un_x = x.clone()
                un_x[prompt_index] = mask
                cond, uncond = torch.chunk(forward(torch.cat([x, un_x]), alpha).logits, 2, dim=0)
                logits, outputs = uncond + (config.cfg_scale + 1) * (cond - uncond), None
            else:
                outputs = forward(x, alpha)
                logits = outputs.logits
            masked = (x[0, start:end] == mask).nonzero(as_tuple=False).squeeze(1)
            k = int(num_transfer[0, step])
            if masked.numel() and k:
                masked = masked + start
                rows = logits[0, masked].float()
                if relu is not None:  # concept suppression: strength · relu(concept–vocabulary alignment)
                    rows = rows - relu
                if config.repetition_penalty != 1.0:
                    seen = x[0].unique()
                    seen = seen[(seen >= 0) & (seen < rows.shape[-1])]
                    if seen.numel():
                        vals = rows[:, seen]
                        rows[:, seen] = torch.where(vals > 0, vals / config.repetition_penalty,
                                                    vals * config.repetition_penalty)
                rows[:, eos] = float("-inf")
                rows.index_fill_(dim=-1, index=banned, value=float("-inf"))
                confidence = torch.softmax(rows, dim=-1).max(dim=-1).values
                _, chosen = confidence.topk(min(k, masked.numel()))
                positions, tokens = [], []
                for i in chosen:
                    token = sample_token(rows[i], config, generator)
                    pos = int(masked[i])
                    x[0, pos] = token
                    positions.append(pos)
                    tokens.append(int(token))
                    if eot is not None and int(token) == eot:  # end of turn: the rest is eos
                        x[0, pos + 1:] = eos
                        done = True
                        break
                pos_t = torch.tensor(positions, dtype=torch.long, device=device)
                tok_t = torch.tensor(tokens, dtype=torch.long, device=device)
                groups.append(CommitRecord(len(groups), global_step, pos_t, tok_t))
                if step_callback is not None and outputs is not None:
                    step_callback(GenerationStepInfo(global_step, logits, outputs, pos_t, tok_t, alpha))
            global_step += 1
            if done:
                break
        if not done and stop_tokens:
            generated = x[:, P:end]
            if any(bool((generated == t).any()) for t in stop_tokens):
                break

    terminal = set(stop_tokens) | ({eot} if eot is not None else set())
    final: list[int] = []
    for t in x[0, P:].tolist():
        if t in (mask, eos):
            continue
        if t in terminal:
            break
        final.append(t)
    trace = DiffusionTrace(ids.to(device), P, P + gen_length, mask, eos, groups)
    return GenerationOutput(x[0], P, final, trace, alphas)
