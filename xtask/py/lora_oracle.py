"""mlx-lm side of the `mlx-lora` parity test (bins/tests/lora.rs).

  lora_oracle.py data OUT_DIR
      Writes a small local dataset per format under OUT_DIR: text/, completions/ (with
      custom keys question/answer), chat/ (messages, every fourth row with tools); each with
      train.jsonl, valid.jsonl and test.jsonl of seeded random words.
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


def main():
    cmd = sys.argv[1]
    if cmd == "data":
        cmd_data(sys.argv[2])
    elif cmd == "run":
        cmd_run(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
