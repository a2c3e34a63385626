#!/usr/bin/env bash
# Qwen3-Next on the GPU machine (issue 26): our mlx-benchmark against mlx-lm's benchmark on
# qwen3-next-80b-a3b-l4-4bit (make_bench_models.py), -p 512 -g 128, with the first run on
# empty kernel caches timed and watched on its own, so that a stall shows where it is.
#
# Run from the repository root after `source /root/stash/activate.sh` (see gpu.sh; sourced
# here when python3 cannot import mlx_lm):
#
#   bash benchmarks/gpu_next.sh BIN_DIR [PART ...]
#
#   BIN_DIR  our release binaries (mlx-benchmark)
#   PART     check | cold | warm (default: all three, in that order)
#     check  greedy text of one prompt (mlx-generate, 64 tokens) with the gated delta-net's
#            lean step (default) and with mlx-lm's step op for op (MLX_GDN_LEAN=0), and
#            mlx-lm's own: the CPU parity shows the two steps give the same bits; this is
#            the same check on the GPU (random weights have near-tied logits, so one
#            differing bit shows as differing text within a few tokens); where ours and
#            mlx-lm's part, ours again with each of our CUDA paths off in turn
#            (MLX_FAST_QMM, _SWIGLU, _RESIDUAL, _MANY, then MLX_FAST_QMV for all)
#     cold   each arm once (-n 1) in its own EMPTY kernel caches (MLX_PTX_CACHE_DIR for
#            MLX's NVRTC output, ours included; CUDA_CACHE_PATH for the driver's;
#            XDG_CACHE_HOME for our fast_qmv device header), as on a fresh machine.
#            Session 14's stall (`Running warmup..`, no more within 150 s) was ours' first
#            process on a fresh machine; session 12, which measured it fine, ran mlx-lm
#            first on that model (gpu.sh's first round), whose kernels MLX cached on disk
#            by name for ours to reuse.
#     warm   ROUNDS processes per arm, alternating (order flipped each round), -n N trials
#            each, every arm in the caches its cold run filled under $OUT (the machine's
#            default caches when no cold run filled them).
# A cold process can take minutes, so on the 600 s device calls run `check cold` in one
# call and `warm` in the next (same machine, same OUT: the caches and model are reused).
#
# While a process runs, a line every WATCH seconds (5): elapsed time, the process's CPU
# seconds and resident memory, GPU utilization and memory, the number of kernels in its
# PTX cache and the newest one's name, and the last line of its output. Ours runs with
# MLX_LOG=debug (timestamped `loaded`, `prefill: n/n prompt tokens`, `first token`) and
# MLX_ENGINE_PROFILE=1 (decode split per token at the end). Reading a stall: CPU seconds
# growing with new cache files = compiling kernels (the file says which); CPU growing and
# no new files = host work (graph building / scheduling); CPU flat and GPU busy = device
# work; both flat = waiting on something.
#
# Environment: OUT (/tmp/next-out), MODELS (/tmp/bench-models), P / G (512 / 128),
# N (trials per warm process, 3), ROUNDS (2), STEP_TIMEOUT (300 s per process),
# DEADLINE (560 s: no process starts after it, and each is cut to what is left, so one
# device call of 600 s returns the summary), WATCH (5), NOQMV=1 (an extra arm: ours with
# MLX_FAST_QMV=0, i.e. without our own one-row 4-bit kernels and their NVRTC compiles),
# GDN0=1 (an extra arm: ours with MLX_GDN_LEAN=0, mlx-lm's gated delta step op for op),
# EXTRA_ARMS ("NAME=VAR=V,VAR=V NAME2=..." : more arms of ours, named ours-NAME, each with
# its variables), PROFILE=0 (ours without MLX_LOG=debug and the engine's profile lines,
# as mlx-lm runs: for the timing arms), WARMUP=1 (warm: one untimed process of ours and
# of mlx-lm first, -g 8, up to 400 s each, for a fresh machine's kernel compiles),
# PYTHON (python3), MODEL (another model directory instead of making the benchmark's; for
# trying the script on a CPU machine with a small one, e.g. benchmarks/next_model.py's).
# Writes $OUT/log.txt (everything, timestamped; appended to by each call), $OUT/summary.md
# (over every process in $OUT/raw, this call's and earlier ones') and $OUT/raw/<arm>-*.txt.
set -u
BIN=${1:?usage: bash benchmarks/gpu_next.sh BIN_DIR [cold] [warm]}
shift
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(check cold warm)
OUT=${OUT:-/tmp/next-out}
MODELS=${MODELS:-/tmp/bench-models}
P=${P:-512}
G=${G:-128}
N=${N:-3}
ROUNDS=${ROUNDS:-2}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
DEADLINE=${DEADLINE:-560}
WATCH=${WATCH:-5}
PY=${PYTHON:-python3}
NAME=qwen3-next-80b-a3b-l4-4bit
M=${MODEL:-$MODELS/$NAME}
CACHES=$OUT/caches
mkdir -p "$OUT/raw" "$CACHES"
echo "==== $(date -u '+%F %T') gpu_next.sh $BIN ${PARTS[*]}" >>"$OUT/log.txt"
T0=$(date +%s)
log() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$OUT/log.txt"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }

