"""Writes a bfloat16 4-bit (group 64) copy of an MLX model directory: every quantized
weight dequantized (float32 scales), cast to bfloat16 and quantized again, every other
weight cast to bfloat16. benchmarks/RESULTS.md "CPU quantized prefill": the default model
as imported from its GGUF has float16 scales and float32 norms, so its activations are
float32; this copy runs the bfloat16 arithmetic instead.

    python benchmarks/requant_bf16.py SRC_DIR DST_DIR
"""
import json
import os
import shutil
import sys

import mlx.core as mx


def main(src, dst):
    os.makedirs(dst, exist_ok=True)
    weights = mx.load(f"{src}/model.safetensors")
    cfg = json.load(open(f"{src}/config.json"))
    quant = cfg["quantization"]
    out = {}
    for name in sorted(k[: -len(".weight")] for k in weights if k.endswith(".weight")):
        if f"{name}.scales" in weights:
            own = quant.get(name) if isinstance(quant.get(name), dict) else quant
            dense = mx.dequantize(
                weights[f"{name}.weight"],
                weights[f"{name}.scales"].astype(mx.float32),
                weights[f"{name}.biases"].astype(mx.float32),
                group_size=own["group_size"],
                bits=own["bits"],
            ).astype(mx.bfloat16)
            w, s, b = mx.quantize(dense, group_size=64, bits=4)
            out[f"{name}.weight"], out[f"{name}.scales"], out[f"{name}.biases"] = w, s, b
        else:
            out[f"{name}.weight"] = weights[f"{name}.weight"].astype(mx.bfloat16)
    mx.save_safetensors(f"{dst}/model.safetensors", out, metadata={"format": "mlx"})
    for key in ("quantization", "quantization_config"):
        cfg[key] = {"group_size": 64, "bits": 4, "mode": "affine"}
    cfg["torch_dtype"] = "bfloat16"
    with open(f"{dst}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    for f in os.listdir(src):
        if f.startswith("tokenizer") or f in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy(f"{src}/{f}", dst)
    print(f"{dst}: {len(out)} arrays")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
