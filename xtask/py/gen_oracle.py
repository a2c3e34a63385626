"""mlx-lm side of the generation parity check (`cargo xtask parity`, generation part).

Subcommands:
  models OUT_DIR --tokenizer DIR [--only a,b]
      Tiny seeded checkpoints (make_tiny_models.py's variants) whose vocab_size is the
      tokenizer's, with the tokenizer files copied in, so `mlx_lm generate` runs on them
      (xtask passes goldens/generate/tokenizer: a byte-level BPE trained here, small
      enough that a debug build loads it in milliseconds).
  dequantize SRC DST
      A float32 copy of a quantized model (mlx-lm's dequantize_model; tokenizer files
      copied verbatim), so mlx-lm's slow CPU quantized path is avoided.
  run CASES_JSON OUT_JSON
      Runs `mlx_lm generate` / `cache_prompt` / `perplexity` cases in this one process (same
      `main()` as `python -m mlx_lm ...`, one import instead of one per case) and writes
      each case's stdout (or error), the prompt ids and generated tokens.
  goldens OUT_DIR [--root DIR]
      The small committed set in goldens/generate: tokenizer/ (a byte-level BPE trained
      on a fixed text, ChatML template), tiny models using it, an mlx-lm prompt cache
      file, cases.json with mlx-lm's outputs (checked by bins/tests/generate_goldens.rs
      without Python) and mlx_lm_generate_help.txt (bins/tests/help_flags.rs).

A case is {"id", "cmd": "generate"|"cache_prompt"|"perplexity"|"compare_caches", "args": [...],
"stdin": optional text, "reseed": optional bool}. With "reseed", the PRNG is seeded
again after loading: mlx-lm's model construction draws random initial weights from the
global key sequence, which shifts every later sample; "reseed" shows whether the rest
of sampling matches when that shift is taken out.
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import shutil
import sys
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_tiny_models as tiny  # noqa: E402
import mlx.core as mx  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

SMALL = tiny.SMALL
GOLDEN_VARIANTS = {
    "llama-small-f32": ("llama", dict(SMALL, tie_word_embeddings=False), {}),
    "llama-small-f32-hd32": (
        "llama", dict(SMALL, num_attention_heads=2, num_key_value_heads=1, head_dim=32), {}),
    "qwen3-small-bf16": ("qwen3", dict(SMALL, head_dim=8), {"dtype": "bfloat16"}),
    "gemma3_text-small-f32": ("gemma3_text", dict(SMALL, head_dim=8, query_pre_attn_scalar=8), {}),
    "llama-small-q4-g32": ("llama", dict(SMALL), {"quant": {"bits": 4, "group_size": 32}}),
}

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model writes short stories about
dragons, castles and the sea. Hello there! How are you today? I am fine, thank you.
Tell me a story about a dragon who lived in a castle by the sea. Once upon a time,
there was a tiny model that could only say a few words, but it said them well.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Unicode: café, naïve, 東京, 🙂.
def hello(name):\n    return f"hello {name}"\n
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# make_tiny_models draws embeddings from N(0, 1): with tied embeddings the last token's
# own logit then dominates and every model repeats one token. Smaller embeddings let
# the layers decide, which gives varied text (and samplers something to choose from).
EMBED_SCALE = 0.1


def random_weights(config, rng):
    weights = _random_weights(config, rng)
    for k in weights:
        if "embed_tokens" in k or k == "model.transformer.wte.weight":  # olmo's is `wte`
            weights[k] = weights[k] * EMBED_SCALE
    return weights


_random_weights = tiny.random_weights
tiny.random_weights = random_weights


def vocab_size(tok_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def copy_tokenizer(tok_dir, dest):
    for f in TOKENIZER_FILES:
        src = Path(tok_dir) / f
        if src.is_file():
            shutil.copy(src, dest / f)


def write_model(out, name, arch, overrides, opts, tok_dir, vocab):
    overrides = dict(overrides, vocab_size=vocab)
    if arch == "gemma2":
        # mlx_lm.load validates the config strictly: this field must be an int.
        qpas = overrides.get("query_pre_attn_scalar", tiny.ARCHS[arch]["query_pre_attn_scalar"])
        overrides["query_pre_attn_scalar"] = int(qpas)
    if arch == "olmo":
        # OLMo's embedding (and logits) are `embedding_size` wide.
        overrides["embedding_size"] = vocab
    if arch == "phixtral":
        # Phixtral's vocabulary is `num_vocab`.
        overrides["num_vocab"] = vocab
    if arch == "gemma4_text" and overrides.get("hidden_size_per_layer_input", 1):
        # The per-layer embeddings are indexed by the same token ids.
        overrides["vocab_size_per_layer_input"] = vocab
    if "quant" in opts:
        dest = tiny.write_quantized(out, name, arch, overrides, opts)
    else:
        dest = tiny.write_dense(out, name, arch, overrides, opts)
    copy_tokenizer(tok_dir, dest)
    return dest


def cmd_models(a):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocab_size(a.tokenizer)
    mx.set_default_device(mx.cpu)
    # The variants come from the caller (xtask's gen_parity/cases.rs `TINY`).
    for name in [s for s in a.variants.split(",") if s]:
        arch, overrides, opts = tiny.VARIANTS[name]
        dest = out / name
        if dest.exists():
            shutil.rmtree(dest)
        write_model(out, name, arch, overrides, opts, a.tokenizer, vocab)
        print(f"wrote {dest} (vocab {vocab})")


def cmd_dequantize(a):
    from mlx.utils import tree_map
    from mlx_lm.utils import dequantize_model, load_model, save_config, save_model

    src, dst = Path(a.src), Path(a.dst)
    model, config = load_model(src)
    model = dequantize_model(model)
    model.update(tree_map(lambda v: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v,
                          model.parameters()))
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    if dst.exists():
        shutil.rmtree(dst)
    save_model(dst, model)
    save_config(config, config_path=dst / "config.json")
    copy_tokenizer(src, dst)
    print(f"wrote {dst}")


class Recorder:
    """Wraps mlx_lm.generate's stream_generate / load to see tokens and reseed."""

    def __init__(self, gen_mod):
        self.mod = gen_mod
        self.orig_stream = gen_mod.stream_generate
        self.orig_load = gen_mod.load
        self.prompt = None
        self.tokens = []
        self.reseed = None

    def stream_generate(self, model, tokenizer, prompt, **kw):
        self.prompt = list(prompt) if not isinstance(prompt, str) else prompt
        for r in self.orig_stream(model, tokenizer, prompt, **kw):
            self.tokens.append(int(r.token))
            yield r

    def load(self, *args, **kw):
        out = self.orig_load(*args, **kw)
        if self.reseed is not None:
            mx.random.seed(self.reseed)
        return out

    def __enter__(self):
        self.mod.stream_generate = self.stream_generate
        self.mod.load = self.load
        return self

    def __exit__(self, *exc):
        self.mod.stream_generate = self.orig_stream
        self.mod.load = self.orig_load


