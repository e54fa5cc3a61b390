"""A Pygments lexer for `.pen`, so Sphinx, MkDocs, Jupyter and anything else that highlights
with Pygments colours ```` ```pen ```` code blocks.

Installed as the entry point `pygments.lexers` → `pen` (pyproject.toml), so after
`pip install penrose-diagrams` the names `pen` and `penrose` and the file pattern `*.pen` find
it: `pygments.lexers.get_lexer_by_name("pen")`, `pygmentize -l pen model.pen`.

    >>> from pygments import lex
    >>> [(str(t), v) for t, v in lex("dim e = 2\\n", PenroseLexer())][:3]
    [('Token.Keyword.Declaration', 'dim'), ('Token.Text.Whitespace', ' '), ('Token.Name.Constant', 'e')]

The functions come from the table of operations (`penrose.ops.OPS`), the keywords, initialisers
and dtypes from the checker's tables (`penrose.tables`), so the lexer follows the language as it
grows.
"""

from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, include, words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Whitespace

from penrose.ops import FUNCTIONS
from penrose.parser import INSTANCE_PATTERN
from penrose.tables import DTYPES, PEN_KEYWORDS
from penrose.tables import INITS as TABLE_INITS

__all__ = ["PenroseLexer"]

KEYWORDS = tuple(sorted(PEN_KEYWORDS))  # the language's keywords, initialisers and dtypes: the checker's tables
INITS = tuple(TABLE_INITS)
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


class PenroseLexer(RegexLexer):
    """`.pen`: Penrose tensor-network diagrams (docs/language.md)."""

    name = "Penrose"
    aliases = ["pen", "penrose"]
    filenames = ["*.pen"]
    mimetypes = ["text/x-penrose"]
    url = "https://github.com/penrose-diagrams/penrose"

    tokens = {
        "root": [
            (r"\n", Whitespace),
            (r"[ \t\f\r]+", Whitespace),
            (r"#[ \t]*[Ii]ndex[ \t]+legend\b.*?$", Comment.Special),
            (r"#[ \t]*\d+\).*?$", Comment.Special),  # a numbered step caption
            (r"#.*?$", Comment.Single),
            (r"\b(dim|const)(\s+)(" + IDENT + r")", bygroups(Keyword.Declaration, Whitespace, Name.Constant)),
            (r"\b(input|param|buffer)(\s+)(" + IDENT + r")", bygroups(Keyword.Declaration, Whitespace, Name.Variable)),
            (r"\b(block)(\s+)(" + IDENT + r")", bygroups(Keyword.Declaration, Whitespace, Name.Function)),
            (r"\b(label)(\s+)(" + IDENT + r")", bygroups(Keyword, Whitespace, Name.Variable)),
            (r"\b(include)\b", Keyword.Namespace),
            (r"\b(as)(\s+)(" + INSTANCE_PATTERN + r")", bygroups(Keyword, Whitespace, Name.Variable.Instance)),
            (words(sorted(FUNCTIONS), prefix=r"\b", suffix=r"(?=\s*\()"), Name.Builtin),
            (r"\b(output|return|repeat|shared|as)\b", Keyword),
            (r"(~)(\s*)" + r"\b(" + "|".join(INITS) + r")\b", bygroups(Operator, Whitespace, Name.Builtin)),
            (r"(:)(\s*)\b(" + "|".join(DTYPES) + r")\b", bygroups(Punctuation, Whitespace, Keyword.Type)),
            (r"(\.)(shape|detach)\b", bygroups(Punctuation, Name.Attribute)),
            include("numbers"),
            (r"'", String.Single, "sq"),
            (r'"', String.Double, "dq"),
            (r"\.\.\.", Punctuation),
            (r"\*\*|//|->|==|!=|<=|>=|[-+*/<>=~]", Operator),
            (r"[\[\](){},.:;]", Punctuation),
            (r"\binf\b", Number.Float),
            (IDENT, Name),
        ],
        "numbers": [
            (r"(\d+\.\d*|\.\d+)([eE][-+]?\d+)?", Number.Float),
            (r"\d+[eE][-+]?\d+", Number.Float),
            (r"\d+", Number.Integer),
        ],
        # einsum specs ('td,de->te') and einops patterns ('t (h d) -> h t d') read inside strings
        "spec": [
            (r"->", String.Escape),
            (r"\.\.\.", String.Escape),
            (r"[,()]", String.Escape),
        ],
        "sq": [
            include("spec"),
            (r"'", String.Single, "#pop"),
            (r"[^'\n,()\-.]+", String.Single),
            (r"[\-.]", String.Single),
            (r"\n", String.Single, "#pop"),  # an unclosed string ends with its line (the checker says so)
        ],
        "dq": [
            include("spec"),
            (r'"', String.Double, "#pop"),
            (r'[^"\n,()\-.]+', String.Double),
            (r"[\-.]", String.Double),
            (r"\n", String.Double, "#pop"),
        ],
    }
