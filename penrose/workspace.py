"""One workspace of files: cached parse → include graph → checked, kept fresh by file stamps.

What the long-running users share (the language server, `penrose serve`, the notebook magic,
the zoo's `load_diagram`): a file is parsed again only when its stamp changes (modification
time in nanoseconds, size and inode; for an editor's unsaved text, the text itself), and a
checked diagram is checked again only when the stamp of a file it was read from changed — the
file itself or any file it includes, transitively. Loading goes through the one loader
(`penrose.load`): the same include resolver, the same pure checker.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "lib.pen"), "w") as f:
    ...     _ = f.write("dim e = 2\\n")
    >>> with open(os.path.join(folder, "m.pen"), "w") as f:
    ...     _ = f.write('include "lib.pen"\\ninput x[e]\\noutput x\\n')
    >>> ws = Workspace()
    >>> ws.load(os.path.join(folder, "m.pen"), sizes={"e": 3}).dim_sizes()
    {'e': 3}
    >>> ws.load(os.path.join(folder, "m.pen"), sizes={"e": 3}) is ws.load(os.path.join(folder, "m.pen"), sizes={"e": 3})
    True
    >>> ws.parses  # m.pen and lib.pen, once each
    2

Editors overlay their unsaved text (`set_text`, `close`): an open file is read from the editor,
not the disk, wherever it is included. A Workspace is safe to share between threads.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from penrose import ir
from penrose.errors import PenroseError, Span
from penrose.io import read_text
from penrose.loader import load_entries
from penrose.reading import (
    Includes,
    Paths,
    empty_file,
    file_key,
    include_folders,
    is_blank,
    is_path,
    merge_sizes,
    walk_includes,
)
from penrose.parser import parse
from penrose.stack import deep

if TYPE_CHECKING:
    from penrose.checked import Checked

__all__ = ["Workspace", "stamp"]

_EMPTY = object()  # a parsed file that holds nothing (its error depends on who reads it)


Stamp = tuple[Any, ...]  # ("disk", mtime_ns, size, inode), ("text", text) or ("missing",)
Key = tuple[Any, ...]


def stamp(path: str | os.PathLike[str]) -> Stamp:
    """A file's stamp on disk: ("disk", mtime_ns, size, inode), or ("missing",)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return ("missing",)
    return ("disk", st.st_mtime_ns, st.st_size, st.st_ino)


def _size(text: str) -> int:
    """Bytes of `text` as UTF-8 (counted only where its length leaves a doubt)."""
    return len(text.encode("utf-8", "surrogatepass")) if len(text) < (1 << 26) else 4 * len(text)


def _key(what: tuple[str, str], text: str | None, sizes: dict[str, Any], folders: tuple[str, ...]) -> Key:
    """A cached check's key: text is read, and relative paths resolve, from the working folder."""
    return (*what, text, tuple(sorted(sizes.items())), folders, os.getcwd())


