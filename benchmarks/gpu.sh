#!/usr/bin/env bash
# Side-by-side benchmark on the GPU machine: our mlx-benchmark / mlx-generate against
# mlx-lm's benchmark / generate, same random-weight models of real shapes, same settings.
#
# Run from the repository root, after `source /root/stash/activate.sh` (MLX CUDA + mlx-lm
# on PYTHONPATH, libmlx on LD_LIBRARY_PATH; sourced here when PYTHONPATH lacks it):
#
#   bash benchmarks/gpu.sh [BIN_DIR] [--big] [--only LIST] [-p N] [-g N] [-b N] [-n N]
#                          [--rounds R] [--startup-runs S] [--budget SECONDS] [--models DIR]
#
#   BIN_DIR         our release binaries (mlx-benchmark, mlx-generate); default .gpu/bin
#   --big           also Llama-3.1-8B (bf16 + 4-bit, ~21 GB written; better in its own call:
#                   --only llama-3.1-8b)
#   --only          comma-separated shapes or variants (e.g. qwen2.5-0.5b,llama-3.2-1b-4bit)
#   -p/-g           prompt tokens, generated tokens (512 / 256)
#   -b              batch size (1; above 1 both tools run their batch generators)
#   -n              timed trials inside each process (3); each process warms up first
#   --rounds        processes per tool, alternating ours / mlx-lm, order flipped each round (2)
#   --startup-runs  process start to first token runs per tool, best kept, after one
#                   untimed run of ours (2; 0 or SKIP_STARTUP=1 skips)
#   --budget        start no new model after this many seconds (default 500), so the
#                   summary is written inside the runner's 600 s limit
#   --models        where the models are written (default /tmp/bench-models)
#
# Tokenizers come from BIN_DIR/tok or .gpu/tok (written here by
# `python xtask/py/make_bench_models.py --pack-tokenizers .gpu/tok`); without them the
# models get a synthetic tokenizer of the same vocabulary size (logged).
#
# A Python process costs ~15-20 s on that machine (imports, CUDA start, kernel JIT), so
# each process runs several trials: R rounds x N trials per tool. Writes $OUT/summary.md
# and $OUT/summary.json (rewritten after every model, so a cut-short run still has one),
# $OUT/log.txt, $OUT/provenance.txt and $OUT/raw/<model>.txt (every command and output).
# Uses no network.
set -euo pipefail

BIN=.gpu/bin
BIG=0
P=512
G=256
B=1
N=3
ROUNDS=2
STARTUP_RUNS=2
BUDGET=500
MODELS=/tmp/bench-models
ONLY=""
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
while [ $# -gt 0 ]; do
  case "$1" in
    --big) BIG=1 ;;
    -p) P=$2; shift ;;
    -g) G=$2; shift ;;
    -b) B=$2; shift ;;
    -n) N=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --startup-runs) STARTUP_RUNS=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    -*) echo "gpu.sh: unknown option $1" >&2; exit 2 ;;
    *) BIN=$1 ;;
  esac
  shift
done
for v in "$P" "$G" "$B" "$N" "$ROUNDS" "$BUDGET"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "gpu.sh: -p/-g/-b/-n/--rounds/--budget take positive integers, got $v" >&2; exit 2; }
done
[[ "$STARTUP_RUNS" =~ ^[0-9]+$ ]] || { echo "gpu.sh: --startup-runs takes an integer, got $STARTUP_RUNS" >&2; exit 2; }
[ "${SKIP_STARTUP:-0}" = 1 ] && STARTUP_RUNS=0

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
  echo "settings: -p $P -g $G -b $B, $ROUNDS processes per tool alternating, -n $N trials each; startup best of $STARTUP_RUNS"
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

# ---- one process: its command and output appended to the model's raw file; a
# `### who kind i ms=T` line records its wall time. Non-zero on failure or timeout.
run_one() {
  local raw=$1 who=$2 kind=$3 i=$4; shift 4
  local a b rc=0
  printf '### %s %s %s $ %s\n' "$who" "$kind" "$i" "$(printf '%q ' "$@")" >>"$raw"
  a=$(date +%s%N)
  timeout "$STEP_TIMEOUT" "$@" >>"$raw" 2>&1 || rc=$?
  b=$(date +%s%N)
  printf '### %s %s %s ms=%d rc=%d\n' "$who" "$kind" "$i" "$(((b - a) / 1000000))" "$rc" >>"$raw"
  return $rc
}

