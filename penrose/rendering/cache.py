"""A cache of Graphviz's output on disk: a `dot` run is looked up by the exact bytes it reads,
its command-line arguments and `dot -V`'s version string, so a figure laid out before (by the
gallery, a test, a render) is not laid out again. `dot` is deterministic, so a hit is the very
bytes the run would print; anything else about a run (a failure, a timeout) is never cached.
Beside the layouts it keeps what `figure.to_dot`'s untangling chose for a figure (its search
lays a figure out tens of times), keyed by the figure, `dot -V` and `code_version()`: penrose's
own source, so a change to the search (or anything else in penrose) misses.

Where: $PENROSE_CACHE if set (a folder), else $XDG_CACHE_HOME/penrose, else ~/.cache/penrose;
entries go under its dot/ folder. PENROSE_CACHE=off (or 0, no, false, none) turns the cache off.
`penrose cache --clear` (or removing the folder) empties it; it is kept under
PENROSE_CACHE_MB megabytes (default 512): past that, the entries used longest ago go first
(checked when a process first writes to it).

Each entry is written whole to a temporary file and moved into place (`os.replace`), so parallel
test workers and a concurrent `make gallery` never read half an entry; an entry carries a
SHA-256 of its content, and one that is unreadable, truncated or altered is recomputed (and
rewritten), never trusted. A cache folder that cannot be written only costs the speed-up.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

_MAGIC = b"penrose-dot-cache 1\n"
_OFF = ("off", "0", "no", "false", "none")
_DEFAULT_MB = 512
_versions: dict = {}  # dot's path -> its `dot -V` string
_code: list = []  # the hash of penrose's own source, once computed
_pruned: set = set()  # the folders checked against the size bound by this process


def folder() -> Path | None:
    """The cache's folder (its dot/ entries), or None when PENROSE_CACHE turns it off."""
    env = os.environ.get("PENROSE_CACHE")
    if env is not None and env.strip().lower() in _OFF:
        return None
    if env:
        base = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "penrose"
    return base / "dot"


def dot_version(exe: str) -> str:
    """`dot -V`'s version string (it prints it on stderr), asked once per program per process."""
    if exe not in _versions:
        proc = subprocess.run([exe, "-V"], capture_output=True, timeout=60, check=False)
        _versions[exe] = (proc.stderr + proc.stdout).decode("utf-8", "replace").strip()
    return _versions[exe]


def code_version() -> str:
    """A SHA-256 of penrose's source (every .py file of the package, by path) and of the versions
    of Python and networkx: what a result penrose derives from Graphviz's layouts (the choice of
    `figure.to_dot`'s untangling) depends on besides them."""
    if not _code:
        import sys

        import networkx

        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256(f"{sys.version}\n{networkx.__version__}\n".encode("utf-8"))
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
        _code.append(h.hexdigest())
    return _code[0]


def key(args: list, data: bytes, version: str) -> str:
    """The entry name of a run: a SHA-256 of the version, each argument and the input bytes
    (each part length-prefixed, so no two different runs share a key)."""
    h = hashlib.sha256()
    for part in (version.encode("utf-8"), *(str(a).encode("utf-8") for a in args), data):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _path(root: Path, name: str) -> Path:
    return root / name[:2] / name[2:]


def read(name: str) -> bytes | None:
    """An entry's bytes, or None: no cache, no entry, or an entry that does not check out."""
    root = folder()
    if root is None:
        return None
    path = _path(root, name)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 64
    if not raw.startswith(_MAGIC) or len(raw) < head:
        return None
    try:
        data = zlib.decompress(raw[head:])
    except zlib.error:
        return None
    if hashlib.sha256(data).hexdigest().encode("ascii") != raw[len(_MAGIC) : head]:
        return None
    try:
        os.utime(path)  # used now: the last to go when the cache is pruned
    except OSError:
        pass
    return data


def write(name: str, data: bytes) -> None:
    """Store an entry: written to a temporary file beside it, then moved into place in one step."""
    root = folder()
    if root is None:
        return
    path = _path(root, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(data).hexdigest().encode("ascii") + zlib.compress(data, 1))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
    if root not in _pruned:
        _pruned.add(root)
        prune(root)


def limit_bytes() -> int:
    """The size bound: PENROSE_CACHE_MB megabytes (default 512)."""
    try:
        return int(float(os.environ.get("PENROSE_CACHE_MB", _DEFAULT_MB)) * 2**20)
    except ValueError:
        return _DEFAULT_MB * 2**20


def entries(root: Path | None = None) -> list:
    """(path, size, last used) of every entry."""
    root = folder() if root is None else root
    out = []
    for path in root.glob("??/*") if root is not None and root.is_dir() else ():
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((path, st.st_size, st.st_mtime))
    return out


def prune(root: Path | None = None, limit: int | None = None) -> int:
    """Remove the entries used longest ago (and temporary files left by a killed writer) until
    the cache is within `limit` bytes (default `limit_bytes()`); the number removed."""
    limit = limit_bytes() if limit is None else limit
    found = sorted(entries(root), key=lambda e: e[2])
    total = sum(size for _, size, _ in found)
    removed = 0
    stale = time.time() - 3600  # a temporary file this old was left by a writer that was killed
    for path, size, used in found:
        if total <= limit and not (path.name.startswith(".tmp-") and used < stale):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def clear() -> int:
    """Empty the cache; the number of entries removed."""
    return prune(limit=0)


def lookup(exe: str, args: list, data: bytes) -> tuple:
    """(entry name, cached bytes or None) of a run; the name is "" when the cache is off."""
    name = key(args, data, dot_version(exe)) if folder() is not None else ""
    return name, (read(name) if name else None)


def run(exe: str, args: list, data: bytes, timeout: float) -> tuple:
    """(returncode, stdout, stderr) of `exe *args` reading `data`: from the cache when this run
    was made before, else run (and cached when it succeeds: exit status 0 and some output).
    A timeout raises subprocess.TimeoutExpired, as subprocess.run does."""
    name, hit = lookup(exe, args, data)
    if hit is not None:
        return 0, hit, b""
    proc = subprocess.run([exe, *args], input=data, capture_output=True, timeout=timeout, check=False)
    if name and proc.returncode == 0 and proc.stdout:
        write(name, proc.stdout)
    return proc.returncode, proc.stdout, proc.stderr
