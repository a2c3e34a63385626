"""Writes a Qwen3-Next checkpoint of the benchmark's structure with smaller sizes.

    python benchmarks/next_model.py OUT_DIR [KEY=VALUE ...] [--bf16 | --f32]

The config is make_bench_models.py's `qwen3-next-80b-a3b-l4` (4 layers: 3 gated
delta-nets and 1 gated attention, every layer a 512-expert MoE with a shared expert)
with the given keys replaced, e.g. `num_experts=32 vocab_size=4096` for a model that a
CPU prefills in seconds, or `hidden_size=64 ...` for graph counts
(benchmarks/graph_nodes.py: the number and kind of primitives do not depend on the
sizes). Weights are make_bench_models.py's seeded random ones, 4-bit (affine, group
64) unless --bf16 (or --f32: the bf16 weights cast to float32, so that a CPU run spends
its time in the gated delta-net rather than in 4-bit products); the tokenizer is a synthetic one of the config's vocabulary size.
"""
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "xtask" / "py"))

import make_bench_models as mbm  # noqa: E402


def main():
    flags = {"--bf16", "--f32"}
    args = [a for a in sys.argv[1:] if a not in flags]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out = Path(args[0])
    config = dict(mbm.QWEN3_NEXT_80B_A3B_L4)
    for kv in args[1:]:
        key, _, value = kv.partition("=")
        if key not in config:
            sys.exit(f"unknown config key `{key}`")
        config[key] = ast.literal_eval(value)
    f32 = "--f32" in sys.argv
    variant = "bf16" if "--bf16" in sys.argv or f32 else "4bit"
    dst = mbm.build_variant(out.name, variant, config, None, out.parent, 0, None)
    # build_variant names the directory NAME-VARIANT; keep the name asked for.
    if dst != out:
        if out.exists():
            import shutil

            shutil.rmtree(out)
        dst.rename(out)
    if f32:
        import mlx.core as mx

        for f in sorted(out.glob("*.safetensors")):
            weights = mx.load(str(f))
            mx.save_safetensors(
                str(f), {k: v.astype(mx.float32) for k, v in weights.items()}, {"format": "mlx"}
            )
    print(out)


if __name__ == "__main__":
    main()
