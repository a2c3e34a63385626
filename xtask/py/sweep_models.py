"""The seeded config sweep of the generation parity check (`cargo xtask parity`).

Each supported architecture gets three tiny checkpoints whose switches are drawn from a
fixed seed: the architecture's own switches (the make_tiny_models.py variants of that
model_type: biases, tied or untied heads, rope variants, sliding windows, layer lists,
wrapped multimodal configs), then the ones every config has: the GQA ratio, an explicit
head_dim, the weights' dtype, quantization (bits 2-8, group sizes 32, 64 and 128,
mxfp4 / mxfp8) and where the EOS token is declared (only the tokenizer's
`tokenizer_config.json`, `config.json`'s `eos_token_id`, or a list in
`generation_config.json`). The EOS token is the third token mlx-lm's greedy decoding
produces, so both sides must stop on it (greedy) or may sample it (seeded).

Every model is loaded and run by mlx-lm once before it is kept: a draw mlx-lm cannot
load or run is redrawn without its optional switches, so every case is a comparison.

usage: sweep_models.py OUT_DIR --tokenizer DIR [--count-per-arch 3]
writes OUT_DIR/<name>/ and OUT_DIR/sweep.json: [{"name", "arch", "switches", "seed",
"key_draws"}] (key_draws: how many keys mlx-lm's load takes from the global sequence)
"""

import argparse
import json
import os
import random
import shutil
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_oracle as g  # noqa: E402  (installs the small-embedding random weights)
import make_tiny_models as tiny  # noqa: E402
import mlx.core as mx  # noqa: E402

# The architectures swept: every model_type of the first 23 ports and the mistral alias.
# Those added since (issue 26) have their own generation cases in cases.rs's TINY list;
# `MLX_SWEEP_ALL=1 cargo xtask parity` sweeps every model_type that make_tiny_models.py
# has variants of (slower: three configs of each, ~70 more types), which is how a new
# architecture is checked against the sweep before it joins this list.
SWEEP_ALL = os.environ.get("MLX_SWEEP_ALL", "") not in ("", "0")
SWEPT = {"cohere2", "exaone4", "gemma", "gemma2", "gemma3", "gemma3_text", "glm4", "gpt_oss",
         "granite", "llama", "mistral", "ministral3", "mistral3", "mixtral", "olmo2", "olmo3",
         "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "starcoder2"}


# model_type as written in config.json -> the make_tiny_models variants that carry its
# own switches (the first one is the plain base).
def arch_variants():
    by_type = {}
    for name, (arch, overrides, opts) in tiny.VARIANTS.items():
        if "quant" in opts or opts.get("hf_mxfp4"):
            continue  # quantization is a sweep switch of its own
        model_type = overrides.get("model_type", tiny.ARCHS[arch]["model_type"])
        if opts.get("wrap_gemma3"):
            model_type = "gemma3"
        elif opts.get("wrap_mistral3"):
            model_type = "mistral3"
        if model_type in SWEPT or SWEEP_ALL:
            by_type.setdefault(model_type, []).append(name)
    return by_type


# Architectures whose config reads these keys (the others ignore them).
READS_HEAD_DIM = {"llama", "mistral", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "gemma3",
                  "cohere2", "exaone4", "glm4", "gpt_oss", "seed_oss", "ministral3", "mistral3", "olmo3"}
TIES = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "granite", "olmo2", "starcoder2", "seed_oss",
        "smollm3", "ministral3", "olmo3", "exaone4", "phi3", "glm4", "qwen3_moe", "mixtral"}
WEIGHTS = ["float32", "bfloat16", "float16",
           ("affine", 4, 64), ("affine", 4, 32), ("affine", 8, 32), ("affine", 2, 64), ("affine", 3, 32),
           ("affine", 5, 64), ("affine", 6, 32), ("affine", 8, 64), ("affine", 4, 128), ("mxfp4",), ("mxfp8",)]
EOS = ["tokenizer", "config", "generation_config"]
PROMPT = ["--prompt", "Tell me a story", "--max-tokens", "8", "--verbose", "False"]


