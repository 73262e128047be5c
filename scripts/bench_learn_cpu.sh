#!/bin/bash
# The CPU learning comparisons in docs/results/2026-12-03-bench-learn-real-tasks.md: gdpo vs mrtpo, 3 seeds, on each task,
# with the CPU preset (configs/bench-learn-cpu.yaml) at 1 prompt x 4 completions per step, 6 steps.
# Measured here (gdpo,mrtpo): 26 min (instructions), 18 min (sql); all five methods:
# 54 min (instructions), 41 min (sql). toolcall starts from the SFT warm start (built on first use,
# ~17 min) and, with the group's prompt computed once in the update, needs no activation
# checkpointing (10.4 GB per run at ~935-token prompts), so two runs fit side by side (JOBS=2).
# Resumable: a finished run is skipped, so the script can be started again after an interruption.
# TASKS="sql" METHODS="grpo,gdpo,mrtpo,contrast,entropy" scripts/bench_learn_cpu.sh: other selections.
set -u
cd "$(dirname "$0")/.."
M=.venv/bin/mrtpo
COMMON=(--methods "${METHODS:-gdpo,mrtpo}" --seeds 0,1,2 --eval-size 16 --jobs "${JOBS:-1}")
SIX=(--max-steps 6 --eval-every 6)
TRAIN=(per_device_train_batch_size=4)   # 1 prompt x 4 completions per step; lr 5e-5 from the preset
run() {
  echo "=== $(date -u +%FT%TZ) start $*"
  /usr/bin/time -v "$M" bench learn "$@"; local rc=$?
  echo "=== $(date -u +%FT%TZ) end rc=$rc"
}
for task in ${TASKS:-instructions toolcall sql}; do
  case $task in
    instructions) run --task instructions "${COMMON[@]}" "${SIX[@]}" --out runs/bench/learn-instructions "${TRAIN[@]}" \
                    max_completion_length=128 'task_args={anchor: [min_words], min_words_range: [20, 60], max_constraints: 3}' ;;
    toolcall) run --task toolcall "${COMMON[@]}" "${SIX[@]}" --out runs/bench/learn-toolcall "${TRAIN[@]}" ;;
    sql) run --task sql "${COMMON[@]}" "${SIX[@]}" --out runs/bench/learn-sql "${TRAIN[@]}" ;;
  esac
done
