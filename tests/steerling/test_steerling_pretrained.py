"""`Steerling.from_pretrained` on checkpoint folders in the published layout (steerling 0.2.0's hub
layout), `--checkpoint` through the CLI, and bench/steerling_load.py --small.

The folders are written here, from a tiny random release state dict, with safetensors' own writer:
config.json with the model fields flat at the top level plus `interpretable`, `concept`,
`vocab_size`, `instruct` and the hub's keys; model.safetensors or shards listed in
model.safetensors.index.json; the tied embedding once, under either of its names. Outputs are
compared in float32 with the independent reference (tests/references/steerling_ref.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from penrose.errors import PenroseError, PenroseShapeError, PenroseWarning
from penrose_zoo.steerling import Steerling
from penrose_zoo.steerling import release as release_module
from penrose_zoo.steerling.cli import main
from penrose_zoo.steerling.release import CheckpointError
from sources import reference

HERE = Path(__file__).resolve().parents[1]  # tests/
TOL = 1e-5
EMB, LM = "transformer.tok_emb.weight", "transformer.lm_head.weight"

# GQA 4/2, post-norm, QK-norm, RoPE, SwiGLU, clip active, padded concept tables (pad_multiple 8),
# both heads wider than a block of 16 concepts (blocked), the byte tokenizer's vocabulary
MODEL = dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=32, block_size=64, diff_block_size=4, intermediate_size=48,
             clip_qkv=3.0, rope_base=10000.0)
CONCEPT = dict(n_concepts=37, n_unknown_concepts=53, concept_dim=32, topk_known=4, topk_known_features=4,
               factorize_rank=16, unknown_topk=5, block_size=16, pad_multiple=8)
VOCAB = 260
HUB = {"model_type": "steerling", "architectures": ["SteerlingForCausalLM"],
       "auto_map": {"AutoModel": "modeling_steerling.SteerlingForCausalLM"}, "transformers_version": "4.57.1",
       "_name_or_path": "guidelabs/steerling-8b", "torch_dtype": "bfloat16"}


ref = reference('steerling_ref')


def release_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the release's keys (tied embedding once, as tok_emb)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in ref.release_state_dict_shapes(MODEL, CONCEPT, VOCAB).items():
        if k == LM:
            continue
        if len(shape) == 1:  # norm weights
            sd[k] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            sd[k] = torch.randn(shape, generator=g) * ((0.6 if "head" in k else 1.0) / shape[-1] ** 0.5)
    return sd


SD = release_state_dict()


def write_published(path: Path, sd=SD, *, shards: int = 0, tied: str = EMB, config: dict | None = None,
                    dtype=torch.float32) -> Path:
    """A published-layout folder: config.json, model.safetensors (shards=0) or `shards` shards + index."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {**HUB, **MODEL, "interpretable": True, "concept": CONCEPT, "vocab_size": VOCAB, "instruct": False}
    (path / "config.json").write_text(json.dumps(cfg if config is None else config, indent=1))
    tensors = {(tied if k == EMB else k): (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
    if not shards:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    keys = list(tensors)
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    wmap = {}
    for i, name in enumerate(files):
        part = {k: tensors[k] for k in keys[i::shards]}
        save_file(part, str(path / name), metadata={"format": "pt"})
        wmap.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}))
    return path


def _compare_with_reference(model, sd=SD) -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 9), generator=g)
    pos = torch.rand(2, 9, generator=g) > 0.4
    for known, unknown in (({}, {}), ({3: 1.0, 20: 0.0}, {5: 0.5})):
        with torch.no_grad():
            out = model(ids, intervene_known=known, intervene_unknown=unknown, positions=pos)
        logits, want = ref.release_intervene(sd, MODEL, CONCEPT, VOCAB, ids, known=known, unknown=unknown, positions=pos)
        assert out.logits.dtype == torch.float32
        assert float((out.logits - logits).abs().max()) <= TOL
        got = out.as_release()
        for key in ("hidden", "known_features", "unk_hat", "composed", "epsilon"):
            if want[key] is None:
                assert got[key] is None, key
            else:
                assert float((got[key] - want[key]).abs().max()) <= TOL, key
        if not known:
            for head in ("known", "unknown"):
                assert torch.equal(got[f"{head}_topk_indices"].sort(-1).values, want[f"{head}_topk_indices"].sort(-1).values)


# ---- the published layout ------------------------------------------------------------------


