"""Time one cached forward of q_len tokens on a model, as speculative verification does.

mlx-lm's speculative verification runs the target over `[last, drafts...]` (q_len =
num_draft_tokens + 1) with a KV cache that grows by a few tokens every round. On MLX's
CUDA backend, attention over more than 3 queries goes to cuDNN, whose execution plan is
built per (q, k) shape: a growing cache means a new plan every round. This probe times
the forward per q_len, with the cache length changing every iteration (as in decoding)
and kept fixed (the plan reused), so the plan-building cost shows apart from the math.

    python benchmarks/verify_shapes_probe.py MODEL_DIR [--prompt 512] [--iters 12]

Prints one line per (q_len, growing|fixed): median milliseconds per forward.
"""

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--qlens", default="1,2,3,4,5,8,16")
    args = ap.parse_args()
    model, _ = load(args.model)
    vocab = model.args.vocab_size if hasattr(model, "args") else 32000
    prompt = mx.random.randint(0, vocab, (1, args.prompt))
    for q in [int(x) for x in args.qlens.split(",")]:
        for mode in ("growing", "fixed"):
            cache = make_prompt_cache(model)
            mx.eval(model(prompt, cache=cache))
            times = []
            for i in range(args.iters + 2):
                toks = mx.random.randint(0, vocab, (1, q))
                mx.eval(toks)
                t0 = time.perf_counter()
                out = model(toks, cache=cache)
                mx.eval(out)
                dt = time.perf_counter() - t0
                if i >= 2:
                    times.append(dt * 1e3)
                # growing: keep one more token each round (the cache's length changes);
                # fixed: trim everything this forward added (same shapes next time).
                keep = 1 if mode == "growing" else 0
                for c in cache:
                    c.trim(q - keep)
            print(f"q_len {q:3d} {mode:8s} median {statistics.median(times):8.2f} ms "
                  f"min {min(times):8.2f} ms", flush=True)


if __name__ == "__main__":
    main()
