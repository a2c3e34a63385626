"""Writes variants of the real default model (SmolLM2-135M-Instruct as imported from its
GGUF: 4-bit weights in groups of 32 with float16 scales and biases, float32 norms, so its
activations are float32) that each change one thing, to find which one makes a step cost
more on the host (benchmarks/GPU.md, session 27):

    f32s  the scales and biases stored as float32 (the same values: the products no
          longer cast them on every step)
    f16   every float32 weight stored as float16 (float16 activations, no casts)

    python benchmarks/smol_variants.py SRC_DIR DST_PARENT
"""
import json
import os
import shutil
import sys

import mlx.core as mx


def write(src, dst, weights):
    os.makedirs(dst, exist_ok=True)
    mx.save_safetensors(f"{dst}/model.safetensors", weights, metadata={"format": "mlx"})
    for f in os.listdir(src):
        if f.endswith(".json") and not f.startswith("model.safetensors"):
            shutil.copy(f"{src}/{f}", f"{dst}/{f}")


def main(src, parent):
    weights = mx.load(f"{src}/model.safetensors")
    f32s = {
        k: v.astype(mx.float32) if k.endswith((".scales", ".biases")) else v
        for k, v in weights.items()
    }
    write(src, f"{parent}/f32s", f32s)
    f16 = {k: v.astype(mx.float16) if v.dtype == mx.float32 else v for k, v in weights.items()}
    write(src, f"{parent}/f16", f16)
    cfg = json.load(open(f"{parent}/f16/config.json"))
    cfg["torch_dtype"] = "float16"
    json.dump(cfg, open(f"{parent}/f16/config.json", "w"), indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