if ! "$PY" -c 'import mlx_lm' 2>/dev/null && [ -f /root/stash/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/stash/activate.sh >>"$OUT/log.txt" 2>&1
fi
[ -x "$BIN/mlx-benchmark" ] || { log "missing $BIN/mlx-benchmark"; exit 1; }
log "bin $BIN ($(cat "$BIN/COMMIT" 2>/dev/null || echo 'no COMMIT file')), parts ${PARTS[*]}, -p $P -g $G"
log "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
log "mlx: $("$PY" -c 'import mlx.core as mx, importlib.metadata as m; print(mx.__version__, mx.default_device(), "mlx-lm", m.version("mlx-lm"))' 2>&1 | tail -1)"
log "default PTX cache /tmp/mlx: $(find /tmp/mlx -name '*.ptx' 2>/dev/null | wc -l) kernels before this run"

TOK=()
[ -d .gpu/tok/qwen2 ] && TOK=(--tokenizers .gpu/tok)
[ -d "$BIN/tok/qwen2" ] && TOK=(--tokenizers "$BIN/tok")
if [ -z "${MODEL:-}" ]; then
  log "making $NAME in $MODELS"
  "$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$NAME" ${TOK[@]+"${TOK[@]}"} >>"$OUT/log.txt" 2>&1 \
    || { log "make_bench_models failed"; exit 1; }
fi

ARMS=(ours)
declare -A ARM_ENV=([ours]="" [ours-noqmv]="MLX_FAST_QMV=0" [ours-gdn0]="MLX_GDN_LEAN=0")
[ "${NOQMV:-0}" = 1 ] && ARMS+=(ours-noqmv)
[ "${GDN0:-0}" = 1 ] && ARMS+=(ours-gdn0)
for a in ${EXTRA_ARMS:-}; do
  ARMS+=("ours-${a%%=*}")
  e=${a#*=}
  ARM_ENV[ours-${a%%=*}]=${e//,/ }
done
ARMS+=(mlx-lm)
OURS_ENV="MLX_LOG=debug MLX_ENGINE_PROFILE=1"
[ "${PROFILE:-1}" = 0 ] && OURS_ENV=""
# arm_cmd ARM TRIALS: the command line of one process of ARM.
arm_cmd() {
  local common=(--model "$M" -p "$P" -g "$G" -n "$2")
  case "$1" in
    mlx-lm) echo "$PY" -m mlx_lm benchmark "${common[@]}" ;;
    *) echo env ${ARM_ENV[$1]} $OURS_ENV "$BIN/mlx-benchmark" "${common[@]}" ;;
  esac
}
# cache_env ARM: the kernel-cache variables of ARM's runs (empty: the machine's defaults).
USE_OWN_CACHES=0
cache_env() {
  [ "$USE_OWN_CACHES" = 1 ] || return 0
  local d=$CACHES/$1
  echo "MLX_PTX_CACHE_DIR=$d/ptx CUDA_CACHE_PATH=$d/nv XDG_CACHE_HOME=$d/xdg"
}
ptx_dir() {
  if [ "$USE_OWN_CACHES" = 1 ]; then echo "$CACHES/$1/ptx"; else find /tmp/mlx -maxdepth 2 -name ptx -type d 2>/dev/null | head -1; fi
}

# run_watched ARM KIND I TRIALS: one process, watched; appends a `### ARM KIND I s=.. rc=..`
# line to $OUT/raw/ARM-KIND.txt and to the log.
run_watched() {
  local arm=$1 kind=$2 i=$3 trials=$4
  local raw=$OUT/raw/$arm-$kind.txt L T
  L=$(left)
  if [ "$L" -lt 30 ]; then log "skip $arm $kind $i: $L s left"; return 1; fi
  T=$((L < STEP_TIMEOUT ? L : STEP_TIMEOUT))
  local envs cmd
  envs=$(cache_env "$arm")
  cmd=$(arm_cmd "$arm" "$trials")
  local pdir
  pdir=$(ptx_dir "$arm")
  [ -n "$envs" ] && mkdir -p "$CACHES/$arm/ptx" "$CACHES/$arm/nv" "$CACHES/$arm/xdg"
  local before=0
  [ -n "$pdir" ] && before=$(find "$pdir" -name '*.ptx' 2>/dev/null | wc -l)
  log "== $arm $kind $i (timeout $T s, $before kernels in its PTX cache): env $envs $cmd"
  echo "### $arm $kind $i \$ env $envs $cmd" >>"$raw"
  local a b rc
  a=$(date +%s%N)
  # shellcheck disable=SC2086
  env $envs timeout "$T" $cmd >"$raw.cur" 2>&1 &
  local tpid=$!
  while kill -0 "$tpid" 2>/dev/null; do
    sleep "$WATCH"
    kill -0 "$tpid" 2>/dev/null || break
    local child cpu="?" rss="?" ptx="?" newest="-" gpu last
    child=$(pgrep -P "$tpid" | head -1)
    if [ -n "$child" ] && [ -r "/proc/$child/stat" ]; then
      cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' "/proc/$child/stat")
      rss=$(awk '/VmRSS/ {printf "%d", $2 / 1024}' "/proc/$child/status")
    fi
    if [ -n "$pdir" ] && [ -d "$pdir" ]; then
      ptx=$(find "$pdir" -name '*.ptx' | wc -l)
      newest=$(ls -t "$pdir" 2>/dev/null | head -1 | cut -c1-90)
    fi
    gpu=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | head -1)
    last=$(tail -c 300 "$raw.cur" | tr '\r' '\n' | grep -v '^$' | tail -1 | cut -c1-140)
    log "   $arm $kind $i: $(( ($(date +%s%N) - a) / 1000000000 )) s, cpu ${cpu} s, rss ${rss} MB, gpu [$gpu], ptx $ptx (newest $newest) | $last"
  done
  wait "$tpid"
  rc=$?
  b=$(date +%s%N)
  cat "$raw.cur" >>"$raw"
  local secs
  secs=$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
  local after=0
  [ -n "$pdir" ] && after=$(find "$pdir" -name '*.ptx' 2>/dev/null | wc -l)
  echo "### $arm $kind $i s=$secs rc=$rc kernels_compiled=$((after - before))" >>"$raw"
  log "   $arm $kind $i done: $secs s, rc=$rc, $((after - before)) kernels compiled into its cache"
  grep -E '^(Trial|Averages)|mlx-engine profile' "$raw.cur" | tee -a "$OUT/log.txt"
  [ $rc = 124 ] && log "   TIMED OUT; last output lines:" && tail -5 "$raw.cur" | tee -a "$OUT/log.txt"
  rm -f "$raw.cur"
  return $rc
}

