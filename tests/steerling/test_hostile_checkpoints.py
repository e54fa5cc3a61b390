"""Hostile Steerling checkpoints (docs/security.md): every config field against one schema
(type, range, finiteness, whole numbers) before anything is built, sizes that would not fit in
memory named by field and bytes, JSON depth and size limits, NaN weights found while loading,
penrose's own training state, and one file-mode rule. Each case is a CheckpointError naming the
file and the field path, never a raw ValueError / OverflowError / RecursionError."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from penrose.errors import PenroseCompileError, PenroseError
from penrose_zoo.steerling import Steerling
from penrose_zoo.steerling.config import CONCEPT_DEFAULTS, MODEL_DEFAULTS
from penrose_zoo.steerling.release import CheckpointError, read_config
from penrose_zoo.steerling.schema import CONCEPT_SCHEMA, MODEL_SCHEMA

MODEL = dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=16, block_size=32, diff_block_size=4, intermediate_size=24)
CONCEPT = dict(n_concepts=6, n_unknown_concepts=8, concept_dim=16, topk_known=2, topk_known_features=2,
               factorize_rank=4, unknown_topk=2, block_size=4, pad_multiple=4)
VOCAB = 260


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny checkpoint in penrose's own layout (Steerling.save)."""
    path = tmp_path_factory.mktemp("ckpt")
    Steerling(MODEL, CONCEPT, VOCAB, seed=0).save(path)
    return path


def _published(path: Path, **changes) -> Path:
    """A published-layout config.json (weights are not needed: the config fails first)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {**MODEL, "interpretable": True, "concept": dict(CONCEPT), "vocab_size": VOCAB}
    for key, value in changes.items():
        if key.startswith("concept_"):
            cfg["concept"][key.removeprefix("concept_")] = value
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))  # NaN and Infinity are written as the JSON extensions
    return path


def _penrose(path: Path, src: Path, edit) -> Path:
    """A copy of the saved checkpoint with its config.json edited by `edit(cfg)`."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    return path


def test_the_schema_covers_every_config_field():
    assert set(MODEL_SCHEMA) == set(MODEL_DEFAULTS) and set(CONCEPT_SCHEMA) == set(CONCEPT_DEFAULTS)
    for name, value in {**MODEL_DEFAULTS}.items():
        assert MODEL_SCHEMA[name].problem(value) is None, name
    for name, value in CONCEPT_DEFAULTS.items():
        assert CONCEPT_SCHEMA[name].problem(value) is None, name


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0, -5, "500000", None, True, [1]])
def test_rope_base_not_finite_or_wrong(tmp_path, value):
    path = _published(tmp_path, rope_base=value)
    with pytest.raises(CheckpointError, match=r"config.json: field 'rope_base' = .*expected a number"):
        Steerling.from_pretrained(path)


@pytest.mark.parametrize("value", [0, -16, -1, 2.5, "16", float("nan"), 1 << 40])
def test_concept_block_size_out_of_range(tmp_path, value):
    path = _published(tmp_path, concept_block_size=value)
    with pytest.raises(CheckpointError, match=r"config.json: field 'concept.block_size' = .*expected a whole number from 1"):
        Steerling.from_pretrained(path)


@pytest.mark.parametrize("field", ["n_layers", "n_head", "n_embd", "block_size", "diff_block_size", "mlp_ratio"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "x"])
def test_model_sizes_must_be_positive_whole_numbers(tmp_path, field, value):
    path = _published(tmp_path, **{field: value})
    with pytest.raises(CheckpointError, match=rf"field '{field}' = .*expected a whole number"):
        read_config(path)


@pytest.mark.parametrize("field, value", [("mask_token_id", "abc"), ("mask_token_id", [1]), ("mask_token_id", -1),
                                          ("mask_token_id", 1.5), ("mask_token_id", 260), ("large_concept_threshold", "x"),
                                          ("large_concept_threshold", -3), ("vocab_size", 0), ("vocab_size", "260"),
                                          ("variant", "sideways")])
def test_penrose_layout_top_level_fields(tmp_path, saved, field, value):
    path = _penrose(tmp_path, saved, lambda cfg: cfg.__setitem__(field, value))
    with pytest.raises(CheckpointError, match=rf"config.json: field '{field}' = "):
        Steerling.load(path)


@pytest.mark.parametrize("where, field, value", [("concept_config", "block_size", 0), ("concept_config", "block_size", -16),
                                                 ("model_config", "rope_base", float("nan")),
                                                 ("model_config", "norm_eps", float("inf")), ("concept_config", "inject_alpha", float("nan")),
                                                 ("model_config", "n_kv_heads", "2"), ("model_config", "nonsense", 1)])
