#!/usr/bin/env bash
# GPU call A: the cuda sandbox tests, evaluation throughput, and a first look at the kernel families.
set -u
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,utilization.gpu --format=csv,noheader
timeout 260 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_cheats.py tests/test_faults.py tests/test_compile.py tests/test_integrate.py tests/test_pool.py tests/test_verify.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/gpu_tests.log | tail -25
timeout 150 python3 bench/eval_throughput.py --backend cuda > $OUT/throughput.log 2>&1; echo "throughput rc=$?"; tail -6 $OUT/throughput.log
timeout 150 python3 bench/check_families_gpu.py --no-compile --points 3 --reps 30 > $OUT/families.log 2>&1; echo "families rc=$?"; tail -45 $OUT/families.log
