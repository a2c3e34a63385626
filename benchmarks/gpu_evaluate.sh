#!/usr/bin/env bash
# lm-evaluation-harness scoring speed on the GPU machine: a 1,000-request multiple-choice
# task (250 questions x 4 choices, local JSON data, written here) through
#   1. `mlx-evaluate` (our scoring through the lm_eval bridge),
#   2. `mlx_lm.evaluate` (mlx-lm 0.32.2, through xtask/py/eval_mlx_lm.py for the local task),
#   3. lm_eval's `local-completions` against `mlx-server` (echo + logprobs scoring),
# on random-weight models of the Llama 3.2 1B and Llama 3.1 8B shapes
# (xtask/py/make_bench_models.py). Each row is one fresh process's wall time (model
# load included), without the chat template (random weights; the same prompts for all).
#
# Run from the repository root, after `source /root/stash/activate.sh` (sourced here when
# PYTHONPATH lacks it); needs lm-eval[api]==0.4.13 in that Python (scripts/setup.sh):
#
#   bash benchmarks/gpu_evaluate.sh [BIN_DIR] [--only VARIANTS] [--batch-size N]
#
#   BIN_DIR       release builds of mlx-evaluate and mlx-server (default .gpu/bin)
#   --only        comma-separated variants (default llama-3.2-1b-bf16,llama-3.1-8b-bf16)
#   --batch-size  mlx_lm.evaluate's --batch-size, also local-completions' (default 8)
#
# Writes $OUT/evaluate.md (a markdown table with provenance) and $OUT/evaluate.log; the
# metric each tool reports goes into the table too (they must agree).
set -euo pipefail
BIN=.gpu/bin
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then BIN=$1; shift; fi
ONLY=llama-3.2-1b-bf16,llama-3.1-8b-bf16 BS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    --batch-size) BS=$2; shift 2 ;;
    *) echo "gpu_evaluate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "${PYTHONPATH:-}" ] && [ -f /root/stash/activate.sh ]; then
  # shellcheck disable=SC1091
  source /root/stash/activate.sh
fi
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
MODELS=/tmp/bench-models
PY=${PY:-python3}
for b in mlx-evaluate mlx-server; do
  [ -x "$BIN/$b" ] || { echo "gpu_evaluate.sh: $BIN/$b is missing" >&2; exit 2; }
done
"$PY" -c "import lm_eval, tenacity, aiohttp" || {
  echo "gpu_evaluate.sh: lm-eval[api]==0.4.13 is missing in $PY (pip install 'lm-eval[api]==0.4.13')" >&2
  exit 2
}
TOK_ARGS=()
for t in "$BIN/tok" .gpu/tok; do
  if [ -d "$t/llama3" ] && [ -d "$t/qwen2" ]; then TOK_ARGS=(--tokenizers "$t"); break; fi
done
"$PY" xtask/py/make_bench_models.py --out "$MODELS" --only "$ONLY" \
  ${TOK_ARGS[@]+"${TOK_ARGS[@]}"} 2>&1 | tee -a "$OUT/evaluate.log" >&2

# The task: 250 seeded questions of ~60 words with 4 answers of 1-6 words each.
TASKS=$OUT/evaluate-tasks
mkdir -p "$TASKS"
"$PY" - "$TASKS" <<'PY'
import json, random, sys
d = sys.argv[1]
rng = random.Random(0)
words = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head").split()
with open(f"{d}/mc1000.jsonl", "w") as f:
    for i in range(250):
        q = " ".join(rng.choice(words) for _ in range(60)).capitalize() + "?"
        choices = [" " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(4)]
        f.write(json.dumps({"question": q, "choices": choices, "label": rng.randrange(4)}) + "\n")
with open(f"{d}/mc1000.yaml", "w") as f:
    f.write(f"task: mc1000\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {d}/mc1000.jsonl\n"
            "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
            "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\n"
            "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
PY

now() { date +%s.%N; }
since() { awk "BEGIN{print $(now) - $1}"; }
# mlx_lm.evaluate (and mlx-evaluate) write eval_<model>_..._<tasks> without an extension,
# lm_eval's own runs results_<time>.json: take the newest file under $1 either way.
acc() { "$PY" -c "import json,sys,glob,os; fs=[f for f in glob.glob(sys.argv[1]+'/**/*', recursive=True) if os.path.isfile(f)]; r=json.load(open(max(fs, key=os.path.getmtime))); r=r.get('results', r); print(r['mc1000']['acc,none'])" "$1"; }
{
  echo "### lm-evaluation-harness, 1,000 multiple-choice requests ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  echo
  echo "git $(git rev-parse --short HEAD); batch size $BS; wall time of one process each, model load included"
  echo
  echo "| model | tool | wall (s) | acc | ratio to mlx_lm.evaluate |"
  echo "| --- | --- | --- | --- | --- |"
} > "$OUT/evaluate.md"
for m in ${ONLY//,/ }; do
  M=$MODELS/$m
  R=$OUT/evaluate-$m
  rm -rf "$R"; mkdir -p "$R"
  t0=$(now)
  "$PY" xtask/py/eval_mlx_lm.py --include-path "$TASKS" --model "$M" --tasks mc1000 \
    --output-dir "$R/mlx_lm" --batch-size "$BS" --no-apply-chat-template 2>&1 | tee -a "$OUT/evaluate.log" >&2
  t_lm=$(since "$t0")
  t0=$(now)
  "$BIN/mlx-evaluate" --model "$M" --tasks mc1000 --include-path "$TASKS" \
    --output-dir "$R/ours" --batch-size "$BS" --no-apply-chat-template --python "$PY" 2>&1 | tee -a "$OUT/evaluate.log" >&2
  t_ours=$(since "$t0")
  PORT=18431
  t0=$(now)
  "$BIN/mlx-server" --model "$M" --port $PORT >>"$OUT/evaluate.log" 2>&1 &
  SERVER=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    kill -0 $SERVER 2>/dev/null || { echo "gpu_evaluate.sh: mlx-server exited" >&2; exit 1; }
    sleep 0.5
  done
  "$PY" -m lm_eval run --model local-completions \
    --model_args "base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer=$M,tokenizer_backend=huggingface,tokenized_requests=True" --batch_size "$BS" \
    --tasks mc1000 --include_path "$TASKS" --output_path "$R/server" 2>&1 | tee -a "$OUT/evaluate.log" >&2
  t_srv=$(since "$t0")
  kill $SERVER; wait $SERVER 2>/dev/null || true
  a_lm=$(acc "$R/mlx_lm"); a_ours=$(acc "$R/ours"); a_srv=$(acc "$R/server")
  printf '| %s | mlx_lm.evaluate | %.1f | %s | 1.00 |\n' "$m" "$t_lm" "$a_lm" >> "$OUT/evaluate.md"
  printf '| %s | mlx-evaluate | %.1f | %s | %.2f |\n' "$m" "$t_ours" "$a_ours" "$(awk "BEGIN{print $t_ours / $t_lm}")" >> "$OUT/evaluate.md"
  printf '| %s | lm_eval local-completions + mlx-server | %.1f | %s | %.2f |\n' "$m" "$t_srv" "$a_srv" "$(awk "BEGIN{print $t_srv / $t_lm}")" >> "$OUT/evaluate.md"
done
cat "$OUT/evaluate.md"
