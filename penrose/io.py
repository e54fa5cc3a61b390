"""Reading and writing files: errors that name the file, and writes that are never half-done.

The lowest layer beside `errors`: it imports nothing else of penrose.

    >>> import tempfile, os
    >>> out = os.path.join(tempfile.mkdtemp(), "model.py")
    >>> atomic_write_text(out, "x = 1\\n")
    >>> read_text(out)
    'x = 1\\n'

Reading (`read_text`): a missing file, a folder, a device or FIFO, an unreadable file and bytes
that are not UTF-8 are each a `PenroseError` naming the file; nothing but a regular file is ever
opened (a FIFO would block). The text comes back as it is on disk (byte-order mark and CRLF
included); `penrose.parse` normalises both.

Writing (`atomic_write_bytes`, `atomic_write_text`):

- the data goes to a temporary file in the target's own folder, is flushed to disk, then renamed
  over the target, so a reader sees the old file or the new one, never a part; any failure
  (disk full, interrupt) removes the temporary file and leaves the old file whole;
- a symlink is written *through*: its target file is replaced and the link stays a link;
- an existing file keeps its permission bits; a new one gets 0666 less the umask;
- a folder, a device, a FIFO or a socket is refused (so is `-o /dev/null`: print to stdout
  instead), as is a file the user may not write (a read-only file stays read-only), all before
  anything is written. Read-only means: this user may not write it (`os.access`), or it has no
  write permission bit at all (mode 0444, `chmod a-w`) — refused even for root, who could write
  it. `writable_target(path)` runs these checks alone, so a command can refuse
  a bad `-o` before doing its work.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from penrose.errors import PenroseError, PenroseSyntaxError, Span

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


# -- reading ----------------------------------------------------------------------------------


def read_text(path, max_bytes: int | None = None) -> str:
    """The UTF-8 text of the regular file at `path`; every failure is a PenroseError naming it.
    With `max_bytes`, a larger file is refused (by its size, then by reading at most one byte
    more: a file that grows, or a /proc file that says 0, cannot make it read on)."""
    name = os.fspath(path)
    if "\x00" in name:  # os.stat raises ValueError for it
        raise PenroseError(f"cannot read {name!r}: a file name holds no NUL character", Span(repr(name)[1:-1]))
    try:
        st = os.stat(name)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise PenroseError(f"cannot read {name}: not a regular file ({_kind(st.st_mode)})", Span(name))
        if max_bytes is not None and st.st_size > max_bytes:
            raise PenroseError(f"cannot read {name}: {st.st_size} bytes, over the limit of {max_bytes}", Span(name))
        with open(name, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise PenroseError(f"cannot read {name}: over the limit of {max_bytes} bytes", Span(name))
    except OSError as e:
        raise PenroseError(f"cannot read {name}: {e.strerror or e}", Span(name)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(name, data, e) from None


def read_json(path, *, max_bytes: int = 1 << 20, max_depth: int = 32):
    """The JSON document in the file at `path`, read within limits: at most `max_bytes` (a
    PenroseError naming the file and the size), nested at most `max_depth` deep (naming the byte
    where it goes deeper; Python's reader would otherwise hit a RecursionError), no key twice in
    one object (naming the key). NaN and Infinity are read as floats (a schema refuses them where
    a field must be finite)."""
    import json

    name = os.fspath(path)
    text = read_text(name, max_bytes=max_bytes)
    deep = _too_deep(text, max_depth)
    if deep is not None:
        raise PenroseError(f"{name}: JSON nested more than {max_depth} levels deep (at character {deep})")

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for k, v in items:
            if k in seen:
                raise PenroseError(f"{name}: key {k!r} appears twice in one object")
            seen[k] = v
        return seen

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise PenroseError(f"{name}: not a readable JSON file ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:  # not reached after _too_deep; kept so no traceback can escape
        raise PenroseError(f"{name}: JSON nested too deeply") from None


def _too_deep(text: str, max_depth: int):
    """The index of the first bracket past `max_depth` levels (strings skipped), or None."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return i
        elif ch in "]}":
            depth -= 1
        i += 1
    return None


def _not_utf8(name: str, data: bytes, e: UnicodeDecodeError) -> PenroseSyntaxError:
    """Positioned at the first bad byte; the line itself is not shown (it does not decode)."""
    before = data[: e.start]
    line = before.count(b"\n") + 1
    col = len(before[before.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
    hint = ""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        hint = "; it looks like UTF-16, save it as UTF-8"
    return PenroseSyntaxError(
        f"{name} is not UTF-8 text ({e.reason} at byte {e.start}){hint}", Span(name, line, col, line, col + 1)
    )


# -- writing ----------------------------------------------------------------------------------


def writable_target(path) -> Path:
    """The file a write to `path` replaces (through symlinks), or a PenroseError saying why not.

    Checks, without writing: the folder exists; the target is not a folder, device, FIFO or
    socket; an existing file is writable by this user.
    """
    name = os.fspath(path)
    target = Path(os.path.realpath(name))  # through every symlink, to the file that changes
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a symlink loop, a path through a file, ...
        raise PenroseError(f"cannot write {name}: {e.strerror or e}", Span(name)) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise PenroseError(f"cannot write {name}: it is a directory", Span(name))
        if not stat.S_ISREG(st.st_mode):
            raise PenroseError(
                f"cannot write {name}: it is {_kind(st.st_mode)}, not a regular file"
                + ("; leave out -o to print instead" if stat.S_ISCHR(st.st_mode) else ""),
                Span(name),
            )
        if not os.access(target, os.W_OK) or not st.st_mode & 0o222:
            # no write bit at all (chmod a-w, 0444) is read-only for everyone, root included:
            # root may write any file, but penrose does not overwrite one marked read-only
            raise PenroseError(f"cannot write {name}: permission denied (the file is read-only)", Span(name))
    folder = target.parent
    if not folder.is_dir():
        shown = Path(name).parent if target == Path(os.path.abspath(name)) else folder
        raise PenroseError(f"cannot write {name}: folder {shown} does not exist", Span(name))
    return target


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the target's folder, then rename.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "out.bin")
    >>> atomic_write_bytes(p, b"\\x00\\x01"); open(p, "rb").read()
    b'\\x00\\x01'
    """

    def write(tmp: str) -> None:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(data)

    atomic_write_file(path, write)


def atomic_write_file(path, write) -> None:
    """`write(tmp)` fills a temporary file (its path, a str) in the target's folder; it is then
    flushed to disk, given the target's mode rule (an existing file keeps its mode, a new one gets
    0666 less the umask: the same for every file penrose writes, whatever wrote the bytes) and
    renamed over `path`. A writer that fails leaves the old file whole and no temporary file."""
    name = os.fspath(path)
    target = writable_target(name)
    mode = _mode_for(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as e:
        raise PenroseError(f"cannot write {name}: {e.strerror or e}", Span(name)) from None
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes the file private (0600); keep the file's own mode
        os.replace(tmp, target)
    except BaseException as e:  # disk full, permission, Ctrl-C: the old file stays whole
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise PenroseError(f"cannot write {name}: {e.strerror or e}", Span(name)) from None
        raise
    _sync_folder(target.parent)


def atomic_write_text(path, text: str) -> None:
    """Text version of atomic_write_bytes (UTF-8, line ends as given)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _mode_for(target: Path) -> int:
    """The mode a rewritten file keeps, or that a new file gets under the process umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask would, for a moment, for every thread)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every system can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_folder(path, write, *, replace: bool = False, hint: str = "") -> Path:
    """`write(tmp)` fills a new temporary folder (a Path) beside `path`, which then takes its
    place: a reader sees the old folder or the new one, never a mix of the two. An existing
    folder that holds anything is refused (a PenroseError naming it, and `hint`) unless
    `replace`, and then removed only after the new one is complete; a writer that fails leaves
    the old folder as it was and no temporary folder. The new folder keeps the old one's mode
    (a new one: 0777 less the umask). Returns the folder's path."""
    import shutil

    name = os.fspath(path)
    target = Path(os.path.abspath(name))
    if target.exists() and not target.is_dir():
        raise PenroseError(f"cannot write {name}: it is a file, not a folder", Span(name))
    if target.is_dir() and any(target.iterdir()) and not replace:
        raise PenroseError(f"{name} exists and is not empty{'; ' + hint if hint else ''}", Span(name))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = target.stat().st_mode & 0o7777 if target.is_dir() else 0o777 & ~_umask()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as e:
        raise PenroseError(f"cannot write {name}: {e.strerror or e}", Span(name)) from None
    try:
        write(tmp)
        os.chmod(tmp, mode)
    except BaseException as e:  # the old folder is untouched
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise PenroseError(f"cannot write {name}: {e.strerror or e}", Span(name)) from None
        raise
    old = Path(f"{tmp}.old") if os.path.lexists(target) else None  # (tmp's name is unique: so is this one)
    try:
        if old is not None:
            os.replace(target, old)  # aside, removed once the new folder stands in its place
        os.replace(tmp, target)
    except OSError as e:
        if old is not None and not os.path.lexists(target):
            os.replace(old, target)  # put it back
        shutil.rmtree(tmp, ignore_errors=True)
        raise PenroseError(f"cannot write {name}: {e.strerror or e}", Span(name)) from None
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)
    _sync_folder(target.parent)
    return Path(name)
