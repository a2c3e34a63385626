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

With `--prefill`, a prompt's attention instead (queries = keys = the prompt's length, the
lengths a server's prompts bring, each new one a plan): `pfresh` / `pagain` causal, one
row; `bfresh` / `bagain` `--rows` left-padded rows under mlx-lm's boolean mask (a batch's
prefill); `ppadded` / `bpadded` queries and keys padded to a multiple of 256 under an
additive mask (one shape for 256 lengths; the padded queries' outputs are dropped);
`pcpadded` the same padding under the causal mask alone (the padded keys come after every
real query's last visible key, so no mask array is needed).

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


def report(cases):
    """Times each (name, call, lengths) case and prints a line for it."""
    for name, fn, lens in cases:
        us = timed(fn, lens)
        print(
            f"{name:10s} median {statistics.median(us):9.1f} us  mean "
            f"{statistics.mean(us):9.1f} us  first {us[0]:9.1f} us  ({len(us)} calls)"
        )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=4)
    p.add_argument("--start", type=int, default=600)
    p.add_argument("--calls", type=int, default=48)
    p.add_argument("--prefill", action="store_true")
    p.add_argument("--rows", type=int, default=8)
    a = p.parse_args()
    if a.prefill:
        return prefill(a)
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
    report(cases)


def prefill(a):
    dt = mx.bfloat16
    lengths = [97 + 41 * i for i in range(a.calls)]
    cap = (max(lengths) // 256 + 1) * 256
    mx.random.seed(0)
    shape = lambda b, h: (b, h, cap, a.dim)
    q = mx.random.normal(shape(a.rows, a.heads)).astype(dt)
    k = mx.random.normal(shape(a.rows, a.kv_heads)).astype(dt)
    v = mx.random.normal(shape(a.rows, a.kv_heads)).astype(dt)
    mx.eval(q, k, v)
    scale = a.dim**-0.5

    def call(b, t, w, mask):
        return mx.fast.scaled_dot_product_attention(
            q[:b, :, :w], k[:b, :, :w], v[:b, :, :w], scale=scale, mask=mask
        )

    def causal(t):
        return call(1, t, t, "causal")

    def batch(t):
        # Row r left-padded by 3 r positions, as a batch of prompts of unequal lengths.
        pad = mx.arange(a.rows)[:, None, None, None] * 3
        rows = mx.arange(t)[:, None]
        cols = mx.arange(t)[None]
        m = (cols <= rows) & (cols >= pad)
        return call(a.rows, t, t, m | (rows < pad))

    def padded_to(b):
        def run(t):
            w = (t // 256 + 1) * 256
            pad = mx.arange(b)[:, None, None, None] * (3 if b > 1 else 0)
            rows = mx.arange(w)[:, None]
            cols = mx.arange(w)[None]
            see = (cols <= rows) & (cols < t) & ((cols >= pad) | (rows < pad))
            return call(b, t, w, mx.where(see, 0.0, -mx.inf).astype(dt))

        return run

    def causal_padded(t):
        # Queries, keys and values all padded by the same p to a 256-multiple: causal
        # (bottom-right) then still hides the padded keys from the real queries, so no mask
        # array is needed; the padded queries' rows are dropped.
        w = (t // 256 + 1) * 256
        o = mx.fast.scaled_dot_product_attention(
            q[:1, :, :w], k[:1, :, :w], v[:1, :, :w], scale=scale, mask="causal"
        )
        return o[:, :, :t]

    for f in (causal, batch, padded_to(1), padded_to(a.rows), causal_padded):
        mx.eval(f(50))
    cases = [
        ("pfresh", causal, lengths),
        ("pagain", causal, lengths),
        ("ppadded", padded_to(1), [t + 1 for t in lengths]),
        ("pcpadded", causal_padded, [t + 4 for t in lengths]),
        ("bfresh", batch, [t + 2 for t in lengths]),
        ("bagain", batch, [t + 2 for t in lengths]),
        ("bpadded", padded_to(a.rows), [t + 3 for t in lengths]),
    ]
    print(
        f"device {mx.default_device()} prefill q {a.heads}x{a.dim} kv {a.kv_heads} "
        f"rows {a.rows} lengths {lengths[0]}..{lengths[-1]}"
    )
    report(cases)
    for t in lengths[:3]:
        a, b = causal(t), causal_padded(t)
        same = mx.array_equal(a, b).item()
        diff = mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()
        print(f"pcpadded against causal at {t}: {'identical' if same else 'differs'}, max abs diff {diff:.3g}")


if __name__ == "__main__":
    main()