def seed_of(args):
    if "--seed" in args:
        return int(args[args.index("--seed") + 1])
    return None


def compare_caches(a, b):
    arrays_a, meta_a = mx.load(a, return_metadata=True)
    arrays_b, meta_b = mx.load(b, return_metadata=True)
    diffs = []
    if meta_a != meta_b:
        keys = sorted(set(meta_a) | set(meta_b))
        diffs += [f"metadata {k}: {meta_a.get(k)!r} vs {meta_b.get(k)!r}" for k in keys
                  if meta_a.get(k) != meta_b.get(k)]
    for k in sorted(set(arrays_a) | set(arrays_b)):
        x, y = arrays_a.get(k), arrays_b.get(k)
        if x is None or y is None:
            diffs.append(f"tensor {k} only in one file")
        elif x.dtype != y.dtype or x.shape != y.shape:
            diffs.append(f"tensor {k}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        elif not mx.array_equal(x, y).item():
            diffs.append(f"tensor {k}: values differ")
    return "identical" if not diffs else "; ".join(diffs[:4])


def local_datasets():
    """A stand-in for Hugging Face's `datasets` package (not installed, and no hub here):
    `load_dataset(DIR, split)` reads DIR/train.jsonl for "train" and "train[:N]", the
    splits mlx_lm.perplexity asks for, so its own data code runs unchanged."""
    mod = types.ModuleType("datasets")

    def load_dataset(path, split=None, **_):
        rows = [json.loads(l) for l in (Path(path) / "train.jsonl").read_text().splitlines()
                if l.strip()]
        if split == "train":
            return rows
        m = re.fullmatch(r"train\[:(\d+)\]", split or "")
        if m:
            return rows[: int(m.group(1))]
        raise ValueError(f"split {split!r} is not in the local stand-in")

    mod.load_dataset = load_dataset
    mod.exceptions = types.SimpleNamespace(DatasetNotFoundError=FileNotFoundError)
    return mod


def run_case(case):
    cmd = case["cmd"]
    if cmd == "compare_caches":
        return {"stdout": compare_caches(*case["args"])}
    module = importlib.import_module(f"mlx_lm.{cmd}")
    exact = []
    if cmd == "perplexity":
        sys.modules["datasets"] = local_datasets()
        orig_eval = module.eval_ppl

        def eval_ppl(*a, **k):
            ppl, se = orig_eval(*a, **k)
            exact.extend([ppl, se])
            return ppl, se

        module.eval_ppl = eval_ppl
    out = io.StringIO()
    old_argv, old_stdin = sys.argv, sys.stdin
    sys.argv = [f"mlx_lm.{cmd}"] + case["args"]
    sys.stdin = io.StringIO(case.get("stdin", ""))
    result = {}
    try:
        with contextlib.redirect_stdout(out):
            if cmd == "generate":
                with Recorder(module) as rec:
                    if case.get("reseed"):
                        rec.reseed = seed_of(case["args"])
                    module.main()
                result["prompt_ids"] = rec.prompt
                result["tokens"] = rec.tokens
            else:
                module.main()
    except SystemExit as e:
        result["error"] = f"exit {e.code}"
    except Exception as e:  # noqa: BLE001 - the error text is the result
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=3)
    finally:
        sys.argv, sys.stdin = old_argv, old_stdin
        if cmd == "perplexity":
            module.eval_ppl = orig_eval
    if exact:
        # repr: the shortest text that reads back to the same double (JSON numbers
        # may not, through a parser without exact float reading).
        result["exact"] = [repr(float(x)) for x in exact]
    result["stdout"] = out.getvalue()
    return result


