"""mlx-lm's side of the convert parity check (`cargo xtask parity`, convert section).

usage:
  convert_oracle.py prepare SPECS_JSON
      [{"src": dir, "dest": dir, "torch_dtype": null | "bfloat16", "config": {overrides}}]: copy each
      tiny checkpoint and give it a tokenizer (a 128-token word-level one made with the
      `tokenizers` package) and a generation config, so mlx_lm.convert can load it
  convert_oracle.py convert CASES_JSON
      run mlx_lm.convert (the same function its CLI calls) for every case:
      [{"src": dir, "out": dir, "args": [mlx_lm.convert CLI flags...]}, ...]
      a case mlx-lm refuses is recorded in OUT.error instead
  convert_oracle.py generate OUT_JSON DIR [DIR ...]
      load each directory with mlx_lm.load (model and tokenizer) and write the greedy
      continuation of PROMPT (full forward passes, argmax) for each: {dir: [ids]}
  convert_oracle.py generate-text OUT_JSON DIR TEXT N
      like generate, for a real model: the prompt is TEXT encoded by the model's own
      tokenizer, N tokens
  convert_oracle.py goldens ROOT
      write goldens/convert/: mlx_lm.convert outputs for a few small golden checkpoints
      (GOLDEN_CASES) and dynamic_quant's pieces (sensitivities, threshold, perplexity) on
      fixed token data, for `cargo test -p mlx-quant` without Python
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx

import olmo_compat  # noqa: F401  (mlx-lm's olmo.py made runnable, see there)

PROMPT = [1, 17, 33, 2, 90, 5, 64]
STEPS = 6


def prepare(src, dest, torch_dtype=None, overrides=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    src, dest = Path(src), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("oracle.safetensors"))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, 128)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(dest))
    with open(dest / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": 2, "bos_token_id": 1}, f, indent=2)
    if torch_dtype or overrides:
        with open(dest / "config.json") as f:
            config = json.load(f)
        if torch_dtype:
            config["torch_dtype"] = torch_dtype
        config.update(overrides or {})
        with open(dest / "config.json", "w") as f:
            json.dump(config, f, indent=2)


def convert(cases_json):
    from mlx_lm.convert import configure_parser
    from mlx_lm.convert import convert as mlx_convert

    with open(cases_json) as f:
        cases = json.load(f)
    parser = configure_parser()
    for case in cases:
        out = Path(case["out"])
        if out.exists():
            shutil.rmtree(out)
        args = parser.parse_args(["--hf-path", case["src"], "--mlx-path", str(out)] + case["args"])
        try:
            mlx_convert(**vars(args))
        except Exception as e:  # recorded: ours must refuse the same cases
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            (out / "error").write_text(f"{type(e).__name__}: {e}")
        print(f"convert_oracle: {out.name}: {' '.join(case['args']) or '(no flags)'}", flush=True)


def greedy(model, prompt, steps):
    tokens = list(prompt)
    for _ in range(steps):
        logits = model(mx.array([tokens]))
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
    return tokens[len(prompt):]


def generate(out_json, dirs):
    from mlx_lm import load

    result = {}
    for d in dirs:
        try:
            model, _tokenizer = load(d)
            result[d] = greedy(model, PROMPT, STEPS)
        except Exception as e:  # e.g. MLX's CPU GatherMM is float32-only
            result[d] = {"error": f"{type(e).__name__}: {e}"}
    with open(out_json, "w") as f:
        json.dump(result, f, indent=1)


def generate_text(out_json, d, text, n):
    from mlx_lm import load

    model, tokenizer = load(d)
    prompt = tokenizer.encode(text)
    with open(out_json, "w") as f:
        json.dump({"prompt": prompt, "tokens": greedy(model, prompt, int(n))}, f)


GOLDEN_CASES = {
    "llama-mixed_3_6-g32": ("llama-small-f32-tied", ["-q", "--quant-predicate", "mixed_3_6", "--q-group-size", "32"]),
    "llama-q3-g32-bf16": ("llama-small-f32-tied", ["-q", "--q-bits", "3", "--q-group-size", "32", "--dtype", "bfloat16"]),
    "llama-nvfp4": ("llama-small-f32-tied", ["-q", "--q-mode", "nvfp4"]),
    "llama-q4-dequantized-f16": ("llama-small-q4-g32", ["-d", "--dtype", "float16"]),
    "mixtral-q8-g32": ("mixtral-small-f32", ["-q", "--q-bits", "8", "--q-group-size", "32"]),
}
DYNAMIC_MODEL = "llama-small-f32-tied"


def dynamic_tokens():
    return mx.array([[(r * 53 + i * 37 + 11) % 128 for i in range(16)] for r in range(6)], dtype=mx.int32)


def goldens(root):
    import tempfile

    from mlx_lm.quant.dynamic_quant import estimate_sensitivities, estimate_threshold, eval_ppl
    from mlx_lm.utils import load_model

    root = Path(root)
    out = root / "goldens/convert"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for name, (src, args) in GOLDEN_CASES.items():
            prepared = Path(tmp) / src
            if not prepared.exists():
                prepare(root / "goldens/models" / src, prepared)
            cases.append({"src": str(prepared), "out": str(out / name), "args": args})
        with open(Path(tmp) / "cases.json", "w") as f:
            json.dump(cases, f)
        convert(str(Path(tmp) / "cases.json"))
    for name in GOLDEN_CASES:
        for f in (out / name).iterdir():
            if f.name not in ("config.json", "model.safetensors", "model.safetensors.index.json", "README.md"):
                f.unlink()
    with open(out / "cases.json", "w") as f:
        json.dump({k: {"source": s, "args": a} for k, (s, a) in GOLDEN_CASES.items()}, f, indent=1)

    model, _ = load_model(root / "goldens/models" / DYNAMIC_MODEL)
    data = dynamic_tokens()
    mx.random.seed(123)
    perm = mx.random.permutation(data.shape[0])
    sens = estimate_sensitivities(model, data, 4, 32, 8, 32, batch_size=4)
    sdict = dict(sens)
    target = 6.0
    threshold = estimate_threshold(model, sdict, target, 4, 32, 8, 32)
    ppl = eval_ppl(model, data, batch_size=4)
    result = {
        "model": DYNAMIC_MODEL,
        "tokens": data.tolist(),
        "permutation_seed_123": perm.tolist(),
        "low_bits": 4, "low_group_size": 32, "high_bits": 8, "high_group_size": 32,
        "batch_size": 4,
        "sensitivities": sens,
        "target_bpw": target,
        "threshold": threshold,
        "ppl": ppl,
    }
    with open(out / "dynamic.json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"convert_oracle: wrote {out}")


def main():
    mx.set_default_device(mx.cpu)
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "prepare":
        with open(rest[0]) as f:
            for spec in json.load(f):
                prepare(spec["src"], spec["dest"], spec.get("torch_dtype"), spec.get("config"))
    elif cmd == "convert":
        convert(rest[0])
    elif cmd == "generate":
        generate(rest[0], rest[1:])
    elif cmd == "goldens":
        goldens(rest[0])
    elif cmd == "generate-text":
        generate_text(*rest)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
