"""Per-token host-time split of mlx-lm's decode loop, to compare with our
`MLX_ENGINE_PROFILE=1` line.

Runs the op sequence of mlx-lm's `generate_step` (greedy, batch 1) with timers around
graph construction (model call, last-position slice, log-softmax, argmax),
`mx.async_eval` and `y.item()`, after one untimed warm-up generation at the same shapes:

    python benchmarks/profile_mlx_lm.py --model DIR [DIR ...] [-p 512] [-g 256] [-n 2]

Prints one line per timed run in the same format as ours (several models share one
process, which saves the ~15 s a Python process costs to start on the GPU machine).
"""

import argparse
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache


def run(model, prompt, gen):
    stream = mx.new_stream(mx.default_device()) if not hasattr(run, "s") else run.s
    run.s = stream
    cache = make_prompt_cache(model)

    def step(y):
        with mx.stream(stream):
            logits = model(y[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return mx.argmax(logprobs, axis=-1), logprobs.squeeze(0)

    with mx.stream(stream):
        model(prompt[None, :-1], cache=cache)
        mx.eval([c.state for c in cache])
        mx.clear_cache()
        y, lp = step(prompt[-1:])
        mx.async_eval(y, lp)
    build = sched = wait = 0.0
    steps = 0
    last = None
    total = 0.0
    for n in range(gen):
        t0 = time.perf_counter()
        ny, nlp = step(y)
        t1 = time.perf_counter()
        mx.async_eval(ny, nlp)
        t2 = time.perf_counter()
        if n == 0:
            mx.eval(y)
        y.item()
        t3 = time.perf_counter()
        if n == 0:
            last = t3
        else:
            build += t1 - t0
            sched += t2 - t1
            wait += t3 - t2
            total += t3 - last
            last = t3
            steps += 1
        if n % 256 == 0:
            mx.clear_cache()
        y, lp = ny, nlp
    us = lambda v: v * 1e6 / steps
    print(
        f"[mlx-lm profile] decode steps {steps}: build {us(build):.0f} us, "
        f"async_eval {us(sched):.0f} us, wait+read {us(wait):.0f} us, "
        f"token-to-token {us(total):.0f} us",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, nargs="+")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-g", type=int, default=256)
    ap.add_argument("-n", type=int, default=2)
    a = ap.parse_args()
    for path in a.model:
        print(f"== {path}", flush=True)
        model, _ = load(path)
        mx.random.seed(0)
        vocab = model.args.vocab_size
        prompt = mx.random.randint(0, vocab, (a.p,))
        run(model, prompt, a.g)  # warm-up
        for _ in range(a.n):
            run(model, prompt, a.g)
        del model
        mx.clear_cache()


if __name__ == "__main__":
    main()
