"""mlx-lm's `batch_generate` on the committed tiny generation models.

Writes goldens/generate/batch_generate.json: for each case, the model directory
(relative to the repository root), the prompts (token ids of different lengths), the
BatchGenerator settings and the greedy tokens mlx-lm generates for each prompt. Checked
by crates/mlx-server/tests/batch_generate.rs without Python.

    .venv/bin/python xtask/py/batch_generate_oracle.py goldens/generate/batch_generate.json
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm import batch_generate, load

ROOT = Path(__file__).resolve().parents[2]
MODELS = "goldens/generate/models"
TOKENIZER = "goldens/generate/tokenizer"

# (model, settings): prompt lengths differ so prefill pads; a small completion batch
# makes later prompts wait for a slot and join a batch that is already decoding.
CASES = [
    ("llama-small-f32", {}),
    ("llama-small-f32", {"completion_batch_size": 2, "prefill_batch_size": 2}),
    ("llama-small-f32", {"prefill_step_size": 4}),
    ("qwen3-small-bf16", {}),
    ("gemma3_text-small-f32", {"prefill_batch_size": 3}),
]
# Models with recurrent layers (ArraysCache: convolution and SSM / delta-net states),
# from the logits goldens (goldens/models, vocabulary 128); mlx-lm loads each from a
# copy with the generation tokenizer beside it, ours from the directory itself. Not
# mamba and nemotron_h: their blocks ignore the right padding of a batched prefill (in
# mlx-lm as here), so mlx-lm's rows depend on which prompts shared a prefill; our
# engine prefills their prompts one at a time (checked against each prompt alone in
# crates/mlx-engine/tests/batch_generate.rs).
RECURRENT = "goldens/models"
RECURRENT_CASES = [
    ("qwen3_next-small-f32", {}),
    ("qwen3_next-small-f32", {"completion_batch_size": 2, "prefill_batch_size": 2, "prefill_step_size": 4}),
    ("qwen3_5-small-f32", {"prefill_batch_size": 3}),
    ("lfm2-small-f32", {"prefill_step_size": 4}),
    ("mamba2-small-f32", {}),
    ("granitemoehybrid-small-f32", {"prefill_batch_size": 2}),
    ("lfm2_moe-small-f32", {"prefill_step_size": 4}),
    ("falcon_h1-small-f32", {"prefill_batch_size": 2}),
    # Not recurrent: a CacheList of the latent KV and the indexer's keys.
    ("deepseek_v32-small-f32", {"completion_batch_size": 2, "prefill_batch_size": 2}),
    # Gemma 4: fewer caches than layers (the KV-shared layers read an earlier layer's),
    # sliding windows of 4 crossed by prompts and generation.
    ("gemma4_text-small-f32", {"prefill_batch_size": 3}),
    ("gemma4_text-small-f32-moe", {"completion_batch_size": 2, "prefill_step_size": 4}),
    ("gemma3n-small-f32", {"prefill_batch_size": 2}),
]
LENGTHS = [5, 1, 12, 7, 3]
MAX_TOKENS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    args = ap.parse_args()
    cases = []
    tmp = Path(tempfile.mkdtemp())
    runs = [(f"{MODELS}/{n}", s, None) for n, s in CASES]
    runs += [(f"{RECURRENT}/{n}", s, n) for n, s in RECURRENT_CASES]
    for model_dir, settings, copy_name in runs:
        name = model_dir.rsplit("/", 1)[-1]
        load_dir = ROOT / model_dir
        if copy_name is not None:
            load_dir = tmp / copy_name
            if not load_dir.exists():
                shutil.copytree(ROOT / model_dir, load_dir, ignore=shutil.ignore_patterns("oracle.safetensors"))
                for f in (ROOT / TOKENIZER).iterdir():
                    shutil.copy(f, load_dir / f.name)
        model, tokenizer = load(str(load_dir))
        config = json.loads((load_dir / "config.json").read_text())
        vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
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
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