# text PROGRAM...: the generated text (between mlx-lm's two `==========` lines).
text() { "$@" 2>/dev/null | awk '/^==========$/ {n++; next} n == 1'; }

for part in "${PARTS[@]}"; do
  case "$part" in
    check)
      [ -x "$BIN/mlx-generate" ] || { log "check: missing $BIN/mlx-generate"; continue; }
      gen=(--model "$M" --prompt "The quick brown fox jumps over the lazy dog. Once upon a time" -m 64 --ignore-chat-template)
      log "== check: greedy text, lean step / mlx-lm's step (MLX_GDN_LEAN=0) / mlx-lm"
      a=$(text timeout 240 "$BIN/mlx-generate" "${gen[@]}")
      b=$(text env MLX_GDN_LEAN=0 timeout 240 "$BIN/mlx-generate" "${gen[@]}")
      c=$(text timeout 240 "$PY" -m mlx_lm generate "${gen[@]}")
      printf '%s\n--- lean ---\n%s\n--- MLX_GDN_LEAN=0 ---\n%s\n--- mlx-lm ---\n%s\n' "${gen[*]}" "$a" "$b" "$c" >"$OUT/raw/check.txt"
      [ -n "$a" ] && [ "$a" = "$b" ] && log "   lean == MLX_GDN_LEAN=0: same text" || log "   lean != MLX_GDN_LEAN=0 (or empty): see raw/check.txt"
      if [ -n "$a" ] && [ "$a" = "$c" ]; then
        log "   ours == mlx-lm: same text"
      else
        log "   ours != mlx-lm (or empty): see raw/check.txt; which of our CUDA paths parts:"
        # One switch off at a time (session 16: MLX_FAST_QMV=0, all of them off, gave
        # mlx-lm's text before one sequence's rows were kept on MLX's qmm from 8 rows).
        for sw in MLX_FAST_QMM MLX_FAST_QMV_SWIGLU MLX_FAST_QMV_RESIDUAL MLX_FAST_QMV_MANY MLX_FAST_QMV; do
          d=$(text env "$sw=0" timeout 240 "$BIN/mlx-generate" "${gen[@]}")
          printf -- '--- ours with %s=0 ---\n%s\n' "$sw" "$d" >>"$OUT/raw/check.txt"
          [ -n "$d" ] && [ "$d" = "$c" ] && log "   $sw=0: mlx-lm's text" || log "   $sw=0: still parts"
        done
      fi
      ;;
    cold)
      USE_OWN_CACHES=1
      for arm in "${ARMS[@]}"; do
        rm -rf "${CACHES:?}/$arm"
        run_watched "$arm" cold 1 1
      done ;;
    warm)
      # The caches a `cold` part filled, in this call or an earlier one on this machine.
      own=1
      for arm in "${ARMS[@]}"; do [ -d "$CACHES/$arm/ptx" ] || own=0; done
      USE_OWN_CACHES=$own
      log "warm: $([ $own = 1 ] && echo "each arm in the caches its cold run filled" || echo "the machine's default kernel caches")"
      if [ "${WARMUP:-0}" = 1 ]; then
        # One untimed process per tool first (-g 8, one trial): on a fresh machine it
        # compiles every kernel into the default caches, so no timed round pays for that.
        save_g=$G; G=8; save_t=$STEP_TIMEOUT; STEP_TIMEOUT=400
        run_watched ours warmup 1 1; run_watched mlx-lm warmup 1 1
        G=$save_g; STEP_TIMEOUT=$save_t
      fi
      for ((r = 0; r < ROUNDS; r++)); do
        order=("${ARMS[@]}")
        if ((r % 2)); then
          rev=(); for ((j = ${#order[@]} - 1; j >= 0; j--)); do rev+=("${order[j]}"); done
          order=("${rev[@]}")
        fi
        for arm in "${order[@]}"; do run_watched "$arm" warm "$((r + 1))" "$N"; done
      done ;;
    *) log "unknown part $part (cold, warm)" ;;
  esac
done

# ---- summary: per arm and kind, mean prefill / decode tok/s over all trials, and wall times
"$PY" - "$OUT" "$P" "$G" <<'EOF' | tee "$OUT/summary.md"
import re, sys, glob, os
out, p, g = sys.argv[1], sys.argv[2], sys.argv[3]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "raw", "*-*.txt"))):
    arm, kind = os.path.basename(f)[:-4].rsplit("-", 1)
    r = rows.setdefault((arm, kind), {"pf": [], "dec": [], "wall": [], "rc": [], "jit": []})
    for line in open(f, errors="replace"):
        m = re.match(r"Trial \d+:\s+prompt_tps=([\d.]+), generation_tps=([\d.]+)", line)
        if m:
            r["pf"].append(float(m.group(1))); r["dec"].append(float(m.group(2)))
        m = re.match(r"### \S+ \S+ \d+ s=([\d.]+) rc=(\d+) kernels_compiled=(-?\d+)", line)
        if m:
            r["wall"].append(float(m.group(1))); r["rc"].append(int(m.group(2))); r["jit"].append(int(m.group(3)))
