#!/usr/bin/env bash
# Side-by-side benchmark on the GPU machine: our mlx-benchmark / mlx-generate against
# mlx-lm's benchmark / generate, same random-weight models of real shapes, same settings.
#
# Run from the repository root, after `source /root/stash/activate.sh` (MLX CUDA + mlx-lm
# on PYTHONPATH, libmlx on LD_LIBRARY_PATH; sourced here when PYTHONPATH lacks it):
#
#   bash benchmarks/gpu.sh [BIN_DIR] [--big] [-p N] [-g N] [-n N] [--models DIR] [--only LIST]
#
#   BIN_DIR     our release binaries (mlx-benchmark, mlx-generate); default .gpu/bin
#   --big       also Llama-3.1-8B (bf16 and 4-bit; ~21 GB of weights written to disk)
#   -p/-g/-n    prompt tokens, generated tokens, timed trials per tool (512 / 256 / 3)
#   --models    where the models are written (default /tmp/bench-models)
#   --only      comma-separated model variants (e.g. llama-3.2-1b-4bit)
#
# Tokenizers come from BIN_DIR/tok or .gpu/tok (written here by
# `python xtask/py/make_bench_models.py --pack-tokenizers .gpu/tok`); without them the
# models get a synthetic tokenizer of the same vocabulary size (noted in the summary).
#
# For each model: one untimed run of each tool, then N trials alternating ours / mlx-lm
# (order flipped every round), each a fresh process with `-n 1` (each process warms up at
# the same shapes first); then process start to first token, best of 3, alternating.
# Writes $OUT/raw/<model>/*.txt (every output), $OUT/summary.md, $OUT/summary.json and
# $OUT/log.txt. Uses no network.
set -euo pipefail

BIN=.gpu/bin
BIG=0
P=512
G=256
N=3
MODELS=/tmp/bench-models
ONLY=""
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
while [ $# -gt 0 ]; do
  case "$1" in
    --big) BIG=1 ;;
    -p) P=$2; shift ;;
    -g) G=$2; shift ;;
    -n) N=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    -*) echo "gpu.sh: unknown option $1" >&2; exit 2 ;;
    *) BIN=$1 ;;
  esac
  shift
done
for v in "$P" "$G" "$N"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "gpu.sh: -p/-g/-n take positive integers, got $v" >&2; exit 2; }
done

OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT/raw"
LOG=$OUT/log.txt
: >"$LOG"
T0=$(date +%s)
log() { echo "[gpu.sh +$(($(date +%s) - T0))s] $*" | tee -a "$LOG" >&2; }

PY=${PYTHON:-python3}
if ! "$PY" -c 'import mlx_lm' 2>/dev/null && [ -f /root/stash/activate.sh ]; then
  log "sourcing /root/stash/activate.sh"
  # shellcheck disable=SC1091
  source /root/stash/activate.sh >>"$LOG" 2>&1
fi
OURS_BENCH=$BIN/mlx-benchmark
OURS_GEN=$BIN/mlx-generate
for b in "$OURS_BENCH" "$OURS_GEN"; do
  [ -x "$b" ] || { log "missing $b (give the directory of our release binaries)"; exit 1; }
done
"$PY" -c 'import mlx_lm, mlx.core' || { log "python3 cannot import mlx_lm (source /root/stash/activate.sh)"; exit 1; }

# ---- provenance
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: ${BENCH_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
  echo "uname: $(uname -a)"
  echo "nproc: $(nproc)"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo unknown)"
  echo "mlx: $("$PY" -c 'import mlx.core as mx, importlib.metadata as m; print(mx.__version__, mx.default_device(), "mlx-lm", m.version("mlx-lm"))')"
  echo "settings: -p $P -g $G -n $N"
} >"$OUT/provenance.txt"
cat "$OUT/provenance.txt" | tee -a "$LOG" >&2

