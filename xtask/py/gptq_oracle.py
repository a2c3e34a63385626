"""mlx-lm's GPTQ (`mlx_lm.gptq`) on tiny golden checkpoints, for `mlx-gptq`'s tests.

  gptq_oracle.py goldens ROOT
      write goldens/gptq/: for each case, mlx-lm's `gptq_quantize` on fixed calibration
      tokens, saved with mlx-lm's `save` as `mlx_lm.gptq` does (model.safetensors and
      config.json kept), and cases.json (source model, flags, tokens)

mlx-lm's command reads its calibration text from a file it downloads; the cases give
`gptq_quantize` the tokens directly, and the Rust test gives ours the same rows.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

import olmo_compat  # noqa: F401  (mlx-lm's olmo.py made runnable, see there)
from convert_oracle import prepare

# name: (golden model, bits, group size, fallback bits, fallback group size, rows)
CASES = {
    # tied embedding (the fallback quantizes it), float32, two calibration batches (8 + 2)
    "llama-tied-q4-g32": ("llama-small-f32-tied", 4, 32, 6, 32, 10),
    # bfloat16 with biases and an untied head (a GPTQ layer), 8 bits
    "llama-bf16-bias-q8-g32": ("llama-small-bf16-untied-bias", 8, 32, 6, 32, 8),
    # mixture of experts: the router as a Linear, the experts as SwitchLinear, 2 bits
    "mixtral-q2-g32": ("mixtral-small-f32", 2, 32, 8, 32, 8),
}
SEQUENCE_LENGTH = 16


def tokens(rows):
    return mx.array(
        [[(r * 59 + i * 41 + 7) % 128 for i in range(SEQUENCE_LENGTH)] for r in range(rows)],
        dtype=mx.int32,
    )


def goldens(root):
    from mlx_lm.quant.gptq import gptq_quantize
    from mlx_lm.utils import load, save

    root = Path(root)
    out = root / "goldens/gptq"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    index = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (src, bits, gs, fbits, fgs, rows) in CASES.items():
            prepared = Path(tmp) / src
            if not prepared.exists():
                prepare(root / "goldens/models" / src, prepared)
            model, tokenizer, config = load(str(prepared), lazy=True, return_config=True)
            data = tokens(rows)
            model, config["quantization"] = gptq_quantize(model, data, bits, gs, fbits, fgs)
            dest = out / name
            save(str(dest), str(prepared), model, tokenizer, config)
            for f in dest.iterdir():
                if f.name not in ("config.json", "model.safetensors"):
                    f.unlink() if f.is_file() else shutil.rmtree(f)
            index[name] = {
                "source": src,
                "bits": bits,
                "group_size": gs,
                "fallback_bits": fbits,
                "fallback_group_size": fgs,
                "tokens": data.tolist(),
            }
            print(f"gptq_oracle: {name}", flush=True)
    with open(out / "cases.json", "w") as f:
        json.dump(index, f, indent=1)


def main():
    mx.set_default_device(mx.cpu)
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "goldens":
        goldens(rest[0])
    else:
        sys.exit(f"gptq_oracle.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
