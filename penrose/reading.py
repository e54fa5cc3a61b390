"""Reading diagrams: path or text, the files they include, and sizes as a mapping — everything
the one loader (`penrose.load`) and the checker need before checking, and nothing that checks.

Sizes (`merge_sizes`): always a mapping, `sizes={"d": 64}`, so a dim of any name can be sized
(`text`, `seed`, `entries`, `include_paths`...); the keyword form `d=64` is the same for names
that are no option. Naming one dim both ways with two values is an error.

Paths and text (`read`):

- `text=...` is always diagram text; a `pathlib.Path` (any `os.PathLike`) is always a path;
- a `str` with a line break is text, as is an empty or blank one (the empty diagram); any other
  `str` is a path. Every diagram has a line break (it needs an `output` and something to
  output), so a one-line string can only be a file name: `penrose.load("nope")` is
  "cannot read nope: No such file or directory", never a syntax error at `<string>:1:7`;
- an `ir.Diagram` is taken as it is; a `Checked` diagram (or a compiled module, which carries
  one) is returned as it is, or checked again when sizes are given.

A path must name a regular, readable, non-empty UTF-8 file (a folder, a device, a FIFO is
refused without being opened; see `penrose.io.read_text`).

Includes (`resolve_include`, `walk_includes`):

- `include "lib.pen"` is relative to the folder of the file that says it (for text: the working
  folder); an include names a `.pen` file;
- the included file must lie inside the *project folder*, the folder of the top-level file (for
  text: the working folder), after symlinks are resolved, or inside one of the extra include
  folders given by `include_paths=` / `--include-path`. An include path also extends the search:
  a relative include not found beside its file is looked up in each include folder in turn;
- an include that leaves those folders (`include "../../etc/x.pen"`, `include "/etc/passwd"`, a
  symlink pointing out) is refused at the include statement without opening the file, so an
  error can never show another file's contents. A file inside the allowed folders that fails to
  parse shows its own line under the caret, with a note pointing at the include.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeGuard, Union

from penrose import ir
from penrose.errors import PenroseCheckError, PenroseError, Span
from penrose.io import read_text
from penrose.parser import parse

Paths = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]

__all__ = [
    "Includes",
    "Paths",
    "include_folders",
    "is_path",
    "merge_sizes",
    "read",
    "read_file",
    "replace_includes",
    "resolve_include",
    "walk_includes",
]


# ---- sizes -------------------------------------------------------------------------------------


def merge_sizes(sizes: Mapping[str, Any] | None = None, more: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One mapping of sizes from `sizes={...}` and the keyword sizes `more`; a name given both
    ways must have one value.

    >>> merge_sizes({"text": 8}, {"d": 4})
    {'text': 8, 'd': 4}
    >>> merge_sizes({"d": 8}, {"d": 4})
    Traceback (most recent call last):
    ...
    penrose.errors.PenroseError: error: size of 'd' given twice: 8 in sizes= and d=4
    """
    out: dict[str, Any]
    if sizes is None:
        out = {}
    elif isinstance(sizes, Mapping):
        out = dict(sizes)
    else:
        raise TypeError(f"sizes= maps dim (or const) names to sizes, got {type(sizes).__name__}")
    for key in out:
        if not isinstance(key, str):
            raise TypeError(f"sizes= maps dim (or const) names to sizes; a key is a {type(key).__name__}: {key!r}")
    for key, value in (more or {}).items():
        if key in out and (out[key] != value or type(out[key]) is not type(value)):
            raise PenroseError(f"size of {key!r} given twice: {out[key]!r} in sizes= and {key}={value!r}")
        out[key] = value
    return out


# ---- paths and text ----------------------------------------------------------------------------


def is_path(source: object) -> TypeGuard[str | os.PathLike[str]]:
    """Whether `read` treats `source` as a file name (the rule in this module's docstring)."""
    if isinstance(source, os.PathLike):
        return True
    return isinstance(source, str) and bool(source.strip()) and "\n" not in source and "\r" not in source


def read(source: object = None, *, text: str | None = None) -> ir.Diagram:
    """A path, `.pen` text or a Diagram → Diagram (syntax only; `penrose.check` does the rest).

    >>> read("dim e = 2\\ninput x[e]\\noutput x").file
    '<string>'
    >>> read("no_such_model.pen")
    Traceback (most recent call last):
    ...
    penrose.errors.PenroseError: no_such_model.pen: error: cannot read no_such_model.pen: No such file or directory
    """
    if text is not None:
        if source is not None:
            raise TypeError("pass either a path or text=..., not both")
        if not isinstance(text, str):
            raise TypeError(f"text= takes a str, got {type(text).__name__}")
        return _parse(text)
    if isinstance(source, ir.Diagram):
        return source
    if is_path(source):
        return read_file(source)
    if isinstance(source, str):
        return _parse(source)
    raise TypeError(f"expected a path, .pen text or a Diagram, got {type(source).__name__}")