# ---- models
TOK_ARGS=()
for t in "$BIN/tok" .gpu/tok; do
  if [ -d "$t/llama3" ] && [ -d "$t/qwen2" ]; then TOK_ARGS=(--tokenizers "$t"); break; fi
done
[ ${#TOK_ARGS[@]} -gt 0 ] || log "WARNING: no packed tokenizers in $BIN/tok or .gpu/tok: synthetic tokenizers"
SHAPES=qwen2.5-0.5b,llama-3.2-1b
[ "$BIG" = 1 ] && SHAPES=$SHAPES,llama-3.1-8b
[ -n "$ONLY" ] && SHAPES=$ONLY
log "making models ($SHAPES) in $MODELS"
"$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$SHAPES" ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} 2>&1 | tee -a "$LOG" >&2
VARIANTS=()
for s in ${SHAPES//,/ }; do
  case "$s" in
    *-bf16|*-4bit) VARIANTS+=("$s") ;;
    *) VARIANTS+=("$s-bf16" "$s-4bit") ;;
  esac
done

# ---- one process, its output kept; fails (non-zero) on error or timeout
run_to() {
  local out=$1; shift
  echo "\$ $*" >"$out"
  timeout "$STEP_TIMEOUT" "$@" >>"$out" 2>&1
}
trial_line() { grep -m1 '^Trial 1:' "$1" || true; }

bench_model() {
  local name=$1 dir=$MODELS/$1 raw=$OUT/raw/$1
  mkdir -p "$raw"
  local common=(--model "$dir" -p "$P" -g "$G" -n 1)
  local ours=("$OURS_BENCH" "${common[@]}")
  local theirs=("$PY" -m mlx_lm benchmark "${common[@]}")
  printf '%q ' "${ours[@]}" >"$raw/cmd-ours.txt"
  printf '%q ' "${theirs[@]}" >"$raw/cmd-mlx-lm.txt"
  log "$name: untimed first run of each"
  run_to "$raw/first-ours.txt" "${ours[@]}" || { log "$name: ours failed: $(tail -3 "$raw/first-ours.txt")"; return 1; }
  run_to "$raw/first-mlx-lm.txt" "${theirs[@]}" || { log "$name: mlx-lm failed: $(tail -3 "$raw/first-mlx-lm.txt")"; return 1; }
  local i
  for ((i = 1; i <= N; i++)); do
    local order=(ours mlx-lm)
    ((i % 2 == 0)) && order=(mlx-lm ours)
    local who
    for who in "${order[@]}"; do
      local f=$raw/trial$i-$who.txt
      if [ "$who" = ours ]; then run_to "$f" "${ours[@]}" || { log "$name: ours trial $i failed"; return 1; }
      else run_to "$f" "${theirs[@]}" || { log "$name: mlx-lm trial $i failed"; return 1; }; fi
      log "$name: trial $i $who: $(trial_line "$f")"
    done
  done
  [ "${SKIP_STARTUP:-0}" = 1 ] && return 0
  local gen=(--model "$dir" --prompt hi -m 1 --verbose False)
  printf '%q ' "$OURS_GEN" "${gen[@]}" >"$raw/cmd-startup-ours.txt"
  printf '%q ' "$PY" -m mlx_lm generate "${gen[@]}" >"$raw/cmd-startup-mlx-lm.txt"
  for ((i = 1; i <= 3; i++)); do
    local order=(ours mlx-lm)
    ((i % 2 == 0)) && order=(mlx-lm ours)
    for who in "${order[@]}"; do
      local a b
      a=$(date +%s%N)
      if [ "$who" = ours ]; then run_to "$raw/startup$i-ours.txt" "$OURS_GEN" "${gen[@]}" || { log "$name: ours startup failed"; return 1; }
      else run_to "$raw/startup$i-mlx-lm.txt" "$PY" -m mlx_lm generate "${gen[@]}" || { log "$name: mlx-lm startup failed"; return 1; }; fi
      b=$(date +%s%N)
      echo "$(((b - a) / 1000000))" >>"$raw/startup-ms-$who.txt"
    done
  done
  log "$name: startup ms ours [$(paste -sd, "$raw/startup-ms-ours.txt")] mlx-lm [$(paste -sd, "$raw/startup-ms-mlx-lm.txt")]"
}

