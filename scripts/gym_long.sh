#!/usr/bin/env bash
# The gym-long comparison of docs/results/gym-long-plan.md, in the plan's order (resumable: finished
# runs are skipped). SEEDS: the RL seeds to run, one after another (default 0 1 2 3 4).
#   bash scripts/gym_long.sh                 # OUT=runs/gym-long
#   MRTPO="python -m mrtpo.cli" bash scripts/gym_long.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MRTPO="${MRTPO:-.venv/bin/mrtpo}"
OUT="${OUT:-runs/gym-long}"
SEEDS="${SEEDS:-0 1 2 3 4}"
STEPS="${STEPS:-100}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
ORACLE=(--method-setting oracle:lam=1 --method-setting oracle:w_max=null)
OTHERS=(--method-setting paper:lam=1 --method-setting paper:w_max=null
        --method-setting shuffled:lam=1 --method-setting shuffled:w_max=null)
learn() {  # learn <methods> <seeds> [settings...]
    $MRTPO bench learn --task gym-long --preset gym --methods "$1" --policies 0,1,2 --seeds "$2" \
        --max-steps "$STEPS" --eval-size 32 --eval-every "$STEPS" --jobs 2 --out "$OUT" "${@:3}" >> "$OUT.log" 2>&1
}
mkdir -p "$(dirname "$OUT")"
done_seeds=""
for seed in $SEEDS; do
    done_seeds="${done_seeds:+$done_seeds,}$seed"
    echo "[gym-long $(date +%H:%M:%S)] seed $seed: gdpo, oracle" | tee -a "$OUT.progress"
    learn gdpo,oracle "$seed" "${ORACLE[@]}"
    echo "[gym-long $(date +%H:%M:%S)] seed $seed: paper, bounded, shuffled" | tee -a "$OUT.progress"
    learn gdpo,oracle,paper=mrtpo,bounded=mrtpo,shuffled=mrtpo-shuffled "$done_seeds" "${ORACLE[@]}" "${OTHERS[@]}"
done
