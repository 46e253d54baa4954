#!/usr/bin/env bash
# GPU call D: the hang fault case again (fixed test kernel), then `kforge apply` with the
# higher-precision end-to-end verdict on the two runs the element-wise rule refused.
set -u
source bench/gpu_env.sh
export KFORGE_SAMPLE_SIZE=gpu
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_faults.py tests/test_cheats.py > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.log
for m in qwen_moe sd35_vae; do
  t0=$(date +%s)
  timeout 200 python3 -m kforge_tui apply gpu_runs/$m sample_models/$m.py --device cuda --json > $OUT/apply_$m.json 2> $OUT/apply_$m.err
  echo "== apply $m rc=$? wall=$(( $(date +%s) - t0 ))s"; tail -2 $OUT/apply_$m.err
  python3 -c "import json,sys; d=json.load(open('$OUT/apply_$m.json')); print({k: d.get(k) for k in ('eager_ms','patched_ms','speedup','max_abs_err','within_tolerance','float64_check','kernels_used')})" 2>&1 | tail -2
done
