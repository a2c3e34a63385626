"""mlx-lm side of the `mlx-lora` parity test (bins/tests/lora.rs).

  lora_oracle.py data OUT_DIR
      Writes a small local dataset per format under OUT_DIR: text/, completions/ (with
      custom keys question/answer), chat/ (messages, every fourth row with tools); each with
      train.jsonl, valid.jsonl and test.jsonl of seeded random words.
  lora_oracle.py widen-vocab SRC DST TOKENIZER_DIR
      Copies the tiny model SRC (config.json, model.safetensors) to DST with its
      vocabulary widened to TOKENIZER_DIR's tokenizer (its `vocab_size` from the
      tokenizer's highest id): new rows of `model.embed_tokens.weight` / `lm_head.weight`,
      then of every other table with one row per token (`TABLES`: other families'
      embeddings and heads, a head's bias, Gemma's per-layer table), drawn N(0, 0.02)
      from MLX seed 0, the tokenizer files copied. The committed MoE
      goldens have 128 entries, fewer than the test tokenizer's ids, and an out-of-range
      id makes MLX's gather read past the table (losses differ run to run, NaN at times).
  lora_oracle.py run CASES_JSON
      Runs `mlx_lm lora` once per case in this one process (the same `main()` as
      `python -m mlx_lm lora`, one import for all cases). A case is {"cwd": dir,
      "args": [...]}; its stdout goes to <cwd>/stdout.txt, an exception's text to
      <cwd>/error.txt.
"""

import contextlib
import io
import json
import os
import random
import sys
import traceback
from pathlib import Path

WORDS = (
    "the quick brown fox jumps over a lazy dog while cats sleep in warm sun and "
    "birds sing loud songs near old trees by the river"
).split()


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def cmd_data(out):
    rng = random.Random(11)
    out = Path(out)
    sizes = {"train": 13, "valid": 7, "test": 6}
    for fmt in ("text", "completions", "chat"):
        d = out / fmt
        d.mkdir(parents=True, exist_ok=True)
        for split, n in sizes.items():
            with open(d / f"{split}.jsonl", "w") as f:
                for i in range(n):
                    if fmt == "text":
                        row = {"text": sentence(rng, 3, 40)}
                    elif fmt == "completions":
                        row = {"question": sentence(rng, 2, 12), "answer": sentence(rng, 2, 20)}
                    else:
                        row = {
                            "messages": [
                                {"role": "system", "content": "be brief"},
                                {"role": "user", "content": sentence(rng, 2, 10)},
                                {"role": "assistant", "content": sentence(rng, 2, 16)},
                            ]
                        }
                        if i % 4 == 1:
                            # A second key: mlx-lm sorts rows by len(row), so these
                            # rows move to the end of the batch order.
                            row["tools"] = [TOOL]
                    f.write(json.dumps(row) + "\n")


def cmd_run(cases_path):
    from mlx_lm import lora
    from mlx_lm.tuner import trainer

    # `--grad-checkpoint` patches the decoder layer's class (`type(layer).__call__`) for
    # the rest of the process; each case gets the classes back as they were, so a later
    # case runs as it would in a fresh `mlx_lm lora`.
    patched = []
    grad_checkpoint = trainer.grad_checkpoint

    def remembering_grad_checkpoint(layer):
        patched.append((type(layer), type(layer).__call__))
        grad_checkpoint(layer)

    trainer.grad_checkpoint = remembering_grad_checkpoint
    cases = json.loads(Path(cases_path).read_text())
    here = os.getcwd()
    for case in cases:
        cwd = Path(case["cwd"])
        cwd.mkdir(parents=True, exist_ok=True)
        os.chdir(cwd)
        buf = io.StringIO()
        sys.argv = ["mlx_lm.lora"] + case["args"]
        try:
            with contextlib.redirect_stdout(buf):
                lora.main()
        except BaseException:  # noqa: BLE001 - the error is the oracle's answer
            (cwd / "error.txt").write_text(traceback.format_exc())
        (cwd / "stdout.txt").write_text(buf.getvalue())
        os.chdir(here)
        for cls, call in reversed(patched):
            cls.__call__ = call
        patched.clear()


# Where the vocabulary's tables live in the tiny checkpoints (embeddings, heads and a
# head's bias, under each family's names).
TABLES = (
    "embed_tokens.",
    "embed_tokens_per_layer.",
    "wte.",
    "head.",
    "output.",
    "embeddings.",
    "embed_in.",
    "embed_out.",
)


def cmd_widen_vocab(src, dst, tok):
    import shutil

    import mlx.core as mx

    src, dst, tok = Path(src), Path(dst), Path(tok)
    dst.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((tok / "tokenizer.json").read_text())["model"]["vocab"]
    n = max(vocab.values()) + 1
    config = json.loads((src / "config.json").read_text())
    # The vocabulary size is top-level, or in the text config of a VLM-style checkpoint.
    configs = [config] + [
        config[k] for k in ("text_config", "llm_config") if isinstance(config.get(k), dict)
    ]
    configs = [c for c in configs if "vocab_size" in c]
    old = configs[0]["vocab_size"]
    mx.random.seed(0)
    weights = mx.load(str(src / "model.safetensors"))
    # The classic two first (so the MoE goldens widen as they always did), then every
    # other table with one row per token, by name.
    classic = ["model.embed_tokens.weight", "lm_head.weight"]
    others = sorted(
        k
        for k, w in weights.items()
        if k not in classic
        and any(t in k for t in TABLES)
        and w.shape[0] == old
        and w.dtype in (mx.float32, mx.float16, mx.bfloat16)
    )
    for k in classic + others:
        if k in weights and n > old:
            w = weights[k]
            extra = 0.02 * mx.random.normal((n - old,) + tuple(w.shape[1:]), dtype=w.dtype)
            weights[k] = mx.concatenate([w, extra])
    for c in configs:
        c["vocab_size"] = max(n, old)
        if c.get("vocab_size_per_layer_input") == old:
            c["vocab_size_per_layer_input"] = max(n, old)
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, dst / f)


def main():
    cmd = sys.argv[1]
    if cmd == "data":
        cmd_data(sys.argv[2])
    elif cmd == "widen-vocab":
        cmd_widen_vocab(*sys.argv[2:5])
    elif cmd == "run":
        cmd_run(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
