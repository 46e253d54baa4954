#!/usr/bin/env bash
# GPU: issue 7 end to end. `kforge optimize` searches every kernel-quality case (bench/cases.py:zoo)
# with the built-in proposer and the default budget, then bench/kernel_quality.py re-evaluates each
# best kernel from the run store next to eager, torch.compile, Liger and the floor.
set -u
source bench/gpu_env.sh
# ZOO=zoo_a / zoo_b search half the cases (bench/cases.py); torch.compile is timed afterwards by
# kernel_quality.py (in the pool's worker), so the search's one GPU worker is not held up by it.
BUDGET=${BUDGET:-50}; LIMIT=${LIMIT:-420}; QLIMIT=${QLIMIT:-200}; ZOO=${ZOO:-zoo}
t0=$(date +%s)
timeout $LIMIT python3 -m kforge_tui optimize bench/cases.py:$ZOO --device cuda --headless --top 11 \
    --budget $BUDGET --parallel 8 --run-dir runs_gpu/$ZOO --no-apply --no-compile-baseline > $OUT/$ZOO.log 2>&1
echo "optimize rc=$? wall=$(( $(date +%s) - t0 ))s"; sed -n '/^run /,$p' $OUT/$ZOO.log | head -16
cp runs_gpu/$ZOO/run.db $OUT/$ZOO.db
t0=$(date +%s)
timeout $QLIMIT python3 bench/kernel_quality.py runs_gpu/$ZOO --json $OUT/quality_$ZOO.json > $OUT/quality_$ZOO.log 2>&1
echo "quality rc=$? wall=$(( $(date +%s) - t0 ))s"; tail -18 $OUT/quality_$ZOO.log
