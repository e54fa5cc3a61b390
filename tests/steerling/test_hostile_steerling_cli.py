"""Hostile `penrose steerling` command lines (docs/security.md, "penrose steerling: options and
outputs"): every option out of range is refused as it is parsed (argparse, exit 2, the option
named), nothing that writes replaces a checkpoint, a corpus or a file without --force, and names
from files reach the terminal escaped. In-process (main), tiny sizes, one thread."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch

from test_steerling_train import write_corpus
from penrose_zoo.steerling.cli import main

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tiny_run):
    return tiny_run  # (conftest.py: 4 steps of the tiny preset; a test that changes it copies it)


def _digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _refused(capsys, argv, message) -> str:
    """main(argv) exits 2 (argparse) or returns 1, with `message` in stderr and no traceback."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (1, 2) and message in err and "Traceback" not in err, (rc, err)
    return err


# ---- writing never destroys ------------------------------------------------------------------

def test_init_refuses_a_trained_checkpoint_and_force_replaces_it_whole(trained, tmp_path, capsys):
    ck = tmp_path / "ck"
    shutil.copytree(trained, ck)
    before = _digest(ck)
    # issue 37: init over a trained checkpoint exited 0 and left weights that train.json no longer described
    _refused(capsys, ["init", "--out", str(ck), "--tiny"], "exists and is not empty (concepts.json, config.json, "
             "model.safetensors, optimizer.safetensors, tokenizer.json, ...); give --force to replace a checkpoint there")
    assert _digest(ck) == before
    assert main(["init", "--out", str(ck), "--tiny", "--force"]) == 0
    assert sorted(p.name for p in ck.iterdir()) == ["config.json", "model.safetensors"]  # no stale training state
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    capsys.readouterr()
    assert main(["info", "--checkpoint", str(ck)]) == 0 and json.loads(capsys.readouterr().out)["parameters"] > 0