class Workspace:
    """Cached parses and checks of files (and editor texts), invalidated by file stamps.

    `include_paths` are the folders includes may reach by default (each call may give others).
    `parses` counts the files and texts parsed, for tests and benchmarks. `reader(path) -> str`
    reads a file from disk (default `penrose.io.read_text`); the language server passes one that
    refuses files outside the workspace folders and over a size limit (docs/security.md).
    """

    def __init__(self, include_paths: Paths = (), *, max_checked: int = 256,
                 reader: Callable[[str], str] | None = None, max_text: int | None = None):
        self.include_paths = include_folders(include_paths)
        self._read = reader or read_text  # how a file is read from disk (the language server's limits it)
        self.max_text = max_text  # bytes (UTF-8) of an editor's text that is parsed; a larger one is refused
        self.parses = 0
        self._lock = threading.RLock()
        self._texts: dict[str, str] = {}  # file key -> an editor's unsaved text
        self._parsed: dict[str, tuple[Stamp, object]] = {}  # path -> (stamp, Diagram | PenroseError | _EMPTY)
        self._checked: collections.OrderedDict[Key, tuple[dict[str, Stamp], Checked | PenroseError]] = collections.OrderedDict()
        self._last: dict[Key, dict[str, Stamp]] = {}  # key -> stamps of the files its last load read
        self.max_checked = max_checked
        # a path as a key, cached: links are not expected to change under a long-running tool
        self._file_key = functools.lru_cache(maxsize=4096)(file_key)

    # -- editors' texts
    def set_text(self, path: str | os.PathLike[str], text: str) -> None:
        """An editor's unsaved text for `path`: read instead of the disk until `close`."""
        with self._lock:
            self._texts[self._file_key(os.fspath(path))] = text

    def close(self, path: str | os.PathLike[str]) -> None:
        with self._lock:
            self._texts.pop(self._file_key(os.fspath(path)), None)

    def text(self, path: str | os.PathLike[str]) -> str | None:
        """The editor's text of `path`, if it is open."""
        if not self._texts:  # no editor: nothing to resolve
            return None
        with self._lock:
            return self._texts.get(self._file_key(os.fspath(path)))

    def exists(self, path: str) -> bool:
        """Whether a file is there to include: open in an editor (saved or not), or on disk."""
        return self.text(path) is not None or os.path.lexists(path)

    def forget(self, path: str | os.PathLike[str]) -> None:
        """Drop what is cached of `path` (a change the stamps may not show)."""
        with self._lock:
            self._parsed.pop(os.fspath(path), None)

    # -- stamps
    def stamp(self, path: str | os.PathLike[str]) -> Stamp:
        """The stamp of a file as this workspace reads it (an open text's is the text)."""
        text = self.text(path)
        return ("text", text) if text is not None else stamp(path)

    def _fresh(self, stamps: dict[str, Stamp]) -> bool:
        return all(self.stamp(f) == s for f, s in stamps.items())

    # -- parsing
    def parse(self, path: str | os.PathLike[str], *, included: bool = False) -> ir.Diagram | PenroseError:
        """The Diagram of the file at `path` (an open text, else the disk), parsed again only when
        its stamp changed; a PenroseError (not raised) when it cannot be read or parsed."""
        name = os.fspath(path)
        now = self.stamp(name)  # before reading: a save during the read is seen next time
        with self._lock:
            hit = self._parsed.get(name)
        found: object
        if hit is not None and hit[0] == now:
            found = hit[1]
        else:
            try:
                text = now[1] if now[0] == "text" else self._read(name)
                if now[0] == "text" and self.max_text is not None and _size(text) > self.max_text:
                    raise PenroseError(f"cannot read {name}: the editor's text is {_size(text):,} bytes, over the limit "
                                       f"of {self.max_text:,}", Span(name))
                found = _EMPTY if is_blank(text) else parse(text, file=name)
            except PenroseError as e:
                found = e
            with self._lock:
                self.parses += 1
                self._parsed[name] = (now, found)
        if found is _EMPTY:
            return empty_file(name, included)
        assert isinstance(found, (ir.Diagram, PenroseError))
        return found

    def _read_include(self, target: str) -> ir.Diagram:
        found = self.parse(target, included=True)
        if isinstance(found, PenroseError):
            raise found
        return found

    def includes(self, diagram: ir.Diagram, include_paths: Paths | None = None) -> Includes:
        """The include graph of `diagram` (`penrose.loader.Includes`), its files read through this
        workspace's cache."""
        folders = self.include_paths if include_paths is None else include_folders(include_paths)
        return walk_includes(diagram, folders, self._read_include, self.exists)

    def files(self, path: str | os.PathLike[str]) -> list[str]:
        """The files the last `load` of `path` read: the file and all it includes (those that
        could be resolved, and those looked for and missing)."""
        with self._lock:
            found = [k for k in self._last if k[1] == os.fspath(path)]
            return list(self._last[found[-1]]) if found else [os.fspath(path)]

    # -- checking
    def load(self, source: object = None, *, text: str | None = None, file: str = "<string>",
             sizes: Mapping[str, Any] | None = None, include_paths: Paths | None = None) -> Checked:
        """The checked diagram of a path (or `text`, named `file` in messages), checked again only
        when a file it was read from changed; raises its PenroseError (the same one again until
        then). `sizes` is a mapping, as for `penrose.load`; a Diagram or Checked is checked
        through the loader without caching."""
        sizes = merge_sizes(sizes)
        folders = self.include_paths if include_paths is None else include_folders(include_paths)
        if isinstance(source, ir.Diagram) and text is None:  # includes read as this workspace reads them
            from penrose.checker import check

            return check(source, sizes, includes=self.includes(source, folders))
        if text is None and not is_path(source):
            checked: Checked = load_entries(source, sizes=sizes, include_paths=folders, read_include=self._read_include)[0]
            return checked
        what = ("text", file) if text is not None else ("file", os.fspath(cast("str | os.PathLike[str]", source)))
        key = _key(what, text, sizes, folders)
        with self._lock:
            hit = self._checked.get(key)
            if hit is not None:
                self._checked.move_to_end(key)
        if hit is not None and self._fresh(hit[0]):
            if isinstance(hit[1], PenroseError):
                raise hit[1]
            return hit[1]
        stamps, result = self._load(what, text, sizes, folders)
        with self._lock:
            self._checked[key] = (stamps, result)
            self._last.pop(key, None)
            self._last[key] = stamps
            while len(self._checked) > self.max_checked:
                old, _ = self._checked.popitem(last=False)
                self._last.pop(old, None)
        if isinstance(result, PenroseError):
            raise result
        return result

    def fresh(self, path: str | os.PathLike[str], *, sizes: Mapping[str, Any] | None = None,
              include_paths: Paths | None = None) -> bool:
        """Whether `load(path, sizes=...)` would answer from the cache (nothing it read changed)."""
        folders = self.include_paths if include_paths is None else include_folders(include_paths)
        key = _key(("file", os.fspath(path)), None, merge_sizes(sizes), folders)
        with self._lock:
            hit = self._checked.get(key)
        return hit is not None and self._fresh(hit[0])

    @deep  # parse and check with room for deep nesting
    def _load(self, what: tuple[str, str], text: str | None, sizes: dict[str, Any],
              folders: tuple[str, ...]) -> tuple[dict[str, Stamp], Checked | PenroseError]:
        """(stamps of the files read, Checked or PenroseError). An include that does not resolve
        (no such file) is not watched: fix the including file, or save it again."""
        stamps: dict[str, Stamp] = {}

        def read_include(target: str) -> ir.Diagram:
            stamps[target] = self.stamp(target)  # before reading, as `parse` does
            return self._read_include(target)

        try:
            diagram: ir.Diagram
            if what[0] == "text":
                assert text is not None, "a text key comes with its text"
                diagram = parse(text, file=what[1])
            else:
                stamps[what[1]] = self.stamp(what[1])
                found = self.parse(what[1])
                if isinstance(found, PenroseError):
                    raise found
                diagram = found
            from penrose.checker import check

            checked: Checked = check(diagram, sizes, includes=walk_includes(diagram, folders, read_include, self.exists))
            return stamps, checked
        except PenroseError as e:
            return stamps, e