FAILED=()
for m in "${VARIANTS[@]}"; do
  if [ ! -f "$MODELS/$m/config.json" ]; then log "$m: model missing, skipped"; FAILED+=("$m"); continue; fi
  bench_model "$m" || FAILED+=("$m")
done

# ---- summary
"$PY" - "$OUT" "$N" "${VARIANTS[@]}" <<'PY' | tee -a "$LOG"
import json, re, sys
from pathlib import Path

out, n, models = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
keys = ("prompt_tps", "generation_tps", "peak_memory", "total_time")

def trial(path):
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Trial 1:"):
            return {k: float(re.search(k + r"=([0-9.]+)", line).group(1)) for k in keys}
    return None

def mean(v):
    return sum(v) / len(v) if v else float("nan")

def ratio(a, b):
    return f"{a / b:.2f}x" if b and a == a and b == b else "-"

prov = (out / "provenance.txt").read_text()
rows, data = [], {}
for m in models:
    raw = out / "raw" / m
    res = {}
    for who in ("ours", "mlx-lm"):
        ts = []
        for i in range(1, n + 1):
            p = raw / f"trial{i}-{who}.txt"
            t = trial(p) if p.exists() else None
            if t:
                ts.append(t)
        ms = raw / f"startup-ms-{who}.txt"
        start = [int(x) / 1000 for x in ms.read_text().split()] if ms.exists() else []
        res[who] = {
            **{k: mean([t[k] for t in ts]) for k in keys},
            "trials": ts,
            "startup_s": start,
            "startup_best_s": min(start) if start else float("nan"),
        }
    data[m] = res
    a, b = res["ours"], res["mlx-lm"]
    if not a["trials"] or not b["trials"]:
        rows.append(f"| {m} | failed (see raw/{m}) | | | | | | | | | | | |")
        continue
    rows.append(
        f"| {m} | {a['prompt_tps']:.0f} | {b['prompt_tps']:.0f} | {ratio(a['prompt_tps'], b['prompt_tps'])} "
        f"| {a['generation_tps']:.1f} | {b['generation_tps']:.1f} | {ratio(a['generation_tps'], b['generation_tps'])} "
        f"| {a['peak_memory']:.2f} | {b['peak_memory']:.2f} | {ratio(a['peak_memory'], b['peak_memory'])} "
        f"| {a['startup_best_s']:.2f} | {b['startup_best_s']:.2f} | {ratio(a['startup_best_s'], b['startup_best_s'])} |"
    )
head = (
    "| model | prefill tok/s ours | mlx-lm | ratio | decode tok/s ours | mlx-lm | ratio "
    "| peak GB ours | mlx-lm | ratio | start to first token s ours | mlx-lm | ratio |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)
md = head + "\n" + "\n".join(rows) + "\n\n" + "\n".join("- " + l for l in prov.strip().splitlines()) + "\n"
cmds = []
for m in models[:1]:
    raw = out / "raw" / m
    for f in ("cmd-ours", "cmd-mlx-lm", "cmd-startup-ours", "cmd-startup-mlx-lm"):
        p = raw / f"{f}.txt"
        if p.exists():
            cmds.append(f"- {f[4:]} (first model): `{p.read_text().strip()}`")
md += "\n".join(cmds) + "\n"
(out / "summary.md").write_text(md)
(out / "summary.json").write_text(json.dumps({"provenance": prov, "models": data}, indent=1))
print(md)
PY
if [ ${#FAILED[@]} -gt 0 ]; then
  log "failed: ${FAILED[*]}"
  exit 1
fi
log "done in $(($(date +%s) - T0)) s; summary in $OUT/summary.md"
