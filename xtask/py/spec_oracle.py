"""mlx-lm side of the speculative-decoding parity check (`cargo xtask parity`, the
speculative part of generation; xtask/src/gen_parity/speculative.rs).

Subcommands:
  models OUT_DIR --tokenizer DIR
      The tiny target / draft models of the cases (make_tiny_models.py's variants and a
      few of this file's, written like gen_oracle.py's `models`: seeded random weights,
      the committed tokenizer), so every pair shares one tokenizer.
  run CASES_JSON OUT_JSON
      gen_oracle.py's cases (`mlx_lm generate --draft-model ...` runs its own
      speculative_generate_step), plus "cache_prompt_draft": `mlx_lm cache_prompt` whose
      cache list also holds a draft model's caches after the model's, the prompt run
      through both, the layout `speculative_generate_step` reads from a prompt cache
      (mlx_lm.server builds the same list in memory); mlx-lm has no command that writes it.
"""

import argparse
import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_oracle  # noqa: E402
import make_tiny_models as tiny  # noqa: E402
import mlx.core as mx  # noqa: E402

# Variants of make_tiny_models.py used as is.
TINY = [
    "llama-f32-tied",
    "llama-f32-hd32",
    "llama-q4-g32",
    "qwen2-f32-tied",
    "qwen3-f32-tied",
    "qwen3-f32-hd32",
    "gemma3_text-f32-tied",
]
# Our own: a sliding-window llama whose window (128) a short generation never fills, so
# mlx-lm's trimming of its rotating cache is exact; and a smaller llama draft.
EXTRA = {
    "llama-f32-sliding128": (
        "llama", {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 128}, {}),
    "llama-f32-1layer": ("llama", {"num_hidden_layers": 1, "hidden_size": 32,
                                   "intermediate_size": 64, "num_attention_heads": 2,
                                   "num_key_value_heads": 1, "head_dim": 16}, {}),
}


def cmd_models(a):
    import shutil

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = gen_oracle.vocab_size(a.tokenizer)
    mx.set_default_device(mx.cpu)
    variants = {name: tiny.VARIANTS[name] for name in TINY}
    variants.update(EXTRA)
    for name, (arch, overrides, opts) in variants.items():
        dest = out / name
        if dest.exists():
            shutil.rmtree(dest)
        gen_oracle.write_model(out, name, arch, overrides, opts, a.tokenizer, vocab)
        print(f"wrote {dest} (vocab {vocab})")


def cache_prompt_draft(args):
    from mlx_lm import cache_prompt as cp
    from mlx_lm.utils import load

    i = args.index("--draft-model")
    draft_path, rest = args[i + 1], args[:i] + args[i + 2:]
    draft, _ = load(draft_path)
    orig_make, orig_step = cp.make_prompt_cache, cp.generate_step

    def make(model, max_kv_size=None):
        return orig_make(model, max_kv_size) + orig_make(draft)

    def step(y, model, prompt_cache=None, **kw):
        n = len(model.layers)
        yield from orig_step(y, model, prompt_cache=prompt_cache[:n], **kw)
        kw.pop("prompt_progress_callback", None)
        for _ in orig_step(y, draft, prompt_cache=prompt_cache[n:], **kw):
            pass

    out = io.StringIO()
    old_argv = sys.argv
    cp.make_prompt_cache, cp.generate_step = make, step
    sys.argv = ["mlx_lm.cache_prompt"] + rest
    result = {}
    try:
        with contextlib.redirect_stdout(out):
            cp.main()
    except Exception as e:  # noqa: BLE001 - the error text is the result
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=3)
    finally:
        cp.make_prompt_cache, cp.generate_step = orig_make, orig_step
        sys.argv = old_argv
    result["stdout"] = out.getvalue()
    return result


def cmd_run(a):
    cases = json.loads(Path(a.cases).read_text())
    mx.set_default_device(mx.cpu)
    results = {}
    for i, case in enumerate(cases):
        print(f"\rmlx-lm {i + 1}/{len(cases)}", end="", file=sys.stderr, flush=True)
        if case["cmd"] == "cache_prompt_draft":
            results[case["id"]] = cache_prompt_draft(case["args"])
        else:
            results[case["id"]] = gen_oracle.run_case(case)
    print(file=sys.stderr)
    Path(a.out).write_text(json.dumps(results, indent=1, ensure_ascii=False))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("models")
    p.add_argument("out")
    p.add_argument("--tokenizer", required=True)
    p = sub.add_parser("run")
    p.add_argument("cases")
    p.add_argument("out")
    a = ap.parse_args()
    {"models": cmd_models, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    main()
