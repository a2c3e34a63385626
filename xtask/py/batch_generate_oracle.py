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
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm import batch_generate, load
from mlx_lm.utils import load_model, load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import olmo_compat  # noqa: E402,F401  (olmo.py runs only with it)

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
# mamba, nemotron_h, jamba, olmo_hybrid and recurrent_gemma: their blocks ignore the right padding of a batched prefill (in
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
    ("plamo2-small-f32", {"prefill_batch_size": 2, "prefill_step_size": 4}),
    # Gear: convolution windows per row and sliding windows of 4 crossed by prompts.
    ("gear-small-f32", {"prefill_batch_size": 2, "prefill_step_size": 4}),
    # LongCat-Flash: a CacheList of two latent KV caches per layer.
    ("longcat_flash-small-f32", {"completion_batch_size": 2, "prefill_batch_size": 2}),
    # Not recurrent: a CacheList of the latent KV and the indexer's keys.
    ("deepseek_v32-small-f32", {"completion_batch_size": 2, "prefill_batch_size": 2}),
    # Gemma 4: fewer caches than layers (the KV-shared layers read an earlier layer's),
    # sliding windows of 4 crossed by prompts and generation.
    ("gemma4_text-small-f32", {"prefill_batch_size": 3}),
    ("gemma4_text-small-f32-moe", {"completion_batch_size": 2, "prefill_step_size": 4}),
    ("gemma3n-small-f32", {"prefill_batch_size": 2}),
    # LFM2-VL: LFM2's convolution and attention layers under language_model.
    ("lfm2-vl-small-f32", {"prefill_batch_size": 2}),
]
# Every other architecture with a committed logits golden, each under one of three
# batch settings in turn (a 2-prompt prefill, a 2-row completion batch that later
# prompts join while it decodes, 4-token prefill chunks). Not here: llama4 (mlx-lm's
# ChunkedKVCache cannot batch; ours serves it unbatched), gemma2-small-f32 (its golden
# config's query_pre_attn_scalar fails mlx-lm's strict config check in BatchGenerator's
# load path) and gpt_bigcode (mlx-lm's batched prefill of it raises).
SETTINGS = [
    {"prefill_batch_size": 2},
    {"completion_batch_size": 2, "prefill_batch_size": 2},
    {"prefill_step_size": 4},
]
ARCH_CASES = [
    (name, SETTINGS[i % len(SETTINGS)])
    for i, name in enumerate([
        "baichuan_m1-small-f32", "cohere-small-f32-qknorm", "cohere2-small-f32",
        "deepseek_v2-small-f32", "deepseek_v3-small-f32", "dots1-small-f32",
        "ernie4_5-small-f32", "ernie4_5_moe-small-f32", "exaone-small-f32",
        "exaone4-small-f32-hybrid", "exaone_moe-small-f32", "gemma-small-f32",
        "glm4-small-f32", "glm4_moe-small-f32", "glm4_moe_lite-small-f32", "gpt2-small-f32",
        "gpt_neox-small-f32", "gpt_oss-small-f32", "granite-small-f32", "granitemoe-small-f32",
        "helium-small-f32", "hunyuan-small-f32", "hunyuan_v1_dense-small-f32",
        "internlm2-small-f32-bias", "internlm3-small-f32", "kimi_k25-small-f32",
        "llama4_text-small-f32", "mimo-small-f32", "minicpm-small-f32", "minicpm3-small-f32",
        "minimax-small-f32", "ministral3-small-f32-sliding", "mixtral-small-f32",
        "nemotron-small-f32", "olmo-small-f32", "olmo2-small-f32", "olmo3-small-f32",
        "olmoe-small-f32", "phi-small-f32", "phi3-small-f32-longrope",
        "phimoe-small-f32-longrope", "qwen2-small-f32", "qwen2_moe-small-f32",
        "qwen2_vl-small-f32", "qwen3_5_moe-small-f32", "qwen3_moe-small-f32",
        "qwen3_vl-small-f32", "qwen3_vl_moe-small-f32", "seed_oss-small-f32",
        "smollm3-small-f32", "stablelm-small-f32-qknorm", "starcoder2-small-f32",
        "bailing_moe-small-f32", "glm_moe_dsa-small-f32", "solar_open-small-f32",
        "apertus-small-f32", "qwen-small-f32", "gptj-small-f32", "glm-small-f32",
        "openelm-small-f32", "nanochat-small-f32", "mistral4-small-f32", "deepseek-small-f32",
        "dbrx-small-f32", "phixtral-small-f32", "telechat3-small-f32", "nanbeige-small-f32",
        "lille-130m-small-f32", "pixtral-small-f32", "kimi_vl-small-f32", "nemotron-nas-small-f32",
        "youtu_llm-small-f32", "Klear-small-f32", "mellum-small-f32",
        "talkie-small-f32", "plamo-small-f32", "iquestloopcoder-small-f32",
        "plamo3-small-f32", "muse_glimmer-small-f32", "spark2_5-small-f32",
        "laguna-small-f32", "mimo_v2_flash-small-f32", "afmoe-small-f32", "step3p5-small-f32",
    ])
]
# Configs transformers refuses (Gear's "conv_mixer" layer type): mlx-lm's model, the
# tokenizer loaded from its own directory.
TOKENIZER_APART = {"gear-small-f32"}
LENGTHS = [5, 1, 12, 7, 3]
MAX_TOKENS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    args = ap.parse_args()
    cases = []
    tmp = Path(tempfile.mkdtemp())
    runs = [(f"{MODELS}/{n}", s, None) for n, s in CASES]
    runs += [(f"{RECURRENT}/{n}", s, n) for n, s in RECURRENT_CASES + ARCH_CASES]
    for model_dir, settings, copy_name in runs:
        name = model_dir.rsplit("/", 1)[-1]
        load_dir = ROOT / model_dir
        if copy_name is not None:
            load_dir = tmp / copy_name
            if not load_dir.exists():
                shutil.copytree(ROOT / model_dir, load_dir, ignore=shutil.ignore_patterns("oracle.safetensors"))
                for f in (ROOT / TOKENIZER).iterdir():
                    shutil.copy(f, load_dir / f.name)
        if name in TOKENIZER_APART:
            # transformers' strict check refuses this config.json when the tokenizer is
            # loaded beside it: the same tokenizer files, read from their own directory.
            model, config = load_model(load_dir)
            tokenizer = load_tokenizer(ROOT / TOKENIZER, eos_token_ids=config.get("eos_token_id", None))
        else:
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
