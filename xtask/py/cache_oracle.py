"""Oracle for mlx-cache: runs mlx-lm's caches (mlx_lm/models/cache.py) and records
what they return, so the Rust port can be checked bit for bit.

Usage:
  python xtask/py/cache_oracle.py goldens [OUT_DIR]     # write goldens (default goldens/cache)
  python xtask/py/cache_oracle.py check-file CACHE UPDATES OUT
      load CACHE with mlx_lm's load_prompt_cache, apply one update per cache from
      UPDATES ("{i}.k"/"{i}.v"), write what mlx-lm returns to OUT (used by the Rust
      tests to check that mlx-lm reads our files).

Golden scenario files (`<name>.safetensors`) hold the inputs ("in.{step}.k/v"), the
returned keys/values of checked steps ("out.{step}.k/v", quantized as ".k.0/1/2"), the
masks ("mask.{step}.{variant}") and, in the metadata key "ops", a JSON list of the steps
with the cache's scalar properties after each one.
"""

import json
import os
import sys

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    load_prompt_cache,
    save_prompt_cache,
)

DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}

# Mask variants recorded before each update: (return_array, window_size).
MASK_VARIANTS = [(False, None), (True, None), (False, 8)]


def make(spec):
    kind = spec["class"]
    if kind == "KVCache":
        return KVCache()
    if kind == "RotatingKVCache":
        return RotatingKVCache(max_size=spec["max_size"], keep=spec["keep"])
    if kind == "QuantizedKVCache":
        return QuantizedKVCache(group_size=spec["group_size"], bits=spec["bits"])
    if kind == "ConcatenateKVCache":
        return ConcatenateKVCache()
    raise ValueError(kind)


def mask_record(m):
    if m is None:
        return "none", None
    if isinstance(m, str):
        return m, None
    return "array", m


def size_of(c):
    return c.size()


def run_scenario(name, spec, ops, out_dir, seed):
    rng = np.random.RandomState(seed)
    dtype = DTYPES[spec["dtype"]]
    b, h, d = spec["B"], spec["H"], spec["D"]
    cache = make(spec)
    arrays = {}
    log = []
    for step, op in enumerate(ops):
        kind = op[0]
        entry = {"op": kind}
        if kind == "update":
            s = op[1]
            check = op[2] if len(op) > 2 else True
            entry["S"] = s
            entry["check"] = check
            masks = []
            for vi, (ret, win) in enumerate(MASK_VARIANTS):
                m = cache.make_mask(s, return_array=ret, window_size=win)
                mk, arr = mask_record(m)
                masks.append(mk)
                if arr is not None:
                    arrays[f"mask.{step}.{vi}"] = arr
            entry["masks"] = masks
            k = mx.array(rng.standard_normal((b, h, s, d)).astype(np.float32)).astype(dtype)
            v = mx.array(rng.standard_normal((b, h, s, d)).astype(np.float32)).astype(dtype)
            arrays[f"in.{step}.k"] = k
            arrays[f"in.{step}.v"] = v
            ko, vo = cache.update_and_fetch(k, v)
            # mlx-lm may hand back its own buffer object, which later in-place
            # assignments overwrite: record copies (mx.array) of what it returned now.
            if check:
                if isinstance(ko, (tuple, list)):
                    for j in range(3):
                        arrays[f"out.{step}.k.{j}"] = mx.array(ko[j])
                        arrays[f"out.{step}.v.{j}"] = mx.array(vo[j])
                else:
                    arrays[f"out.{step}.k"] = mx.array(ko)
                    arrays[f"out.{step}.v"] = mx.array(vo)
        elif kind == "trim":
            entry["n"] = op[1]
            entry["trimmed"] = cache.trim(op[1])
        elif kind == "to_quantized":
            entry["group_size"], entry["bits"] = op[1], op[2]
            cache = cache.to_quantized(group_size=op[1], bits=op[2])
        else:
            raise ValueError(kind)
        entry["class"] = type(cache).__name__
        entry["offset"] = cache.offset
        entry["size"] = size_of(cache)
        entry["trimmable"] = cache.is_trimmable()
        entry["nbytes"] = cache.nbytes
        entry["empty"] = cache.empty()
        if isinstance(cache, RotatingKVCache):
            entry["idx"] = cache._idx
        log.append(entry)
    mx.eval(arrays)
    meta = {"ops": json.dumps(log), "spec": json.dumps(spec)}
    mx.save_safetensors(os.path.join(out_dir, f"{name}.safetensors"), arrays, meta)


