#!/usr/bin/env bash
# Advance a sweep by one time slice, on a machine that is lent for a while (a batch job, a borrowed GPU):
# run `memlab sweep --deadline SECS`, which starts no run (or pack) that its finished runs say would end after
# SECS seconds, and at SECS stops as Ctrl-C does, so that its running runs write their checkpoints and go back
# to pending; the next slice resumes them. Then the finished runs' checkpoints are deleted (reports read the
# store and the runs' CSV files, never a checkpoint), so that the results folder stays small enough to carry
# between machines or to commit. Runs that have not checkpointed 2 minutes past SECS are killed (they resume from
# their last checkpoint), so give the slice SECS + 3 minutes of the machine.
#
#   bash scripts/sweep_slice.sh [--memlab BIN] [--store FILE.txz] [--grace G] SECS SWEEP.yaml [sweep options...]
#
#   --store FILE.txz  the results folder travels as this one file, for a machine whose files do not outlast the
#                     slice: FILE, where it exists, is unpacked over the results folder first (--results DIR, or
#                     results/NAME for its folder NAME, which must then be the sweep's name), and the folder is
#                     written back to FILE at the end, whatever became of the sweep (through a temporary file and a
#                     rename), without TensorBoard event files and the launcher's logs/ (each run keeps its log.txt).
#   --grace G         the sweep is interrupted G seconds past SECS if it is still there, and killed 15 s later
#                     (default 150), for a machine with a hard end: the slice then takes at most SECS + G + 15 s
#                     and the time to write FILE. Runs killed before their checkpoint resume from an earlier one.
#
# Ctrl-C (or TERM) stops the sweep as its deadline does, and the store is still written.
# Exit status: 0 when the sweep finished or was stopped at its slice's end, the sweep's own otherwise.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