def cmd_run(a):
    cases = json.loads(Path(a.cases).read_text())
    mx.set_default_device(mx.cpu)
    results = {}
    for i, case in enumerate(cases):
        print(f"\rmlx-lm {i + 1}/{len(cases)}", end="", file=sys.stderr, flush=True)
        results[case["id"]] = run_case(case)
    print(file=sys.stderr)
    Path(a.out).write_text(json.dumps(results, indent=1, ensure_ascii=False))


def key_draws(model_dir):
    """How many keys mlx-lm's model construction takes from the global sequence."""
    from mlx_lm.utils import load_model

    mx.random.seed(0)
    load_model(Path(model_dir))
    after = mx.random.state[0]
    mx.random.seed(0)
    for n in range(1 << 16):
        if mx.array_equal(mx.random.state[0], after).item():
            return n
        mx.random.uniform()
    return -1


def write_help(dest):
    """`mlx_lm generate --help` at a fixed width (argparse wraps by $COLUMNS)."""
    os.environ["COLUMNS"] = "100"
    from mlx_lm.generate import setup_arg_parser

    parser = setup_arg_parser()
    parser.prog = "mlx_lm.generate"
    dest.write_text(parser.format_help())


def write_small_tokenizer(dest):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([CORPUS], trainer)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in enumerate(SPECIALS)
        },
        "bos_token": "<|im_start|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 2048,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<|endoftext|>",
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return tok.get_vocab_size(with_added_tokens=True)


