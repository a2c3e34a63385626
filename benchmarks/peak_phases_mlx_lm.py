"""mlx-lm's generation with MLX memory printed after each phase, to set beside ours:
`MLX_LOG=mlx_server=trace mlx-benchmark -b N ...` (batched: prefill steps, sequences
joining decoding, every decoding step) or `MLX_LOG=mlx_benchmark=debug,mlx_engine=debug mlx-benchmark -b 1
...` (one sequence: loading, prefill chunks, first token). Same prompts as
`mlx_lm.benchmark` (seed 0). With `--steps`, a decoding step is printed where it raised
the peak.

    python benchmarks/peak_phases_mlx_lm.py MODEL_DIR [-b 32] [-p 128] [-g 128] [--steps]
"""
import argparse
import importlib

import mlx.core as mx
from mlx_lm import batch_generate, load

# `mlx_lm.generate` the module (the package re-exports a function of that name).
gen = importlib.import_module("mlx_lm.generate")


def report(what):
    print(f"{what}: active {mx.get_active_memory() / 1e9:.4f} GB, "
          f"peak {mx.get_peak_memory() / 1e9:.4f} GB", flush=True)


def wrap(cls, name, label):
    orig = getattr(cls, name)

    def f(self, *a, **k):
        out = orig(self, *a, **k)
        rows = a[0] if a else None
        if isinstance(rows, list) and rows:
            report(f"{label} ({len(rows)} rows)")
        return out

    setattr(cls, name, f)


def wrap_steps(cls, name, label):
    orig = getattr(cls, name)
    state = {"n": 0, "peak": 0}

    def f(self, *a, **k):
        out = orig(self, *a, **k)
        state["n"] += 1
        peak = mx.get_peak_memory()
        if peak < state["peak"]:  # the peak was reset (a new trial)
            state["peak"] = 0
        if peak > state["peak"]:
            state["peak"] = peak
            report(f"{label} {state['n']} ({len(self)} rows) raised the peak")
        return out

    setattr(cls, name, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-b", type=int, default=32)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("--steps", action="store_true")
    args = ap.parse_args()
    mx.random.seed(0)
    model, tokenizer, config = load(args.model, return_config=True)
    tokenizer._eos_token_ids = {}
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    prompts = mx.random.randint(0, vocab, (args.b, args.p)).tolist()
    report("loaded")
    if args.b == 1:
        for trial in ("warm-up", "trial"):
            mx.reset_peak_memory()

            def progress(done, total):
                report(f"{trial}: prompt {done}/{total}")

            for i, r in enumerate(gen.stream_generate(model, tokenizer, prompts[0],
                                                      max_tokens=args.g,
                                                      prompt_progress_callback=progress)):
                if i == 0:
                    report(f"{trial}: first token")
            report(f"{trial} done (stream_generate peak_memory: {r.peak_memory:.3f})")
        return
    if args.steps:
        wrap_steps(gen.GenerationBatch, "next", "decoding step")
    wrap(gen.PromptProcessingBatch, "prompt", "prefill step")
    wrap(gen.PromptProcessingBatch, "generate", "prefilled sequences start decoding")
    for trial in ("warm-up", "trial"):
        mx.reset_peak_memory()
        stats = batch_generate(model, tokenizer, prompts, max_tokens=args.g).stats
        report(f"{trial} done (batch_generate peak_memory, since the reset: {stats.peak_memory:.3f})")


if __name__ == "__main__":
    main()