@pytest.mark.parametrize("shards", [0, 3])
@pytest.mark.parametrize("tied", [EMB, LM])
def test_published_folder_matches_the_reference(tmp_path, shards, tied):
    path = write_published(tmp_path / "ckpt", shards=shards, tied=tied)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the hub's keys are read past silently
        model = Steerling.from_pretrained(path, dtype=torch.float32).eval()
    assert model.checkpoint_layout == "published" and model.variant == "block_causal" and not model.instruct
    assert model.vocab_size == VOCAB and model.num_parameters() == ref.release_param_count(MODEL, CONCEPT, VOCAB)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    _compare_with_reference(model)
    # Steerling.load reads the same folder (as stored: float32 here)
    again = Steerling.load(path)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters()))


def test_bfloat16_by_default_and_the_weights_are_mapped_not_copied(tmp_path):
    path = write_published(tmp_path / "ckpt", shards=2, tied=LM, dtype=torch.bfloat16)
    model = Steerling.from_pretrained(path).eval()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    sd16 = {k: v.to(torch.bfloat16).float() for k, v in SD.items()}
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        low = model(ids).logits.float()
        full = Steerling.from_pretrained(path, dtype=torch.float32)(ids).logits
    logits, _ = ref.release_forward(sd16, MODEL, CONCEPT, VOCAB, ids)
    assert float((full - logits).abs().max()) <= TOL  # the same weights, widened
    assert float((low - logits).abs().max() / logits.abs().max()) <= 5e-2
    # the parameters are the files' tensors (memory-mapped), not copies: each has a storage of
    # its own exactly its size, and reading it does not allocate
    emb = model.net.tok_emb
    assert emb.untyped_storage().nbytes() == emb.numel() * 2
    assert Steerling.from_pretrained(path, dtype=None).net.tok_emb.dtype == torch.bfloat16


@pytest.mark.parametrize("known,unknown", [({3: 1.0}, {}), ({}, {5: 0.5}), ({3: 1.0, 20: 0.0}, {5: 0.5})])
def test_bfloat16_interventions_on_every_path(tmp_path, known, unknown):
    """Intervention values follow the weights' dtype: blocked heads, dense heads and the embeddings
    diagram (per-position values) all run in bfloat16. With ε on (no known intervention) the logits
    are h's, near the float32 model's; with ε off they read k̂ + û, whose top-k may pick other
    concepts at the boundary in bfloat16, so only their dtype and finiteness are checked."""
    path = write_published(tmp_path / "ckpt", dtype=torch.bfloat16)
    # the unknown head "large" (53 > 40 concepts), as in the release: its diagram draws the rule
    low = Steerling.from_pretrained(path, large_concept_threshold=40).eval()
    full = Steerling.from_pretrained(path, dtype=torch.float32, large_concept_threshold=40).eval()
    assert low.unknown_large and not low.known_large
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    per_position = {c: torch.full(ids.shape, v) for c, v in known.items()}
    with torch.no_grad():
        runs = [(low(ids, intervene_known=known, intervene_unknown=unknown, **kw),
                 full(ids, intervene_known=known, intervene_unknown=unknown, **kw)) for kw in ({}, {"dense_heads": True})]
        emb = low.forward_from_embeddings(low.embed(ids), intervene_known=per_position, intervene_unknown=unknown)
        runs.append((emb, full.forward_from_embeddings(full.embed(ids), intervene_known=per_position,
                                                        intervene_unknown=unknown)))
    for got, want in runs:
        assert got.logits.dtype == got.known_features.dtype == torch.bfloat16
        assert torch.isfinite(got.logits.float()).all() and torch.isfinite(got.unknown_features.float()).all()
        if not known:
            assert float((got.logits.float() - want.logits).abs().max() / want.logits.abs().max()) <= 5e-2


def test_instruct_config_and_release_vocabulary_set_the_mask_token(tmp_path):
    cfg = {**HUB, **MODEL, "interpretable": True, "concept": CONCEPT, "vocab_size": VOCAB, "instruct": True}
    model = Steerling.from_pretrained(write_published(tmp_path / "a", config=cfg), dtype=torch.float32)
    assert model.instruct and model.mask_token_id == 259  # the byte tokenizer's, for this vocabulary
    with torch.device("meta"):
        big = Steerling.from_release_config(MODEL, CONCEPT, 100281)
    sd = {k: torch.zeros(s) for k, s in big.expected_release_shapes().items()}
    cfg = {**HUB, **MODEL, "interpretable": True, "concept": CONCEPT, "instruct": False}  # vocab_size: the release's
    model = Steerling.from_pretrained(write_published(tmp_path / "b", sd, config=cfg), dtype=torch.float32)
    assert model.vocab_size == 100281 and model.mask_token_id == 100280