def singles(n, check=True):
    return [["update", 1, check] for _ in range(n)]


def scenarios():
    kv_ops = (
        [["update", 5]]
        + singles(3)
        + [["trim", 2], ["update", 1], ["update", 250]]
        + singles(2)
        + [["trim", 3], ["update", 1], ["update", 300], ["update", 1], ["trim", 1000]]
        + singles(2)
    )
    rot_ops = (
        [["update", 3], ["trim", 1], ["update", 2]]
        + singles(14)
        + [["update", 7]]
        + singles(20)
        + [["update", 20]]
        + singles(3)
    )
    rot0_ops = [["update", 12]] + singles(10) + [["update", 5]] + singles(9) + [["update", 1]]
    big = [["update", 200]]
    for i in range(105):
        off = 201 + i
        big.append(["update", 1, i % 10 == 0 or off in (255, 256, 257, 258) or off >= 299])
    big += [["update", 4]] + singles(2)
    q_ops = (
        [["update", 5]]
        + singles(3)
        + [["trim", 2], ["update", 260]]
        + singles(2)
        + [["trim", 5], ["update", 3], ["update", 1]]
    )
    to_q = [["update", 10], ["update", 1], ["to_quantized", 32, 4]] + singles(3)
    to_q += [["update", 250], ["update", 1]]
    concat = [["update", 3], ["update", 1], ["update", 1], ["trim", 1], ["update", 2]]
    return {
        "kv_f16": ({"class": "KVCache", "dtype": "float16", "B": 2, "H": 2, "D": 4}, kv_ops),
        "rotating_16_keep4": (
            {"class": "RotatingKVCache", "max_size": 16, "keep": 4, "dtype": "float16",
             "B": 1, "H": 2, "D": 4},
            rot_ops,
        ),
        "rotating_8_keep0": (
            {"class": "RotatingKVCache", "max_size": 8, "keep": 0, "dtype": "bfloat16",
             "B": 1, "H": 1, "D": 4},
            rot0_ops,
        ),
        "rotating_300_keep4": (
            {"class": "RotatingKVCache", "max_size": 300, "keep": 4, "dtype": "float16",
             "B": 1, "H": 1, "D": 2},
            big,
        ),
        "quantized_32_4": (
            {"class": "QuantizedKVCache", "group_size": 32, "bits": 4, "dtype": "float16",
             "B": 1, "H": 2, "D": 32},
            q_ops,
        ),
        "quantized_64_8_bf16": (
            {"class": "QuantizedKVCache", "group_size": 64, "bits": 8, "dtype": "bfloat16",
             "B": 1, "H": 1, "D": 64},
            [["update", 4], ["update", 1], ["update", 1]],
        ),
        "kv_to_quantized": (
            {"class": "KVCache", "dtype": "float32", "B": 1, "H": 1, "D": 32}, to_q
        ),
        "concatenate": (
            {"class": "ConcatenateKVCache", "dtype": "float32", "B": 1, "H": 2, "D": 4}, concat
        ),
    }


