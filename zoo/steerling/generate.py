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
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from penrose.errors import PenroseShapeError
from penrose_zoo.steerling import tokenizer as _tokenizer


def ByteTokenizer(**kw) -> _tokenizer.ByteTokenizer:  # noqa: N802 - the name callers import
    """penrose_zoo.steerling.tokenizer.ByteTokenizer with generation's defaults: encode prepends
    bos, decode drops the special ids (keywords override them). There is one byte tokenizer;
    this is it, configured."""
    kw.setdefault("add_special_tokens", True)
    kw.setdefault("skip_special_tokens", True)
    return _tokenizer.ByteTokenizer(**kw)


def sample_logits(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0,
                  generator: torch.Generator | None = None, banned: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """Sample one token per row of `logits` (n, v). Returns (tokens, confidence): the confidence
    of a row is the largest probability of its tempered, top-p-truncated distribution (the
    release's unmasking score, "softmax maximum"); temperature 0 is greedy."""
    logits = logits.float().clone()
    if banned:
        logits[:, banned] = -math.inf
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


def _check(model, prompt: list[int] | Tensor, max_new_tokens: int) -> Tensor:
    ids = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
    if ids.numel() == 0:
        raise PenroseShapeError("the prompt is empty; give at least one token (a bos token will do)")
    if max_new_tokens < 0:
        raise PenroseShapeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    context = model.model_config["block_size"]
    if ids.numel() + max_new_tokens > context:
        raise PenroseShapeError(f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) exceed the context (block_size = {context})")
    model.check_input_ids(ids)
    return ids


@torch.no_grad()
def generate_autoregressive(model, prompt, max_new_tokens: int, *, temperature: float = 1.0, top_p: float = 1.0,
                            eos_id: int | None = None, banned: list[int] | None = None,
                            generator: torch.Generator | None = None, **intervene) -> Tensor:
    """Left-to-right sampling (the causal variant): one full forward pass per new token (the
    diagrams have no key/value cache). `intervene`: intervene_known / intervene_unknown dicts."""
    ids = _check(model, prompt, max_new_tokens)
    device = next(model.parameters()).device
    ids = ids.to(device)
    for _ in range(max_new_tokens):
        logits = model(ids[None], **intervene).logits[0, -1:]
        tok, _ = sample_logits(logits, temperature, top_p, generator, banned)
        ids = torch.cat([ids, tok])
        if eos_id is not None and int(tok) == eos_id:
            break
    return ids


@torch.no_grad()
def generate_block_diffusion(model, prompt, max_new_tokens: int, *, mask_id: int, steps_per_block: int = 8,
                             temperature: float = 1.0, top_p: float = 1.0, banned: list[int] | None = None,
                             generator: torch.Generator | None = None, **intervene) -> Tensor:
    """Block-by-block masked diffusion (the block-causal variant); see the module docstring."""
    ids = _check(model, prompt, max_new_tokens)
    if not 0 <= mask_id < model.vocab_size:
        raise PenroseShapeError(f"mask_id {mask_id} is out of range for vocab_size {model.vocab_size}")
    if steps_per_block < 1:
        raise PenroseShapeError(f"steps_per_block must be >= 1, got {steps_per_block}")
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
            logits = model(seq[None, :end], **intervene).logits[0, masked]
            tok, conf = sample_logits(logits, temperature, top_p, generator, banned)
            n = math.ceil(masked.numel() / (steps_per_block - step))  # the rest on the last step
            pick = conf.topk(n).indices
            seq[masked[pick]] = tok[pick]
        start = end
    return seq


def generate(model, prompt, max_new_tokens: int, *, mask_id: int | None = None, **kw) -> Tensor:
    """Autoregressive for a causal model, block diffusion otherwise (mask_id defaults to the
    last vocabulary id, where the release puts its mask token)."""
    if model.variant == "causal":
        kw.pop("steps_per_block", None)
        return generate_autoregressive(model, prompt, max_new_tokens, **kw)
    if mask_id is None:
        mask_id = model.vocab_size - 1
    kw.pop("eos_id", None)
    return generate_block_diffusion(model, prompt, max_new_tokens, mask_id=mask_id, **kw)
