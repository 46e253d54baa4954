#!/usr/bin/env bash
# Install kforge-tui (editable) into the current Python environment.
#   scripts/install.sh          the tool and the sample-model extras
#   scripts/install.sh --test   the same plus the test tools (and tmux for the terminal test)
#
# torch is installed first, and only when missing: with torch already present (a CUDA build on a
# GPU server) nothing replaces it, because pyproject asks only torch>=2.4. On a machine with no
# torch, `torch==2.13.0` is taken: on CPU-only boxes that have its wheel locally (our CI) it is the
# CPU build; elsewhere pip takes PyPI's default build for the platform.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "install: kforge-tui needs Python 3.11 or newer (tomllib); $PY is $("$PY" -V 2>&1)" >&2
  exit 2
fi
extras="models"
if [[ "${1:-}" == "--test" ]]; then extras="models,test"; fi

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "install: torch not found; installing torch==2.13.0"
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[${extras}]"

if [[ "$extras" == *test* ]] && ! command -v tmux >/dev/null 2>&1; then
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    echo "install: installing tmux (the real-terminal TUI test uses it)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux) >/dev/null
  else
    echo "install: tmux not found; the real-terminal TUI test will be skipped (install tmux to run it)"
  fi
fi
"$PY" -c "import kforge_tui, torch; print(f'install: kforge-tui {kforge_tui.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}')"