def test_from_release_accepts_the_tied_tensor_under_the_lm_head_name():
    sd = {(LM if k == EMB else k): v for k, v in SD.items()}
    model = Steerling.from_release(sd, MODEL, CONCEPT, VOCAB).eval()
    assert torch.equal(model.net.tok_emb, SD[EMB])
    _compare_with_reference(model)
    both = {**SD, LM: SD[EMB].clone()}
    assert torch.equal(Steerling.from_release(both, MODEL, CONCEPT, VOCAB).net.tok_emb, SD[EMB])
    with pytest.raises(PenroseShapeError, match="differs from transformer.tok_emb.weight"):
        Steerling.from_release({**SD, LM: SD[EMB] + 1}, MODEL, CONCEPT, VOCAB)


def test_penrose_folders_load_through_from_pretrained_too(tmp_path):
    model = Steerling.from_release(SD, MODEL, CONCEPT, VOCAB)
    model.save(tmp_path / "ckpt")
    again = Steerling.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    assert again.checkpoint_layout == "penrose"
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters()))
    assert Steerling.load(tmp_path / "ckpt").net.tok_emb.dtype == torch.float32


# ---- bad folders: a clear error naming the file and the field or key, nothing loaded ----------


@pytest.fixture
def no_weight_read(monkeypatch):
    """Fail the test if a weight is read: every check must come first."""
    def refuse(*a, **k):
        raise AssertionError("a weight was read before the folder was checked")
    monkeypatch.setattr(release_module, "read_tensors", refuse)