# Golden cases: (name, model, args, options). Paths are relative to the repository
# root, where the test runs the binary. Ours runs with the same flags (a quantized
# model stays quantized on the CPU by default, as in mlx-lm).
def golden_cases(models_rel, pc_rel):
    m = lambda n: f"{models_rel}/{n}"  # noqa: E731
    chat = ["--prompt", "Tell me a story", "--max-tokens", "12"]
    return [
        ("llama-greedy-chat", m("llama-small-f32"), chat + ["--temp", "0"], {}),
        ("llama-greedy-raw-verbose-false", m("llama-small-f32"),
         ["--prompt", "Hello there", "--ignore-chat-template", "--max-tokens", "16", "--verbose", "False"], {}),
        ("llama-top-p-seed", m("llama-small-f32"),
         chat + ["--temp", "0.8", "--top-p", "0.9", "--seed", "7", "--verbose", "False"], {"seeded": True}),
        ("llama-top-k-seed", m("llama-small-f32"),
         chat + ["--temp", "1.0", "--top-k", "5", "--seed", "3", "--verbose", "False"], {"seeded": True}),
        ("llama-min-p-seed", m("llama-small-f32"),
         chat + ["--temp", "0.7", "--min-p", "0.1", "--seed", "11", "--verbose", "False"], {"seeded": True}),
        # mlx-lm's llama defines make_cache, so it ignores --max-kv-size; qwen3 rotates.
        ("llama-max-kv-size-ignored", m("llama-small-f32"),
         ["--prompt", "Once upon a time, there was a tiny model", "--ignore-chat-template",
          "--max-kv-size", "24", "--max-tokens", "24", "--verbose", "False"], {}),
        ("qwen3-max-kv-size", m("qwen3-small-bf16"),
         ["--prompt", "Once upon a time, there was a tiny model", "--ignore-chat-template",
          "--max-kv-size", "24", "--max-tokens", "24", "--verbose", "False"], {}),
        ("qwen3-max-kv-size-seed", m("qwen3-small-bf16"),
         ["--prompt", "Once upon a time, there was a tiny model", "--ignore-chat-template",
          "--max-kv-size", "24", "--max-tokens", "24", "--temp", "0.9", "--seed", "13", "--verbose", "False"],
         {"seeded": True}),
        ("llama-system-prefill-step", m("llama-small-f32"),
         ["--prompt", "Hello", "--system-prompt", "Be brief.", "--prefill-step-size", "4",
          "--max-tokens", "12", "--verbose", "False"], {}),
        ("llama-hd32-kv-bits", m("llama-small-f32-hd32"),
         chat + ["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "4", "--verbose", "False"], {}),
        ("llama-prompt-cache", m("llama-small-f32"),
         ["--prompt-cache-file", pc_rel, "--prompt", " about dragons", "--max-tokens", "10", "--verbose", "False"],
         {"no_model_flag": True}),
        ("qwen3-bf16-greedy", m("qwen3-small-bf16"), chat + ["--verbose", "False"], {}),
        ("qwen3-bf16-top-p-seed", m("qwen3-small-bf16"),
         chat + ["--temp", "0.9", "--top-p", "0.8", "--seed", "5", "--verbose", "False"], {"seeded": True}),
        ("gemma3-sliding-greedy", m("gemma3_text-small-f32"),
         ["--prompt", "Once upon a time", "--max-tokens", "16", "--verbose", "False"], {}),
        ("llama-q4-greedy", m("llama-small-q4-g32"), chat + ["--verbose", "False"], {}),
    ]


def cmd_goldens(a):
    out = Path(a.out)
    root = Path(a.root).resolve()
    if out.exists():
        shutil.rmtree(out)
    tok_dir = out / "tokenizer"
    vocab = write_small_tokenizer(tok_dir)
    models = out / "models"
    mx.set_default_device(mx.cpu)
    for name, (arch, overrides, opts) in GOLDEN_VARIANTS.items():
        write_model(models, name, arch, overrides, opts, tok_dir, vocab)
    write_help(out / "mlx_lm_generate_help.txt")
    rel = lambda p: os.path.relpath(p, root)  # noqa: E731
    pc = out / "llama-small-f32.prompt-cache.safetensors"
    os.chdir(root)
    res = run_case({"cmd": "cache_prompt", "args": [
        "--model", rel(models / "llama-small-f32"), "--prompt-cache-file", rel(pc), "--prompt", "Tell me a story"]})
    if "error" in res:
        sys.exit(f"cache_prompt failed: {res['error']}")
    cases = []
    draws = {}
    for name, model, args, opts in golden_cases(rel(models), rel(pc)):
        full = args if opts.get("no_model_flag") else ["--model", model] + args
        res = run_case({"cmd": "generate", "args": full})
        if "error" in res:
            sys.exit(f"{name}: mlx-lm failed: {res['error']}")
        if model not in draws:
            draws[model] = key_draws(model)
        cases.append({
            "name": name,
            "model": model,
            "args": full,
            "ours_extra_args": [],
            "seeded": bool(opts.get("seeded")),
            "stdout": res["stdout"],
            "prompt_ids": res["prompt_ids"],
            "tokens": res["tokens"],
            "key_draws": draws[model],
        })
        print(f"{name}: {res['stdout'].strip()!r}")
    (out / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("models")
    p.add_argument("out")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--variants", required=True, help="make_tiny_models.py variants, comma-separated")
    p = sub.add_parser("dequantize")
    p.add_argument("src")
    p.add_argument("dst")
    p = sub.add_parser("run")
    p.add_argument("cases")
    p.add_argument("out")
    p = sub.add_parser("goldens")
    p.add_argument("out")
    p.add_argument("--root", default=".")
    a = ap.parse_args()
    {"models": cmd_models, "dequantize": cmd_dequantize, "run": cmd_run, "goldens": cmd_goldens}[a.cmd](a)


if __name__ == "__main__":
    main()
