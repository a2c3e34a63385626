"""Oracle for mlx-cache's batch caches: replays scenarios on mlx-lm's BatchKVCache and
BatchRotatingKVCache (mlx_lm/models/cache.py) and records what they hold after every
step, so the Rust port can be checked bit for bit.

Usage:
  python xtask/py/batch_cache_oracle.py [OUT_DIR]      # default goldens/cache

Each scenario file (`batch_<name>.safetensors`) holds, per step:
  - "single.{step}.{j}.k/v.{u}": the updates that fill single-sequence cache j (merge,
    extend steps),
  - "in.{step}.k/v": the batch update (update steps),
  - "mask.{step}.{w}": make_mask(S, window_size=WINDOWS[w]) before an update,
  - "out.{step}.k/v": what update_and_fetch returned,
  - "state.{step}.k/v": the raw buffers after every step but updates (absent while
    empty),
(masks and outputs only for updates whose "check" is not false),
  - "extract.{step}.k/v": the extracted row's buffers (extract steps),
and in the metadata key "ops" a JSON list of the steps with the host bookkeeping
(offset, left_padding, idx, and for the rotating cache _offset and rotated).
"""

import json
import os
import sys

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    RotatingKVCache,
)

WINDOWS = [None, 3]
H, DK, DV = 2, 4, 3


def rand(rng, shape, dtype):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def fill_single(kind, fills, rng, dtype, arrays, prefix):
    c = KVCache() if kind == "kv" else RotatingKVCache(max_size=kind, keep=0)
    for u, s in enumerate(fills):
        k = rand(rng, (1, H, s, DK), dtype)
        v = rand(rng, (1, H, s, DV), dtype)
        arrays[f"{prefix}.k.{u}"] = k
        arrays[f"{prefix}.v.{u}"] = v
        c.update_and_fetch(k, v)
    return c


def merged(kind, rows, rng, dtype, arrays, step):
    singles = [
        fill_single(kind, fills, rng, dtype, arrays, f"single.{step}.{j}")
        for j, fills in enumerate(rows)
    ]
    cls = BatchKVCache if kind == "kv" else BatchRotatingKVCache
    return cls.merge(singles)


def record_state(cache, arrays, step, entry):
    if cache.keys is not None and entry["op"] != "update":
        arrays[f"state.{step}.k"] = mx.array(cache.keys)
        arrays[f"state.{step}.v"] = mx.array(cache.values)
    entry["offset"] = cache.offset.tolist()
    entry["left_padding"] = cache.left_padding.tolist()
    entry["idx"] = cache._idx
    entry["size"] = cache.size()
    entry["trimmable"] = cache.is_trimmable()
    entry["empty"] = cache.empty()
    if isinstance(cache, BatchRotatingKVCache):
        entry["written"] = cache._offset
        entry["rotated"] = cache.rotated


def run(name, kind, dtype, ops, out_dir, seed):
    rng = np.random.RandomState(seed)
    arrays = {}
    log = []
    cache = None
    for step, op in enumerate(ops):
        entry = dict(op)
        what = op["op"]
        if what == "merge":
            cache = merged(kind, op["rows"], rng, dtype, arrays, step)
        elif what == "extend":
            other = merged(kind, op["rows"], rng, dtype, arrays, step)
            cache.extend(other)
        elif what == "update":
            s = op["S"]
            check = op.get("check", True)
            if check:
                for w, win in enumerate(WINDOWS):
                    arrays[f"mask.{step}.{w}"] = cache.make_mask(s, window_size=win)
            b = cache.offset.shape[0]
            k = rand(rng, (b, H, s, DK), dtype)
            v = rand(rng, (b, H, s, DV), dtype)
            arrays[f"in.{step}.k"] = k
            arrays[f"in.{step}.v"] = v
            ko, vo = cache.update_and_fetch(k, v)
            if check:
                arrays[f"out.{step}.k"] = mx.array(ko)
                arrays[f"out.{step}.v"] = mx.array(vo)
        elif what == "filter":
            cache.filter(op["keep"])
        elif what == "extract":
            row = cache.extract(op["row"])
            arrays[f"extract.{step}.k"] = mx.array(row.keys)
            arrays[f"extract.{step}.v"] = mx.array(row.values)
            entry["extract_offset"] = row.offset
            entry["extract_idx"] = getattr(row, "_idx", row.offset)
        elif what == "trim":
            entry["trimmed"] = cache.trim(op["n"])
        elif what == "prepare":
            cache.prepare(
                left_padding=op.get("pad_left"),
                lengths=op.get("chunk_lengths"),
                right_padding=op.get("pad_right"),
            )
        elif what == "finalize":
            cache.finalize()
        else:
            raise ValueError(what)
        record_state(cache, arrays, step, entry)
        mx.eval(arrays)
        log.append(entry)
    meta = {"ops": json.dumps(log), "kind": json.dumps(kind), "dtype": str(dtype)}
    mx.save_safetensors(os.path.join(out_dir, f"batch_{name}.safetensors"), arrays, meta)


