"""`penrose zoo ...`: the zoo's commands. The zoo registers them with the penrose command line as
an entry point (pyproject.toml, group `penrose.commands`); penrose.cli forwards the arguments
after `zoo` to `main`.

    penrose zoo list          the zoo's models, parameter counts at default sizes, diagrams
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="penrose zoo", description="The interpretable zoo: models from diagrams.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("list", help="the models, their parameter counts at default sizes and their diagrams")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run `penrose zoo ARGV...`; returns the exit status.

    >>> main(["list"])  # doctest: +ELLIPSIS
    model ...
    0
    """
    p = _parser()
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not args.command:
        p.print_help()
        return 2
    import penrose_zoo

    for line in penrose_zoo.list_lines():
        print(line)
    return 0
