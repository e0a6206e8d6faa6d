#!/usr/bin/env bash
# Advance a sweep by one time slice, on a machine that is lent for a while (a batch job, a borrowed GPU):
# run `memlab sweep --deadline SECS`, which starts no run (or pack) that its finished runs say would end after
# SECS seconds, and at SECS stops as Ctrl-C does, so that its running runs write their checkpoints and go back
# to pending; the next slice resumes them. Then the finished runs' checkpoints are deleted (reports read the
# store and the runs' CSV files, never a checkpoint), so that the results folder stays small enough to carry
# between machines or to commit. Runs that have not checkpointed 2 minutes past SECS are killed (they resume from
# their last checkpoint), so give the slice SECS + 3 minutes of the machine.
#
#   bash scripts/sweep_slice.sh [--memlab BIN] SECS SWEEP.yaml [memlab sweep options...]
#
# Exit status: 0 when the sweep finished or was stopped at its slice's end, the sweep's own otherwise.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
MEMLAB=""
if [[ "${1:-}" == "--memlab" ]]; then
  [[ $# -ge 2 ]] || die "--memlab needs a path"
  MEMLAB="$2"; shift 2
fi
[[ $# -ge 2 ]] || die "usage: sweep_slice.sh [--memlab BIN] SECS SWEEP.yaml [memlab sweep options...]"
SECS="$1"; shift
[[ "$SECS" =~ ^[0-9]+$ && "$SECS" -gt 0 ]] || die "SECS must be a positive whole number of seconds, got '$SECS'"
for a in "$@"; do [[ "$a" != --deadline && "$a" != --deadline=* ]] || die "the slice sets --deadline itself (SECS)"; done
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MEMLAB="${MEMLAB:-$REPO_ROOT/build/memlab}"
[[ -x "$MEMLAB" ]] || die "no memlab binary at $MEMLAB (build it first, or pass --memlab BIN)"

# The sweep stops itself at SECS (and kills runs that have not stopped 120 s later); SIGINT, its clean stop, only if
# it is still there at SECS + 150, and SIGKILL if that hangs.
rc=0
timeout -s INT -k 30 "$((SECS + 150))" "$MEMLAB" sweep "$@" --deadline "$SECS" || rc=$?
case "$rc" in
  0) ;;
  124|130) echo "sweep_slice: stopped within ${SECS} s; the next slice resumes from the checkpoints"; rc=0 ;;
  *) echo "sweep_slice: memlab sweep exited with status $rc" >&2 ;;
esac

# The runs' status from --list, given the options that pick the runs but not those of running (--pack, --gpus, ...),
# which --list refuses. Its first line names the results folder: "sweep NAME: N runs in RESULTS (...)".
list_args=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --pack|--gpus|--workers|--threads|--retries|--stale|--deadline) i=$((i + 1)) ;;
    --pack=*|--gpus=*|--workers=*|--threads=*|--retries=*|--stale=*|--deadline=*|--retry-failed) ;;
    *) list_args+=("${args[i]}") ;;
  esac
done
if listing="$("$MEMLAB" sweep "${list_args[@]}" --list)"; then
  results="$(sed -n '1s/^sweep [^:]*: [0-9]* runs in \(.*\) (.*$/\1/p' <<<"$listing")"
  # A run is finished when the store says so; its id is the second column.
  if [[ -n "$results" && -d "$results/runs" ]]; then
    awk '$3 == "done" {print $2}' <<<"$listing" | while read -r id; do rm -f "$results/runs/$id/checkpoint.pt"; done
  fi
else
  echo "sweep_slice: could not list the sweep's runs; finished runs keep their checkpoints" >&2
fi
exit "$rc"
