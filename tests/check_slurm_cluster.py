#!/usr/bin/env python3
"""tests/slurm_cluster.sh against real Slurm: job arrays run to completion (sbatch --wait), a failing task
makes sbatch --wait fail, start/stop/start in one folder, two clusters side by side, and after stop none of
a cluster's processes is left while the other cluster keeps running.

Exit 77 (ctest: skipped) with the reason when Slurm cannot start here (see tests/slurm_cluster.py).
usage: check_slurm_cluster.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slurm_cluster  # noqa: E402
from checklib import expect, failures, finish  # noqa: E402

# Short: the munge socket path lives under it (unix socket paths are limited to 107 bytes).
tmp = tempfile.mkdtemp(prefix="memlab-slurm-", dir="/tmp")
os.chmod(tmp, 0o755)

JOB = """#!/bin/bash
#SBATCH --output={out}/slurm-%A_%a.out
#SBATCH --time=5
echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT $SLURM_CPUS_ON_NODE" > {out}/task_$SLURM_ARRAY_TASK_ID.tmp
mv {out}/task_$SLURM_ARRAY_TASK_ID.tmp {out}/task_$SLURM_ARRAY_TASK_ID
[ "$SLURM_ARRAY_TASK_ID" != "{fail}" ] || exit 3
"""


def run_array(env, name, tasks=4, fail=-1):
    """sbatch --array=0-(tasks-1) --wait of JOB; returns (sbatch result, {task id: file fields})."""
    out = os.path.join(tmp, name)
    os.makedirs(out)
    script = os.path.join(out, "job.sh")
    with open(script, "w") as f:
        f.write(JOB.format(out=out, fail=fail))
    r = subprocess.run(["sbatch", "--parsable", f"--array=0-{tasks - 1}", "--wait", script], env=env, cwd=out,
                       capture_output=True, text=True, timeout=300)
    files = {}
    for i in range(tasks):
        p = os.path.join(out, f"task_{i}")
        if os.path.exists(p):
            with open(p) as f:
                files[i] = f.read().split()
    return r, files


def check_array(env, name):
    r, files = run_array(env, name)
    expect(r.returncode == 0, f"{name}: sbatch --wait exit {r.returncode}: {r.stdout} {r.stderr}")
    job = r.stdout.strip().split(";")[0]
    expect(job.isdigit(), f"{name}: sbatch --parsable printed '{r.stdout.strip()}'")
    expect(sorted(files) == [0, 1, 2, 3], f"{name}: task files {sorted(files)}")
    for i, fields in files.items():
        expect(fields[:3] == [job, str(i), "4"], f"{name}: task {i} wrote {fields}, expected job {job} of 4 tasks")


def daemon_pids(directory):
    with open(os.path.join(directory, "run", "started")) as f:
        return {name: int(pid) for name, pid in (line.split() for line in f)}


def processes_using(directory):
    """pids of processes with their working folder, or an open file, under directory."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            links = [os.readlink(f"/proc/{p}/cwd")]
            links += [os.readlink(f"/proc/{p}/fd/{fd}") for fd in os.listdir(f"/proc/{p}/fd")]
        except OSError:
            continue
        if any(link == directory or link.startswith(directory + "/") for link in links):
            found.append(int(p))
    return found


def check_stopped(directory, pids):
    for name, pid in pids.items():
        expect(not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower(),
               f"{name} (pid {pid}) of {directory} still runs after stop")
    left = processes_using(directory)
    expect(not left, f"processes still using {directory} after stop: {left}")
    r = subprocess.run(["bash", slurm_cluster.SCRIPT, "status", directory], capture_output=True, text=True)
    expect(r.returncode != 0, f"status after stop says running: {r.stdout}")


def system_munged():
    try:
        with open("/run/munge/munged.pid") as f:
            pid = int(f.read().strip())
        return pid if os.path.exists(f"/proc/{pid}") else None
    except (OSError, ValueError):
        return None


sys_munge = system_munged()
a = os.path.join(tmp, "a")
b = os.path.join(tmp, "b")

with slurm_cluster.running(a) as env:
    check_array(env, "a1")
    check_array(env, "a2")
    r, files = run_array(env, "a_fail", fail=2)
    expect(r.returncode != 0, "sbatch --wait exits 0 although task 2 exited 3")
    expect(sorted(files) == [0, 1, 2, 3], f"failing array: every task still ran, got {sorted(files)}")
    pids_a = daemon_pids(a)
check_stopped(a, pids_a)

# The same folder again, and a second cluster beside it that is stopped while the first keeps working.
with slurm_cluster.running(a) as env_a:
    check_array(env_a, "a3")
    pids_a = daemon_pids(a)
    with slurm_cluster.running(b) as env_b:
        pids_b = daemon_pids(b)
        expect(env_a["SLURM_CONF"] != env_b["SLURM_CONF"], "clusters share a slurm.conf")
        check_array(env_b, "b1")
    check_stopped(b, pids_b)
    for name, pid in pids_a.items():
        expect(os.path.exists(f"/proc/{pid}"), f"stopping cluster b ended {name} of cluster a")
    check_array(env_a, "a4")
check_stopped(a, pids_a)

if sys_munge is not None:
    expect(os.path.exists(f"/proc/{sys_munge}"), f"the system's munged (pid {sys_munge}) is gone")

if not failures:
    shutil.rmtree(tmp, ignore_errors=True)
finish("slurm_cluster.sh: job arrays ran to completion, start/stop/start and two clusters side by side OK")
