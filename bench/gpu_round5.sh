#!/usr/bin/env bash
# GPU steps for the region round (issues 12, 13, 14, 16, 17), one or more per device call:
#   bash bench/gpu_round5.sh tests      # GPU-marked tests of the new paths (capture, integrate, codegen,
#                                       # families, cheats, sandbox)
#   bash bench/gpu_round5.sh issue12    # RMSNorm, NewGELU, BatchNorm2d+ReLU at KernelBench's shapes:
#                                       # built-in search, then eager / torch.compile / best / floor
#   bash bench/gpu_round5.sh models     # issue 16: optimize + apply the four sample models (GPU size)
#   bash bench/gpu_round5.sh level2     # issue 16: ten level-2 style problems, optimize + apply
#   bash bench/gpu_round5.sh sweep      # issue 14: bench/shape_sweep.py --quick
#   bash bench/gpu_round5.sh triton     # issue 13: Triton candidates per minute, seeds vs Inductor
#   bash bench/gpu_round5.sh throughput # issue 17: honest candidates per minute and latency
# Each step writes under $OUT and prints a short table last. BUDGET (default 20) and TOP
# (default 6) size the searches; MODELS / L2 pick a subset.
set -u
source bench/gpu_env.sh
export KFORGE_SAMPLE_SIZE=gpu
step() { echo "== $1 rc=$2 wall=$(( $(date +%s) - $3 ))s"; }
B=${BUDGET:-20}; T=${TOP:-6}
opt() {  # opt NAME MODEL [extra args]: optimize then apply, tables from both
  local name=$1 model=$2; shift 2
  timeout ${OPT_LIMIT:-300} python3 -m kforge_tui optimize "$model" --device cuda --headless --top $T \
      --budget $B --no-apply --run-dir runs_gpu/$name "$@" > $OUT/$name.opt.log 2>&1
  timeout ${APPLY_LIMIT:-240} python3 -m kforge_tui apply runs_gpu/$name "$model" --device cuda --json \
      > $OUT/$name.json 2> $OUT/$name.apply.err
}
while [ $# -gt 0 ]; do
  s=$1; shift; t0=$(date +%s)
  case $s in
    tests)
      timeout ${TEST_LIMIT:-420} python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
          tests/test_capture.py tests/test_profile.py tests/test_integrate.py tests/test_codegen_gpu.py \
          tests/test_codegen_compute_gpu.py tests/test_families_gpu.py tests/test_cheats.py \
          tests/test_compile.py tests/test_verify.py tests/test_faults.py tests/test_pool.py > $OUT/tests.log 2>&1
      step tests $? $t0; tail -25 $OUT/tests.log ;;
    issue12)
      for f in rms_norm new_gelu batchnorm_relu; do
        timeout 200 python3 -m kforge_tui optimize tests/fixtures/kernelbench/$f.py --device cuda --headless \
            --top 1 --budget $B --no-apply --compile-baseline --run-dir runs_gpu/kb_$f > $OUT/kb_$f.log 2>&1
      done
      step issue12 $? $t0; python3 bench/e2e_table.py regions runs_gpu/kb_rms_norm runs_gpu/kb_new_gelu runs_gpu/kb_batchnorm_relu ;;
    models)
      for m in ${MODELS:-gemma qwen_moe resnet50 sd35_vae}; do opt $m sample_models/$m.py --compile-baseline; done
      step models $? $t0
      python3 bench/e2e_table.py regions $(for m in ${MODELS:-gemma qwen_moe resnet50 sd35_vae}; do echo runs_gpu/$m; done)
      python3 bench/e2e_table.py models $(for m in ${MODELS:-gemma qwen_moe resnet50 sd35_vae}; do echo $OUT/$m.json; done) ;;
    level2)
      names=${L2:-$(ls tests/fixtures/kernelbench_l2/*.py | xargs -n1 basename | sed 's/\.py$//')}
      for n in $names; do opt l2_$n tests/fixtures/kernelbench_l2/$n.py --compile-baseline; done
      step level2 $? $t0; python3 bench/e2e_table.py models $(for n in $names; do echo $OUT/l2_$n.json; done) ;;
    sweep)
      timeout 420 python3 bench/shape_sweep.py --quick --out $OUT > $OUT/sweep.log 2>&1
      step sweep $? $t0; tail -45 $OUT/sweep.log ;;
    triton)
      timeout 300 python3 bench/triton_throughput.py --candidates 30 --json $OUT/triton.json > $OUT/triton.log 2>&1
      step triton $? $t0; tail -20 $OUT/triton.log ;;
    throughput)
      timeout 300 python3 bench/eval_throughput.py --backend cuda > $OUT/throughput.log 2>&1
      step throughput $? $t0; tail -20 $OUT/throughput.log ;;
    *) echo "unknown step $s" ;;
  esac
done
