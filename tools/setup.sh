#!/usr/bin/env bash
# Install everything penrose needs on a fresh Debian machine: system packages, the CPU build of
# torch, and the project itself (editable) with its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
[ -d /usr/share/games/fortunes ] || need_apt+=(fortunes)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# torch first, pinned to the CPU build available locally (a bare 'torch' may pull a CUDA build)
if ! $PYTHON -c "import torch" >/dev/null 2>&1; then
  $PYTHON -m pip install -q torch==2.13.0
fi
$PYTHON -m pip install -q -e ".[zoo,test,editor]"
echo "penrose: set-up complete"
