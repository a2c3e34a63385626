"""Writes goldens/perplexity/expected.json: mlx_lm.perplexity's data and results on the
committed tiny models of goldens/generate/models and the datasets of goldens/perplexity
(text, chat, completions rows), for crates/mlx-eval/tests/perplexity.rs (no Python
there). mlx-lm's own load_data and eval_ppl run, with a local stand-in for Hugging
Face's `datasets` (gen_oracle.local_datasets).

    python xtask/py/perplexity_goldens.py [ROOT]
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_oracle  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

sys.modules["datasets"] = gen_oracle.local_datasets()

from mlx_lm import load  # noqa: E402
from mlx_lm.perplexity import eval_ppl, load_data  # noqa: E402

# (model, dataset, sequence length, samples, batch size, seed)
CASES = [
    ("llama-small-f32", "text", 32, 6, 4, 123),
    ("llama-small-f32", "chat", 24, 5, 2, 7),
    ("llama-small-f32", "completions", 32, 4, 8, 123),
    ("qwen3-small-bf16", "text", 16, 6, 4, 123),
    ("llama-small-q4-g32", "chat", 32, 3, 2, 123),
]


def main():
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    mx.set_default_device(mx.cpu)
    out = []
    for model_name, data_name, length, samples, batch, seed in CASES:
        np.random.seed(seed)
        model, tok = load(str(root / "goldens/generate/models" / model_name))
        data_dir = root / "goldens/perplexity" / data_name
        data = load_data(tok, str(data_dir), samples, length)
        ppl, se = eval_ppl(model, data, batch_size=batch)
        out.append({
            "model": model_name, "data": data_name, "sequence_length": length,
            "num_samples": samples, "batch_size": batch, "seed": seed,
            "tokens": data.tolist(), "ppl": repr(float(ppl)), "se": repr(float(se)),
        })
    dest = root / "goldens/perplexity/expected.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
