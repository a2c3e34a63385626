"""MLX's transient memory in one quantized matmul, by the number of rows: how far the
peak rises above the inputs and the output while `quantized_matmul` runs. A transient
the size of a dequantized weight shows a path that expands the weight.

    python benchmarks/qmm_memory.py [N] [K] [--bits 4] [--group-size 64] [--rows 1,2,8,...]

Defaults: llama-3.2-1b's tied head (N=128256, K=2048), 4-bit, group 64, bfloat16 input.
"""
import argparse

import mlx.core as mx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=128256)
    ap.add_argument("k", type=int, nargs="?", default=2048)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--rows", default="1,2,4,8,9,16,24,32,64,1024")
    args = ap.parse_args()
    mx.random.seed(0)
    w = mx.random.normal((args.n, args.k)).astype(mx.bfloat16)
    wq, scales, biases = mx.quantize(w, group_size=args.group_size, bits=args.bits)
    mx.eval(wq, scales, biases)
    del w
    mx.clear_cache()
    dense = args.n * args.k * 2 / 1e6
    print(f"weight {args.n}x{args.k} {args.bits}-bit: packed {wq.nbytes / 1e6:.1f} MB, "
          f"bfloat16 {dense:.1f} MB")
    for m in [int(r) for r in args.rows.split(",")]:
        x = mx.random.normal((m, args.k)).astype(mx.bfloat16)
        mx.eval(x)
        for rep in range(2):
            mx.clear_cache()
            mx.reset_peak_memory()
            base = mx.get_active_memory()
            y = mx.quantized_matmul(x, wq, scales, biases, transpose=True,
                                    group_size=args.group_size, bits=args.bits)
            mx.eval(y)
            extra = (mx.get_peak_memory() - base - y.nbytes) / 1e6
            print(f"rows {m:5d} (run {rep}): output {y.nbytes / 1e6:8.1f} MB, "
                  f"transient {extra:8.1f} MB", flush=True)
            del y


if __name__ == "__main__":
    main()
