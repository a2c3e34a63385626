"""mlx-lm's `batch_generate` on the committed tiny generation models.

Writes goldens/generate/batch_generate.json: for each case, the model directory
(relative to the repository root), the prompts (token ids of different lengths), the
BatchGenerator settings and the greedy tokens mlx-lm generates for each prompt. Checked
by crates/mlx-server/tests/batch_generate.rs without Python.

    .venv/bin/python xtask/py/batch_generate_oracle.py goldens/generate/batch_generate.json
"""

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import batch_generate, load

ROOT = Path(__file__).resolve().parents[2]
MODELS = "goldens/generate/models"

# (model, settings): prompt lengths differ so prefill pads; a small completion batch
# makes later prompts wait for a slot and join a batch that is already decoding.
CASES = [
    ("llama-small-f32", {}),
    ("llama-small-f32", {"completion_batch_size": 2, "prefill_batch_size": 2}),
    ("llama-small-f32", {"prefill_step_size": 4}),
    ("qwen3-small-bf16", {}),
    ("gemma3_text-small-f32", {"prefill_batch_size": 3}),
]
LENGTHS = [5, 1, 12, 7, 3]
MAX_TOKENS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    args = ap.parse_args()
    cases = []
    for name, settings in CASES:
        model_dir = f"{MODELS}/{name}"
        model, tokenizer = load(str(ROOT / model_dir))
        vocab = model.args.vocab_size
        mx.random.seed(7)
        prompts = [
            mx.random.randint(0, vocab, (n,)).tolist() for n in LENGTHS
        ]
        r = batch_generate(
            model,
            tokenizer,
            prompts,
            max_tokens=MAX_TOKENS,
            return_token_ids=True,
            **settings,
        )
        eos = sorted(tokenizer.eos_token_ids)
        cases.append(
            {
                "model": model_dir,
                "settings": settings,
                "eos": eos,
                "max_tokens": MAX_TOKENS,
                "prompts": prompts,
                "tokens": r.token_ids,
            }
        )
        print(f"{name} {settings}: {r.token_ids}")
    Path(args.out).write_text(json.dumps(cases, indent=1) + "\n")


if __name__ == "__main__":
    main()
