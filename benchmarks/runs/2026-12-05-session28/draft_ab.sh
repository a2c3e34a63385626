cd /work/main
M=/root/.cache/mlx-rs/models/SmolLM2-135M-Instruct
run() { # bin draftargs label
  $1 --model $M --port 18993 $2 > /tmp/srv_dab.log 2>&1 &
  srv=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:18993/health >/dev/null 2>&1 && break; sleep 1; done
  python3 benchmarks/predict_bench.py --base-url http://127.0.0.1:18993 -g 64 --words 40 --streams ${STREAMS:-4} --trials 2 --predict source --label "$3" 2>&1 | grep -E "\| plain \|" | sed "s/^/$3 /"
  kill $srv; wait $srv 2>/dev/null
}
for r in 1 2; do
run /tmp/srv_dw "" "plain"
run /tmp/srv_old "--draft-model $D" "old+draft"
run /tmp/srv_dw "--draft-model $D" "new+draft"
done