def replace_includes(diagram: ir.Diagram, replacements: dict[str, Any]) -> ir.Diagram:
    """The diagram with its top-level `include "A"` statements replaced, on the IR, by includes
    of the files `replacements[A]` names (a path or a list of paths, relative to the diagram's
    folder as its own includes are); the new statements keep the old one's position, so a
    replacement file that is missing, empty or does not parse is reported at the line that was
    replaced. Each key must be included exactly once.

    >>> d = read('include "heads.pen"\\ninput x[e]\\noutput x')
    >>> [s.path for s in replace_includes(d, {"heads.pen": ["a.pen", "b.pen"]}).body if isinstance(s, ir.Include)]
    ['a.pen', 'b.pen']
    """
    if not isinstance(replacements, dict):
        raise TypeError(f"replacements maps an included path to its new files, got {type(replacements).__name__}")
    found = {key: 0 for key in replacements}
    body = []
    for s in diagram.body:
        if isinstance(s, ir.Include) and s.path in replacements:
            found[s.path] += 1
            new = replacements[s.path]
            for path in [new] if isinstance(new, (str, os.PathLike)) else list(new):
                body.append(dataclasses.replace(s, path=os.fspath(path)))
        else:
            body.append(s)
    for key, n in found.items():
        if n != 1:
            raise PenroseError(f"{diagram.file} includes {key!r} {n} times; replace_includes needs it exactly once", Span(diagram.file))
    return dataclasses.replace(diagram, body=tuple(body))


def read_file(path: str | os.PathLike[str], *, included: bool = False) -> ir.Diagram:
    """Parse the diagram file at `path`; an empty file is an error naming it."""
    name = os.fspath(path)
    text = read_text(name)
    if is_blank(text):
        raise empty_file(name, included)
    return _parse(text, file=name)


def _parse(text: str, file: str = "<string>") -> ir.Diagram:
    diagram: ir.Diagram = parse(text, file=file)
    return diagram


def is_blank(text: str) -> bool:
    return not text.lstrip("\ufeff").strip()


def empty_file(name: str, included: bool) -> PenroseError:
    what = "an included file holds dims or blocks" if included else "a diagram declares at least an input and an output"
    return PenroseError(f"{name} is empty; {what}", Span(name))


# ---- includes ----------------------------------------------------------------------------------


def include_folders(paths: Paths = ()) -> tuple[str, ...]:
    """The extra folders includes may reach (absolute); each must be a folder.

    >>> include_folders(os.sep) == (os.sep,)
    True
    """
    if paths is None:
        paths = ()
    if isinstance(paths, (bytes, dict)) or not isinstance(paths, (str, os.PathLike)) and not hasattr(paths, "__iter__"):
        raise TypeError(f"include_paths= takes a folder or a list of folders (str or os.PathLike), not {type(paths).__name__}")
    listed = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for p in listed:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"include_paths= takes folders as str or os.PathLike, not {type(p).__name__} ({p!r:.40})")
    folders = tuple(os.path.abspath(os.fspath(p)) for p in listed)
    for folder in folders:
        if not os.path.isdir(folder):
            raise PenroseError(f"include path {folder} is not a folder", Span(folder))
    return folders


def project_folder(top_file: str) -> str:
    """The folder includes stay inside by default: the top-level file's, or the working one."""
    if top_file.startswith("<"):
        return os.path.abspath(os.getcwd())
    return os.path.dirname(os.path.abspath(top_file))


def allowed_folders(top_file: str, include_paths: Sequence[str] = ()) -> list[str]:
    """The project folder, then the include folders.

    >>> allowed_folders("model.pen", [os.sep]) == [os.getcwd(), os.sep]
    True
    """
    return [project_folder(top_file), *include_paths]


