#!/usr/bin/env bash
# GPU: `kforge optimize` on sample models at GPU size (built-in proposer, default budget), which
# ends with the end-to-end check of the patched model. Usage: bench/gpu_samples.sh MODEL... [-- extra flags]
set -u
source bench/gpu_env.sh
export KFORGE_SAMPLE_SIZE=gpu
TOP=${TOP:-2}; BUDGET=${BUDGET:-50}; LIMIT=${LIMIT:-280}
mkdir -p $OUT/runs
for m in "$@"; do
  t0=$(date +%s)
  timeout $LIMIT python3 -m kforge_tui optimize sample_models/$m.py --device cuda --headless --top $TOP \
      --budget $BUDGET --run-dir runs_gpu/$m > $OUT/$m.log 2>&1
  rc=$?; t1=$(date +%s)
  echo "== $m rc=$rc wall=$((t1-t0))s"; grep -E "^kforge: (best|done|failed|\[)|baseline" $OUT/$m.log | tail -12
  sed -n '/^run /,$p' $OUT/$m.log | head -20
  cp runs_gpu/$m/run.db $OUT/runs/$m.db 2>/dev/null
done
