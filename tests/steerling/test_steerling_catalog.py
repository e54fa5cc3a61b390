"""The concept catalog (penrose_zoo.steerling.catalog) over the shipped fixture, and the CLI's
`concepts` command and --concept / --intervene names through --catalog."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from penrose_zoo.steerling.catalog import CatalogError, Concept, ConceptCatalog
from penrose_zoo.steerling.cli import main

torch.set_num_threads(1)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "steerling_concepts.csv"
HEADER = "concept_id,name,description,head,group_id,group_name,is_steerable,is_tone,is_alignment,is_demographic\n"


@pytest.fixture(scope="module")
def cat():
    return ConceptCatalog.load(FIXTURE)


def ids(concepts):
    return [c.concept_id for c in concepts]


def test_load_reads_every_column(cat):
    assert len(cat) == 20
    assert sum(c.head == "unknown" for c in cat) == 4
    assert cat.get(3) == Concept(3, "legal reasoning", "Courts, judges and how a court rules on the law", "known",
                                 4, "law", True, False, False, False)
    assert cat.get(8).description == 'Functors, morphisms and "abstract nonsense"'  # CSV quoting
    assert (cat.get(9).is_tone, cat.get(11).is_alignment, cat.get(11).is_steerable, cat.get(13).is_demographic) == \
        (True, True, False, True)
    assert (cat.get(14).group_id, cat.get(14).group_name) == (None, None)
    assert cat.get(0).name == "cats"  # ids are per head: the known concept without head=
    assert cat.get(0, head="unknown").name == "unknown 0"
    assert 15 in cat and 16 not in cat and cat[2].name == "sea"
    with pytest.raises(CatalogError, match="no concept with id 99"):
        cat.get(99)
    with pytest.raises(CatalogError, match="no unknown concept with id 5"):
        cat.get(5, head="unknown")


def test_search_names_and_descriptions(cat):
    assert ids(cat.search("court")) == [4, 3]  # a name match ranks before a description match
    assert ids(cat.search("COURT")) == [4, 3]
    assert ids(cat.search("cat")) == [0, 8]  # substrings: "category theory" too
    assert ids(cat.search("programming language")) == [1, 15]  # every word, in the description
    assert ids(cat.search("python")) == [15]
    assert ids(cat.search("the python")) == [15]  # "the" in the description, "python" in the name
    assert ids(cat.search("harm")) == [12]
    assert cat.search("harm", steerable_only=True) == []
    assert ids(cat.search("unlabelled", head="unknown", limit=2)) == [0, 1]
    assert cat.search("cat", head="unknown") == [] and cat.search("") == [] and cat.search("zebra") == []
    assert ids(cat.search("sea")) == [2]


def test_groups(cat):
    assert ids(cat.group(4)) == [3, 4, 5]
    assert [c.name for c in cat.group(1)] == ["cats", "dogs", "birds"]
    assert cat.group(99) == []
    assert cat.group_of(4) == [4, 3, 5]  # the release's group(): the concept first
    assert cat.group_of(14) == [14]


def test_resolve(cat):
    assert cat.resolve("sea") == 2 and cat.resolve("Python") == 15 and cat.resolve("legal reasoning") == 3
    assert cat.resolve("12") == 12 and cat.resolve(12) == 12 and cat.resolve(" 7 ") == 7
    assert cat.resolve("unknown 2") == 2 and cat.resolve("1", head="unknown") == 1
    assert cat.lookup("unknown 2").head == "unknown" and cat.lookup("2").name == "sea"
    with pytest.raises(CatalogError, match=r"unknown concept 'legal': no concept of that name in .*steerling_concepts"
                                           r"\.csv; did you mean 'legal reasoning'\?"):
        cat.resolve("legal")
    with pytest.raises(CatalogError, match=r"did you mean 'dogs'\?"):
        cat.resolve("dgos")
    with pytest.raises(CatalogError, match=r"unknown concept 'Cats'.*did you mean 'cats'"):
        cat.resolve("Cats")  # names are exact
    with pytest.raises(CatalogError, match="unknown concept 'unknown 1'"):
        cat.resolve("unknown 1", head="known")
    with pytest.raises(CatalogError, match="no concept with id 99"):
        cat.resolve("99")
    twins = ConceptCatalog([Concept(0, "tone"), Concept(1, "tone"), Concept(2, "other")])
    with pytest.raises(CatalogError, match=r"concept name 'tone' is ambiguous .*ids 0 \(known\), 1 \(known\); give the id"):
        twins.resolve("tone")


def test_the_releases_column_names(tmp_path):
    p = tmp_path / "release.csv"
    p.write_text("concept_id,concept_name,concept_description,head,public_group_id,group_name,is_steerable\n"
                 "5,whales,Large marine mammals,known,2,sea life,1\n6,krill,,known,2,sea life,0\n")
    c = ConceptCatalog.load(p)
    assert c.get(5) == Concept(5, "whales", "Large marine mammals", "known", 2, "sea life", True)
    assert c.group_of(6) == [6, 5] and c.get(6).description == ""


@pytest.mark.parametrize("body,message", [
    ("id,name\n0,a\n", r"no column concept_id \(columns: id, name"),
    (HEADER + "x,a,,known,,,true,false,false,false\n", r":2: row 1: concept_id is 'x'; expected a whole number"),
    (HEADER + "0,a,,known,,,maybe,false,false,false\n", r":2: row 1: is_steerable is 'maybe'"),
    (HEADER + "0,a,,both,,,true,false,false,false\n", r"head is 'both'; expected known or unknown"),
    (HEADER + "0,a,,known,,,,,,\n0,b,,known,,,,,,\n", r"known concept id 0 appears twice"),
])
def test_bad_files(tmp_path, body, message):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(CatalogError, match=message):
        ConceptCatalog.load(p)


def test_missing_file():
    with pytest.raises(CatalogError, match="no catalog file 'nowhere.csv'"):
        ConceptCatalog.load("nowhere.csv")


def test_parquet(tmp_path, cat, monkeypatch):
    p = tmp_path / "labels.parquet"
    try:
        import pandas

        pandas.DataFrame([vars(c) for c in cat]).to_parquet(p)
    except ImportError:
        p.write_bytes(b"PAR1")
        monkeypatch.setitem(sys.modules, "pandas", None)
        monkeypatch.setitem(sys.modules, "pyarrow", None)
        with pytest.raises(CatalogError, match="reading parquet needs pyarrow"):
            ConceptCatalog.load(p)
        return
    again = ConceptCatalog.load(p)
    assert again.concepts == cat.concepts


# ------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------

def test_cli_concepts(capsys, monkeypatch):
    assert main(["concepts", "--catalog", str(FIXTURE), "--search", "court"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["4", "3"]
    assert lines[0] == "      4  court rulings  [known, group 4 law, steerable]  Decisions handed down by a judge"
    assert main(["concepts", "--catalog", str(FIXTURE), "--search", "cat", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["matches"] == 2 and [c["name"] for c in r["concepts"]] == ["cats", "category theory"]
    assert main(["concepts", "--catalog", str(FIXTURE), "--group", "6", "--json"]) == 0
    assert [c["concept_id"] for c in json.loads(capsys.readouterr().out)["concepts"]] == [9, 10]
    assert main(["concepts", "--catalog", str(FIXTURE), "--id", "refusal"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["11", "refusal"]
    assert main(["concepts", "--catalog", str(FIXTURE), "--id", "unknown 2"]) == 0  # its own head, not known 2
    assert capsys.readouterr().out.split()[:4] == ["2", "unknown", "2", "[unknown]"]
    assert main(["concepts", "--catalog", str(FIXTURE), "--search", "zebra"]) == 1
    assert "no concept matches 'zebra'" in capsys.readouterr().err
    assert main(["concepts", "--catalog", str(FIXTURE), "--id", "legal"]) == 1
    assert "unknown concept 'legal'" in capsys.readouterr().err
    monkeypatch.delenv("STEERLING_CONCEPTS_PATH", raising=False)
    assert main(["concepts", "--search", "x"]) == 1
    assert "give --catalog FILE" in capsys.readouterr().err
    monkeypatch.setenv("STEERLING_CONCEPTS_PATH", str(FIXTURE))
    assert main(["concepts", "--search", "sea", "--limit", "1"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["2", "sea"]


def test_cli_generate_intervenes_by_name(tmp_path, capsys, monkeypatch):
    import penrose_zoo.steerling.generate as g

    ckpt = tmp_path / "tiny"
    assert main(["init", "--out", str(ckpt), "--tiny", "--seed", "1"]) == 0
    seen = {}
    real = g.generate

    def spy(model, prompt, n, **kw):
        seen["known"] = kw.get("intervene_known")
        return real(model, prompt, n, **kw)

    monkeypatch.setattr(g, "generate", spy)
    base = ["generate", "--checkpoint", str(ckpt), "--prompt", "Hi", "--max-new-tokens", "2", "--steps-per-block", "1"]
    assert main(base + ["--catalog", str(FIXTURE), "--intervene", "legal reasoning=1.5", "--intervene", "7=0"]) == 0
    assert seen["known"] == {3: 1.5, 7: 0.0}
    capsys.readouterr()
    assert main(base + ["--catalog", str(FIXTURE), "--intervene", "legal=1"]) == 1
    assert "unknown concept 'legal'" in capsys.readouterr().err
    assert main(base + ["--intervene", "sea=1"]) == 1
    assert "'sea' is not a concept id; give --catalog FILE" in capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from test_steerling_train import write_corpus

    root = tmp_path_factory.mktemp("cat_cli")
    out = root / "run"
    assert main(["train", "--preset", "tiny", "--data", str(write_corpus(root / "corpus")), "--steps", "2",
                 "--seq-len", "32", "--batch-size", "4", "--val-every", "2", "--out", str(out), "--no-progress"]) == 0
    return out  # known concepts cats 0, code 1, sea 2: the fixture's first three


def test_cli_steer_and_explain_by_catalog(trained, capsys):
    steer = ["steer", "--checkpoint", str(trained), "--value", "1", "--prompt", "a", "--max-new-tokens", "2", "--json"]
    assert main(steer + ["--concept", "sea", "--catalog", str(FIXTURE)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["concept"], r["id"]) == ("sea", 2)
    assert main(steer + ["--concept", "1", "--catalog", str(FIXTURE)]) == 0
    assert json.loads(capsys.readouterr().out)["concept"] == "code"
    assert main(steer + ["--concept", "legal reasoning", "--catalog", str(FIXTURE)]) == 1
    assert ("'legal reasoning' is known concept 3 in" in (err := capsys.readouterr().err)
            and "has 3 known concepts (ids 0..2)" in err)
    assert main(steer + ["--concept", "whales", "--catalog", str(FIXTURE)]) == 1
    assert "unknown concept 'whales'" in capsys.readouterr().err

    explain = ["explain", "--checkpoint", str(trained), "--text", "cat meow", "--json", "--ig-steps", "4",
               "--heatmap", str(trained / "h.png")]
    assert main(explain + ["--concept", "cats", "--catalog", str(FIXTURE)]) == 0
    r = json.loads(capsys.readouterr().out)
    c = r["concept"]
    assert (c["name"], c["id"]) == ("cats", 0)
    assert [p["token"] for p in c["probability_per_token"]] == [t["token"] for t in r["tokens"]]
    assert all(0 <= p["probability"] <= 1 for p in c["probability_per_token"])
    assert len(c["integrated_gradients"]["per_token"]) == len(r["tokens"])
    assert c["integrated_gradients"]["completeness_error"] < 1e-2
    assert main(explain + ["--concept", "sea"]) == 0  # the checkpoint's own names without --catalog
    assert json.loads(capsys.readouterr().out)["concept"]["id"] == 2
    assert main(explain + ["--concept", "dogs"]) == 1
    assert "unknown concept 'dogs'" in capsys.readouterr().err
