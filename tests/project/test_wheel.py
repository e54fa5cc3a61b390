"""The distribution as users install it: the wheel and sdist built by the standard `build`
frontend, the wheel installed (not editable) into a clean virtual environment, and every console
command and public name used from outside the source tree.

The clean environment gets penrose only from the wheel. Its third-party dependencies are the ones
already installed beside this test (linked in through a .pth file, penrose's own editable install
left out) so the test needs no network and no second copy of torch; that every dependency the
wheel declares is present there is checked too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from sources import package_folders

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {folder.name: name for name, folder in package_folders().items()}  # source folder -> import name
GRAMMAR = ROOT / "grammar" / "penrose.lark"  # the one copy; the wheel carries it inside the package (setup.py)
GRAMMAR_IN_WHEEL = "penrose/grammar/penrose.lark"

DIAGRAM = """\
# index legend: b batch, i input, h hidden
dim i = 4, h = 3
input x[i]
param W[i, h]
y = relu(einsum('i,ih->h', x, W))
output y
"""

MODULE = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))
"""


def _source_files() -> set[str]:
    """Every file of the two packages in the source tree, as its path inside the wheel."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *PACKAGES], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the folders
        listed = [p.relative_to(ROOT).as_posix() for folder in PACKAGES for p in (ROOT / folder).rglob("*")
                  if p.is_file()]
    out = set()
    for rel in filter(None, listed):
        if "__pycache__" in rel or rel.endswith((".pyc", ".pyo")) or not (ROOT / rel).is_file():
            continue
        folder, _, rest = rel.partition("/")
        out.add(f"{PACKAGES[folder]}/{rest}")
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # sdist first, then the wheel built from the unpacked sdist (build's default): both must be whole
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return wheels[0], sdists[0]


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A new virtual environment with the wheel installed and nothing of the source tree."""
    wheel, _ = dist
    base = tmp_path_factory.mktemp("env")
    env_dir = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    # the dependencies: this environment's site-packages without penrose's own (editable) install
    deps = base / "deps"
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("__editable__", "penrose", "_penrose")) or entry.suffix == ".pth":
            continue
        (deps / entry.name).symlink_to(entry)
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    (target / "_penrose_test_deps.pth").write_text(f"{deps}\n")
    # without PYTHONPATH: a source tree on it holds the build's egg-info, and pip would take the
    # wheel as installed already
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return env_dir


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["MPLBACKEND"] = "Agg"
    return env


def _run(venv, *args, cwd, input=None, timeout=300, check=True):
    exe = venv / "bin" / args[0]
    proc = subprocess.run([str(exe), *args[1:]], cwd=cwd, capture_output=True, text=True, env=_env(),
                          input=input, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


def test_wheel_holds_every_package_file(dist):
    wheel, _ = dist
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_files() - names)
    assert not missing, f"files of the source tree missing from the wheel: {missing}"
    assert not any(n.startswith(("zoo/", "tests/", "grammar/")) for n in names), "a stray top-level folder in the wheel"
    assert "penrose/py.typed" in names and "penrose_zoo/py.typed" in names
    assert zipfile.ZipFile(wheel).read(GRAMMAR_IN_WHEEL) == GRAMMAR.read_bytes(), "the wheel's grammar is not grammar/penrose.lark"


def test_sdist_holds_every_package_file(dist):
    _, sdist = dist
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    folder_of = {name: folder for folder, name in PACKAGES.items()}
    source = {f"{folder_of[f.split('/', 1)[0]]}/{f.split('/', 1)[1]}" for f in _source_files()}
    missing = sorted(source - names)
    assert not missing, f"files missing from the sdist: {missing}"
    for needed in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "grammar/penrose.lark"):
        assert needed in names


