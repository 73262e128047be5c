#!/usr/bin/env bash
# The credit gym comparison (docs/gym.md): every stage writes its figures as it goes and is resumable
# (finished runs are skipped), so a cut-off run continues where it stopped when started again.
#
#   bash scripts/gym_compare.sh              # full comparison on this CPU (2 worker processes)
#   QUICK=1 bash scripts/gym_compare.sh      # gdpo vs mrtpo, 2 seeds x 40 steps: ~1 min (warm start cached)
#   DEVICE=cuda JOBS=4 bash scripts/gym_compare.sh   # on one GPU (dry-run on the CPU by tests/test_gym_train.py)
#   STAGES="precision lr main" bash scripts/gym_compare.sh   # some stages only
#
# Stages: precision (credit precision against ground truth, every family, before learning);
# lr (learning-rate sweep of every method on separate seeds); main (every method x SEEDS on
# gym-constraints, each at its best rate); families (gdpo vs mrtpo on the other families);
# sweeps (the MRTPO - GDPO gap against response length and number of rewards); ablations (mrtpo
# with lam 0.5 and with logratio relevance); equaltime (gdpo trained as long, in seconds, as
# mrtpo's run); summary (tables and plots into OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
MRTPO="${MRTPO:-.venv/bin/mrtpo}"
OUT="${OUT:-runs/gym}"
JOBS="${JOBS:-2}"
DEVICE="${DEVICE:-cpu}"
METHODS="${METHODS:-grpo,gdpo,mrtpo,contrast,entropy}"
SEEDS="${SEEDS:-0,1,2,3,4}"
STEPS="${STEPS:-150}"
LRS="${LRS:-1e-4 3e-4 1e-3}"
LR_SEEDS="${LR_SEEDS:-100,101}"
LR_STEPS="${LR_STEPS:-80}"
SWEEP_SEEDS="${SWEEP_SEEDS:-0,1,2}"
SWEEP_STEPS="${SWEEP_STEPS:-100}"
STAGES="${STAGES:-precision lr main families sweeps ablations equaltime summary}"
if [ "${QUICK:-0}" = 1 ]; then
    OUT="${OUT%/}-quick"; METHODS=gdpo,mrtpo; SEEDS=0,1; STEPS=40; STAGES="main summary"
fi
EXTRA=()
[ "$DEVICE" = cuda ] && EXTRA+=("use_cpu=false")
# EXTRA_ARGS: more arguments for every `mrtpo bench learn` call, space-separated: key=value settings or flags
# (e.g. a tiny policy and --eval-size 4 for a dry run)
read -r -a USER_ARGS <<< "${EXTRA_ARGS:-}"
EXTRA+=("${USER_ARGS[@]}")
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
log() { echo "[gym $(date +%H:%M:%S)] $*" | tee -a "$OUT/progress.log"; }
learn() {  # learn <task> <out> <methods> <seeds> <steps> [extra args...]
    local task=$1 out=$2 methods=$3 seeds=$4 steps=$5; shift 5
    "$MRTPO" bench learn --task "$task" --preset gym --methods "$methods" --seeds "$seeds" --max-steps "$steps" \
        --jobs "$JOBS" --out "$out" "$@" "${EXTRA[@]}" >> "$out.log" 2>&1
}
lr_args() {  # --method-setting per method from the sweep's choice (lr.json), or nothing before the sweep
    [ -f "$OUT/lr.json" ] || return 0
    .venv/bin/python -c "import json,sys; print(' '.join(f'--method-setting {m}:learning_rate={lr}' for m, lr in json.load(open(sys.argv[1]))['best'].items() if m in sys.argv[2].split(',')))" "$OUT/lr.json" "$1"
}

for stage in $STAGES; do
    case $stage in
    precision)
        for task in gym-constraints gym-answer gym-call gym-overlap; do
            log "precision $task"
            "$MRTPO" bench gym --task "$task" --prompts 32 --out "$OUT/precision-$task.json" > "$OUT/precision-$task.log" 2>&1
        done ;;
    lr)
        for lr in $LRS; do
            log "lr sweep $lr"
            learn gym-constraints "$OUT/lr-$lr" "$METHODS" "$LR_SEEDS" "$LR_STEPS" "learning_rate=$lr"
        done
        .venv/bin/python scripts/gym_summary.py pick-lr "$OUT" $LRS ;;
    main)
        log "main: gym-constraints, $METHODS x seeds $SEEDS, $STEPS steps"
        # shellcheck disable=SC2046
        learn gym-constraints "$OUT/main-gym-constraints" "$METHODS" "$SEEDS" "$STEPS" $(lr_args "$METHODS") ;;
    families)
        for task in gym-call gym-overlap gym-answer; do
            log "family $task"
            # shellcheck disable=SC2046
            learn "$task" "$OUT/family-$task" gdpo,mrtpo "$SEEDS" "$STEPS" $(lr_args gdpo,mrtpo)
        done ;;
    sweeps)
        for n in 2 4 6; do
            log "sweep: $n rewards"
            # shellcheck disable=SC2046
            learn gym-constraints "$OUT/sweep-rewards-$n" gdpo,mrtpo "$SWEEP_SEEDS" "$SWEEP_STEPS" \
                "task_args={num_clauses: $n}" $(lr_args gdpo,mrtpo)
        done
        for n in 2 6; do  # the longer sweep: 3 rewards is the main comparison itself
            log "sweep: $n rewards, $STEPS steps, seeds $SEEDS"
            # shellcheck disable=SC2046
            learn gym-constraints "$OUT/sweep150-rewards-$n" gdpo,mrtpo "$SEEDS" "$STEPS" \
                "task_args={num_clauses: $n}" $(lr_args gdpo,mrtpo)
        done
        for len in 8 16 32; do
            log "sweep: length $len"
            # shellcheck disable=SC2046
            learn gym-constraints "$OUT/sweep-length-$len" gdpo,mrtpo "$SWEEP_SEEDS" "$SWEEP_STEPS" \
                "task_args={length: $len}" "max_completion_length=$((2 * len + 8))" $(lr_args gdpo,mrtpo)
        done ;;
    ablations)
        for v in "lam-0.5:lam=0.5" "logratio:relevance=logratio"; do
            log "ablation ${v%%:*}"
            # shellcheck disable=SC2046
            learn gym-constraints "$OUT/ablation-${v%%:*}" mrtpo "$SEEDS" "$STEPS" "${v#*:}" $(lr_args mrtpo)
        done ;;
    equaltime)
        steps=$(.venv/bin/python scripts/gym_summary.py equal-steps "$OUT" "$STEPS")
        log "equal wall-clock: gdpo for $steps steps"
        # shellcheck disable=SC2046
        learn gym-constraints "$OUT/equal-time-gdpo" gdpo "$SEEDS" "$steps" $(lr_args gdpo) ;;
    summary)
        log "summary"
        # steps to a target: about GDPO's final level on each task (chosen after seeing the runs)
        for t in "main-gym-constraints 1.3" "equal-time-gdpo 1.3" "family-gym-call 1.7" "family-gym-overlap 1.9" \
                 "family-gym-answer ${ANSWER_TARGET:-1.0}"; do
            [ -f "$OUT/${t% *}/bench.json" ] && .venv/bin/python scripts/gym_summary.py retarget "$OUT/${t% *}" "${t#* }"
        done
        .venv/bin/python scripts/gym_summary.py summary "$OUT" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
    esac
done
log "done: $OUT"
