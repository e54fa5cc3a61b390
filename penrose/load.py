"""Paths and text → IR: which argument is a file, reading it, and where includes may reach.

The layer between `parse` and `check`; it imports neither torch nor the checker.

    >>> from penrose.load import read
    >>> read(text="dim e = 2\\ninput x[e]\\noutput x").body[1].name
    'x'

Paths and text (`read`, and so `penrose.load`, `penrose.compile`, `penrose.source`):

- `text=...` is always diagram text; a `pathlib.Path` (any `os.PathLike`) is always a path;
- a `str` with a line break is text, as is an empty or blank one (the empty diagram); any other
  `str` is a path. Every diagram has a line break (it needs an `output` and something to
  output), so a one-line string can only be a file name: `penrose.load("nope")` is
  "cannot read nope: No such file or directory", never a syntax error at `<string>:1:7`;
- an `ir.Diagram` is taken as it is.

A path must name a regular, readable, non-empty UTF-8 file (a folder, a device, a FIFO is
refused without being opened; see `penrose.io.read_text`).

Includes (`resolve_include`, `read_include`, called by the checker):

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

Import names from this module (`from penrose.load import read`): the package attribute
`penrose.load` is the `load` function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import contextvars
import os

from penrose import ir
from penrose.errors import PenroseCheckError, PenroseError, Span
from penrose.io import read_text
from penrose.parse import parse

# Extra include folders for the check now running (set by penrose.load(include_paths=...));
# a context variable, so threads and async tasks loading at once keep their own.
_include_paths: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("penrose_include_paths", default=())


def is_path(source) -> bool:
    """Whether `read` treats `source` as a file name (the rule in this module's docstring)."""
    if isinstance(source, os.PathLike):
        return True
    return isinstance(source, str) and bool(source.strip()) and "\n" not in source and "\r" not in source


def read(source=None, *, text: str | None = None) -> ir.Diagram:
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
        return parse(text)
    if isinstance(source, ir.Diagram):
        return source
    if is_path(source):
        return read_file(source)
    if isinstance(source, str):
        return parse(source)
    raise TypeError(f"expected a path, .pen text or a Diagram, got {type(source).__name__}")


def replace_includes(diagram: ir.Diagram, replacements: dict) -> ir.Diagram:
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


def read_file(path, *, included: bool = False) -> ir.Diagram:
    """Parse the diagram file at `path`; an empty file is an error naming it."""
    name = os.fspath(path)
    text = read_text(name)
    if not text.lstrip("\ufeff").strip():
        what = "an included file holds dims or blocks" if included else "a diagram declares at least an input and an output"
        raise PenroseError(f"{name} is empty; {what}", Span(name))
    return parse(text, file=name)


@contextlib.contextmanager
def include_paths(paths=()):
    """Within this block, includes may also reach into (and are searched in) `paths`.

    A context variable: it holds for checks on this thread (`penrose.load` reads and checks on
    one `stack.deep` worker), not for threads started inside the block.

    >>> with include_paths([os.sep]):
    ...     allowed_folders("model.pen") == [os.getcwd(), os.sep]
    True
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    folders = tuple(os.path.abspath(os.fspath(p)) for p in paths)
    for folder in folders:
        if not os.path.isdir(folder):
            raise PenroseError(f"include path {folder} is not a folder", Span(folder))
    token = _include_paths.set(_include_paths.get() + folders)
    try:
        yield
    finally:
        _include_paths.reset(token)


def project_folder(top_file: str) -> str:
    """The folder includes stay inside by default: the top-level file's, or the working one."""
    if top_file.startswith("<"):
        return os.path.abspath(os.getcwd())
    return os.path.dirname(os.path.abspath(top_file))


def allowed_folders(top_file: str) -> list[str]:
    """The project folder, then the include paths in force."""
    return [project_folder(top_file), *_include_paths.get()]


def _inside(path: str, folders) -> bool:
    real = os.path.realpath(path)
    for folder in folders:
        root = os.path.realpath(folder)
        try:
            if os.path.commonpath([real, root]) == root:
                return True
        except ValueError:  # another drive (Windows)
            continue
    return False


def resolve_include(path: str, span: Span, including_file: str, top_file: str) -> str:
    """The absolute path of the file `include path` names, or a positioned PenroseCheckError.

    Nothing is opened here, and nothing outside the allowed folders is even looked at.
    """
    if not path.endswith(".pen"):
        raise PenroseCheckError(f"cannot include {path!r}: an include names a .pen file", span)
    folders = allowed_folders(top_file)
    base = os.path.dirname(os.path.abspath(including_file)) if not including_file.startswith("<") else os.getcwd()
    if os.path.isabs(path):
        candidates = [os.path.normpath(path)]
    else:
        candidates = [os.path.normpath(os.path.join(base, path))]
        candidates += [os.path.normpath(os.path.join(f, path)) for f in _include_paths.get()]
    for target in candidates:
        if not _inside(target, folders):
            allowed = " or ".join(folders)
            raise PenroseCheckError(
                f"cannot include {path!r}: it lies outside {allowed} "
                "(allow another folder with --include-path DIR or include_paths=[DIR])",
                span,
            )
        if os.path.lexists(target):
            if os.path.isdir(target):
                raise PenroseCheckError(f"cannot include {path!r}: {target} is a directory", span)
            return target
    raise PenroseCheckError(f"cannot include {path!r}: no such file (looked at {', '.join(candidates)})", span)


_INCLUDE_READER: contextvars.ContextVar = contextvars.ContextVar("penrose_include_reader", default=None)


@contextlib.contextmanager
def include_reader(reader):
    """Within this block, included files are read by `reader(path) -> ir.Diagram` instead of
    from disk (an editor's unsaved text: the language server); it raises PenroseError as
    `read_file` does. A context variable, like `include_paths`."""
    token = _INCLUDE_READER.set(reader)
    try:
        yield
    finally:
        _INCLUDE_READER.reset(token)


def read_include(target: str, span: Span) -> ir.Diagram:
    """Parse an included file; its errors gain a note pointing at the include statement."""
    note = (("included from here", span),)
    reader = _INCLUDE_READER.get()
    try:
        return reader(target) if reader is not None else read_file(target, included=True)
    except PenroseError as e:
        if not e.span.line:  # unreadable, empty, not a regular file: say so at the include
            raise PenroseCheckError(e.message, span) from None
        raise e.__class__(e.message, e.span, e.notes + note) from None
