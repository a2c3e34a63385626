"""Writes mlx-lm's logits for tiny models: the oracle of the parity harness.

For each model directory it loads the model with `mlx_lm.utils.load_model` and writes
`oracle.safetensors` next to it with, for every prompt i:
  full.{i}.tokens / full.{i}.logits      one forward pass over the prompt, no cache
  decode.{i}.tokens / decode.{i}.logits  prefill a prefix with make_prompt_cache, then
                                         one token at a time (logits concatenated)
  decode.{i}.prefill                     prefix length (int32 scalar)
  batch.tokens / batch.logits            a batch of two prompts, no cache
  qdecode.{j}.*                          like decode, with the caches quantized after
                                         the prefill (mlx-lm's kv_bits=8,
                                         kv_group_size=32); only where mlx-lm can

usage: oracle_logits.py MODEL_DIR [MODEL_DIR ...]
"""

import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

import olmo_compat  # noqa: F401  (mlx-lm's olmo.py made runnable, see there)

# Token ids below 128 (the tiny vocabularies). Lengths cover single-token prompts,
# prompts longer than the sliding windows (4) and MoE's sorted path (>= 64 slots).
PROMPTS = [
    [7],
    [1, 17, 33, 2, 90, 5],
    [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43],
    [(i * 37 + 11) % 128 for i in range(40)],
]
DECODE = [(1, 1), (1, 2), (2, 5), (3, 30)]  # (prompt index, prefill length)
BATCH = [[5, 6, 7, 8, 9], [100, 101, 3, 4, 127]]
QDECODE = [(2, 5)]
KV_GROUP, KV_BITS = 32, 8


def decode(model, p, k, kv_bits=None):
    """Prefill p[:k], then one token at a time, quantizing the caches after each call
    the way mlx-lm's generate_step does."""
    cache = make_prompt_cache(model)
    steps = [model(mx.array([p[:k]], dtype=mx.int32), cache=cache)]
    maybe_quantize_kv_cache(cache, 0, KV_GROUP, kv_bits)
    for t in p[k:]:
        steps.append(model(mx.array([[t]], dtype=mx.int32), cache=cache))
        maybe_quantize_kv_cache(cache, 0, KV_GROUP, kv_bits)
        mx.eval(steps[-1])
    return mx.concatenate(steps, axis=1)


def oracle(model_dir):
    model, _ = load_model(Path(model_dir))
    out = {}
    for i, p in enumerate(PROMPTS):
        tokens = mx.array([p], dtype=mx.int32)
        out[f"full.{i}.tokens"] = tokens
        out[f"full.{i}.logits"] = model(tokens)
    for j, (i, k) in enumerate(DECODE):
        p = PROMPTS[i]
        out[f"decode.{j}.tokens"] = mx.array([p], dtype=mx.int32)
        out[f"decode.{j}.prefill"] = mx.array(k, dtype=mx.int32)
        out[f"decode.{j}.logits"] = decode(model, p, k)
    for j, (i, k) in enumerate(QDECODE):
        p = PROMPTS[i]
        try:
            logits = decode(model, p, k, kv_bits=KV_BITS)
            mx.eval(logits)
        except Exception:  # head_dim not a multiple of 32, rotating caches, gemma2
            continue
        out[f"qdecode.{j}.tokens"] = mx.array([p], dtype=mx.int32)
        out[f"qdecode.{j}.prefill"] = mx.array(k, dtype=mx.int32)
        out[f"qdecode.{j}.logits"] = logits
    batch = mx.array(BATCH, dtype=mx.int32)
    out["batch.tokens"] = batch
    out["batch.logits"] = model(batch)
    mx.eval(out)
    mx.save_safetensors(str(Path(model_dir) / "oracle.safetensors"), out)


def main():
    mx.set_default_device(mx.cpu)
    failed = 0
    for d in sys.argv[1:]:
        try:
            oracle(d)
            print(f"oracle {d}")
        except Exception as e:  # report and go on: the harness shows the model as failed
            failed += 1
            (Path(d) / "oracle.safetensors").unlink(missing_ok=True)
            print(f"oracle FAILED {d}: {e}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
