#!/usr/bin/env bash
# CPU A/B of MLX_WIDTH_WALL_TIMES=1 (issue 19): the same release build, arms alternating,
# predict_bench predicted / plain at 1, 4 and 8 streams, and --mix at 4 and 8.
cd /work/main
H=benchmarks/runs/2026-12-05-session30
for round in 1 2; do
  for s in 1 4 8; do
    for mix in "" --mix; do
      [ "$s" = 1 ] && [ -n "$mix" ] && continue
      arms="default wall"; [ $round = 2 ] && arms="wall default"
      for arm in $arms; do
        echo "=== round $round streams $s arm $arm ${mix:-predicted}"
        if [ $arm = wall ]; then export MLX_WIDTH_WALL_TIMES=1; else unset MLX_WIDTH_WALL_TIMES; fi
        STREAMS=$s TRIALS=3 EXTRA="$mix" bash benchmarks/runs/2026-12-05-session27/cpu_pred.sh 2>&1 | grep '^|'
      done
    done
  done
done
unset MLX_WIDTH_WALL_TIMES