def test_penrose_layout_nested_fields_are_named_by_path(tmp_path, saved, where, field, value):
    path = _penrose(tmp_path, saved, lambda cfg: cfg.setdefault(where, {}).__setitem__(field, value))
    with pytest.raises(CheckpointError, match=rf"config.json: .*'{where}.{field}'"):
        Steerling.load(path)


@pytest.mark.parametrize("field, value", [("concept_n_unknown_concepts", 10**10), ("concept_n_concepts", 10**9),
                                          ("n_embd", 10**9), ("vocab_size", 10**9)])
def test_sizes_that_would_not_fit_in_memory_name_the_field_and_the_bytes(tmp_path, field, value):
    path = _published(tmp_path, **{field: value})
    if field == "n_embd":
        _published(tmp_path, n_embd=value, concept_concept_dim=value)
    name = field.replace("concept_", "concept.", 1) if field.startswith("concept_") else field
    with pytest.raises(CheckpointError, match=rf"config.json: the weight.* sized by .*'{name}' = {value:,}.*bytes"):
        Steerling.from_pretrained(path)


def test_deep_big_and_duplicated_json(tmp_path):
    path = _published(tmp_path)
    (path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nested more than 32 levels"):
        read_config(path)
    (path / "config.json").write_text('{"a": "' + "x" * (2 << 20) + '"}')
    with pytest.raises(CheckpointError, match="over the limit"):
        read_config(path)
    (path / "config.json").write_text('{"n_layers": 1, "n_layers": 2}')
    with pytest.raises(CheckpointError, match="'n_layers' appears twice"):
        read_config(path)
    (path / "config.json").write_bytes(b'{"n_layers": "\xff"}')
    with pytest.raises(CheckpointError, match="not UTF-8"):
        read_config(path)


@pytest.mark.skipif(os.name == "nt", reason="devices and FIFOs")
def test_config_json_that_is_not_a_regular_file(tmp_path):
    path = tmp_path / "c"
    path.mkdir()
    os.symlink("/dev/zero", path / "config.json")
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_config(path)


def test_nan_weights_are_found_while_loading(tmp_path, saved):
    path = tmp_path / "nan"
    path.mkdir()
    (path / "config.json").write_text((saved / "config.json").read_text())
    tensors = load_file(str(saved / "model.safetensors"))
    key = "transformer.blocks.0.mlp.c_fc.weight"
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[7] = float("nan")
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor {key} holds a non-finite value \(nan at entry 7"):
        Steerling.load(path)
    model = Steerling.load(path, allow_nonfinite=True)  # the documented opt-out: inspect it anyway
    assert torch.isnan(model.release_state_dict()[key]).any()
    tensors[key].view(-1)[7] = float("-inf")
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"tensor {key} holds a non-finite value \(-inf"):
        Steerling.from_pretrained(path, dtype=None)


def test_from_release_refuses_nan_weights(saved):
    sd = load_file(str(saved / "model.safetensors"))
    key = "transformer.ln_f.weight"
    sd[key] = sd[key].clone()
    sd[key][0] = float("inf")
    with pytest.raises(CheckpointError, match=rf"state_dict: tensor {key} holds a non-finite value \(inf at entry 0"):
        Steerling.from_release(sd, MODEL, CONCEPT, VOCAB)
    assert Steerling.from_release(sd, MODEL, CONCEPT, VOCAB, allow_nonfinite=True) is not None


def test_direct_construction_checks_the_same_schema():
    with pytest.raises(PenroseCompileError, match="large_concept_threshold"):
        Steerling(MODEL, CONCEPT, VOCAB, large_concept_threshold="x")
    with pytest.raises(PenroseCompileError, match="'block_size' = 0"):
        Steerling(MODEL, {**CONCEPT, "block_size": 0}, VOCAB)
    with pytest.raises(PenroseCompileError, match="'rope_base' = nan"):
        Steerling({**MODEL, "rope_base": float("nan")}, CONCEPT, VOCAB)
    with pytest.raises(PenroseCompileError, match=r"Steerling: the weight .*'concept_config.n_concepts' = 1,000,000,000.*bytes"):
        Steerling(MODEL, {**CONCEPT, "n_concepts": 10**9}, VOCAB)


def test_files_are_written_with_one_mode_rule(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "m"
    Steerling(MODEL, CONCEPT, VOCAB, seed=0).save(path)
    modes = {f: stat.S_IMODE((path / f).stat().st_mode) for f in ("config.json", "model.safetensors")}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    os.chmod(path / "model.safetensors", 0o640)
    os.chmod(path / "config.json", 0o640)
    Steerling(MODEL, CONCEPT, VOCAB, seed=1).save(path)  # an existing file keeps its mode
    assert {stat.S_IMODE((path / f).stat().st_mode) for f in ("config.json", "model.safetensors")} == {0o640}
    assert not [p for p in path.iterdir() if p.name.startswith(".")]  # no temporary file left


# ---- penrose's own training checkpoints ------------------------------------------------------


def _train_state(path: Path, **changes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    state = {"format": "penrose-steerling-train", "version": 1, "config": {"preset": "tiny", "steps": 3, "lr": 0.001},
             "step": 3, "history": {"train": [], "val": []}}
    for k, v in changes.items():
        if k.startswith("config_"):
            state["config"][k.removeprefix("config_")] = v
        else:
            state[k] = v
    (path / "train.json").write_text(json.dumps(state))
    return path


@pytest.mark.parametrize("changes, match", [
    ({"step": "x"}, "field 'step'"), ({"step": -1}, "field 'step'"), ({"history": []}, "field 'history'"),
    ({"config": None}, "field 'config'"), ({"config_lr": float("nan")}, "'config.lr'"), ({"config_steps": "3"}, "'config.steps'"),
    ({"config_nonsense": 1}, "'config.nonsense'"), ({"format": "other"}, "not a penrose steerling training state"),
])
def test_train_state_is_checked(tmp_path, changes, match):
    from penrose_zoo.steerling.checkpoints import read_train_state

    path = _train_state(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=match):
        read_train_state(path)


def test_a_good_train_state_reads(tmp_path):
    from penrose_zoo.steerling.checkpoints import read_train_state

    assert read_train_state(_train_state(tmp_path))["step"] == 3


@pytest.mark.parametrize("doc, match", [({"known": ["a", "a"]}, r"known\[1\]' = 'a' repeats known\[0\]"),
                                        ({"known": ["caf\u00e9", "cafe\u0301"]}, r"known\[1\]' = '.*' repeats known\[0\]"),
                                        ({"known": ["a", "\u200b"]}, r"known\[1\]' = '\\u200b': expected a concept name \(visible"),
                                        ({"known": ["a", "b\x1b]0;x\x07"]}, r"known\[1\]' = 'b\\x1b\]0;x\\x07'.*no control"),
                                        ({"known": ["a", None]}, r"known\[1\]' = None"), ({"known": "ab"}, "list 'known'"),
                                        ({"known": ["a"]}, "has 1 names, but the model has 2")])
def test_concept_names_are_checked(tmp_path, doc, match):
    from penrose_zoo.steerling.checkpoints import read_concept_names

    (tmp_path / "concepts.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=match):
        read_concept_names(tmp_path, 2)


def test_optimizer_state_with_nan_is_refused(tmp_path):
    from penrose_zoo.steerling.checkpoints import read_optimizer

    save_file({"0.exp_avg": torch.tensor([1.0, float("nan")]), "0.step": torch.tensor(3.0)}, str(tmp_path / "optimizer.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor 0.exp_avg holds a non-finite value \(nan at entry 1"):
        read_optimizer(tmp_path)
    (tmp_path / "optimizer.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        read_optimizer(tmp_path)


def test_every_refusal_is_a_penrose_error():
    assert issubclass(CheckpointError, PenroseError)


@pytest.mark.parametrize("doc, match", [
    ({"format": "x"}, "not a"), ({"special_tokens": 5}, "field 'special_tokens' = 5"), ({"kind": "bpe", "bpe": "garbage"}, "field 'bpe'"),
    ({"kind": "bpe", "bpe": {"model": 7}}, "field 'bpe.model' must be a BPE model"), ({"kind": "nonesuch"}, "field 'kind' = 'nonesuch'"),
])
def test_a_damaged_tokenizer_json(tmp_path, doc, match):
    from penrose_zoo.steerling.tokenizer import SPECIAL_TOKENS, TOKENIZER_FORMAT, TokenizerError, load_tokenizer

    full = {"format": TOKENIZER_FORMAT, "version": 1, "kind": "byte", "special_tokens": list(SPECIAL_TOKENS), **doc}
    (tmp_path / "tokenizer.json").write_text(json.dumps(full))
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("[" * 50_000)
    with pytest.raises(TokenizerError, match="nested more than"):
        load_tokenizer(tmp_path)


def test_sampling_nan_logits_is_a_clear_error():
    from penrose_zoo.steerling.generate import GenerationConfig, sample_logits, sample_token

    logits = torch.zeros(2, 5)
    logits[1, 3] = float("nan")
    for t in (0.0, 1.0):
        with pytest.raises(PenroseError, match="row 1 hold NaN or \\+inf"):
            sample_logits(logits, temperature=t)
    with pytest.raises(PenroseError, match="only -inf"):
        sample_logits(torch.zeros(1, 3), banned=[0, 1, 2])
    with pytest.raises(PenroseError, match="NaN"):
        sample_token(logits[1], GenerationConfig())


def _bpe_doc():
    from penrose_zoo.steerling.tokenizer import BPETokenizer

    tok = BPETokenizer.train(["the cat sat on the mat"] * 20, vocab_size=300)
    return json.loads(json.dumps({"format": "penrose-steerling-tokenizer", "version": 1, "kind": "bpe",
                                  "special_tokens": list(tok.special_tokens), **tok._payload()}))


def _last_token(vocab: dict) -> str:
    return max(vocab, key=vocab.get)


@pytest.mark.parametrize("change, match", [
    # issue 37: a missing id put a word on the special ids (text encoded as <|pad|>); an id past the end was accepted
    (lambda v: v.pop(_first_token(v, 5)), r"= \d+ is past the end of the \d+ ids, and id 5 is missing"),
    (lambda v: v.__setitem__(_last_token(v), 10**6), r"= 1000000 is past the end of the \d+ ids, and id \d+ is missing"),
    (lambda v: v.__setitem__(_last_token(v), 0), r"= 0: the id of .* too; each id names one token"),
    (lambda v: v.__setitem__(_last_token(v), -1), r"= -1: expected a whole number of at least 0"),
    (lambda v: v.__setitem__(_last_token(v), True), r"= True: expected a whole number of at least 0"),
    (lambda v: v.__setitem__(_last_token(v), 3.0), r"= 3.0: expected a whole number"),
])
def test_a_bpe_tokenizer_with_ids_that_are_not_0_to_n(tmp_path, change, match):
    from penrose_zoo.steerling.tokenizer import TokenizerError, load_tokenizer

    doc = _bpe_doc()
    assert load_tokenizer(_written(tmp_path, doc)).vocab_size == len(doc["bpe"]["model"]["vocab"]) + 4
    change(doc["bpe"]["model"]["vocab"])
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: field bpe\.model\.vocab\[.*\] " + match):
        load_tokenizer(_written(tmp_path, doc))


def _first_token(vocab: dict, i: int) -> str:
    return next(k for k, v in vocab.items() if v == i)


def _written(tmp_path, doc):
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    return tmp_path


def test_added_tokens_count_among_the_ids(tmp_path):
    from penrose_zoo.steerling.tokenizer import TokenizerError, load_tokenizer

    doc = _bpe_doc()
    doc["bpe"]["added_tokens"] = [{"id": 2, "content": "<x>", "special": True, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False}]
    with pytest.raises(TokenizerError, match=r"field bpe\.added_tokens\[0\]\.id = 2: the id of bpe\.model\.vocab"):
        load_tokenizer(_written(tmp_path, doc))
    doc["bpe"]["model"]["type"] = "WordLevel"
    with pytest.raises(TokenizerError, match=r"field 'bpe\.model' must be a BPE model"):
        load_tokenizer(_written(tmp_path, doc))


@pytest.mark.parametrize("change, match", [
    ({"kind": "release", "special_tokens": ["<|pad|>", "<|bos|>", "<|endofchunk|>", "<|mask|>"], "instruct": "false"},
     r"field 'instruct' = 'false': expected true or false"),  # issue 37: bool("false") is True
    ({"kind": "release", "instruct": 0}, r"field 'instruct' = 0: expected true or false"),
    ({"version": "1"}, r"field 'version' = '1': expected 1"),
    ({"version": True}, r"field 'version' = True: expected 1"),
    ({"kind": ["byte"]}, r"field 'kind' = \['byte'\]"),
])
def test_tokenizer_fields_have_strict_json_types(tmp_path, change, match):
    from penrose_zoo.steerling.tokenizer import SPECIAL_TOKENS, TOKENIZER_FORMAT, TokenizerError, load_tokenizer

    doc = {"format": TOKENIZER_FORMAT, "version": 1, "kind": "byte", "special_tokens": list(SPECIAL_TOKENS), **change}
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(_written(tmp_path, doc))


def test_config_instruct_must_be_a_boolean(tmp_path):
    from penrose_zoo.steerling.tokenizer import TokenizerError, tokenizer_for

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100281, "instruct": "false"}))
    with pytest.raises(TokenizerError, match=r"config.json's field 'instruct' = 'false': expected true or false"):
        tokenizer_for(tmp_path)