case "${1:-}" in -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
MEMLAB="" STORE="" GRACE=150
while [[ $# -gt 0 ]]; do
  case "$1" in
    --memlab) [[ $# -ge 2 ]] || die "--memlab needs a path"; MEMLAB="$2"; shift 2 ;;
    --store)
      [[ $# -ge 2 && -n "$2" ]] || die "--store needs a file (FILE.txz)"
      STORE="$(realpath -m -- "$2")"; shift 2 ;;
    --grace)
      [[ $# -ge 2 && "$2" =~ ^[0-9]{1,6}$ ]] || die "--grace needs a whole number of seconds, got '${2:-}'"
      GRACE=$((10#$2)); shift 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] ||
  die "usage: sweep_slice.sh [--memlab BIN] [--store FILE.txz] [--grace G] SECS SWEEP.yaml [memlab sweep options...]"
[[ "$1" =~ ^[0-9]{1,7}$ && $((10#$1)) -gt 0 ]] || die "SECS must be a positive whole number of seconds, got '$1'"
SECS=$((10#$1)); shift
for a in "$@"; do [[ "$a" != --deadline && "$a" != --deadline=* ]] || die "the slice sets --deadline itself (SECS)"; done
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MEMLAB="${MEMLAB:-$REPO_ROOT/build/memlab}"
[[ -x "$MEMLAB" ]] || die "no memlab binary at $MEMLAB (build it first, or pass --memlab BIN)"
if [[ -n "$STORE" ]]; then
  # Found out now, not after the slice's work: where the store cannot be written.
  [[ ! -e "$STORE" || -f "$STORE" ]] || die "--store $STORE exists and is not a file"
  mkdir -p -- "$(dirname "$STORE")" 2>/dev/null && [[ -w "$(dirname "$STORE")" ]] ||
    die "--store $STORE: cannot write to its folder"
fi

# The options that pick the sweep's runs, without those of running them (--pack, --gpus, ...), which --list refuses;
# and apart, --results DIR where given (results_given, results_arg) and the others (others).
list_args=() others=() results_given=0 results_arg=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --pack|--gpus|--workers|--threads|--retries|--stale|--deadline|--fill) i=$((i + 1)) ;;
    --pack=*|--gpus=*|--workers=*|--threads=*|--retries=*|--stale=*|--deadline=*|--fill=*|--retry-failed) ;;
    --results) results_given=1 results_arg="${args[i + 1]:-}"; list_args+=("${args[@]:i:2}"); i=$((i + 1)) ;;
    --results=*) results_given=1 results_arg="${args[i]#--results=}"; list_args+=("${args[i]}") ;;
    *) list_args+=("${args[i]}"); others+=("${args[i]}") ;;
  esac
done
# From --list's first line, "sweep NAME: N runs[ (K repeated grid points dropped)] in RESULTS (D done, ...)", which it
# prints once the folder holds a store: the results folder (results_of) and the sweep's name (name_of).
header_re='^sweep \([^:]*\): [0-9]* runs\( ([0-9]* repeated grid points dropped)\)\{0,1\} in \(.*\) ([0-9]* done, .*$'
results_of() { sed -n "1s/$header_re/\\3/p" <<<"$1"; }
name_of() { sed -n "1s/$header_re/\\1/p" <<<"$1"; }

results=""
if [[ -n "$STORE" && -f "$STORE" ]]; then
  # FILE holds one folder (the results folder it was written from). It is unpacked beside its destination, checked
  # with --list, and only then copied over it: into --results DIR where given, else into results/NAME, where NAME
  # must be the sweep's name (its default results folder).
  tops="$(tar tJf "$STORE" 2>/dev/null | cut -d/ -f1 | sort -u)" || die "cannot read $STORE as an xz tarball"
  [[ -n "$tops" && "$tops" != *$'\n'* && "$tops" != . ]] ||
    die "$STORE should hold one results folder, and holds: $(tr '\n' ' ' <<<"${tops:-nothing}")"
  [[ $results_given == 0 || -n "$results_arg" ]] || die "--results needs a folder"
  dir="${results_arg:-results/$tops}"
  made=""  # the outermost folder above dir that does not exist yet: removed where the slice fails
  d="$(dirname -- "$dir")"
  while [[ ! -e "$d" ]]; do made="$d"; d="$(dirname -- "$d")"; done
  undo() {
    if [[ -n "${unpacked:-}" ]]; then rm -rf -- "$unpacked" "$unpacked.err"; fi
    if [[ -n "$made" ]]; then rm -rf -- "$made"; fi
  }
  unpacked=""
  trap undo EXIT  # every way out before the folder is in place (an error below, Ctrl-C, TERM) leaves nothing behind
  mkdir -p -- "$(dirname -- "$dir")" 2>/dev/null && unpacked="$(mktemp -d "$(dirname -- "$dir")/.unpack.XXXXXX")" &&
    tar xJf "$STORE" --strip-components=1 -C "$unpacked" 2>/dev/null || die "could not unpack $STORE beside $dir"
  if ! listing="$("$MEMLAB" sweep "${others[@]}" --results "$unpacked" --list 2>"$unpacked.err")"; then
    why="$(grep -m1 '^error: ' "$unpacked.err" | cut -c8-)"
    die "$STORE: memlab sweep --list could not read it${why:+: $why}"
  fi
  rm -f -- "$unpacked.err"
  name="$(name_of "$listing")"
  [[ $results_given == 1 || "$name" == "$tops" ]] ||
    die "$STORE holds the folder $tops, but this sweep's results folder is results/${name:-NAME}: pass --results DIR"
  # A folder already there (a machine that kept it from an earlier call) keeps its other files.
  if [[ -e "$dir" ]]; then
    cp -a -- "$unpacked/." "$dir/" || die "could not copy $STORE over $dir"
    rm -rf -- "$unpacked"
  else
    mv -T -- "$unpacked" "$dir" || die "could not move $STORE's folder to $dir"
  fi
  unpacked=""
  trap - EXIT
  results="$dir"
  echo "sweep_slice: $STORE unpacked into $dir ($(sed -n '1s/^.* (\(.*\))$/\1/p' <<<"$listing"))"
fi

# The sweep stops itself at SECS (and kills runs that have not stopped 120 s later); SIGINT, its clean stop, only if
# it is still there at SECS + GRACE, and SIGKILL 15 s after that. timeout runs the sweep in a process group of its
# own, which a terminal's Ctrl-C does not reach: INT or TERM sent here is passed to timeout, which passes it on.
rc=0
timeout -s INT -k 15 "$((SECS + GRACE))" "$MEMLAB" sweep "$@" --deadline "$SECS" &
sweep_pid=$!
trap 'kill -INT "$sweep_pid" 2>/dev/null' INT TERM
while :; do
  rc=0
  wait "$sweep_pid" || rc=$?
  kill -0 "$sweep_pid" 2>/dev/null || break  # wait returned for a signal here; the sweep is still stopping
done
trap - INT TERM
case "$rc" in
  0) ;;
  124|130) echo "sweep_slice: stopped within ${SECS} s; the next slice resumes from the checkpoints"; rc=0 ;;
  137) echo "sweep_slice: the sweep was killed $((GRACE + 15)) s past its deadline; its runs resume from their last" \
         "checkpoints"; rc=0 ;;
  *) echo "sweep_slice: memlab sweep exited with status $rc" ;;
esac

if listing="$("$MEMLAB" sweep "${list_args[@]}" --list 2>/dev/null)"; then
  r="$(results_of "$listing")"
  results="${r:-$results}"
  # A run is finished when the store says so; its id is the second column.
  if [[ -n "$results" && -d "$results/runs" ]]; then
    awk '$3 == "done" {print $2}' <<<"$listing" | while read -r id; do rm -f "$results/runs/$id/checkpoint.pt"; done
  fi
else
  echo "sweep_slice: could not list the sweep's runs; finished runs keep their checkpoints"
fi

if [[ -n "$STORE" ]]; then
  if [[ -z "$results" || ! -d "$results" ]]; then
    [[ $rc == 0 ]] || exit "$rc"  # the sweep has said what went wrong
    echo "error: no results folder to write to $STORE" >&2
    exit 2
  fi
  tmp="$STORE.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  top="$(basename -- "$results")"
  # --anchored for logs/: only the launcher's folder at the top, not a results folder that happens to be called logs
  if tar cf - --anchored --exclude="$top/logs" --no-anchored --exclude='events.out*' -C "$(dirname -- "$results")" \
    "$top" | xz -6 >"$tmp" && sync "$tmp" && mv -T -- "$tmp" "$STORE"; then
    echo "sweep_slice: $results written to $STORE ($(du -h "$STORE" | cut -f1))"
  else
    echo "error: could not write $results to $STORE; it holds the previous slice's store" >&2
    exit 2
  fi
fi
exit "$rc"