def draw(model_type, variant, index, rng):
    """The switches of one sweep config: (name, arch, overrides, opts, description)."""
    arch, overrides, opts = tiny.VARIANTS[variant]
    overrides, opts = dict(overrides), dict(opts)
    opts.pop("extras", None)
    base = {**tiny.BASE, **tiny.ARCHS[arch], **overrides}
    desc = [variant]
    heads = base["num_attention_heads"]
    if "num_key_value_heads" not in overrides:
        kv = rng.choice([d for d in (1, 2, heads) if heads % d == 0])
        overrides["num_key_value_heads"] = kv
        desc.append(f"kv{kv}")
    if model_type in READS_HEAD_DIM and "head_dim" not in overrides and rng.random() < 0.5:
        hd = rng.choice([8, 32])
        overrides["head_dim"] = hd
        if "query_pre_attn_scalar" in base:
            overrides["query_pre_attn_scalar"] = type(base["query_pre_attn_scalar"])(hd)
        desc.append(f"hd{hd}")
    if model_type in TIES and rng.random() < 0.5:
        tie = not base.get("tie_word_embeddings", True)
        overrides["tie_word_embeddings"] = tie
        desc.append("tied" if tie else "untied")
    weights = WEIGHTS[(index * 5 + zlib.crc32(model_type.encode())) % len(WEIGHTS)]
    if isinstance(weights, str):
        if opts.get("dtype", "float32") == "float32":
            opts["dtype"] = weights
        desc.append(opts.get("dtype", "float32"))
    else:
        opts["quant"] = ({"mode": weights[0]} if weights[0] != "affine"
                         else {"bits": weights[1], "group_size": weights[2]})
        if weights[0] == "affine" and weights[2] == 128:
            # Group size 128 needs input dims that are multiples of 128.
            overrides["hidden_size"] = 128
            overrides["intermediate_size"] = 256
        if rng.random() < 0.5:
            opts["dtype"] = "bfloat16"
        desc.append("-".join(str(w) for w in weights) + ("-bf16" if opts.get("dtype") else ""))
    eos = EOS[index % len(EOS)]
    desc.append(f"eos-{eos}")
    name = f"{model_type}-{index}"
    return name, arch, overrides, opts, eos, " ".join(desc)


def mlx_lm_tokens(path, extra=()):
    """mlx-lm's tokens for the sweep prompt (or an exception)."""
    gen_mod = g.importlib.import_module("mlx_lm.generate")

    rec = g.Recorder(gen_mod)
    out = g.io.StringIO()
    old = sys.argv
    sys.argv = ["mlx_lm.generate", "--model", str(path), *PROMPT, *extra]
    try:
        with g.contextlib.redirect_stdout(out), rec:
            gen_mod.main()
    finally:
        sys.argv = old
    return rec.tokens


def declare_eos(path, eos, token):
    """Declares `token` as the EOS token where `eos` says."""
    if eos == "config":
        config = json.loads((path / "config.json").read_text())
        config["eos_token_id"] = token
        (path / "config.json").write_text(json.dumps(config, indent=2))
    elif eos == "generation_config":
        tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
        vocab = json.loads((path / "tokenizer.json").read_text())["added_tokens"]
        im_end = next(t["id"] for t in vocab if t["content"] == tok_cfg["eos_token"])
        (path / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [im_end, token], "do_sample": True}, indent=2))


def write_one(out, name, arch, overrides, opts, eos, tok, vocab):
    path = g.write_model(out, name, arch, overrides, opts, tok, vocab)
    tokens = mlx_lm_tokens(path)
    if eos != "tokenizer":
        if len(tokens) < 3:
            raise RuntimeError(f"greedy decoding gave {len(tokens)} tokens")
        eos_token = tokens[2]
        declare_eos(path, eos, eos_token)
        tokens = mlx_lm_tokens(path)
        if tokens[-1:] != [eos_token] or len(tokens) > 3:
            raise RuntimeError(f"the declared EOS did not stop greedy decoding: {tokens}")
    mlx_lm_tokens(path, ["--temp", "0.9", "--seed", "1"])
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--count-per-arch", type=int, default=3)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    vocab = g.vocab_size(a.tokenizer)
    manifest = []
    by_type = arch_variants()
    for model_type in sorted(by_type):
        variants = by_type[model_type]
        for index in range(a.count_per_arch):
            rng = random.Random(zlib.crc32(f"{model_type}/{index}".encode()))
            variant = variants[index % len(variants)]
            name, arch, overrides, opts, eos, desc = draw(model_type, variant, index, rng)
            try:
                write_one(out, name, arch, overrides, opts, eos, a.tokenizer, vocab)
            except Exception as e:  # noqa: BLE001 - redrawn without the optional switches
                print(f"sweep: {name} ({desc}) does not run in mlx-lm ({type(e).__name__}: "
                      f"{str(e)[:120]}); redrawn plain", file=sys.stderr)
                shutil.rmtree(out / name, ignore_errors=True)
                arch, overrides, opts = tiny.VARIANTS[variant]
                opts = {k: v for k, v in opts.items() if k != "extras"}
                desc = f"{variant} eos-{eos} (redrawn)"
                try:
                    write_one(out, name, arch, dict(overrides), opts, eos, a.tokenizer, vocab)
                except Exception as e2:  # noqa: BLE001 - mlx_lm generate cannot run it at all
                    print(f"sweep: {name} skipped: mlx_lm generate cannot run {variant} "
                          f"({type(e2).__name__}: {str(e2)[:120]})", file=sys.stderr)
                    shutil.rmtree(out / name, ignore_errors=True)
                    continue
            manifest.append({"name": name, "arch": model_type, "switches": desc,
                             "seed": zlib.crc32(name.encode()) % 1000,
                             "key_draws": g.key_draws(out / name)})
            print(f"sweep: {name}: {desc}", file=sys.stderr)
    (out / "sweep.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
