"""Write the files that list the language's functions from the one table of operations.

    python tools/gen_tables.py            # rewrite them
    python tools/gen_tables.py --check    # exit 1 (naming the files) when one has drifted

The files: the TextMate grammar (grammar/penrose.tmLanguage.json: its `support.function.builtin.pen`
pattern, and its `inits` pattern from the initialisers of penrose/tables.py; the VS Code
extension copies it when built, editors/vscode/package.json), and the table of element-wise
functions in the language reference (docs/language.md, between its two marker comments). The
Pygments lexer and the language server read `penrose.ops` directly. tests/editors/test_editors.py
and tests/language/test_ops_table.py fail when a file differs from what this script writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from penrose.ops import ELEMENTWISE, FUNCTIONS, OPS  # noqa: E402  (after the path is set)
from penrose.tables import INITIALISERS  # noqa: E402

TEXTMATE = ROOT / "grammar" / "penrose.tmLanguage.json"
LANGUAGE = ROOT / "docs" / "language.md"
BEGIN = "<!-- element-wise functions: written from penrose/ops.py by tools/gen_tables.py, do not edit -->"
END = "<!-- end of the element-wise functions -->"


def grammar_text(text: str) -> str:
    """The grammar with its builtin-function pattern naming every function of the table, and
    its init pattern every initialiser (in the table's order)."""
    grammar = json.loads(text)
    (builtin,) = [p for p in grammar["repository"]["functions"]["patterns"] if p["name"] == "support.function.builtin.pen"]
    builtin["match"] = r"\b(" + "|".join(sorted(FUNCTIONS)) + r")\b(?=\s*\()"
    grammar["repository"]["inits"]["match"] = r"(~)\s*\b(" + "|".join(INITIALISERS) + r")\b"
    return json.dumps(grammar, indent=2, ensure_ascii=False) + "\n"


def elementwise_table() -> str:
    """The language reference's table of element-wise functions, one row of the table each."""
    lines = [BEGIN, "| element-wise function | meaning |", "| --- | --- |"]
    for name in sorted(ELEMENTWISE):
        row = OPS[name]
        also = "; also of a plain number or a dim's size (`" + name + "(d)`)" if row.scalar else ""
        lines.append(f"| `{row.signature}` | {row.doc.replace('|', chr(92) + '|')}{also} |")  # a pipe would end the cell
    lines.append(END)
    return "\n".join(lines)


def language_text(text: str) -> str:
    """docs/language.md with the generated table between its markers."""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{LANGUAGE}: the markers of the element-wise table are missing")
    return pattern.sub(lambda m: elementwise_table(), text)


def expected() -> dict:
    """path -> the text this script writes there."""
    return {TEXTMATE: grammar_text(TEXTMATE.read_text(encoding="utf-8")),
            LANGUAGE: language_text(LANGUAGE.read_text(encoding="utf-8"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say which files differ")
    args = ap.parse_args(argv)
    drifted = []
    for path, text in expected().items():
        if path.read_text(encoding="utf-8") != text:
            drifted.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    for path in drifted:
        print(f"{'differs' if args.check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if args.check and drifted else 0


if __name__ == "__main__":
    raise SystemExit(main())
