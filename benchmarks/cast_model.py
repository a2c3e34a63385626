"""A copy of an MLX model directory with its floating-point weights (quantization scales
and biases, norms, float embeddings) cast to another dtype: the real default model, whose
weights are float32, run in bfloat16 as most GPU models are (benchmarks/gpu_session15.sh
part `agree` with AGREE_MODEL=smollm2-bf16: batched attention kernels that take half
precision only). Needs mlx.

    python benchmarks/cast_model.py SRC DST [--dtype bfloat16]
"""

import argparse
import glob
import json
import os
import shutil

import mlx.core as mx


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    a = ap.parse_args()
    dtype = getattr(mx, a.dtype)
    os.makedirs(a.dst, exist_ok=True)
    for f in os.listdir(a.src):
        path = os.path.join(a.src, f)
        if os.path.isfile(path) and not f.endswith(".safetensors") and f != "config.json":
            shutil.copy(path, a.dst)
    for path in sorted(glob.glob(os.path.join(a.src, "*.safetensors"))):
        weights = mx.load(path)
        cast = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
        mx.save_safetensors(os.path.join(a.dst, os.path.basename(path)), cast, {"format": "mlx"})
    with open(os.path.join(a.src, "config.json")) as f:
        config = json.load(f)
    config["torch_dtype"] = a.dtype
    with open(os.path.join(a.dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.src} -> {a.dst} ({a.dtype})")


if __name__ == "__main__":
    main()