def rand(rng, shape, dtype):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def prompt_cache_golden(out_dir):
    """A prompt-cache file written by mlx-lm plus what mlx-lm returns after loading
    it back and applying one more single-token update to every cache."""
    rng = np.random.RandomState(7)
    kv = KVCache()
    kv.update_and_fetch(rand(rng, (1, 2, 5, 4), mx.float16), rand(rng, (1, 2, 5, 4), mx.float16))
    kv.update_and_fetch(rand(rng, (1, 2, 1, 4), mx.float16), rand(rng, (1, 2, 1, 4), mx.float16))
    rot = RotatingKVCache(max_size=8, keep=2)
    rot.update_and_fetch(rand(rng, (1, 1, 5, 4), mx.float32), rand(rng, (1, 1, 5, 4), mx.float32))
    for _ in range(6):
        rot.update_and_fetch(
            rand(rng, (1, 1, 1, 4), mx.float32), rand(rng, (1, 1, 1, 4), mx.float32)
        )
    q = QuantizedKVCache(group_size=32, bits=4)
    q.update_and_fetch(rand(rng, (1, 1, 3, 32), mx.float16), rand(rng, (1, 1, 3, 32), mx.float16))
    cat = ConcatenateKVCache()
    cat.update_and_fetch(rand(rng, (1, 1, 2, 4), mx.float32), rand(rng, (1, 1, 2, 4), mx.float32))
    caches = [kv, rot, q, cat, KVCache(), RotatingKVCache(max_size=8), QuantizedKVCache()]
    meta = {"model": "tiny-model", "chat_template": "{{ messages }}", "tokenizer_config": "{}"}
    path = os.path.join(out_dir, "prompt_cache_mlx_lm.safetensors")
    save_prompt_cache(path, caches, meta)

    # What mlx-lm does with the file after loading it.
    updates = {}
    shapes = [(1, 2, 4, mx.float16), (1, 1, 4, mx.float32), (1, 1, 32, mx.float16),
              (1, 1, 4, mx.float32), (1, 1, 4, mx.float32), (1, 1, 4, mx.float32),
              (1, 1, 64, mx.float32)]
    for i, (b, h, d, dt) in enumerate(shapes):
        updates[f"{i}.k"] = rand(rng, (b, h, 1, d), dt)
        updates[f"{i}.v"] = rand(rng, (b, h, 1, d), dt)
    upd_path = os.path.join(out_dir, "prompt_cache_updates.safetensors")
    mx.save_safetensors(upd_path, updates)
    apply_updates(path, upd_path, os.path.join(out_dir, "prompt_cache_expected.safetensors"))


def apply_updates(cache_path, updates_path, out_path):
    caches, meta = load_prompt_cache(cache_path, return_metadata=True)
    updates = mx.load(updates_path)
    out = {}
    info = []
    for i, c in enumerate(caches):
        entry = {"class": type(c).__name__, "offset_loaded": c.offset}
        if f"{i}.k" in updates:
            ko, vo = c.update_and_fetch(updates[f"{i}.k"], updates[f"{i}.v"])
            if isinstance(ko, (tuple, list)):
                for j in range(3):
                    out[f"{i}.k.{j}"] = mx.array(ko[j])
                    out[f"{i}.v.{j}"] = mx.array(vo[j])
            else:
                out[f"{i}.k"] = mx.array(ko)
                out[f"{i}.v"] = mx.array(vo)
        # The state after the update (or as loaded when there was none).
        entry["offset"] = c.offset
        if isinstance(c, RotatingKVCache):
            entry.update(keep=c.keep, max_size=c.max_size, idx=c._idx)
        if isinstance(c, QuantizedKVCache):
            entry.update(group_size=c.group_size, bits=c.bits)
        info.append(entry)
    mx.eval(out)
    mx.save_safetensors(
        out_path, out, {"info": json.dumps(info), "metadata": json.dumps(meta, sort_keys=True)}
    )


def main():
    args = sys.argv[1:]
    if not args or args[0] == "goldens":
        out_dir = args[1] if len(args) > 1 else os.path.join("goldens", "cache")
        os.makedirs(out_dir, exist_ok=True)
        for seed, (name, (spec, ops)) in enumerate(sorted(scenarios().items())):
            run_scenario(name, spec, ops, out_dir, seed)
        prompt_cache_golden(out_dir)
    elif args[0] == "check-file" and len(args) == 4:
        apply_updates(args[1], args[2], args[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
