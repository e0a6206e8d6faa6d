#!/usr/bin/env bash
# Does one GPU train several runs faster side by side than one after another? Times the same short run alone, as one
# pack of 3 (memlab train --seeds), and as 2, 3 and 6 processes at once; prints each layout's wall time and the
# runs' last ms per step. (Results for the Table 3 configs: results/reference/hqlt_table3_sweep.md.)
#
#   bash scripts/gpu_sharing.sh [CONFIG] [STEPS]      defaults: configs/hqlt/parity_hqlt_sync.yaml, 1000
#   MEMLAB=path/to/memlab to use another binary (default build/memlab)
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
cd "$(dirname "${BASH_SOURCE[0]}")/.."
C=${1:-configs/hqlt/parity_hqlt_sync.yaml}
STEPS=${2:-1000}
M=${MEMLAB:-build/memlab}
[[ -x $M ]] || die "no memlab binary at $M (build it, or set MEMLAB)"
[[ -f $C ]] || die "no config $C"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "STEPS must be a positive integer, got '$STEPS'"
# Training steps only: no evaluation during training, no checkpoints, a small final evaluation.
S=(--config "$C" --steps "$STEPS" --set train.log_every=100 --set eval.every=0 --set train.checkpoint_every=0
   --set eval.n=1024 --set "eval.ranges=[[3,40]]")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ms() { tail -1 "$1" | cut -d, -f6; }
now() { date +%s%N; }
took() { echo "$(( ($(now) - $1) / 1000000 )) ms"; }
t0=$(now); "$M" train "${S[@]}" --seed 1 --out "$tmp/solo" > "$tmp/solo.log" 2>&1 || die "the solo run failed: $(tail -3 "$tmp/solo.log")"
echo "alone: $(took "$t0"), $(ms "$tmp/solo/train.csv") ms/step"
t0=$(now); "$M" train "${S[@]}" --seeds 1,2,3 --out "$tmp/pack" > "$tmp/pack.log" 2>&1 || die "the pack failed: $(tail -3 "$tmp/pack.log")"
echo "one pack of 3: $(took "$t0"), $(for f in $(find "$tmp/pack" -name train.csv | sort); do ms "$f"; done | tr '\n' ' ')ms/step"
for n in 2 3 6; do
  t0=$(now); pids=()
  for s in $(seq 1 $n); do "$M" train "${S[@]}" --seed "$s" --out "$tmp/p${n}_$s" > "$tmp/p${n}_$s.log" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || die "a run of $n at once failed"; done
  echo "$n processes at once: $(took "$t0"), $(for s in $(seq 1 $n); do ms "$tmp/p${n}_$s/train.csv"; done | tr '\n' ' ')ms/step"
done
