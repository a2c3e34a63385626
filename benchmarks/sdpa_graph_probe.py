"""What a speculative verification's attention costs on MLX's CUDA backend (issue 19).

A verification runs a few query positions a row (`[y, drafts...]`); MLX 0.32 sends more
than three to cuDNN, whose graphs are cached by the keys' shape. The keys grow every
round, so each round may build a new graph on the host. This times one attention call
(queued and waited for) per key length:

  fresh     causal, every call a key length not seen before
  again     the same key lengths a second time (the graphs cached)
  maskfresh a boolean array mask (what a batch's verification passes), new lengths
  maskagain the same again
  padded    the keys' whole buffer (a multiple of 256) with an additive mask hiding the
            positions past the length: one shape for 256 lengths
  vector    one query position (MLX's vector kernel, no cuDNN), new lengths

Run on the device with MLX's CUDA build: `python benchmarks/sdpa_graph_probe.py`.
Prints one line a case: median and mean microseconds a call.
"""

import argparse
import statistics
import time

import mlx.core as mx


def timed(fn, lengths):
    out = []
    for t in lengths:
        mx.synchronize()
        start = time.perf_counter()
        y = fn(t)
        mx.eval(y)
        mx.synchronize()
        out.append((time.perf_counter() - start) * 1e6)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=4)
    p.add_argument("--start", type=int, default=600)
    p.add_argument("--calls", type=int, default=48)
    a = p.parse_args()
    dt = mx.bfloat16
    n = a.queries
    cap = ((a.start + n * a.calls * 2) // 256 + 1) * 256
    mx.random.seed(0)
    q = mx.random.normal((1, a.heads, n, a.dim)).astype(dt)
    q1 = mx.random.normal((1, a.heads, 1, a.dim)).astype(dt)
    kb = mx.random.normal((1, a.kv_heads, cap, a.dim)).astype(dt)
    vb = mx.random.normal((1, a.kv_heads, cap, a.dim)).astype(dt)
    mx.eval(q, q1, kb, vb)
    scale = a.dim**-0.5

    def causal(t):
        return mx.fast.scaled_dot_product_attention(
            q, kb[:, :, :t], vb[:, :, :t], scale=scale, mask="causal"
        )

    def boolmask(t):
        rows = mx.arange(t - n, t)[:, None]
        cols = mx.arange(t)[None]
        m = (cols <= rows)[None, None]
        return mx.fast.scaled_dot_product_attention(
            q, kb[:, :, :t], vb[:, :, :t], scale=scale, mask=m
        )

    def padded(t):
        # The whole 256-multiple prefix of the buffer, positions past `t` hidden.
        w = (t // 256 + 1) * 256
        rows = mx.arange(t - n, t)[:, None]
        cols = mx.arange(w)[None]
        m = mx.where(cols <= rows, 0.0, -mx.inf).astype(dt)[None, None]
        return mx.fast.scaled_dot_product_attention(
            q, kb[:, :, :w], vb[:, :, :w], scale=scale, mask=m
        )

    def vector(t):
        return mx.fast.scaled_dot_product_attention(
            q1, kb[:, :, :t], vb[:, :, :t], scale=scale
        )

    # Warm every kind once at a length outside the ones timed.
    for f in (causal, boolmask, padded, vector):
        mx.eval(f(a.start - 1))
    first = [a.start + i * n for i in range(a.calls)]
    second = [a.start + n * a.calls + i * n for i in range(a.calls)]
    cases = [
        ("fresh", causal, first),
        ("again", causal, first),
        ("maskfresh", boolmask, second),
        ("maskagain", boolmask, second),
        ("padded", padded, [x + 1 for x in first]),
        ("vector", vector, [x + 2 for x in first]),
    ]
    print(
        f"device {mx.default_device()} q {a.heads}x{n}x{a.dim} kv {a.kv_heads} "
        f"lengths {a.start}..{second[-1]} buffer {cap}"
    )
    for name, fn, lens in cases:
        us = timed(fn, lens)
        print(
            f"{name:10s} median {statistics.median(us):9.1f} us  mean "
            f"{statistics.mean(us):9.1f} us  first {us[0]:9.1f} us  ({len(us)} calls)"
        )


if __name__ == "__main__":
    main()