bench_model() {
  local name=$1 dir=$MODELS/$1 raw=$OUT/raw/$1.txt
  : >"$raw"
  local common=(--model "$dir" -p "$P" -g "$G" -b "$B" -n "$N")
  local ours=("$OURS_BENCH" "${common[@]}")
  local theirs=("$PY" -m mlx_lm benchmark "${common[@]}")
  local gen=(--model "$dir" --prompt hi -m 1 --verbose False)
  local i who
  for ((i = 1; i <= ROUNDS; i++)); do
    local order=(ours mlx-lm)
    ((i % 2 == 0)) && order=(mlx-lm ours)
    for who in "${order[@]}"; do
      local done_before rc=0
      done_before=$(grep -c '^Averages:' "$raw" || true)
      if [ "$who" = ours ]; then run_one "$raw" ours bench "$i" "${ours[@]}" || rc=$?
      else run_one "$raw" mlx-lm bench "$i" "${theirs[@]}" || rc=$?; fi
      if [ "$rc" != 0 ]; then
        # A process that printed all its trials and then died on the way out (seen on
        # the CPU: glibc heap-corruption aborts at exit, in both tools) still counts.
        if [ "$(grep -c '^Averages:' "$raw" || true)" -gt "$done_before" ]; then
          log "$name: WARNING: $who exited with $rc after printing its trials (kept): $(tail -3 "$raw" | head -2 | tr '\n' ' ')"
        else
          log "$name: $who failed (rc $rc): $(tail -4 "$raw" | tr '\n' ' ')"
          return 1
        fi
      fi
      log "$name: round $i $who: $(grep '^Averages:' "$raw" | tail -1) ($(tail -1 "$raw" | sed 's/.*ms=//'))"
    done
  done
  # One untimed run first: MLX compiles some CUDA kernels for the prompt's shapes on first
  # use and caches them on disk for every later process (of either tool), so without it
  # whichever tool starts first on a fresh machine pays for that (runs 5 and 6: 27-39 s).
  if ((STARTUP_RUNS > 0)); then
    run_one "$raw" ours warm 0 "$OURS_GEN" "${gen[@]}" || log "$name: untimed warm start failed (continuing)"
  fi
  for ((i = 1; i <= STARTUP_RUNS; i++)); do
    local order=(ours mlx-lm)
    ((i % 2 == 0)) && order=(mlx-lm ours)
    for who in "${order[@]}"; do
      if [ "$who" = ours ]; then run_one "$raw" ours startup "$i" "$OURS_GEN" "${gen[@]}" || { log "$name: ours startup failed"; return 1; }
      else run_one "$raw" mlx-lm startup "$i" "$PY" -m mlx_lm generate "${gen[@]}" || { log "$name: mlx-lm startup failed"; return 1; }; fi
      log "$name: startup $i $who: $(tail -1 "$raw" | sed 's/.*ms=//')"
    done
  done
}

summary() {
  "$PY" - "$OUT" "$@" <<'PY'
import json, re, sys
from pathlib import Path

out, models = Path(sys.argv[1]), sys.argv[2:]
keys = ("prompt_tps", "generation_tps", "peak_memory", "total_time")

def parse(path):
    """{who: {"trials": [...], "startup_s": [...]}} from a model's raw file."""
    res = {w: {"trials": [], "startup_s": []} for w in ("ours", "mlx-lm")}
    who = kind = None
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"### (\S+) (\S+) (\d+) (\$|ms=(\d+) rc=(\d+))", line)
        if m:
            who, kind = m.group(1), m.group(2)
            if m.group(5) is not None and kind == "startup" and m.group(6) == "0":
                res[who]["startup_s"].append(int(m.group(5)) / 1000)
            continue
        if kind == "bench" and line.startswith("Trial "):
            vals = {k: re.search(k + r"=([0-9.]+)", line) for k in keys}
            if all(vals.values()):
                res[who]["trials"].append({k: float(v.group(1)) for k, v in vals.items()})
    return res

def mean(v):
    return sum(v) / len(v) if v else float("nan")

def ratio(a, b):
    return f"{a / b:.2f}x" if b and a == a and b == b else "-"

prov = (out / "provenance.txt").read_text()
rows, data = [], {}
for m in models:
    raw = out / "raw" / f"{m}.txt"
    if not raw.exists():
        rows.append(f"| {m} | not run | | | | | | | | | | | |")
        continue
    res = parse(raw)
    for r in res.values():
        for k in keys:
            r[k] = mean([t[k] for t in r["trials"]])
        # peak_memory is cumulative over a process (both tools read MLX's peak without
        # resetting it), so a tool's peak is the highest any of its trials reported.
        r["peak_memory"] = max([t["peak_memory"] for t in r["trials"]], default=float("nan"))
        r["startup_best_s"] = min(r["startup_s"]) if r["startup_s"] else float("nan")
    data[m] = res
    a, b = res["ours"], res["mlx-lm"]
    if not a["trials"] or not b["trials"]:
        rows.append(f"| {m} | failed (see raw/{m}.txt) | | | | | | | | | | | |")
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
for m in data:
    cmds = [l[4:].split(" $ ", 1) for l in (out / "raw" / f"{m}.txt").read_text(errors="replace").splitlines() if l.startswith("### ") and " $ " in l]
    seen = {}
    for who_kind, cmd in cmds:
        key = " ".join(who_kind.split()[:2])
        seen.setdefault(key, cmd.strip())
    md += "".join(f"- {k} (first model): `{c}`\n" for k, c in seen.items())
    break
(out / "summary.md").write_text(md)
(out / "summary.json").write_text(json.dumps({"provenance": prov, "models": data}, indent=1))
print(md)
PY
}

FAILED=()
for m in "${VARIANTS[@]}"; do
  if (($(date +%s) - T0 > BUDGET)); then log "$m: skipped, past the ${BUDGET} s budget"; FAILED+=("$m"); continue; fi
  if [ ! -f "$MODELS/$m/config.json" ]; then log "$m: model missing, skipped"; FAILED+=("$m"); continue; fi
  bench_model "$m" || FAILED+=("$m")
  summary "${VARIANTS[@]}" >/dev/null || log "summary failed"
done

# ---- summary
summary "${VARIANTS[@]}" | tee -a "$LOG"
if [ ${#FAILED[@]} -gt 0 ]; then
  log "failed: ${FAILED[*]}"
  exit 1
fi
log "done in $(($(date +%s) - T0)) s; summary in $OUT/summary.md"
