"""Package discovery (the rest of the metadata is in pyproject.toml).

Everything under penrose/ is the package `penrose`; the zoo's folder zoo/ is the package
`penrose_zoo` (so the wheel installs no generic top-level `zoo`). Packages are found by walking
the folders, and every other file beside them (.pen diagrams, py.typed, any data a module reads)
is package data, so a new subpackage or file cannot be left out of the wheel by a forgotten list;
tests/project/test_wheel.py builds the wheel and fails on any file missing from it.

The language's grammar lives at the top of the tree, grammar/penrose.lark (grammar/README.md);
building the wheel copies it into the package as penrose/grammar/penrose.lark, where the parser
finds it once installed (penrose.parser.grammar_file). MANIFEST.in puts grammar/ in the sdist.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

GRAMMAR = Path("grammar", "penrose.lark")  # the one copy in the tree
GRAMMAR_IN_PACKAGE = Path("penrose", "grammar", "penrose.lark")  # where the wheel carries it

ROOTS = {"penrose": "penrose", "penrose_zoo": "zoo"}  # import name -> folder
NOT_DATA = {".py", ".pyc", ".pyo"}

packages, package_data = [], {}
for name, folder in ROOTS.items():
    found = [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    packages += found
    for pkg in found:
        pkg_dir = Path(folder, *pkg.split(".")[1:])
        subpackages = {Path(folder, *p.split(".")[1:]) for p in found if p.startswith(pkg + ".")}
        files = [
            f.relative_to(pkg_dir).as_posix()
            for f in sorted(pkg_dir.rglob("*"))
            if f.is_file() and f.suffix not in NOT_DATA and "__pycache__" not in f.parts
            and not any(parent in subpackages for parent in f.parents)
        ]
        if files:
            package_data[pkg] = files



class BuildWithGrammar(build_py):
    """build_py, then the grammar copied into the built package (an editable install runs no
    build_py: the parser reads grammar/ of the tree there)."""

    def run(self):
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib, GRAMMAR_IN_PACKAGE)
            self.mkpath(str(target.parent))
            self.copy_file(str(GRAMMAR), str(target))


setup(packages=packages, package_dir=ROOTS, package_data=package_data, cmdclass={"build_py": BuildWithGrammar})