def test_version_is_defined_once(dist, venv, tmp_path):
    import penrose

    wheel, _ = dist
    assert f"-{penrose.__version__}-" in wheel.name
    proc = _run(venv, "penrose", "--version", cwd=tmp_path)
    assert proc.stdout.strip() == f"penrose {penrose.__version__}"
    declared = re.findall(r'^version\s*=\s*"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert not declared, "pyproject.toml must read the version from penrose/__init__.py"


def test_installed_package_is_the_wheel_and_imports_lightly(venv, tmp_path):
    code = (
        "import sys, json, penrose, penrose_zoo; import importlib.metadata as md\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'graphviz', 'sympy') if m in sys.modules]\n"
        "missing = []\n"
        "from packaging.requirements import Requirement\n"
        "for r in md.requires('penrose-diagrams') or []:\n"
        "    req = Requirement(r)\n"
        "    if req.marker is None or req.marker.evaluate({'extra': 'zoo'}) or req.marker.evaluate({'extra': 'editor'}):\n"
        "        try: md.version(req.name)\n"
        "        except md.PackageNotFoundError: missing.append(req.name)\n"
        "print(json.dumps({'file': penrose.__file__, 'zoo': penrose_zoo.__file__, 'heavy_before_zoo': heavy, 'missing': missing}))\n"
    )
    # penrose alone must not import the heavy libraries
    light = _run(venv, "python", "-c", "import sys, penrose; print(sorted(m for m in ('torch', 'matplotlib', 'graphviz', 'sympy') if m in sys.modules))", cwd=tmp_path)
    assert light.stdout.strip() == "[]", f"import penrose pulled in {light.stdout.strip()}"
    info = json.loads(_run(venv, "python", "-c", code, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert str(venv) in info["file"] and str(venv) in info["zoo"], info
    assert not info["missing"], f"declared dependencies not installed: {info['missing']}"


def test_every_public_name_imports(venv, tmp_path):
    code = (
        "import penrose, penrose_zoo\n"
        "for mod in (penrose, penrose_zoo):\n"
        "    assert mod.__all__, mod\n"
        "    for name in mod.__all__:\n"
        "        getattr(mod, name)\n"
        "print(len(penrose.__all__) + len(penrose_zoo.__all__))\n"
    )
    proc = _run(venv, "python", "-c", code, cwd=tmp_path)
    assert int(proc.stdout.strip()) > 20


COMMANDS = ["check", "compile", "plan", "fmt", "render", "trace", "gallery", "lsp", "serve", "zoo", "steerling"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_console_command_help(venv, tmp_path, command):
    proc = _run(venv, "penrose", *([command] if command else []), "--help", cwd=tmp_path)
    assert "usage" in proc.stdout.lower()
    if command is None:
        for name in COMMANDS:
            assert name in proc.stdout


def test_console_commands_work_from_the_wheel(venv, tmp_path):
    (tmp_path / "tiny.pen").write_text(DIAGRAM)
    (tmp_path / "model.py").write_text(MODULE)
    proc = _run(venv, "penrose", "check", "tiny.pen", cwd=tmp_path)
    assert "ok" in proc.stdout
    _run(venv, "penrose", "compile", "tiny.pen", "-o", "tiny.py", "--size", "h=5", cwd=tmp_path)
    assert "class" in (tmp_path / "tiny.py").read_text()
    _run(venv, "python", "-c", "import importlib.util, torch\n"
         "spec = importlib.util.spec_from_file_location('tiny', 'tiny.py')\n"
         "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
         "cls = [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, torch.nn.Module) and 'forward' in vars(v) and v.__module__ == 'tiny'][-1]\n"
         "assert cls()(torch.randn(2, 4)).shape == (2, 5)", cwd=tmp_path)
    assert "FLOP" in _run(venv, "penrose", "plan", "tiny.pen", cwd=tmp_path).stdout
    assert "einsum" in _run(venv, "penrose", "fmt", "tiny.pen", cwd=tmp_path).stdout
    _run(venv, "penrose", "render", "tiny.pen", "-o", "tiny.svg", cwd=tmp_path)
    assert (tmp_path / "tiny.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    _run(venv, "penrose", "render", "tiny.pen", "-o", "tiny.tex", cwd=tmp_path)
    assert "tikzpicture" in (tmp_path / "tiny.tex").read_text()
    _run(venv, "penrose", "render", "--einsum", "bi,ijk,bj->bk", "-o", "bilinear.svg", cwd=tmp_path)
    assert (tmp_path / "bilinear.svg").stat().st_size > 500
    _run(venv, "penrose", "trace", "model.py:Net", "--input", "4,16", "-o", "net.pen", cwd=tmp_path)
    assert "param" in (tmp_path / "net.pen").read_text()
    _run(venv, "penrose", "gallery", "tiny.pen", "-o", "gal", cwd=tmp_path)
    assert (tmp_path / "gal" / "index.html").is_file()
    listing = _run(venv, "penrose", "zoo", "list", cwd=tmp_path).stdout
    assert "concept_bottleneck" in listing
    assert "usage" in _run(venv, "penrose", "steerling", "--help", cwd=tmp_path).stdout.lower()


def test_the_wheel_parses_with_the_grammar_it_carries(venv, tmp_path):
    """Outside the tree the installed package reads the grammar inside it: the parser's keywords
    and every syntax error, worded and placed by Lark, come from that file."""
    where = _run(venv, "python", "-c", "import penrose; from penrose.parser import grammar_file\n"
                 "print(grammar_file()); print(penrose.__file__)", cwd=tmp_path).stdout.split("\n")
    assert where[0] == str(Path(where[1]).parent / "grammar" / "penrose.lark") and where[0].startswith(str(venv)), where
    (tmp_path / "tiny.pen").write_text(DIAGRAM)
    (tmp_path / "bad.pen").write_text("dim e = 2\ninput x[e]\ny = x +\noutput y\n")
    assert "ok" in _run(venv, "penrose", "check", "tiny.pen", cwd=tmp_path).stdout
    proc = _run(venv, "penrose", "check", "bad.pen", cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "bad.pen:3:8: error: unexpected end of line" in proc.stderr, proc.stderr


def _frame(msg: dict) -> bytes:
    body = json.dumps(msg).encode()
    return f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def test_lsp_from_the_wheel_initializes_and_shuts_down(venv, tmp_path):
    blob = b"".join([
        _frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"processId": None, "rootUri": tmp_path.as_uri(), "capabilities": {}}}),
        _frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
        _frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": None}),
        _frame({"jsonrpc": "2.0", "method": "exit", "params": None}),
    ])
    proc = subprocess.run([str(venv / "bin" / "penrose"), "lsp"], input=blob, capture_output=True, cwd=tmp_path,
                          env=_env(), timeout=120)
    answers, data = {}, proc.stdout
    while data:  # header lines (Content-Length, maybe Content-Type), a blank line, then the body
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"a truncated message: {head!r}"
        length = int(re.search(rb"Content-Length: *(\d+)", head, re.I).group(1))
        msg, data = json.loads(data[:length]), data[length:]
        if "id" in msg:
            answers[msg["id"]] = msg
    assert "capabilities" in answers[1]["result"], answers
    assert answers[2].get("result", "missing") is None, answers
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_serve_from_the_wheel_answers_a_request(venv, tmp_path):
    (tmp_path / "tiny.pen").write_text(DIAGRAM)
    proc = subprocess.Popen([str(venv / "bin" / "penrose"), "serve", "tiny.pen", "--port", "0"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"(http://\S+)", line)
            url = m.group(1) if m else None
        assert url, f"serve printed no address: {proc.stderr.read() if proc.poll() is not None else ''}"
        with urllib.request.urlopen(url, timeout=60) as answer:
            assert answer.status == 200
            assert "tiny" in answer.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
