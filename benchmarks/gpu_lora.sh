#!/usr/bin/env bash
# Fine-tuning side by side on the GPU machine: our mlx-lora against `mlx_lm lora`, the
# same random-weight models of real shapes (xtask/py/make_bench_models.py), the same
# data and settings (issue 24's two shapes):
#   llama-3.2-1b-bf16   LoRA rank 8 (mlx-lm's default lora_parameters) on 16 layers,
#                       batch 4, sequence 512
#   llama-3.1-8b-4bit   QLoRA, the same settings
#
# Run from the repository root, after `source /root/stash/activate.sh` (MLX CUDA + mlx-lm):
#
#   bash benchmarks/gpu_lora.sh [BIN_DIR] [--only LIST] [--iters N] [--report N]
#                               [--rounds R] [--models DIR]
#
#   BIN_DIR    our release binaries (mlx-lora); default .gpu/bin
#   --only     comma-separated variants (default llama-3.2-1b-bf16,llama-3.1-8b-4bit)
#   --iters    training iterations per process (40)
#   --report   --steps-per-report (10); the first report (warm-up: graph building,
#              kernel JIT) is left out of the tokens/s mean
#   --rounds   processes per tool, alternating ours / mlx-lm, order flipped each round (2)
#   --models   where the models are written (default /tmp/bench-models)
#   --bound-ab also run ours with MLX_TRAIN_MEMORY_BOUND=0 each round ("ours-free": without
#              the default bound on the memory of queued GPU work,
#              crates/mlx-train/src/membound.rs; before session 17 the bound was opt-in and
#              this arm, "ours-bound", set it to 1)
#   --dequant-ab also run ours with MLX_DEQUANT_GEMM=1 each round ("ours-dequant": the base
#              model's quantized products of many rows as MLX's dequantize and dense matmul,
#              with the weight dequantized again for the backward product; every weight
#              size: MLX_DEQUANT_GEMM_MIN_ELEMENTS=0)
#
# Data: 256 rows of seeded random words, each longer than 512 tokens, so every batch is
# 4 x 512 after mlx-lm's truncation (both tools print its warning); no validation set (no
# validation pass), no test. Numbers: tokens/s = mean of the training reports' tokens/s
# after the first; peak memory = the largest report's peak (MLX's get_peak_memory, GB).
# Ours reports through <adapter-path>/metrics.jsonl, mlx-lm through the same reports
# (benchmarks/lora_mlx_lm.py records its on_train_loss_report). Writes $OUT/summary.md,
# $OUT/summary.json, $OUT/raw/ (every command's output). Uses no network.
set -euo pipefail

BIN=.gpu/bin
ONLY="llama-3.2-1b-bf16,llama-3.1-8b-4bit"
ITERS=40
REPORT=10
ROUNDS=2
MODELS=/tmp/bench-models
BOUND_AB=0
DEQUANT_AB=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --report) REPORT=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --bound-ab) BOUND_AB=1 ;;
    --dequant-ab) DEQUANT_AB=1 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) BIN=$1 ;;
  esac
  shift
done
if [ -z "${PYTHONPATH:-}" ] && [ -f /root/stash/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/stash/activate.sh
fi
PY=${MLX_PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-lora-out}
mkdir -p "$OUT/raw" "$MODELS"
[ -x "$BIN/mlx-lora" ] || { echo "no $BIN/mlx-lora (cargo build --release -p mlx-bins)" >&2; exit 1; }

"$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" >"$OUT/raw/models.txt" 2>&1

DATA="$OUT/data"
mkdir -p "$DATA"
"$PY" - "$DATA" <<'PYEOF'
import json, random, sys
words = ("the quick brown fox jumps over a lazy dog while cats sleep in warm sun and "
         "birds sing loud songs near old trees by the river").split()
rng = random.Random(7)
with open(sys.argv[1] + "/train.jsonl", "w") as f:
    for _ in range(256):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(900))}) + "\n")
PYEOF

summarize() { # metrics.jsonl -> "tok_s peak_gb"
  "$PY" - "$1" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "train_loss" in l]