def _inside(path: str, folders: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    for folder in folders:
        root = os.path.realpath(folder)
        try:
            if os.path.commonpath([real, root]) == root:
                return True
        except ValueError:  # another drive (Windows)
            continue
    return False


def resolve_include(path: str, span: Span, including_file: str, top_file: str, include_paths: Sequence[str] = (),
                    exists: Callable[[str], bool] = os.path.lexists) -> str:
    """The absolute path of the file `include path` names, or a positioned PenroseCheckError.

    `include_paths` are absolute folders (`include_folders`). Nothing is opened here, and
    nothing outside the allowed folders is even looked at. `exists(target)` says whether a
    candidate is there (default: on disk; an editor's workspace also counts its unsaved files).
    """
    if not path.endswith(".pen"):
        raise PenroseCheckError(f"cannot include {path!r}: an include names a .pen file", span)
    folders = allowed_folders(top_file, include_paths)
    base = os.path.dirname(os.path.abspath(including_file)) if not including_file.startswith("<") else os.getcwd()
    if os.path.isabs(path):
        candidates = [os.path.normpath(path)]
    else:
        candidates = [os.path.normpath(os.path.join(base, path))]
        candidates += [os.path.normpath(os.path.join(f, path)) for f in include_paths]
    for target in candidates:
        if "\x00" in target:  # no file has such a name (an editor's document may, or the text)
            raise PenroseCheckError(f"cannot include {path!r}: a file name holds no NUL character", span)
        if not _inside(target, folders):
            allowed = " or ".join(folders)
            raise PenroseCheckError(
                f"cannot include {path!r}: it lies outside {allowed} "
                "(allow another folder with --include-path DIR or include_paths=[DIR])",
                span,
            )
        if exists(target):
            if os.path.isdir(target):
                raise PenroseCheckError(f"cannot include {path!r}: {target} is a directory", span)
            return target
    raise PenroseCheckError(f"cannot include {path!r}: no such file (looked at {', '.join(candidates)})", span)


def file_key(path: str) -> str:
    """A file as a key: symlinks resolved, case folded where the file system folds it (a name
    no file can have, one holding a NUL, as it is)."""
    if path.startswith("<") or "\x00" in path:
        return path
    return os.path.normcase(os.path.realpath(path))


@dataclasses.dataclass(frozen=True)
class Includes:
    """Every file a diagram includes, transitively, read before it is checked.

    `targets` maps (including file, include path) to the file the include resolves to, or to
    the refusal (outside the allowed folders, no such file); `files` maps each file reached,
    in the order first reached, to its Diagram or to why it could not be read or parsed.
    The checker asks `target(include, including_file)` and `diagram(include, target)`, and reads
    nothing itself.
    """

    targets: Mapping[tuple[str, str], str | PenroseError] = dataclasses.field(default_factory=dict)
    files: Mapping[str, ir.Diagram | PenroseError] = dataclasses.field(default_factory=dict)

    def target(self, inc: ir.Include, including_file: str) -> str:
        """The file an include resolves to, or its refusal at the include statement."""
        target = self.targets.get((including_file, inc.path))
        if target is None:
            raise PenroseCheckError(f"cannot include {inc.path!r}: the file was not read before checking", inc.span)
        if isinstance(target, PenroseError):
            raise PenroseCheckError(target.message, inc.span)
        return target

    def diagram(self, inc: ir.Include, target: str) -> ir.Diagram:
        """The Diagram of an included file, or its error (at the include when the file cannot be
        read; in the file, with a note pointing at the include, when it does not parse)."""
        found = self.files[target]
        if isinstance(found, PenroseError):
            if not found.span.line:  # unreadable, empty, not a regular file: say so at the include
                raise PenroseCheckError(found.message, inc.span)
            raise found.__class__(found.message, found.span, found.notes + (("included from here", inc.span),))
        return found


Reader = Callable[[str], ir.Diagram]


def _read_included(target: str) -> ir.Diagram:
    return read_file(target, included=True)


def walk_includes(diagram: ir.Diagram, include_paths: Sequence[str] = (), read: Reader | None = None,
                  exists: Callable[[str], bool] = os.path.lexists) -> Includes:
    """Resolve and read the files `diagram` includes, transitively (each file once, cycles
    included: the checker names the cycle). `include_paths` are absolute folders
    (`include_folders`); `read(target)` parses a file or raises PenroseError (default: from
    disk; a `Workspace` passes its cache and an editor's unsaved text) and `exists(target)`
    says whether a file is there (a `Workspace` counts the unsaved ones).

    >>> walk_includes(read("dim e = 2\\ninput x[e]\\noutput x")).files
    {}
    """
    read = read or _read_included
    targets: dict[tuple[str, str], str | PenroseError] = {}
    files: dict[str, ir.Diagram | PenroseError] = {}
    by_key: dict[str, ir.Diagram | PenroseError] = {}
    top = diagram.file
    stack = [diagram]
    while stack:
        d = stack.pop()
        for s in d.body:
            if not isinstance(s, ir.Include) or (d.file, s.path) in targets:
                continue
            try:
                target = resolve_include(s.path, s.span, d.file, top, include_paths, exists)
            except PenroseError as e:
                targets[(d.file, s.path)] = e
                continue
            targets[(d.file, s.path)] = target
            key = file_key(target)
            if key in by_key:
                files.setdefault(target, by_key[key])
                continue
            sub: ir.Diagram | PenroseError
            try:
                sub = read(target)
            except PenroseError as e:
                sub = e
            files[target] = by_key[key] = sub
            if isinstance(sub, ir.Diagram):
                stack.append(sub)
    return Includes(targets, files)
