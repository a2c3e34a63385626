#!/usr/bin/env bash
# CPU: mlx-server on the default model, predict_bench at given streams
cd /work/main
PORT=${PORT:-18977}
M=/root/.cache/mlx-rs/models/SmolLM2-135M-Instruct
${BIN:-./target/release/mlx-server} --model $M --port $PORT ${SRV_ARGS:-} > /tmp/srv.log 2>&1 &
srv=$!
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:$PORT/health >/dev/null 2>&1 && break; sleep 1; done
python3 benchmarks/predict_bench.py --base-url http://127.0.0.1:$PORT -g ${G:-64} --words ${WORDS:-40} --streams ${STREAMS:-4} --trials ${TRIALS:-1} --predict source ${EXTRA:-}
kill $srv; wait $srv 2>/dev/null
