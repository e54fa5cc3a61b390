"""The gallery: its pages, its determinism, and the committed gallery/ being what the command makes."""

import re
import shutil
from pathlib import Path

import pytest

from penrose.rendering import gallery
from penrose.rendering.gallery import build_files, describe, equation_file, write_tree

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "gallery"

pytestmark = pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed")

ATTENTION = """\
# index legend: t query token, p key token, d embedding, e attention dim
# Self-attention (section 3), one head.
dim t = 6, d = 8, e = 4
input Z[t, d]
param W_q[d, e]
param W_k[d, e]
param W_v[d, e]
# 1) Affinity of each token embedding Z with slices of W matrices. Yields: q, k, v.
q = einsum('td,de->te', Z, W_q)
k = einsum('pd,de->pe', Z, W_k)
v = einsum('pd,de->pe', Z, W_v)
# 2) For pair of tokens (t, tp), affinity query embedding q and key k.
l = einsum('te,pe->tp', q, k) / sqrt(e)
probs = softmax(l, dim=-1)
h = einsum('tp,pe->te', probs, v)
output h
"""

BLOCKS = """\
# index legend: t token, e embedding, f hidden
# description: A residual stack of four MLP layers.
dim t = 4, e = 8, f = 16
input Z[t, e]
block layer(x[t, e]) {
  param W1[e, f]
  param W2[f, e]
  h = relu(einsum('te,ef->tf', x, W1))
  return x + einsum('tf,fe->te', h, W2)
}
Z = layer(Z) repeat 4 as layers
output Z
"""

LIBRARY = "block twice(x[t]) {\n  return x * 2\n}\n"  # blocks only: included elsewhere, no page


def fake_equation(latex):
    """A stand-in for mathtext (slow): the tests check where equations go, not how they look."""
    return f'<svg xmlns="http://www.w3.org/2000/svg"><desc>{len(latex)}</desc></svg>'


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    (root / "paper").mkdir()
    (root / "paper" / "self_attention.pen").write_text(ATTENTION)
    (root / "stack.pen").write_text(BLOCKS)
    (root / "library.pen").write_text(LIBRARY)
    return root


@pytest.fixture(scope="module")
def files(zoo):
    return build_files([zoo], equation_svg=fake_equation)


def html_of(files):
    return {k: v.decode() for k, v in files.items() if k.endswith(".html")}


def test_description_comes_from_the_first_comment_or_a_description_line():
    assert describe(ATTENTION) == "Self-attention (section 3), one head."
    assert describe(BLOCKS) == "A residual stack of four MLP layers."
    assert describe("# One line that goes on\n# over two lines. And more.\ndim t = 1\n") == "One line that goes on over two lines."
    assert describe("# index legend: t token\n# 1) A step.\ndim t = 1\n") == ""
    assert describe("# Maps u (e.g. from a bottleneck) to r. Then more.\n") == "Maps u (e.g. from a bottleneck) to r."


def test_index_lists_every_diagram_with_thumbnail_params_and_description(files):
    index = files["index.html"].decode()
    assert 'href="paper-self_attention.html"' in index and 'href="stack.html"' in index
    assert "library" not in index  # a file of blocks only has no page
    assert '<img src="figures/paper-self_attention/thumb.svg"' in index
    assert "96 parameters" in index  # 3 × 8 × 4
    assert "1,024 parameters" in index  # 4 layers × 2 × 8 × 16
    assert "Self-attention (section 3), one head." in index
    assert index.index("Paper transcriptions") < index.index("stack.html")


def test_page_is_figure_then_rosetta_stone_then_source_then_plan(files):
    page = files["paper-self_attention.html"].decode()
    order = [page.index(x) for x in ('src="figures/paper-self_attention.svg"', "Rosetta stone", "Generated PyTorch module", "Contraction plan")]
    assert order == sorted(order)
    rows = re.findall(r'<tr id="statement-(\d+)">', page)
    assert rows == [str(n) for n in range(1, 7)]
    # one row: its diagram, its .pen line, its PyTorch line, its equation and its reading
    row = page[page.index('<tr id="statement-4">'):page.index('<tr id="statement-5">')]
    assert 'src="figures/paper-self_attention/s04.svg"' in row
    assert "l = einsum(&#x27;te,pe-&gt;tp&#x27;, q, k) / sqrt(e)" in row
    assert '<pre class="torch">' in row and re.search(r'<pre class="torch">[^<]+</pre>', row)
    assert 'src="equations/eq-' in row
    assert "Matrix–matrix product." in row and "Rescale." in row
    assert "1) Affinity of each token embedding Z" in page  # the step's caption heads its rows
    assert "class SelfAttention(torch.nn.Module)" in page
    assert re.search(r"contraction plan for zoo\w*/paper/self_attention.pen", page)  # a relative path


