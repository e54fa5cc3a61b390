"""Sampling from Steerling (zoo/steerling/generate.py) and its CLI, on tiny random models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from penrose.errors import PenroseShapeError
from penrose_zoo.steerling import Steerling
from penrose_zoo.steerling.cli import TINY_CONCEPTS, TINY_MODEL, main
from penrose_zoo.steerling.generate import (ByteTokenizer, generate, generate_autoregressive, generate_block_diffusion,
                                            sample_logits)

HERE = Path(__file__).resolve().parents[1]  # tests/
TOK = ByteTokenizer()


def _ref():
    spec = importlib.util.spec_from_file_location("steerling_ref", HERE / "references" / "steerling_ref.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("steerling_ref", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def diffusion_model():
    return Steerling.from_release_config(TINY_MODEL, TINY_CONCEPTS, 260, seed=1).eval()


@pytest.fixture(scope="module")
def causal_model():
    return Steerling.from_release_config(TINY_MODEL, TINY_CONCEPTS, 260, causal=True, seed=2).eval()


class _Counting:
    """Counts forward passes and the lengths they see."""

    def __init__(self, model):
        self.model, self.lengths = model, []
        self.handle = model.net.register_forward_pre_hook(lambda m, a, kw: self.lengths.append(kw["ids"].shape[-1]), with_kwargs=True)

    def close(self):
        self.handle.remove()


def test_block_diffusion_fills_blocks_left_to_right(diffusion_model):
    blk = diffusion_model.sizes["blk"]  # 8
    prompt = TOK.encode("Hi there")  # 9 tokens: the prompt ends inside the second block
    counter = _Counting(diffusion_model)
    try:
        out = generate_block_diffusion(diffusion_model, prompt, 2 * blk + 7, mask_id=TOK.mask_id, steps_per_block=4,
                                       generator=torch.Generator().manual_seed(0))
    finally:
        counter.close()
    assert out.shape == (len(prompt) + 2 * blk + 7,)
    assert out[: len(prompt)].tolist() == prompt
    assert not (out == TOK.mask_id).any()
    # blocks [8, 16), [16, 24), [24, 32): 4 steps each, each run on the sequence up to the block's end
    assert counter.lengths == [16] * 4 + [24] * 4 + [32] * 4


def test_block_diffusion_unmasks_the_most_confident_first(diffusion_model):
    """With as many steps as positions, each step unmasks exactly one position."""
    blk = diffusion_model.sizes["blk"]
    seen = []
    real_sample = sample_logits

    def spy(logits, *a, **k):
        tok, conf = real_sample(logits, *a, **k)
        seen.append((logits.shape[0], conf.clone()))
        return tok, conf

    import penrose_zoo.steerling.generate as g

    g.sample_logits = spy
    try:
        generate_block_diffusion(diffusion_model, [TOK.bos_id] * blk, blk, mask_id=TOK.mask_id, steps_per_block=blk,
                                 temperature=0.0)
    finally:
        g.sample_logits = real_sample
    assert [n for n, _ in seen] == list(range(blk, 0, -1))


def test_block_diffusion_is_causal_across_blocks(diffusion_model):
    """A block does not depend on the blocks generated after it (same seed, shorter request)."""
    blk = diffusion_model.sizes["blk"]
    prompt = [TOK.bos_id] * blk
    kw = dict(mask_id=TOK.mask_id, steps_per_block=3, temperature=1.0, top_p=0.9)
    long = generate_block_diffusion(diffusion_model, prompt, 2 * blk, generator=torch.Generator().manual_seed(5), **kw)
    short = generate_block_diffusion(diffusion_model, prompt, blk, generator=torch.Generator().manual_seed(5), **kw)
    assert torch.equal(long[: 2 * blk], short)
    again = generate_block_diffusion(diffusion_model, prompt, 2 * blk, generator=torch.Generator().manual_seed(5), **kw)
    assert torch.equal(long, again)


def test_greedy_autoregressive_matches_the_reference(causal_model):
    ref = _ref()
    sd, m, c = causal_model.release_state_dict(), dict(causal_model.model_config), dict(causal_model.concept_config)
    m["diff_block_size"] = 1  # the release's causal attention
    prompt = TOK.encode("ab")
    out = generate_autoregressive(causal_model, prompt, 6, temperature=0.0)
    ids = torch.tensor(prompt)
    for _ in range(6):
        logits, _ = ref.release_forward(sd, m, c, 260, ids[None])
        ids = torch.cat([ids, logits[0, -1].argmax()[None]])
    assert torch.equal(out, ids)


def test_generate_picks_the_sampler_by_variant(diffusion_model, causal_model):
    gen = torch.Generator().manual_seed(0)
    assert generate(causal_model, [TOK.bos_id], 5, generator=gen, steps_per_block=2).shape == (6,)
    out = generate(diffusion_model, [TOK.bos_id], 5, mask_id=TOK.mask_id, generator=gen, eos_id=TOK.eos_id)
    assert out.shape == (6,) and not (out == TOK.mask_id).any()


def test_generation_with_an_intervention(causal_model):
    a = generate_autoregressive(causal_model, [TOK.bos_id], 4, temperature=0.0)
    b = generate_autoregressive(causal_model, [TOK.bos_id], 4, temperature=0.0, intervene_known={0: 1.0, 1: 1.0})
    assert a.shape == b.shape == (5,)


def test_sample_logits_top_p_and_temperature():
    logits = torch.tensor([[0.0, 3.0, 1.0, -1.0]]).repeat(50, 1)
    tok, conf = sample_logits(logits, temperature=1.0, top_p=0.05, generator=torch.Generator().manual_seed(0))
    assert (tok == 1).all() and torch.allclose(conf, torch.ones(50))
    tok, _ = sample_logits(logits, temperature=0.0)
    assert (tok == 1).all()
    tok, _ = sample_logits(logits, banned=[1], temperature=0.0)
    assert (tok == 2).all()
    tok, _ = sample_logits(logits, temperature=5.0, generator=torch.Generator().manual_seed(0))
    assert len(set(tok.tolist())) > 1


def test_generation_input_errors(diffusion_model):
    context = diffusion_model.model_config["block_size"]
    with pytest.raises(PenroseShapeError, match="exceed the context"):
        generate(diffusion_model, [1, 2], context)
    with pytest.raises(PenroseShapeError, match="prompt is empty"):
        generate(diffusion_model, [], 3)
    with pytest.raises(PenroseShapeError, match="mask_id 999"):
        generate_block_diffusion(diffusion_model, [1], 3, mask_id=999)
    with pytest.raises(PenroseShapeError, match="token id 300"):
        generate(diffusion_model, [300], 3)


def test_byte_tokenizer_round_trip():
    text = "Steerling — ok"
    ids = TOK.encode(text)
    assert ids[0] == TOK.bos_id and TOK.decode(ids) == text
    assert TOK.decode([TOK.mask_id, 72, 105, TOK.eos_id]) == "Hi"


def test_cli_init_and_generate(tmp_path, capsys):
    ckpt = tmp_path / "tiny"
    assert main(["init", "--out", str(ckpt), "--tiny", "--seed", "3"]) == 0
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "config.json").is_file()
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "Hello", "--max-new-tokens", "6",
                 "--steps-per-block", "2", "--intervene", "3=1.0", "--show-concepts"]) == 0
    text = capsys.readouterr().out
    assert "known concepts (last position):" in text
    assert main(["init", "--out", str(tmp_path / "c"), "--tiny", "--causal"]) == 0
    assert main(["generate", "--checkpoint", str(tmp_path / "c"), "--prompt", "Hi", "--temperature", "0",
                 "--max-new-tokens", "3"]) == 0
    assert main(["info", "--checkpoint", str(ckpt)]) == 0
    assert '"variant": "block_causal"' in capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(tmp_path / "missing"), "--prompt", "x"]) == 1
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "x", "--intervene", "nope"]) == 1
    assert main([]) == 2


def test_penrose_cli_forwards_to_steerling(tmp_path):
    from penrose.cli import main as penrose_main

    assert penrose_main(["steerling", "init", "--out", str(tmp_path / "t"), "--tiny"]) == 0
    assert penrose_main(["steerling", "generate", "--checkpoint", str(tmp_path / "t"), "--prompt", "Hi",
                         "--max-new-tokens", "4"]) == 0
