"""Type-check penrose and the zoo under the zoo's import name, `penrose_zoo`.

    python tools/typecheck.py                          # mypy -p penrose -p penrose_zoo
    python tools/typecheck.py -p penrose_zoo           # the zoo only
    python tools/typecheck.py -m penrose_zoo.steerling.outputs
    python tools/typecheck.py --summary                # errors per file, then the total

The folder zoo/ is installed as `penrose_zoo` (pyproject's package-dir), by an editable finder
that mypy cannot follow. Plain `mypy` (pyproject's files = ["penrose", "zoo"]) therefore checks
the zoo as a package named `zoo`, and every `from penrose_zoo... import` inside it is an unknown
module (Any): calls between zoo modules go unchecked. This script makes build/typecheck/penrose_zoo
a link to zoo/ and runs mypy with MYPYPATH=build/typecheck from the repository root (where
`penrose` is found as it is), so the zoo's own imports resolve. The rest of the configuration is
pyproject's [tool.mypy] (its `files` is not used: the packages are named here); the cache is
build/typecheck/mypy_cache, apart from plain mypy's. Paths in the report are the repository's
(zoo/..., not build/typecheck/penrose_zoo/...). The exit status is mypy's.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "typecheck"
LINK = BUILD / "penrose_zoo"
PREFIX = "build/typecheck/penrose_zoo/"


def link() -> None:
    """build/typecheck/penrose_zoo -> ../../zoo (made, or remade when it points elsewhere)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(ROOT / "zoo", BUILD)
    if LINK.is_symlink() and os.readlink(LINK) == target:
        return
    if LINK.is_symlink() or LINK.exists():
        LINK.unlink()
    LINK.symlink_to(target, target_is_directory=True)


def repo_paths(text: str) -> str:
    """mypy's report with the link's paths written as the repository's."""
    return re.sub(rf"(?m)^{re.escape(PREFIX)}", "zoo/", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", action="store_true", help="print errors per file (most first) after the report")
    args, rest = ap.parse_known_args(argv)
    if not any(a in ("-p", "--package", "-m", "--module") or a.startswith(("-p", "-m")) for a in rest):
        rest = ["-p", "penrose", "-p", "penrose_zoo", *rest]
    link()
    env = dict(os.environ)
    env["MYPYPATH"] = os.pathsep.join(p for p in (str(BUILD), env.get("MYPYPATH", "")) if p)
    cache = ["--cache-dir", str(BUILD / "mypy_cache")]  # its own: plain mypy caches the zoo as `zoo`
    run = subprocess.run([sys.executable, "-m", "mypy", *cache, *rest], cwd=ROOT, env=env, capture_output=True, text=True)
    out = repo_paths(run.stdout)
    sys.stdout.write(out)
    sys.stderr.write(repo_paths(run.stderr))
    if args.summary:
        per_file = Counter(line.split(":", 1)[0] for line in out.splitlines() if ": error:" in line)
        for path, n in per_file.most_common():
            print(f"{n:5d}  {path}")
        print(f"{sum(per_file.values()):5d}  in {len(per_file)} files")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