NARROWED = """\
# index legend: t token, f feature, a first part, b second part, c third part
dim t = 2, f = 6, a = 2, b = 2, c = 2
input x[t, f]
u, v, w = split(relu(x), f, [a, b, c])
y = u + w
output y
"""


def test_rosetta_row_shows_every_line_a_statement_generates(tmp_path):
    """Regression: the row of a split narrowed into the pieces read showed only its first line
    (statements are paired with their code by the compiler's source map, not by pattern)."""
    (tmp_path / "narrowed.pen").write_text(NARROWED)
    page = build_files([tmp_path / "narrowed.pen"], equation_svg=fake_equation)["narrowed.html"].decode()
    row = page[page.index('<tr id="statement-1">'):page.index('<tr id="statement-2">')]
    torch = re.search(r'<pre class="torch">([^<]*)</pre>', row).group(1)
    assert torch.splitlines() == [
        "_split = torch.relu(x)",
        "u = _split.narrow(-1, 0, A)  # [..., t, a=2]",
        "w = _split.narrow(-1, A + B, C)  # [..., t, c=2]",
    ]


def test_blocks_get_their_own_figure_and_rows(files):
    page = files["stack.html"].decode()
    assert 'src="figures/stack/block-layer.svg"' in page
    assert re.findall(r'<tr id="block-layer-statement-(\d+)">', page) == ["1", "2"]
    assert "A residual stack of four MLP layers." in page
    assert "figures/stack/block-layer.svg" in files


def test_every_link_and_image_resolves_and_nothing_is_remote(files):
    for name, text in html_of(files).items():
        for ref in re.findall(r'(?:src|href)="([^"]+)"', text):
            assert not re.match(r"[a-z]+://", ref), f"{name} refers to {ref}"
            assert ref.split("#")[0] in files, f"{name}: {ref} is missing"
        # at most one script, inline (the figures' pan and zoom): nothing fetched from anywhere
        assert re.findall(r"<script\b([^>]*)>", text) in ([], [""]), f"{name} has a script with attributes"


def test_no_absolute_paths_or_dates(files, zoo):
    for name, data in files.items():
        text = data.decode("utf-8", "replace")
        assert str(zoo) not in text and str(ROOT) not in text, name
        assert not re.search(r"20\d\d-\d\d-\d\d", text), name


def test_equations_are_named_by_their_latex(files):
    names = [k for k in files if k.startswith("equations/")]
    assert names and all(re.fullmatch(r"equations/eq-[0-9a-f]{16}\.svg", n) for n in names)
    latex = r"q_{te} = \sum_{d} Z_{td} \, W_{q,de}"
    assert f"equations/{equation_file(latex)}" in files


def test_build_is_byte_deterministic(zoo, files):
    again = build_files([zoo], equation_svg=fake_equation)
    assert again.keys() == files.keys()
    assert [k for k in files if files[k] != again[k]] == []


def test_write_tree_removes_only_what_it_made(tmp_path, files):
    write_tree(files, tmp_path)
    (tmp_path / "figures" / "old.svg").write_text("stale")
    (tmp_path / "old.html").write_text(gallery.GENERATOR + " stale page")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "mine.html").write_text("<p>mine</p>")
    write_tree(files, tmp_path)
    assert not (tmp_path / "figures" / "old.svg").exists() and not (tmp_path / "old.html").exists()
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "mine.html").exists()
    assert (tmp_path / "index.html").read_bytes() == files["index.html"]


def test_cli_gallery(tmp_path, zoo, capsys):
    from penrose.cli import main

    out = tmp_path / "site"
    assert main(["gallery", str(zoo / "stack.pen"), "-o", str(out)]) == 0
    assert (out / "index.html").exists() and (out / "stack.html").exists()
    eqs = list((out / "equations").iterdir())
    assert eqs and all(p.read_text().startswith("<?xml") for p in eqs)  # drawn by mathtext
    assert main(["gallery", str(tmp_path / "nope.pen"), "-o", str(out)]) == 1
    assert "no such diagram" in capsys.readouterr().err


def test_staleness_is_detected(tmp_path, zoo, files):
    write_tree(files, tmp_path)
    assert gallery.stale_files(tmp_path, [zoo], redraw=0) == []
    (tmp_path / "stack.html").write_text("edited by hand")
    (tmp_path / "figures" / "extra.svg").write_text("x")
    (tmp_path / "figures" / "stack.svg").unlink()
    assert gallery.stale_files(tmp_path, [zoo], redraw=0) == ["missing figures/stack.svg", "extra figures/extra.svg", "changed stack.html"]


def test_committed_gallery_is_what_the_command_makes():
    """gallery/ must be exactly what `make gallery` (penrose gallery -o gallery) writes: rebuild
    it with `make gallery` when this fails."""
    problems = gallery.stale_files(COMMITTED)
    assert problems == [], "stale gallery/ (run `make gallery`): " + "; ".join(problems[:10])