def test_folder_without_config_or_weights(tmp_path, no_weight_read):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: no config.json, no model.safetensors"):
        Steerling.from_pretrained(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        Steerling.from_pretrained(tmp_path / "nowhere")
    path = write_published(tmp_path / "ckpt")
    (path / "model.safetensors").rename(path / "optimizer.safetensors")  # penrose's training state only
    with pytest.raises(CheckpointError, match=r"ckpt: no weights: expected model.safetensors"):
        Steerling.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config.json;"):
        Steerling.from_pretrained(path)
    bad = write_published(tmp_path / "bad")
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json: not a readable JSON file"):
        Steerling.from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps({**MODEL, "interpretable": True, "concept": CONCEPT, "vocab_size": VOCAB}))
    (bad / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a readable safetensors file"):
        Steerling.from_pretrained(bad)


def test_weights_under_other_file_names_load_as_the_release_loads_them(tmp_path):
    """regression: a folder whose weights are not named model.safetensors (nor model-i-of-n) was
    refused, while the release reads every *.safetensors file of a folder."""
    path = write_published(tmp_path / "ckpt", shards=2)
    (path / "model.safetensors.index.json").unlink()
    for i, f in enumerate(sorted(path.glob("model-*.safetensors"))):
        f.rename(path / f"part{i}.safetensors")
    _compare_with_reference(Steerling.from_pretrained(path, dtype=torch.float32))
    other = write_published(tmp_path / "dup")
    (other / "model.safetensors").rename(other / "a.safetensors")
    import shutil
    shutil.copy(other / "a.safetensors", other / "b.safetensors")
    with pytest.raises(CheckpointError, match=r"b.safetensors: weight .* is also in a.safetensors"):
        Steerling.from_pretrained(other)


def test_shard_listed_in_the_index_but_missing(tmp_path, no_weight_read):
    path = write_published(tmp_path / "ckpt", shards=3)
    (path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: lists shard\(s\) that are not in .*"
                                              r"model-00002-of-00003.safetensors \(for \d+ weight"):
        Steerling.from_pretrained(path)
    (path / "model.safetensors.index.json").unlink()  # shards without an index: the gap is found too
    with pytest.raises(CheckpointError, match=r"shard\(s\) model-00002-of-00003.safetensors missing"):
        Steerling.from_pretrained(path)
    path = write_published(tmp_path / "moved", shards=2)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    key = next(k for k, v in index["weight_map"].items() if v.startswith("model-00001"))
    index["weight_map"][key] = "model-00002-of-00002.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"not in the shard the index names: {key} \(model-00002"):
        Steerling.from_pretrained(path)


@pytest.mark.parametrize("change,match", [
    ({"model_type": "llama"}, r"field 'model_type' = 'llama': not a Steerling"),
    ({"architectures": ["LlamaForCausalLM"]}, r"field 'architectures' = \['LlamaForCausalLM'\]"),
    ({"hidden_size": 4096, "num_hidden_layers": 32}, r"field\(s\) 'hidden_size', 'num_hidden_layers' of another architecture"),
    ({"interpretable": False}, r"field 'interpretable' = False: the diagrams draw the interpretable model"),
    ({"concept": None}, r"field 'concept' = None: expected an object"),
    ({"mlp_type": "standard"}, r"config not supported by the steerling diagrams: field 'mlp_type'"),
    ({"n_layers": "2"}, r"field 'n_layers' = '2': expected a whole number"),
    ({"concept": {**CONCEPT, "n_concepts": 2.5}}, r"field 'concept.n_concepts' = 2.5: expected a whole number"),
    ({"concept": {**CONCEPT, "bogus": 1}}, r"field 'concept' has unknown field\(s\) 'bogus'"),
    ({"vocab_size": 0}, r"field 'vocab_size' = 0"),
])
def test_config_of_another_architecture_or_that_does_not_fit(tmp_path, no_weight_read, change, match):
    cfg = {**HUB, **MODEL, "interpretable": True, "concept": CONCEPT, "vocab_size": VOCAB, **change}
    path = write_published(tmp_path / "ckpt", config=cfg)
    with pytest.raises(CheckpointError, match=r"ckpt/config.json: " + match):
        Steerling.from_pretrained(path)


def test_config_without_interpretable_is_refused(tmp_path, no_weight_read):
    cfg = {**MODEL, "concept": CONCEPT, "vocab_size": VOCAB}
    with pytest.raises(CheckpointError, match=r"config.json: no field 'interpretable'"):
        Steerling.from_pretrained(write_published(tmp_path / "ckpt", config=cfg))


def test_other_unknown_config_fields_warn(tmp_path):
    cfg = {**HUB, **MODEL, "interpretable": True, "concept": CONCEPT, "vocab_size": VOCAB, "my_note": "x"}
    with pytest.warns(PenroseWarning, match=r"config.json: ignoring field\(s\) 'my_note'"):
        Steerling.from_pretrained(write_published(tmp_path / "ckpt", config=cfg), dtype=torch.float32)


def test_weight_of_the_wrong_shape_names_it_and_both_shapes(tmp_path, no_weight_read):
    key = "transformer.blocks.1.attn.c_attn.weight"
    sd = {**SD, key: torch.zeros(63, 32)}
    path = write_published(tmp_path / "ckpt", sd, shards=2)
    with pytest.raises(CheckpointError, match=rf"model-0000\d-of-00002.safetensors: {key} has shape \(63, 32\), "
                                              rf"expected \(64, 32\)"):
        Steerling.from_pretrained(path)
    sd = {**SD, "known_head.concept_embedding.weight": torch.zeros(40, 32, dtype=torch.int32)}
    with pytest.raises(CheckpointError, match=r"known_head.concept_embedding.weight has dtype I32"):
        Steerling.from_pretrained(write_published(tmp_path / "int", sd))


def test_missing_and_unknown_weights(tmp_path, no_weight_read):
    sd = {k: v for k, v in SD.items() if k not in ("transformer.ln_f.weight", EMB)}
    with pytest.raises(CheckpointError, match=r"missing weight\(s\) transformer.tok_emb.weight, transformer.ln_f.weight"):
        Steerling.from_pretrained(write_published(tmp_path / "missing", sd))
    extra = {**SD, "transformer.blocks.2.ln_1.weight": torch.ones(32), "known_head.concept_query_projection.weight": torch.ones(32, 32)}
    path = write_published(tmp_path / "extra", extra, shards=2)
    with pytest.raises(CheckpointError, match=r"unknown weight\(s\) .*transformer.blocks.2.ln_1.weight"):
        Steerling.from_pretrained(path)


def test_unknown_weights_with_strict_off_warn_and_load(tmp_path):
    extra = {**SD, "transformer.blocks.2.ln_1.weight": torch.ones(32)}
    path = write_published(tmp_path / "extra", extra)
    with pytest.warns(PenroseWarning, match=r"ignoring unknown weight\(s\) transformer.blocks.2.ln_1.weight"):
        model = Steerling.from_pretrained(path, dtype=torch.float32, strict=False)
    _compare_with_reference(model.eval())


def test_tied_tensor_stored_twice_must_agree(tmp_path):
    path = write_published(tmp_path / "twice", {**SD, LM: SD[EMB].clone()})
    assert torch.equal(Steerling.from_pretrained(path, dtype=torch.float32).net.tok_emb, SD[EMB])
    path = write_published(tmp_path / "differ", {**SD, LM: SD[EMB] + 1})
    with pytest.raises(CheckpointError, match="transformer.lm_head.weight differs from transformer.tok_emb.weight"):
        Steerling.from_pretrained(path)
    path = write_published(tmp_path / "shape", {**SD, LM: SD[EMB][:-1].clone()})
    with pytest.raises(CheckpointError, match=r"lm_head.weight has shape \(259, 32\), but it is the tied token embedding"):
        Steerling.from_pretrained(path)


def test_errors_are_penrose_errors(tmp_path):
    assert issubclass(CheckpointError, PenroseError)
    assert main(["info", "--checkpoint", str(tmp_path / "nowhere")]) == 1


# ---- --checkpoint through the CLI ----------------------------------------------------------


def test_cli_info_and_generate_read_a_published_folder(tmp_path, capsys):
    path = write_published(tmp_path / "ckpt", shards=2, tied=LM, dtype=torch.bfloat16)
    assert main(["info", "--checkpoint", str(path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == ref.release_param_count(MODEL, CONCEPT, VOCAB) and info["vocab_size"] == VOCAB
    assert info["dtype"] == "bfloat16"
    assert main(["info", "--checkpoint", str(path), "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    assert main(["generate", "--checkpoint", str(path), "--prompt", "Hi", "--max-new-tokens", "5",
                 "--temperature", "0", "--dtype", "float32"]) == 0
    capsys.readouterr()
    (path / "model-00001-of-00002.safetensors").unlink()
    assert main(["generate", "--checkpoint", str(path), "--prompt", "Hi"]) == 1
    assert "model-00001-of-00002.safetensors" in capsys.readouterr().err


def test_cli_explain_and_steer_read_a_published_folder(tmp_path, capsys):
    path = write_published(tmp_path / "ckpt", tied=LM)
    heat = tmp_path / "h.png"
    assert main(["explain", "--checkpoint", str(path), "--text", "cat", "--json", "--heatmap", str(heat),
                 "--ig-steps", "4"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["tokens"]) == len("cat") + 2 and r["prediction"]["attribution_error"] < 1e-4  # bos, 3 bytes, mask
    assert main(["steer", "--checkpoint", str(path), "--concept", "3", "--scale", "2", "--prompt", "a",
                 "--max-new-tokens", "2", "--json", "--dtype", "bfloat16"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["id"] == 3 and isinstance(r["steered"], str)
    assert main(["evaluate", "--checkpoint", str(path)]) == 1  # evaluation needs a training checkpoint
    assert "train.json" in capsys.readouterr().err


# ---- bench/steerling_load.py --small ---------------------------------------------------------


def test_load_bench_small_holds_one_copy_of_the_weights():
    run = subprocess.run([sys.executable, str(HERE.parent / "bench" / "steerling_load.py"), "--small", "--json",
                          "--tokens", "16", "--steps-per-block", "2", "--threads", "1"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["shards"] > 1 and r["weight_bytes"] > 200e6
    # loading maps the files: nothing is read until used; every weight read = one copy
    assert r["rss_after_load"] - r["rss_before_load"] < 0.25 * r["weight_bytes"]
    assert r["touched_over_weights"] <= 1.15, r
    assert r["s_per_token"] > 0 and r["new_tokens"] == 16


def _corpus(path: Path, cats=("cats", "sea")) -> Path:
    """A corpus of category files (fortunes format: entries between '%' lines)."""
    path.mkdir(parents=True, exist_ok=True)
    words = {"cats": "the cat purrs and meows at the mouse", "sea": "waves roll over the ship at sea",
             "unmapped": "nothing to see here"}
    for cat in cats:
        entries = [f"{words[cat]} number {i}, {'again ' * (i % 3)}and more." for i in range(40)]
        (path / cat).write_text("\n%\n".join(entries) + "\n%\n")
    return path


def test_cli_evaluate_reads_a_published_folder(tmp_path, capsys):
    """regression: `evaluate` took only training checkpoints (it reads their corpus), so a
    published folder could not be evaluated; now --data names a corpus and --catalog (or
    --concept CATEGORY=ID) the known concept of each category."""
    path = write_published(tmp_path / "ckpt")
    data = _corpus(tmp_path / "corpus")
    catalog = HERE / "fixtures" / "steerling_concepts.csv"
    assert main(["evaluate", "--checkpoint", str(path), "--data", str(data), "--catalog", str(catalog),
                 "--max-batches", "2", "--seq-len", "32", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["concepts_scored"] == {"cats": 0, "sea": 2}
    assert set(r["concept_auc_per_concept"]) == {"cats", "sea"}
    assert math.isfinite(r["val_loss"]) and 0 < r["val_loss"] < 20
    assert set(r["steering"]) <= {"cats", "sea"}
    # --concept maps a category by id, and agrees with the catalog's mapping
    assert main(["evaluate", "--checkpoint", str(path), "--data", str(data), "--concept", "cats=0", "--concept", "sea=2",
                 "--max-batches", "2", "--seq-len", "32", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["val_loss"] == r["val_loss"] and again["concept_auc_per_concept"] == r["concept_auc_per_concept"]


def test_cli_evaluate_of_a_published_folder_needs_a_corpus_and_its_concepts(tmp_path, capsys):
    path = write_published(tmp_path / "ckpt")
    assert main(["evaluate", "--checkpoint", str(path)]) == 1
    assert "no training corpus to evaluate on: give --data DIR" in capsys.readouterr().err
    data = _corpus(tmp_path / "corpus", ("cats", "unmapped"))
    catalog = HERE / "fixtures" / "steerling_concepts.csv"
    assert main(["evaluate", "--checkpoint", str(path), "--data", str(data), "--catalog", str(catalog)]) == 1
    err = capsys.readouterr().err
    assert "corpus categories without a known concept: 'unmapped' (unknown concept 'unmapped'" in err
    assert main(["evaluate", "--checkpoint", str(path), "--data", str(data), "--concept", "cats=0",
                 "--concept", "unmapped=99"]) == 1
    assert "category 'unmapped' is known concept 99, but the model has 37 known concepts" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", str(path), "--data", str(data), "--concept", "cats"]) == 1
    assert "--concept takes CATEGORY=ID|NAME" in capsys.readouterr().err


def test_cli_on_a_bf16_folder_with_the_release_vocabulary(tmp_path, capsys):
    """regression: `explain` on a bfloat16 checkpoint crashed in numpy (`Got unsupported ScalarType
    BFloat16`); every command runs on a published bf16 folder with the release's vocabulary and
    tokenizer (cl100k through bpe-openai), and no library deprecation warning reaches the user."""
    model = Steerling(MODEL, CONCEPT, 100281, seed=0)
    path = write_published(tmp_path / "ckpt", model.release_state_dict(), config={
        **HUB, **MODEL, "interpretable": True, "concept": CONCEPT, "vocab_size": 100281, "instruct": False},
        dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # e.g. bpe-openai's importlib.resources use
        assert main(["generate", "--checkpoint", str(path), "--prompt", "The court ruled", "--max-new-tokens", "3",
                     "--temperature", "0"]) == 0
        assert main(["explain", "--checkpoint", str(path), "--text", "The court ruled", "--json",
                     "--heatmap", str(tmp_path / "h.png")]) == 0
        out = capsys.readouterr().out
        assert json.loads(out[out.index("{"):])["tokens"]
        assert (tmp_path / "h.png").is_file()
        before = sorted(p.name for p in path.iterdir())
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:  # without --heatmap the downloaded folder is left as it is: the heatmap goes here
            assert main(["explain", "--checkpoint", str(path), "--text", "Hi"]) == 0
        finally:
            os.chdir(cwd)
        capsys.readouterr()
        assert sorted(p.name for p in path.iterdir()) == before and (tmp_path / "explain.png").is_file()
        data = _corpus(tmp_path / "corpus")
        assert main(["evaluate", "--checkpoint", str(path), "--data", str(data), "--concept", "cats=1", "--concept",
                     "sea=2", "--max-batches", "1", "--seq-len", "32", "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert math.isfinite(r["val_loss"])
