"""The hand-written reference (tests/references/steerling_ref.py) against the published release.

Each fixture in tests/fixtures/steerling/ holds a tiny random configuration of steerling 0.2.0,
its weights under the release's key names, and the release's outputs for several calls
(regenerate with tools/make_steerling_fixtures.py in the release venv).  Here the reference
recomputes every call from the weights alone and must match every output within 1e-5 (float32).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sources import reference

HERE = Path(__file__).resolve().parents[1]  # tests/
FIXTURES = HERE / "fixtures" / "steerling"
TOL = 1e-5


ref = reference('steerling_ref')
NAMES = sorted(p.stem for p in FIXTURES.glob("*.safetensors"))
RUNS = [(n, r) for n in NAMES for r in json.loads((FIXTURES / f"{n}.json").read_text())["runs"]]


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    return ref.load_fixture(FIXTURES / request.param)


_cache: dict[str, object] = {}


def _fixture(name: str):
    if name not in _cache:
        _cache[name] = ref.load_fixture(FIXTURES / name)
    return _cache[name]


def _run(fx, run: dict):
    """Replay one recorded release call through the reference."""
    common = (fx.state_dict, fx.model_config, fx.concept_config, fx.vocab_size, fx.tensors["input.input_ids"])
    args = run["args"]
    if run["call"] == "intervene":
        positions = fx.tensors[args["positions"]] if args["positions"] else None
        return ref.release_intervene(
            *common,
            known={int(k): v for k, v in args["known"].items()} or None,
            unknown={int(k): v for k, v in args["unknown"].items()} or None,
            positions=positions,
            large_concept_threshold=fx.large_concept_threshold,
        )
    kwargs = dict(args)
    if "position_injection" in kwargs:
        kwargs["position_injection"] = fx.tensors[kwargs["position_injection"]]
    with torch.no_grad():
        return ref.release_forward(*common, large_concept_threshold=fx.large_concept_threshold, **kwargs)


def _canonical_topk(idx: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order each top-k row by (logit desc, index asc); the release leaves ties in any order."""
    by_index = torch.argsort(idx, dim=-1, stable=True)
    idx, logits = idx.gather(-1, by_index), logits.gather(-1, by_index)
    by_logit = torch.argsort(logits, dim=-1, descending=True, stable=True)
    return idx.gather(-1, by_logit), logits.gather(-1, by_logit)


@pytest.mark.parametrize("name,run_name", RUNS, ids=[f"{n}-{r}" for n, r in RUNS])
def test_reference_matches_release(name, run_name):
    fx = _fixture(name)
    run = fx.meta["runs"][run_name]
    logits, out = _run(fx, run)
    got = {"logits": logits, **out}
    want_all = {k: fx.tensors[f"{run_name}.{k}"] for k in run["outputs"]}

    present = {k for k, v in got.items() if v is not None}
    assert present == set(run["outputs"]), f"present outputs differ: {present ^ set(run['outputs'])}"
    assert {k for k, v in got.items() if v is None} == set(run["none"])

    for head in ("known", "unknown"):
        i_key, l_key = f"{head}_topk_indices", f"{head}_topk_logits"
        if i_key in present:
            want_all[i_key], want_all[l_key] = _canonical_topk(want_all[i_key], want_all[l_key])
            got[i_key], got[l_key] = _canonical_topk(got[i_key], got[l_key])

    for key in sorted(present):
        want, have = want_all[key], got[key]
        assert have.shape == want.shape, f"{key}: shape {tuple(have.shape)} != {tuple(want.shape)}"
        if want.dtype.is_floating_point:
            assert have.dtype == torch.float32, key
            err = float((have - want).abs().max()) if want.numel() else 0.0
            assert err <= TOL, f"{key}: max abs error {err:.3g}"
        else:
            assert torch.equal(have, want), key


def test_param_count_matches_release(fixture):
    counts = fixture.meta["param_count"]
    assert ref.release_param_count(fixture.model_config, fixture.concept_config, fixture.vocab_size) == counts["parameters"]


def test_state_dict_shapes_match_release(fixture):
    shapes = ref.release_state_dict_shapes(fixture.model_config, fixture.concept_config, fixture.vocab_size)
    want = {k: tuple(v) for k, v in fixture.meta["state_dict_shapes"].items()}
    assert shapes == want
    stored = {k: tuple(v.shape) for k, v in fixture.state_dict.items()}
    if fixture.meta["tied_embedding_stored_once"]:
        want.pop("transformer.lm_head.weight")  # the tied tensor is saved once, as tok_emb
    assert stored == want


def test_release_defaults():
    meta = json.loads((FIXTURES / "release_defaults.json").read_text())
    m, c, v = meta["model_config"], meta["concept_config"], meta["vocab_size"]
    assert m == ref.MODEL_DEFAULTS and c == ref.CONCEPT_DEFAULTS and v == ref.RELEASE_VOCAB_SIZE
    assert meta["large_concept_threshold"] == ref.LARGE_CONCEPT_THRESHOLD
    assert ref.release_param_count(m, c, v) == meta["param_count"]["parameters"] == 8_391_778_304
    shapes = ref.release_state_dict_shapes(m, c, v)
    assert sum(torch.Size(s).numel() for s in shapes.values()) == meta["param_count"]["state_dict_numel"]
    for key, shape in meta["state_dict_shapes"].items():
        assert shapes[key] == tuple(shape), key


def test_fixtures_stay_small():
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 2 * 1024 * 1024
