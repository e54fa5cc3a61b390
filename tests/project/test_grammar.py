"""grammar/ at the top of the tree holds the language's grammars, one copy each: the parser reads
grammar/penrose.lark from there in a checkout (the installed wheel's copy is checked by
tests/project/test_wheel.py), and a keyword renamed there is renamed for both of the parser's
readers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from penrose.parser import _parser, grammar_file

ROOT = Path(__file__).resolve().parents[2]
LARK = ROOT / "grammar" / "penrose.lark"


def test_the_parser_reads_the_grammar_at_the_top_of_the_tree():
    assert Path(str(grammar_file())) == LARK
    assert _parser().source_grammar == LARK.read_text(encoding="utf-8")


def test_git_holds_one_copy_of_each_grammar():
    # the files git tracks or would (not ignored), as they are in the working tree
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split("\n")
    listed = [f for f in listed if (ROOT / f).is_file()]
    assert [f for f in listed if f.endswith(".lark")] == ["grammar/penrose.lark"]
    assert [f for f in listed if f.endswith(".tmLanguage.json")] == ["grammar/penrose.tmLanguage.json"]


# run in a copy of the source tree whose grammar names `param` `weight` and `as` `named`
RENAMED = r"""
import json
from penrose.errors import PenroseSyntaxError
from penrose.parser import _Lines, _parse_fast, _parse_lark, grammar_file, parse

text = "dim e = 2\ninput x[e]\nweight W[e]\nf = mul(x, W) named scale\noutput f\n"
fast, lark = _parse_fast(text, _Lines(text, "t.pen")), _parse_lark(text, _Lines(text, "t.pen"))
out = {"grammar": str(grammar_file()), "fast": fast is not None, "same": fast == lark,
       "kinds": [type(s).__name__ + ":" + getattr(s, "kind", "") for s in lark[0]], "instance": lark[0][3].instance}
try:
    parse(text.replace("weight", "param"), "t.pen")
except PenroseSyntaxError as e:
    out["old"] = [str(e).splitlines()[0], e.line, e.col]
print(json.dumps(out))
"""


def test_a_keyword_renamed_in_the_grammar_is_the_one_edit_the_parser_needs(tmp_path):
    shutil.copytree(ROOT / "penrose", tmp_path / "penrose", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "grammar").mkdir()
    text = LARK.read_text(encoding="utf-8")
    renamed = text.replace('param_decl: "param"', 'param_decl: "weight"').replace('"as" INSTANCE', '"named" INSTANCE')
    assert renamed.count('"weight"') == 1 and renamed.count('"named"') == 1
    (tmp_path / "grammar" / "penrose.lark").write_text(renamed, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", RENAMED], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": ""},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["grammar"] == str(tmp_path / "grammar" / "penrose.lark")
    assert out["fast"] and out["same"], "the fast path and Lark read the renamed keywords alike"
    assert out["kinds"] == ["Dim:", "Tensor:input", "Tensor:param", "Assign:", "Output:"]
    assert out["instance"] == "scale"
    # the old keyword is a name now: `param W[e]` is not a statement (a name may be followed by
    # its stated legs, `param[e] = ...`, so '[' is expected too)
    assert out["old"] == ["t.pen:3:7: error: unexpected 'W'; expected ',', '=', '[', end of line", 3, 7]