mean = lambda v: sum(v) / len(v) if v else float("nan")
print(f"## qwen3-next-80b-a3b-l4-4bit, -p {p} -g {g}\n")
print("| arm | kind | processes (rc) | wall s per process | kernels compiled | prefill tok/s | decode tok/s |")
print("| --- | --- | --- | --- | ---: | ---: | ---: |")
for (arm, kind), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"| {arm} | {kind} | {len(r['wall'])} ({','.join(map(str, r['rc']))}) | "
          f"{' '.join(f'{w:.0f}' for w in r['wall'])} | {sum(r['jit'])} | {mean(r['pf']):,.1f} | {mean(r['dec']):,.1f} |")
for kind in ("warm", "cold"):
    b = rows.get(("mlx-lm", kind))
    for (arm, k), a in sorted(rows.items()):
        if k != kind or arm == "mlx-lm" or not (a and b and a["pf"] and b["pf"]):
            continue
        print(f"\n{kind}: {arm} / mlx-lm prefill {mean(a['pf']) / mean(b['pf']):.2f}x, "
              f"decode {mean(a['dec']) / mean(b['dec']):.2f}x; decode per trial "
              f"{' '.join(f'{d:.0f}' for d in a['dec'])} against {' '.join(f'{d:.0f}' for d in b['dec'])}")
EOF
log "done"
