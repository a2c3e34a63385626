#!/usr/bin/env bash
# A/B of builds or settings of our mlx-benchmark on the GPU machine (decode profile lines
# per arm), processes interleaved so that drift spreads over every arm.
#
# Run from the repository root after `source /root/stash/activate.sh` (see gpu.sh):
#
#   bash benchmarks/gpu_ab.sh ARM [ARM ...]
#
#   ARM  NAME=BIN_DIR[:VAR=VALUE,VAR=VALUE...], e.g. nograph=.gpu/bin:MLX_USE_CUDA_GRAPHS=0
#        BIN_DIR holds mlx-benchmark (and decode_build for MICRO / SPLIT)
#
# Environment: OUT (/tmp/ab-out), MODELS (/tmp/bench-models), ONLY (shapes, default
# qwen2.5-0.5b,llama-3.2-1b; a shape means its bf16 and 4-bit variants, or name one, e.g.
# qwen3-30b-a3b-l12-bf16), P / G (512 / 256), N (trials per process, 3), ROUNDS
# (processes per arm and model, 2; arm order reversed every other round), MICRO=1 (each
# arm's decode_build micro: host cost per node of single-op chains), SPLIT=1 (each arm's
# decode_build on the bf16 models: build, async_eval with the device idle, wait),
# MLX_LM=1 (benchmarks/profile_mlx_lm.py on the same models, one process).
# Writes $OUT/log.txt and $OUT/summary.txt (decode token-to-token mean per arm and model).
set -u
OUT=${OUT:-/tmp/ab-out}
MODELS=${MODELS:-/tmp/bench-models}
ONLY=${ONLY:-qwen2.5-0.5b,llama-3.2-1b}
P=${P:-512}
G=${G:-256}
N=${N:-3}
ROUNDS=${ROUNDS:-2}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/log.txt"; }
run() {
  log "\$ $*"
  timeout "${STEP_TIMEOUT:-150}" "$@" >>"$OUT/log.txt" 2>&1
  local rc=$?
  [ $rc = 0 ] || log "rc=$rc"
}
# arm_env NAME -> "env VAR=VALUE ..." words; arm_bin NAME -> BIN_DIR
declare -A BIN ENVS
NAMES=()
for a in "$@"; do
  name=${a%%=*}
  rest=${a#*=}
  BIN[$name]=${rest%%:*}
  e=""
  [[ "$rest" == *:* ]] && e=${rest#*:}
  ENVS[$name]=${e//,/ }
  NAMES+=("$name")
done
log "arms: $*"
TOK=()
[ -d .gpu/tok/qwen2 ] && TOK=(--tokenizers .gpu/tok)
run "$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" ${TOK[@]+"${TOK[@]}"}
VARIANTS=()
for s in ${ONLY//,/ }; do
  case "$s" in
    *-bf16|*-4bit) VARIANTS+=("$s") ;;
    *) VARIANTS+=("$s-bf16" "$s-4bit") ;;
  esac
done

if [ "${MICRO:-0}" = 1 ]; then
  for n in "${NAMES[@]}"; do
    log "== micro $n"
    run env ${ENVS[$n]} "${BIN[$n]}/decode_build" micro 0 200
  done
fi
if [ "${SPLIT:-0}" = 1 ]; then
  for m in "${VARIANTS[@]}"; do
    [[ $m == *-bf16 ]] || continue
    for n in "${NAMES[@]}"; do
      log "== split $n $m"
      run env ${ENVS[$n]} "${BIN[$n]}/decode_build" "$MODELS/$m" "$P" 128
    done
  done
fi
for m in "${VARIANTS[@]}"; do
  for ((r = 0; r < ROUNDS; r++)); do
    order=("${NAMES[@]}")
    if ((r % 2)); then
      order=()
      for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do order+=("${NAMES[$i]}"); done
    fi
    for n in "${order[@]}"; do
      log "== ab $n $m"
      run env MLX_ENGINE_PROFILE=1 ${ENVS[$n]} "${BIN[$n]}/mlx-benchmark" --model "$MODELS/$m" \
        -p "$P" -g "$G" -n "$N"
    done
  done
done
if [ "${MLX_LM:-0}" = 1 ]; then
  paths=()
  for m in "${VARIANTS[@]}"; do paths+=("$MODELS/$m"); done
  log "== mlx-lm"
  run "$PY" benchmarks/profile_mlx_lm.py --model "${paths[@]}" -p "$P" -g "$G" -n "$N"
fi

# summary: mean token-to-token (us) of the timed generations (warm-up lines skipped)
"$PY" - "$OUT/log.txt" >"$OUT/summary.txt" <<'PY'
import re, sys, collections
arm = model = kind = None
skip = 0
vals = collections.defaultdict(list)
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\[\+\d+s\] == (ab|split|micro|mlx-lm) ?(\S+)?(?: (\S+))?", line)
    if m:
        kind, arm, model = m.group(1), m.group(2) or m.group(1), m.group(3)
        skip = 1 if kind == "ab" else 0
        continue
    m = re.search(r"\[mlx-engine profile\].*build (\d+) us, async_eval (\d+) us.*token-to-token (\d+) us", line)
    if m and kind == "ab":
        if skip:
            skip -= 1
            continue
        vals[(model, arm)].append(tuple(int(g) for g in m.groups()))
    if "micro " in line or line.startswith("round 1") or "[mlx-lm profile]" in line or line.startswith("=="):
        print(f"{arm or ''} {model or ''}: {line.strip()}")
print()
print("| model | arm | n | build us | async_eval us | token-to-token us (mean) | min |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for (model, arm), v in vals.items():
    n = len(v)
    mean = lambda i: sum(x[i] for x in v) / n
    print(f"| {model} | {arm} | {n} | {mean(0):.0f} | {mean(1):.0f} | {mean(2):.0f} | {min(x[2] for x in v)} |")
PY
cat "$OUT/summary.txt"
log "done"
