#!/usr/bin/env bash
# A private single-node Slurm for tests: munged, slurmctld and slurmd of this host, with every key, socket,
# port, state, spool, log and pid file under DIR, so a system munge or Slurm is left alone.
#
#   bash tests/slurm_cluster.sh start DIR    # starts the daemons, waits until the node is idle, writes DIR/env.sh
#   . DIR/env.sh; sbatch --array=0-3 --wait job.sh
#   bash tests/slurm_cluster.sh stop DIR     # cancels its jobs, stops exactly the processes it started
#   bash tests/slurm_cluster.sh status DIR   # exit 0 when all three daemons run
#
# Needs root (slurmd runs jobs as their submitter) and Debian's slurm-wlm and munge. On failure: one
# 'slurm_cluster: error: ...' line with the reason (and the tail of a dead daemon's log), whatever was
# started is stopped again, exit 1. Start takes ~2 s, stop ~4 s.
set -uo pipefail

PROG=slurm_cluster
log() { echo "$PROG: $*"; }
err() { echo "$PROG: error: $*" >&2; }
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

[[ $# -eq 2 && ( $1 == start || $1 == stop || $1 == status ) ]] || { usage >&2; exit 2; }
ACTION=$1
if [[ $ACTION == start ]]; then
  mkdir -p "$2" 2>/dev/null || { err "cannot create directory '$2'"; exit 1; }
elif [[ ! -d $2 ]]; then
  log "no directory '$2': nothing started there"
  [[ $ACTION == stop ]]; exit   # stop: nothing to do (0); status: not running (1)
fi
DIR=$(cd "$2" && pwd) || { err "cannot enter directory '$2'"; exit 1; }
CONF=$DIR/slurm.conf
PIDS=$DIR/run/started          # "name pid" of each daemon this script started; read by stop
DAEMONS=(munged slurmctld slurmd)
START_TIMEOUT=${SLURM_CLUSTER_TIMEOUT:-60}

# The pid recorded for NAME when that process is still the daemon we started (guards against pid reuse:
# its command line must name DIR).
live_pid() {
  local name=$1 pid cmd
  [[ -f $PIDS ]] || return 1
  pid=$(awk -v n="$name" '$1 == n { print $2 }' "$PIDS" | tail -n1)
  [[ -n $pid ]] || return 1
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
  [[ $cmd == *"$DIR/"* ]] || return 1
  echo "$pid"
}

session_of() { awk '{ sub(/^.*\) /, ""); print $4 }' "/proc/$1/stat" 2>/dev/null; }

# Helpers the daemons fork, found by their open log file under DIR: slurmscriptd (slurmctld's) and one
# slurmstepd per job step (slurmd's; it leaves slurmd's session and leads one holding the job's processes).
helper_pids() {
  local f pid comm
  for f in $(find /proc/[0-9]*/fd -maxdepth 1 -lname "$DIR/log/*" 2>/dev/null); do
    pid=${f#/proc/}; pid=${pid%%/*}
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    [[ $comm == slurmstepd || $comm == slurmscriptd ]] && echo "$pid"
  done | sort -u
}

# Every process of this cluster still alive: the daemons, their helpers and everything in the sessions
# these lead (job scripts and what they started).
cluster_pids() {
  local name pid sids=() sid p
  for name in "${DAEMONS[@]}"; do
    pid=$(live_pid "$name") && sids+=("$(session_of "$pid")")
  done
  for pid in $(helper_pids); do sids+=("$(session_of "$pid")"); done
  [[ ${#sids[@]} -gt 0 ]] || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    sid=$(session_of "$p") || continue
    for s in "${sids[@]}"; do
      [[ -n $s && $s -gt 1 && $sid == "$s" && $p != $$ ]] && { echo "$p"; break; }
    done
  done
}

wait_gone() {   # wait_gone TENTHS PID...: wait until none of the pids exists; fails if some still do
  local n=$1 i p left; shift
  for i in $(seq 1 "$n"); do
    left=0
    for p in "$@"; do [[ -d /proc/$p ]] && left=1; done
    [[ $left -eq 0 ]] && return 0
    sleep 0.1
  done
  return 1
}

log_tail() {
  local f
  for f in "$@"; do
    [[ -s $f ]] || continue
    echo "---- last lines of $f" >&2
    tail -n 20 "$f" >&2
  done
}

# ---------------------------------------------------------------------------------------------- stop
stop_cluster() {
  local pid pids left=() n=0 name names i
  [[ -f $PIDS ]] || { log "nothing started in $DIR"; return 0; }
  # Cancel the jobs first, so slurmd ends them and their steps itself (the controller may be gone already).
  if live_pid slurmctld >/dev/null && live_pid slurmd >/dev/null; then
    export SLURM_CONF=$CONF
    timeout 10 scancel --quiet --user="$(id -un)" >/dev/null 2>&1 || true
    for i in $(seq 1 50); do
      [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  # slurmd and slurmctld first, munged (their authentication) last.
  for names in "slurmd slurmctld" munged; do
    pids=()
    for name in $names; do
      pid=$(live_pid "$name") && pids+=("$pid")
    done
    [[ ${#pids[@]} -gt 0 ]] || continue
    n=$((n + ${#pids[@]}))
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait_gone 50 "${pids[@]}" || { log "$names ignored SIGTERM for 5 s: SIGKILL"; kill -KILL "${pids[@]}" 2>/dev/null || true; }
  done
  # Whatever is left (steps of jobs that were still running, their processes): SIGTERM, then SIGKILL.
  left=($(cluster_pids))
  if [[ ${#left[@]} -gt 0 ]]; then
    log "ending leftover processes ${left[*]}"
    kill -TERM "${left[@]}" 2>/dev/null || true
    wait_gone 30 "${left[@]}" || kill -KILL "${left[@]}" 2>/dev/null || true
    wait_gone 30 "${left[@]}"
    left=($(cluster_pids))
  fi
  if [[ ${#left[@]} -gt 0 ]]; then
    err "processes of the cluster in $DIR still alive after stop: ${left[*]}"
    return 1
  fi
  rm -f "$PIDS" "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"
  log "stopped ($n daemons) in $DIR"
}

# --------------------------------------------------------------------------------------------- start
fail() {   # fail MESSAGE [LOG...]: report, stop what was started, exit 1
  local msg=$1; shift
  err "$msg"
  log_tail "$@"
  stop_cluster >/dev/null 2>&1
  exit 1
}

# During start the daemons are children of this shell: a pid is not reused before it is reaped, and a
# fresh child may not have exec'd its daemon yet (so live_pid's command-line test does not apply).
wait_alive() {   # wait_alive NAME LOG...: the daemon must still be running
  local name=$1 pid st; shift
  pid=$(awk -v n="$name" '$1 == n { print $2 }' "$PIDS" | tail -n1)
  st=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$pid/stat" 2>/dev/null)
  [[ -n $st && $st != Z && $st != X ]] || fail "$name died during start-up" "$@"
}

free_ports() {   # two distinct free TCP ports, chosen by the kernel
  python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
}

start_cluster() {
  local b node hw ports p_ctld p_slurmd i state pid
  [[ $(id -u) -eq 0 ]] || { err "must run as root (slurmd starts jobs as their submitting user); this is uid $(id -u)"; exit 1; }
  for b in munged munge unmunge slurmctld slurmd sinfo squeue scancel sbatch python3 setsid timeout find; do
    command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$b" >/dev/null 2>&1 \
      || { err "'$b' not found (Debian: apt-get install slurm-wlm munge)"; exit 1; }
  done
  export PATH=$PATH:/usr/sbin:/sbin
  if live_pid munged >/dev/null || live_pid slurmctld >/dev/null || live_pid slurmd >/dev/null; then
    err "a cluster started by this script is already running in $DIR (stop it first)"; exit 1
  fi
  # A unix socket path has at most 107 bytes.
  (( ${#DIR} + 20 < 108 )) || { err "directory path '$DIR' is too long for the munge socket path (max ~87 characters)"; exit 1; }

  node=$(hostname -s 2>/dev/null || hostname)
  node=${node%%.*}
  [[ -n $node ]] || { err "cannot read this machine's host name"; exit 1; }
  # The node's CPUs, sockets, cores, threads and memory as slurmd itself detects them: a node described
  # with more than slurmd finds gets drained.
  hw=$(slurmd -C 2>&1 | head -n1)
  [[ $hw == NodeName=* ]] || { err "'slurmd -C' did not describe this machine: $hw"; exit 1; }
  hw=${hw#NodeName=* }
  ports=$(free_ports) || { err "could not pick free TCP ports"; exit 1; }
  read -r p_ctld p_slurmd <<<"$ports"

  rm -rf "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
  mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log" || fail "cannot create folders under $DIR"
  # munged wants its socket folder (and those above it) searchable by all and writable by none but root.
  chmod 0755 "$DIR" "$DIR/munge"
  chmod 0700 "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
  : >"$PIDS"

  (umask 077; head -c 1024 /dev/urandom >"$DIR/munge/munge.key") || fail "cannot write the munge key"
  : >"$DIR/plugstack.conf"   # no SPANK plugins (keeps /etc/slurm/plugstack.conf out)
  cat >"$CONF" <<EOF
# Single-node test cluster written by tests/slurm_cluster.sh; everything lives under $DIR.
ClusterName=memlabtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$p_ctld
SlurmdPort=$p_slurmd
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# One CPU per task, memory not a consumable: array tasks without --mem run side by side.
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
InactiveLimit=0
KillWait=5
SchedulerType=sched/backfill
# Schedule batch jobs at once, not up to 3 s later.
SchedulerParameters=batch_sched_delay=0
# Finished job records kept 4 s (not 300): sbatch --wait then polls every 2 s instead of at 2, 10, 42 s, ...
MinJobAge=4
MailProg=/bin/true
NodeName=$node NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

  cd "$DIR/run" || fail "cannot enter $DIR/run"
  # Each daemon in the foreground in its own session, output to a file (an inherited pipe would keep
  # a caller such as subprocess.run waiting).
  setsid munged -F --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
    </dev/null >"$DIR/log/munged.out" 2>&1 &
  echo "munged $!" >>"$PIDS"
  for i in $(seq 1 100); do
    [[ -S $DIR/munge/munge.socket ]] && break
    wait_alive munged "$DIR/log/munged.out"
    sleep 0.1
  done
  [[ -S $DIR/munge/munge.socket ]] || fail "munged made no socket in 10 s" "$DIR/log/munged.out"
  munge -n --socket="$DIR/munge/munge.socket" | unmunge --socket="$DIR/munge/munge.socket" >/dev/null 2>&1 \
    || fail "munged does not encode/decode credentials" "$DIR/log/munged.out"

  setsid slurmctld -D -f "$CONF" </dev/null >"$DIR/log/slurmctld.out" 2>&1 &
  echo "slurmctld $!" >>"$PIDS"
  setsid slurmd -D -f "$CONF" -N "$node" </dev/null >"$DIR/log/slurmd.out" 2>&1 &
  pid=$!
  echo "slurmd $pid" >>"$PIDS"

  cat >"$DIR/env.sh" <<EOF
# Clients of the test cluster in $DIR (written by tests/slurm_cluster.sh).
export SLURM_CONF=$CONF
export PATH=\$PATH:/usr/sbin:/sbin
# Slurm's own clients take the munge socket from AuthInfo in slurm.conf; munge/unmunge need it given:
export SLURM_CLUSTER_MUNGE_SOCKET=$DIR/munge/munge.socket
EOF

  state=""
  for i in $(seq 1 $((START_TIMEOUT * 5))); do
    wait_alive slurmctld "$DIR/log/slurmctld.out"
    wait_alive slurmd "$DIR/log/slurmd.out"
    wait_alive munged "$DIR/log/munged.out"
    state=$(SLURM_CONF=$CONF timeout 5 sinfo -h -N -n "$node" -o %t 2>/dev/null | head -n1)
    [[ $state == idle ]] && break
    sleep 0.2
  done
  [[ $state == idle ]] || fail "node $node is '${state:-not known to slurmctld}' after ${START_TIMEOUT} s, not idle" \
    "$DIR/log/slurmctld.out" "$DIR/log/slurmd.out"
  log "node $node idle ($hw), slurmctld port $p_ctld, slurmd port $p_slurmd; clients: . $DIR/env.sh"
}

case $ACTION in
  start) start_cluster ;;
  stop) stop_cluster ;;
  status)
    rc=0
    for name in "${DAEMONS[@]}"; do
      if pid=$(live_pid "$name"); then log "$name running (pid $pid)"; else log "$name not running"; rc=1; fi
    done
    exit $rc ;;
esac
