"""Writing files so that nothing is ever half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from penrose.errors import PenroseError, Span


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same folder, then rename."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise PenroseError(f"cannot write {path}: folder {folder} does not exist", Span(str(path)))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise PenroseError(f"cannot write {path}: {e.strerror or e}", Span(str(path))) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, _mode_for(path))  # mkstemp makes the file private (0600); keep the usual mode
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PenroseError(f"cannot write {path}: {e.strerror or e}", Span(str(path))) from None


def _mode_for(path: Path) -> int:
    """The mode a rewritten file keeps, or that a new file gets under the process umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path, text: str) -> None:
    """Text version of atomic_write_bytes (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))
