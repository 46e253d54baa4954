#!/usr/bin/env bash
# GPU steps of issue 7 (rounds 3 and 4 of bench/NOTES.md; bench/RESULTS.md), chained as a call allows:
#   bash bench/gpu_steps.sh families   # family points (FAM_ONLY cases, '|'-separated; FAM_FLAGS extra flags)
#   bash bench/gpu_steps.sh resnet     # issue 6: ResNet-50 with adaptive_avg_pool2d searched, then kforge apply
#   bash bench/gpu_steps.sh probe      # cluster residency (cudaOccupancyMaxActiveClusters) per cluster_group point
#   bash bench/gpu_steps.sh ncu        # Nsight Compute metrics on bench/ncu_points.py's NCU_SET (round3)
#   bash bench/gpu_steps.sh stalls     # Nsight Compute sections (warp stalls, issue, memory) on NCU_SET,
#                                      # kernels matching NCU_KERNELS (regex, default kf_)
#   bash bench/gpu_steps.sh zoo_a      # issue 7 search + kernel_quality on half the zoo (also zoo_b)
#   bash bench/gpu_steps.sh solo CASE:OP [...]   # one case searched alone (full budget) + kernel_quality
#   AB_DIR=ab_a bash bench/gpu_steps.sh ab   # A/B: sources an older checkout rendered into AB_DIR vs this one
#   bash bench/gpu_steps.sh tests      # the GPU-marked tests
# Steps can be chained in one call: bash bench/gpu_steps.sh probe ncu zoo_b
set -u
source bench/gpu_env.sh
step() { echo "== $1 rc=$2 wall=$(( $(date +%s) - $3 ))s"; }
while [ $# -gt 0 ]; do
  s=$1; shift; t0=$(date +%s)
  case $s in
    families)
      timeout ${FAM_LIMIT:-200} python3 bench/check_families_gpu.py --extra --points 3 --reps 30 \
          ${FAM_FLAGS---no-compile --read-flush} --only "${FAM_ONLY:-group_norm,layer_norm,rms_norm,silu}" > $OUT/fam.log 2>&1
      step families $? $t0; sed -n '/^case /,$p' $OUT/fam.log ;;
    resnet)
      KFORGE_SAMPLE_SIZE=gpu timeout 200 python3 -m kforge_tui optimize sample_models/resnet50.py --device cuda \
          --headless --ops adaptive_avg_pool2d --budget 50 --run-dir runs_gpu/resnet50_pool > $OUT/resnet_opt.log 2>&1
      step "resnet50 optimize" $? $t0; sed -n '/^run /,$p' $OUT/resnet_opt.log | head -12
      cp runs_gpu/resnet50_pool/run.db $OUT/resnet50_pool.db 2>/dev/null; t0=$(date +%s)
      KFORGE_SAMPLE_SIZE=gpu timeout 120 python3 -m kforge_tui apply runs_gpu/resnet50_pool sample_models/resnet50.py \
          --device cuda --json > $OUT/apply_resnet50.json 2> $OUT/apply_resnet50.err
      step "resnet50 apply" $? $t0; tail -3 $OUT/apply_resnet50.err ;;
    probe)
      timeout 150 python3 bench/probe_clusters.py > $OUT/probe.log 2>&1; step probe $? $t0; cat $OUT/probe.log ;;
    ncu)
      timeout 90 ncu --kernel-name regex:'kf_' --launch-count 12 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__occupancy_limit_registers,launch__grid_size,launch__block_size \
        python3 bench/ncu_points.py ${NCU_SET:-round3} > $OUT/ncu.log 2>&1
      step ncu $? $t0; grep -E "^\[|void kf_|gpu__time|dram__|hit_rate|warps_active|registers_per" $OUT/ncu.log | head -80 ;;
    stalls)
      timeout ${NCU_LIMIT:-240} ncu --kernel-name regex:"${NCU_KERNELS:-kf_}" --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section MemoryWorkloadAnalysis python3 bench/ncu_points.py ${NCU_SET:-round4} \
        > $OUT/stalls.log 2>&1
      step stalls $? $t0; grep -E "^\[|void kf_|Duration|DRAM Throughput|Registers Per|Achieved Occ|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|Executed Ipc A" $OUT/stalls.log | head -150 ;;
    zoo|zoo_a|zoo_b)
      ZOO=$s bash bench/gpu_quality.sh ;;
    solo)
      for c in "$@"; do
        case=${c%%:*}; op=${c##*:}; t0=$(date +%s)
        timeout ${LIMIT:-150} python3 -m kforge_tui optimize bench/cases.py:$case --device cuda --headless --ops $op \
            --budget 50 --run-dir runs_gpu/$case --no-apply --no-compile-baseline > $OUT/$case.log 2>&1
        step "$case optimize" $? $t0; cp runs_gpu/$case/run.db $OUT/$case.db 2>/dev/null
        timeout 70 python3 bench/kernel_quality.py runs_gpu/$case --json $OUT/quality_$case.json > $OUT/quality_$case.log 2>&1
        echo "quality rc=$?"; sed -n '/^op /,$p' $OUT/quality_$case.log
      done
      shift $# ;;
    ab)
      timeout ${AB_LIMIT:-240} python3 bench/ab_families.py time ${AB_DIR:?AB_DIR: the A sources, see bench/ab_families.py} \
          --only "${AB_ONLY:-}" > $OUT/ab.log 2>&1
      step ab $? $t0; sed -n '/^case /,$p' $OUT/ab.log; grep -E "FAIL|WRONG" $OUT/ab.log | head ;;
    tests)
      timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_cheats.py tests/test_faults.py \
          tests/test_compile.py tests/test_integrate.py tests/test_capture.py tests/test_loader.py tests/test_profile.py \
          > $OUT/gpu_tests.log 2>&1
      step tests $? $t0; tail -3 $OUT/gpu_tests.log ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
