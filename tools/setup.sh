#!/usr/bin/env bash
# Install everything penrose needs on a fresh Debian-like machine: the Debian packages, a Python
# environment, the CPU build of torch, and the project itself (editable) with all its extras.
# Safe to run again.
#
# Where things go: into the virtual or conda environment you have activated, if any; otherwise
# into .venv/ at the repository root, made with the system's `python3 -m venv` (Debian's and
# Ubuntu's system Python refuse `pip install` outside a virtual environment, PEP 668).
# Prints the environment's python on its last line (for scripts; the Makefile picks the same
# environment by the same rule: $VIRTUAL_ENV, else $CONDA_PREFIX, else .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "penrose setup: please install $* with your system's package manager" >&2
    return 0
  fi
  if [ $apt_updated -eq 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
[ -d /usr/share/games/fortunes ] || need_apt+=(fortunes)
[ ${#need_apt[@]} -gt 0 ] && apt_install "${need_apt[@]}"
# A small TeX for the TikZ compile test (tests/rendering/test_tikz.py compiles every paper
# listing's figure): LaTeX, TikZ and pdftotext, without the recommended docs and fonts (about
# 200 MB, a minute to install)
tex_apt=()
{ command -v pdflatex >/dev/null 2>&1 && kpsewhich tikz.sty >/dev/null 2>&1; } || tex_apt+=(texlive-latex-base texlive-latex-recommended texlive-pictures)
command -v pdftotext >/dev/null 2>&1 || tex_apt+=(poppler-utils)
[ ${#tex_apt[@]} -gt 0 ] && apt_install --no-install-recommends "${tex_apt[@]}"

# The environment: an activated venv, an activated conda env, or the project's own .venv.
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY="$VIRTUAL_ENV/bin/python"
elif [ -n "${CONDA_PREFIX:-}" ] && [ -x "$CONDA_PREFIX/bin/python" ]; then
  PY="$CONDA_PREFIX/bin/python"
else
  BASE=${PENROSE_BASE_PYTHON:-python3}
  if [ ! -x .venv/bin/python ]; then
    # Debian ships venv's pip bootstrap (ensurepip) separately, in python3-venv
    if ! "$BASE" -c "import ensurepip, venv" >/dev/null 2>&1; then
      ver=$("$BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
      apt_install python3-venv "python$ver-venv" || apt_install python3-venv
    fi
    rm -rf .venv
    "$BASE" -m venv .venv
  fi
  PY="$PWD/.venv/bin/python"
fi

# pip's notes about this machine's optional local package folders are noise, not errors
quiet_pip() { "$PY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# torch first, pinned to the CPU build available locally (a bare 'torch' may pull a CUDA build)
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  quiet_pip install -q torch==2.13.0
fi
quiet_pip install -q -e ".[zoo,test,editor,dev,lightning,pyc,onnx]"
# timm without its torchvision requirement (pyproject.toml's trace-test extra says why)
if ! "$PY" -m pip show -q timm >/dev/null 2>&1; then
  quiet_pip install -q --no-deps "timm>=1.0"
fi
echo "penrose: set-up complete in $("$PY" -c 'import sys; print(sys.prefix)')" >&2
echo "$PY"