def updates(n, s=1, every=1):
    """`n` updates of `s` positions; only every `every`-th (and the last) is recorded."""
    return [
        {"op": "update", "S": s, "check": i % every == 0 or i == n - 1} for i in range(n)
    ]


def scenarios():
    kv = (
        [{"op": "merge", "rows": [[5], [], [3, 1, 1]]}]
        + updates(3)
        + [{"op": "extract", "row": 1}, {"op": "filter", "keep": [2, 0]}]
        + updates(2)
        + [{"op": "filter", "keep": [0]}, {"op": "extend", "rows": [[12], [2]]}]
        + updates(2)
        + updates(1, 3)
        + [{"op": "trim", "n": 2}]
        + updates(250, every=61)
        + [{"op": "extract", "row": 0}, {"op": "extract", "row": 2}]
        + [{"op": "filter", "keep": [1, 2]}, {"op": "extend", "rows": [[300]]}]
        + updates(2)
        + [{"op": "extract", "row": 2}]
    )
    rot = (
        [{"op": "merge", "rows": [[9], [3], [4, 1, 1], [6, 1, 1, 1]]}]
        + updates(3)
        + [{"op": "extract", "row": 1}, {"op": "extract", "row": 3}]
        + updates(5)
        + [{"op": "filter", "keep": [3, 1]}, {"op": "extend", "rows": [[2], [5, 1]]}]
        + updates(4)
        + [{"op": "extract", "row": 0}, {"op": "extract", "row": 3}]
        + [{"op": "filter", "keep": [0, 2]}]
        + updates(1, 2)
        + updates(3)
        + [{"op": "extend", "rows": [[1]]}]
        + updates(7)
        + [{"op": "extract", "row": 0}, {"op": "extract", "row": 2}]
    )
    # An extend that meets an empty batch, then the first update.
    rot_empty = (
        [{"op": "merge", "rows": [[], []]}, {"op": "extend", "rows": [[4], [7]]}]
        + updates(4)
        + [{"op": "extract", "row": 1}]
    )
    # Right-padded prefill chunks (prepare / update / finalize), as BatchGenerator runs
    # them, then decoding.
    def chunk(lengths):
        top = max(lengths)
        return [
            {"op": "prepare", "chunk_lengths": lengths, "pad_right": [top - n for n in lengths]},
            {"op": "update", "S": top},
        ]

    kv_prefill = (
        [{"op": "merge", "rows": [[3], [], [1]]}]
        + chunk([4, 2, 5])
        + [{"op": "finalize"}]
        + updates(2)
        + chunk([1, 3, 2])
        + [{"op": "finalize"}]
        + updates(2)
        + [{"op": "extract", "row": i} for i in range(3)]
        + [{"op": "merge", "rows": [[], []]}, {"op": "prepare", "pad_left": [2, 0]}]
        + updates(1, 3)
        + updates(2)
        + [{"op": "extract", "row": 0}]
    )
    rot_prefill = (
        [{"op": "merge", "rows": [[2], [], [4]]}]
        + chunk([5, 3, 7])
        + chunk([4, 1, 2])
        + [{"op": "finalize"}]
        + updates(5)
        + [{"op": "extract", "row": i} for i in range(3)]
    )
    return [
        ("kv", "kv", mx.float16, kv, 1),
        ("kv_prefill", "kv", mx.float32, kv_prefill, 5),
        ("rotating_6_prefill", 6, mx.float32, rot_prefill, 6),
        ("kv_f32", "kv", mx.float32, kv[:10], 2),
        ("rotating_6", 6, mx.bfloat16, rot, 3),
        ("rotating_5_empty", 5, mx.float32, rot_empty, 4),
    ]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "goldens/cache"
    os.makedirs(out_dir, exist_ok=True)
    for name, kind, dtype, ops, seed in scenarios():
        run(name, kind, dtype, ops, out_dir, seed)
        print(f"wrote batch_{name}.safetensors")


if __name__ == "__main__":
    main()