tps = [r["tokens_per_second"] for r in rows[1:]] or [r["tokens_per_second"] for r in rows]
peak = max(r["peak_memory"] for r in rows)
print(f"{sum(tps) / len(tps):.1f} {peak:.3f}")
PYEOF
}

COMMON=(--train --data "$DATA" --batch-size 4 --max-seq-length 512 --num-layers 16
        --iters "$ITERS" --steps-per-report "$REPORT" --save-every 100000 --seed 0)
echo "| model | tool | round | tokens/s | peak GB |" >"$OUT/runs.md"
echo "| --- | --- | --- | --- | --- |" >>"$OUT/runs.md"
: >"$OUT/runs.txt"
IFS=, read -r -a VARIANTS <<<"$ONLY"
for v in "${VARIANTS[@]}"; do
  M="$MODELS/$v"
  for r in $(seq 1 "$ROUNDS"); do
    order="ours mlx-lm"
    [ $((r % 2)) -eq 0 ] && order="mlx-lm ours"
    [ "$BOUND_AB" = 1 ] && order="$order ours-free"
    [ "$DEQUANT_AB" = 1 ] && order="$order ours-dequant"
    for tool in $order; do
      A="$OUT/adapters/$v-$tool-$r"
      rm -rf "$A"
      log="$OUT/raw/$v-$tool-$r.txt"
      if [ "$tool" = ours ]; then
        "$BIN/mlx-lora" --model "$M" "${COMMON[@]}" --adapter-path "$A" >"$log" 2>&1
        metrics="$A/metrics.jsonl"
      elif [ "$tool" = ours-free ] || [ "$tool" = ours-dequant ]; then
        e=(MLX_TRAIN_MEMORY_BOUND=0)
        [ "$tool" = ours-dequant ] && e=(MLX_DEQUANT_GEMM=1 MLX_DEQUANT_GEMM_MIN_ELEMENTS=0)
        env "${e[@]}" "$BIN/mlx-lora" --model "$M" "${COMMON[@]}" --adapter-path "$A" >"$log" 2>&1
        metrics="$A/metrics.jsonl"
      else
        mkdir -p "$A"
        metrics="$A/metrics-mlx-lm.jsonl"
        "$PY" benchmarks/lora_mlx_lm.py "$metrics" --model "$M" "${COMMON[@]}" \
          --adapter-path "$A" >"$log" 2>&1
      fi
      read -r tps peak < <(summarize "$metrics")
      echo "$v $tool $r $tps $peak" | tee -a "$OUT/runs.txt"
      echo "| $v | $tool | $r | $tps | $peak |" >>"$OUT/runs.md"
    done
  done
done

"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
runs = [l.split() for l in open(out + "/runs.txt") if l.strip()]
summary = {}
for v, tool, _, tps, peak in runs:
    s = summary.setdefault(v, {}).setdefault(tool, {"tokens_per_second": [], "peak_gb": []})
    s["tokens_per_second"].append(float(tps))
    s["peak_gb"].append(float(peak))
lines = ["| model | ours tok/s | mlx-lm tok/s | ratio | ours peak GB | mlx-lm peak GB | ratio |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
for v, s in summary.items():
    o, p = s.get("ours"), s.get("mlx-lm")
    if not o or not p:
        continue
    ot, pt = max(o["tokens_per_second"]), max(p["tokens_per_second"])
    om, pm = max(o["peak_gb"]), max(p["peak_gb"])
    lines.append(f"| {v} | {ot:.1f} | {pt:.1f} | {ot / pt:.2f}x | {om:.3f} | {pm:.3f} | {om / pm:.2f}x |")
    for arm in ("ours-free", "ours-dequant"):
        f = s.get(arm)
        if f:
            ft, fm = max(f["tokens_per_second"]), max(f["peak_gb"])
            lines.append(f"| {v} ({arm}) | {ft:.1f} | {pt:.1f} | {ft / pt:.2f}x | {fm:.3f} | {pm:.3f} | {fm / pm:.2f}x |")
open(out + "/summary.md", "w").write("\n".join(lines) + "\n\nper run:\n\n" + open(out + "/runs.md").read())
json.dump(summary, open(out + "/summary.json", "w"), indent=1)
print("\n".join(lines))
PYEOF
