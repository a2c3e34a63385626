"""Oracle for the prompt-cache files of hybrid models (mlx-lm's ArraysCache beside
KVCache) and of chunked-attention models (ChunkedKVCache beside KVCache), on the
committed tiny checkpoints in goldens/models/.

Usage:
  python xtask/py/hybrid_cache_oracle.py goldens [OUT_DIR]   (default goldens/cache)
      for each model: prefill PROMPT with make_prompt_cache(model), write the cache with
      save_prompt_cache (what mlx_lm.cache_prompt writes, with its metadata keys) to
      prompt_cache_<model>.safetensors, then decode NEXT one token at a time and write
      the logits to prompt_cache_<model>_expected.safetensors ("logits").
  python xtask/py/hybrid_cache_oracle.py check-file MODEL_DIR CACHE OUT
      load CACHE with mlx-lm's load_prompt_cache, decode NEXT on MODEL_DIR's model, write
      the logits ("logits") and the loaded classes (metadata "classes") to OUT.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache
from mlx_lm.utils import load_model

MODELS = ["qwen3_next-small-f32", "qwen3_5-small-f32", "qwen3_5_moe-small-f32", "lfm2-small-f32", "mamba2-small-f32",
          "granitemoehybrid-small-f32", "nemotron_h-small-f32", "mamba-small-f32"]
# Llama 4: a chunk of 8 positions, shorter than PROMPT, so the files hold trimmed caches.
CHUNKED = ["llama4-small-f32"]
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32]
NEXT = [38, 46, 26]
ROOT = Path(__file__).resolve().parents[2]


def decode(model, cache):
    steps = []
    for t in NEXT:
        steps.append(model(mx.array([[t]], dtype=mx.int32), cache=cache))
        mx.eval(steps[-1])
    return mx.concatenate(steps, axis=1)


def goldens(out):
    out.mkdir(parents=True, exist_ok=True)
    for name in MODELS + CHUNKED:
        model, _ = load_model(ROOT / "goldens/models" / name)
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([PROMPT], dtype=mx.int32), cache=cache))
        meta = {"model": name, "chat_template": "", "tokenizer_config": "{}"}
        save_prompt_cache(str(out / f"prompt_cache_{name}.safetensors"), cache, meta)
        logits = decode(model, cache)
        mx.save_safetensors(str(out / f"prompt_cache_{name}_expected.safetensors"), {"logits": logits})
        print(f"wrote prompt_cache_{name}")


def check_file(model_dir, cache_file, out):
    model, _ = load_model(Path(model_dir))
    cache = load_prompt_cache(cache_file)
    classes = [type(c).__name__ for c in cache]
    logits = decode(model, cache)
    mx.save_safetensors(out, {"logits": logits}, metadata={"classes": json.dumps(classes)})


def main():
    mx.set_default_device(mx.cpu)
    args = sys.argv[1:]
    if args and args[0] == "goldens" and len(args) <= 2:
        goldens(Path(args[1]) if len(args) == 2 else ROOT / "goldens/cache")
    elif args and args[0] == "check-file" and len(args) == 4:
        check_file(*args[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
