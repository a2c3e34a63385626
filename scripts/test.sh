#!/usr/bin/env bash
# The project's test command (README, .ci/run): setup, then `cargo xtask test`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MLX_PYTHON="$PWD/.venv/bin/python"
exec cargo xtask test "$@"