def test_init_force_replaces_a_checkpoint_never_other_files(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("years of work")
    _refused(capsys, ["init", "--out", str(tmp_path / "notes"), "--tiny", "--force"],
             "holds files that are not a checkpoint's (thesis.tex): --force replaces a checkpoint only")
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "years of work"
    (tmp_path / "f").write_text("x")
    _refused(capsys, ["init", "--out", str(tmp_path / "f"), "--tiny"], "is a file, not a folder")


def test_train_out_that_is_a_file(trained, tmp_path, capsys):
    (tmp_path / "f").write_text("x")  # regression: NotADirectoryError from Path.iterdir
    _refused(capsys, ["train", "--data", str(trained.parent / "corpus"), "--steps", "1", "--out", str(tmp_path / "f"),
                      "--no-progress"], "is a file, not a folder")
    assert (tmp_path / "f").read_text() == "x"


def test_explain_heatmap_replaces_a_figure_never_another_file(trained, tmp_path, capsys):
    ck = tmp_path / "ck"
    shutil.copytree(trained, ck)
    before = _digest(ck)
    explain = ["explain", "--checkpoint", str(ck), "--text", "cat", "--ig-steps", "2", "--json"]
    _refused(capsys, explain + ["--heatmap", str(ck / "model.safetensors")], "exists and is not a PNG image")
    assert _digest(ck) == before
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(capsys, explain + ["--heatmap", str(fifo)], "it is a FIFO, not a regular file")
    _refused(capsys, explain + ["--heatmap", str(tmp_path / "none" / "h.png")], "folder")
    heat = tmp_path / "h.png"
    heat.write_bytes(b"\x89PNG\r\n\x1a\n" + b"an earlier heatmap")
    assert main(explain + ["--heatmap", str(heat)]) == 0 and heat.stat().st_size > 100  # a figure replaced
    (tmp_path / "keep.txt").write_text("mine")
    assert main(explain + ["--heatmap", str(tmp_path / "keep.txt"), "--force"]) == 0  # --force: the user's choice
    assert (tmp_path / "keep.txt").read_bytes().startswith(b"\x89PNG")


def test_planted_replaces_only_a_planted_corpus(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["planted", "--out", str(out), "--chunks", "20"]) == 0
    _refused(capsys, ["planted", "--out", str(out), "--chunks", "20"], "exists and is not empty")
    assert main(["planted", "--out", str(out), "--chunks", "30", "--seed", "1", "--force"]) == 0
    assert json.loads((out / ".planted.json").read_text())["config"]["n_chunks"] == 30
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.csv").write_text("1,2")
    _refused(capsys, ["planted", "--out", str(tmp_path / "mine"), "--chunks", "20", "--force"], "holds no planted corpus")
    assert (tmp_path / "mine" / "data.csv").read_text() == "1,2"


# ---- options out of range --------------------------------------------------------------------

CK = "CHECKPOINT"  # replaced by the trained checkpoint


@pytest.mark.parametrize("argv, message", [
    # issue 37: negative or zero counts crashed with KeyError, max() of an empty sequence, torch.cat([]) or did something else
    (["evaluate", "--checkpoint", CK, "--max-batches", "0"], "argument --max-batches: expected a whole number of at least 1, got 0"),
    (["evaluate", "--checkpoint", CK, "--max-batches", "-1"], "argument --max-batches: expected a whole number of at least 1"),
    (["evaluate", "--checkpoint", CK, "--seq-len", "0"], "argument --seq-len: expected a whole number from 2 to"),
    (["evaluate", "--checkpoint", CK, "--max-chunks", "-3"], "argument --max-chunks: expected a whole number of at least 0"),
    (["train", "--out", "o", "--batch-size", "0"], "argument --batch-size: expected a whole number of at least 1, got 0"),
    (["train", "--out", "o", "--seq-len", "1"], "argument --seq-len: expected a whole number from 2 to"),
    (["train", "--out", "o", "--threads", "0"], "argument --threads: expected a whole number of at least 1, got 0"),
    (["train", "--out", "o", "--threads", "-2"], "argument --threads: expected a whole number of at least 1"),
    (["train", "--out", "o", "--val-every", "0"], "argument --val-every: expected a whole number of at least 1"),
    (["train", "--out", "o", "--save-every", "0"], "argument --save-every: expected a whole number of at least 1"),
    (["train", "--out", "o", "--stop-after", "0"], "argument --stop-after: expected a whole number of at least 1"),
    (["train", "--out", "o", "--max-chunks", "-1"], "argument --max-chunks: expected a whole number of at least 0"),
    (["train", "--out", "o", "--bpe-vocab", "0"], "argument --bpe-vocab: expected a whole number from 260 to"),
    (["train", "--out", "o", "--teacher-forcing-steps", "-5"], "argument --teacher-forcing-steps: expected a whole number of at least 0"),
    (["train", "--out", "o", "--lr", "0"], "argument --lr: expected a finite number above 0, got 0"),
    (["train", "--out", "o", "--lambda-concept", "-1"], "argument --lambda-concept: expected a finite number of at least 0"),
    (["train", "--out", "o", "--seed", "-1"], "argument --seed: expected a whole number from 0 to 4,294,967,295, got -1"),
    (["explain", "--checkpoint", CK, "--text", "a", "--top", "-1"], "argument --top: expected a whole number of at least 1"),
    (["explain", "--checkpoint", CK, "--text", "a", "--ig-steps", "0"], "argument --ig-steps: expected a whole number of at least 1"),
    (["generate", "--checkpoint", CK, "--prompt", "a", "--max-new-tokens", "0"], "argument --max-new-tokens: expected a whole number of at least 1"),
    (["generate", "--checkpoint", CK, "--prompt", "a", "--steps-per-block", "0"], "argument --steps-per-block: expected a whole number of at least 1"),
    (["generate", "--checkpoint", CK, "--prompt", "a", "--temperature", "-1"], "argument --temperature: expected a finite number of at least 0"),
    (["generate", "--checkpoint", CK, "--prompt", "a", "--top-p", "0"], "argument --top-p: expected a finite number in (0, 1], got 0"),
    (["generate", "--checkpoint", CK, "--prompt", "a", "--device", "banana"], "argument --device: expected a device"),
    (["generate", "--checkpoint", CK, "--prompt", "a", "--device", "cuda:99"], "--device 'cuda:99': no such CUDA device"),
    (["steer", "--checkpoint", CK, "--prompt", "a", "--max-new-tokens", "-3"], "argument --max-new-tokens"),
    (["steer", "--checkpoint", CK, "--prompt", "a", "--inject", "0=1", "--cutoff-tokens", "-1"], "argument --cutoff-tokens"),
    (["steer", "--checkpoint", CK, "--prompt", "a", "--repetition-penalty", "0.5"], "argument --repetition-penalty: expected a finite number of at least 1"),
    (["init", "--out", "o", "--vocab-size", "5"], "argument --vocab-size: expected a whole number from 260 to"),
    (["concepts", "--catalog", "c.csv", "--limit", "-1"], "argument --limit: expected a whole number of at least 0"),
    (["concepts", "--catalog", "c.csv", "--group", "-1"], "argument --group: expected a whole number of at least 0"),
    (["planted", "--out", "o", "--rare-weight", "0"], "argument --rare-weight: expected a finite number above 0"),
    (["planted", "--out", "o", "--co-occur", "1.5"], "argument --co-occur: expected a finite number from 0 to 1"),
    (["known-answer", "--checkpoint", CK, "--samples", "0"], "argument --samples: expected a whole number of at least 1"),
    (["known-answer", "--checkpoint", CK, "--unlearn-strength", "-1"], "argument --unlearn-strength: expected a finite number of at least 0"),
    (["scaling", "--out", "o", "--seeds", "a,1"], "argument --seeds: expected a whole number in ASCII digits, got 'a'"),
    (["nulls", "--data", "d", "--out", "o", "--seeds", "a,1"], "argument --seeds: expected a whole number in ASCII digits, got 'a'"),
    (["nulls", "--data", "d", "--out", "o", "--seeds", ","], "argument --seeds: expected comma-separated seeds"),
    (["nulls", "--data", "d", "--out", "o", "--seeds", "-1"], "argument --seeds"),
    (["scaling", "--out", "o", "--threads", "٣"], "argument --threads: expected a whole number in ASCII digits"),
])
def test_options_out_of_range_are_refused_as_parsed(trained, capsys, argv, message):
    _refused(capsys, [str(trained) if a == CK else a for a in argv], message)


@pytest.mark.parametrize("argv, message", [
    (["--words", "1000000"], "distinct words are needed"),  # issue 37: looped for ever drawing pseudo-words
    (["--rare", "50"], "rare must be a whole number from 0 to 6, got 50"),
    (["--chunks", "2000000"], "n_chunks must be a whole number from 1 to 1,000,000"),
    (["--concepts", "30"], "n_concepts must be a whole number from 2 to 24"),
    (["--withheld", "9"], "withheld=9 must leave at least one labelled concept"),
])
def test_planted_options_beyond_the_generator(tmp_path, capsys, argv, message):
    err = _refused(capsys, ["planted", "--out", str(tmp_path / "p"), *argv], message)
    assert "error: error:" not in err and not (tmp_path / "p").exists()


def test_inject_layer_beyond_the_model(tmp_path, capsys):
    assert main(["init", "--out", str(tmp_path / "blk"), "--tiny"]) == 0  # block diffusion, 2 layers
    # regression: exited 0 having injected nothing (the release's rule for a layer past the last)
    _refused(capsys, ["steer", "--checkpoint", str(tmp_path / "blk"), "--inject", "0=2", "--prompt", "a",
                      "--inject-layer", "99"], "--inject-layer 99: this model has 2 layers (1..2)")


def test_known_answer_with_default_options_on_a_small_corpus(tmp_path, capsys):
    # issue 37: a concept no validation chunk carries made `max() arg is an empty sequence`
    assert main(["planted", "--out", str(tmp_path / "p"), "--chunks", "20"]) == 0
    assert main(["train", "--data", str(tmp_path / "p"), "--steps", "1", "--seq-len", "32", "--batch-size", "4",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["known-answer", "--checkpoint", str(tmp_path / "run"), "--samples", "1", "--new-tokens", "1",
                 "--max-batches", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert any(s["suppress"] is None for s in r["steering"].values())  # the concept with nothing to suppress


def test_other_scripts_digits_are_not_ids(trained, capsys):
    # regression: int("٣") is 3, so --concept cats=٣ mapped the category to known concept 3
    _refused(capsys, ["evaluate", "--checkpoint", str(trained), "--data", str(trained.parent / "corpus"),
                      "--concept", "cats=٣"], "corpus categories without a known concept")


# ---- names from files reach the terminal escaped ----------------------------------------------

def test_a_category_file_name_is_a_visible_name(trained, tmp_path, capsys):
    data = write_corpus(tmp_path / "corpus")
    (data / "cats").rename(data / "cats\x1b]0;owned\x07")  # would retitle the terminal wherever the concept is printed
    err = _refused(capsys, ["train", "--data", str(data), "--steps", "1", "--out", str(tmp_path / "o"), "--no-progress"],
                   "must be visible text without control characters")
    assert "\x1b" not in err and "\\x1b]0;owned\\x07" in err
    (data / "cats\x1b]0;owned\x07").rename(data / "\u200b")
    _refused(capsys, ["train", "--data", str(data), "--steps", "1", "--out", str(tmp_path / "o"), "--no-progress"],
             "'\\u200b'")


def test_catalog_text_is_printed_escaped(tmp_path, capsys):
    cat = tmp_path / "c.csv"
    cat.write_text("concept_id,name,description\n0,cats,\"purrs\x1b[2J\x1b]0;owned\x07\u202e\"\n")
    assert main(["concepts", "--catalog", str(cat)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "purrs\\x1b[2J\\x1b]0;owned\\x07\\u202e" in out
    assert main(["concepts", "--catalog", str(cat), "--json"]) == 0
    text = capsys.readouterr().out
    assert "\u202e" not in text and json.loads(text)["concepts"][0]["description"].endswith("\x07\u202e")


def test_weights_that_are_not_train_jsons_step_are_refused(trained, tmp_path, capsys):
    """A save interrupted between its files, or weights written over a training checkpoint, leave
    weights train.json does not describe: refused, naming the file (version-2 checkpoints tag them)."""
    from penrose_zoo.steerling.model import Steerling

    ck = tmp_path / "ck"
    shutil.copytree(trained, ck)
    assert json.loads((ck / "train.json").read_text())["version"] == 2
    Steerling.load(ck).save(ck)  # as an interrupted save, or the API's save over the folder, would leave it
    _refused(capsys, ["evaluate", "--checkpoint", str(ck), "--max-batches", "1"],
             "model.safetensors: holds no step but train.json says step 4: the checkpoint was interrupted")
    run = ["train", "--data", str(trained.parent / "corpus"), "--steps", "2", "--seq-len", "32", "--batch-size", "4",
           "--out", str(tmp_path / "half"), "--no-progress"]
    assert main(run + ["--stop-after", "1"]) == 0  # resumable at step 1
    Steerling.load(tmp_path / "half").save(tmp_path / "half", metadata={"step": "0"})
    _refused(capsys, run, "model.safetensors: holds step 0 but train.json says step 1")


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("chunks"), "field 'chunks': missing 'chunks'"),
    (lambda m: m["config"].update(n_concepts="8"), "field 'config': n_concepts must be a whole number"),
    (lambda m: m["config"].update(bogus=1), "field 'config': unknown field(s) bogus"),
    (lambda m: m["chunks"][0].update(spans=[[0, 10**6, "alpha"]]), "field 'chunks[0]': span [0, 1000000, 'alpha'] is not inside"),
    (lambda m: m["chunks"][0].update(labels=["nope"]), "field 'chunks[0]': a concept or label is not a planted concept"),
    (lambda m: m["lexicon"].update(alpha=[1, 2]), "field 'lexicon': expected a list of strings"),
])
def test_a_damaged_planted_manifest(tmp_path, change, message):
    from penrose.errors import PenroseError
    from penrose_zoo.steerling.planted import MANIFEST, load_planted

    assert main(["planted", "--out", str(tmp_path / "p"), "--chunks", "10"]) == 0
    doc = json.loads((tmp_path / "p" / MANIFEST).read_text())
    change(doc)
    (tmp_path / "p" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(PenroseError, match=rf"\.planted\.json: {__import__('re').escape(message)}"):
        load_planted(tmp_path / "p")


def test_known_answer_on_a_corpus_changed_since_it_was_planted(tmp_path, capsys):
    assert main(["planted", "--out", str(tmp_path / "p"), "--chunks", "20"]) == 0
    with open(tmp_path / "p" / "alpha", "a") as f:
        f.write("%\nta gibe ro fa nu.\n")  # a chunk the manifest does not know: its truth is unknown (was a KeyError)
    assert main(["train", "--data", str(tmp_path / "p"), "--steps", "1", "--seq-len", "32", "--batch-size", "4",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    _refused(capsys, ["known-answer", "--checkpoint", str(tmp_path / "run"), "--samples", "1"],
             "is not in .planted.json: the corpus was changed after")


# ---- the API under the commands: the same rules ------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model(trained):
    from penrose_zoo.steerling.model import Steerling

    return Steerling.load(trained)


@pytest.mark.parametrize("kw, message", [
    ({"temperature": float("nan")}, "temperature must be a finite number of at least 0, got nan"),  # was greedy, silently
    ({"temperature": -1.0}, "temperature must be a finite number of at least 0"),
    ({"top_p": 0.0}, r"top_p must be a finite number in \(0, 1\], got 0.0"),  # was NaN probabilities in torch.multinomial
    ({"steps_per_block": 0}, "steps_per_block must be a whole number of at least 1, got 0"),
    ({"max_new_tokens": 2.0}, r"max_new_tokens must be a whole number of at least 0, got 2.0 \(float\)"),
])
def test_generation_arguments(tiny_model, kw, message):
    from penrose.errors import PenroseArgumentError
    from penrose_zoo.steerling.generate import generate

    model = tiny_model
    args = {"max_new_tokens": 2, **kw}
    with pytest.raises(PenroseArgumentError, match=message):
        generate(model, [257, 99], args.pop("max_new_tokens"), **args)


@pytest.mark.parametrize("change, message", [
    ({"lr": -1.0}, "lr must be a finite number above 0, got -1.0"),
    ({"seq_len": 1}, "seq_len must be a whole number of at least 2, got 1"),
    ({"batch_size": 0}, "batch_size must be a whole number of at least 1, got 0"),
    ({"teacher_forcing_steps": -5}, "teacher_forcing_steps must be a whole number of at least 0"),  # was written, then unreadable
    ({"lambda_concept": float("nan")}, "lambda_concept must be a finite number of at least 0, got nan"),
    ({"grad_clip": 0.0}, "grad_clip must be a finite number above 0"),
    ({"epsilon": "no"}, "epsilon must be True or False, got 'no'"),
    ({"preset": ["tiny"]}, r"unknown preset \['tiny'\]"),
    ({"categories": "cats"}, "categories must be a list of category file names, got 'cats'"),
])
def test_train_config_fields(change, message):
    from penrose.errors import PenroseError
    from penrose_zoo.steerling.train import TrainConfig

    with pytest.raises(PenroseError, match=message):
        TrainConfig(**change).resolved()


def test_train_and_known_answer_arguments(trained, tmp_path):
    from penrose.errors import PenroseArgumentError
    from penrose_zoo.steerling.known_answer import known_answer
    from penrose_zoo.steerling.train import TrainConfig, train

    with pytest.raises(PenroseArgumentError, match="val_every must be a whole number of at least 1, got 0"):
        train(TrainConfig(data=str(trained.parent / "corpus")), tmp_path / "o", val_every=0)  # was a ZeroDivisionError
    assert not (tmp_path / "o").exists()
    for kw, message in (({"samples": 0}, "samples must be"), ({"strength": float("inf")}, "strength must be a finite"),
                        ({"concepts": "alpha"}, "concepts must be a list of concept names")):
        with pytest.raises(PenroseArgumentError, match=message):
            known_answer(trained, **kw)
