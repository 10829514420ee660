#!/usr/bin/env bash
# One-time (idempotent) set-up: a virtual environment in .venv with torch, the toolkit and its test tools.
# Re-running is quick: it only reinstalls when pyproject.toml changed.
# INTERP_TORCH chooses the torch requirement installed first (default torch==2.13.0; on a machine with a
# local CPU wheel of it, e.g. CI, that wheel is used; from PyPI on Linux it is the CUDA build).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "setup.sh: Python 3.11 or newer is needed ($("$PY" --version 2>&1) found); set PYTHON=python3.11" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.interp-setup-$("$PY" -c 'import hashlib; print(hashlib.sha1(open("pyproject.toml", "rb").read()).hexdigest()[:12])')"
if [ ! -f "$stamp" ]; then
  log=.venv/setup.log
  pip_install() { .venv/bin/python -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; echo "setup.sh: pip install $* failed (full log: $log)" >&2; exit 1; }; }
  echo "setup.sh: installing into .venv (log: $log) ..."
  pip_install --upgrade pip
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    pip_install "${INTERP_TORCH:-torch==2.13.0}"
  fi
  pip_install -e ".[test]"
  .venv/bin/python -c "import torch, transformer_lens, interp.tasks, interp.analyses, interp.app" \
    || { echo "setup.sh: the installed packages do not import (log: $log)" >&2; exit 1; }
  rm -f .venv/.interp-setup-* && touch "$stamp"
  echo "setup.sh: done"
fi
