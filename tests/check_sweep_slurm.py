#!/usr/bin/env python3
"""memlab sweep --slurm --submit --wait against a real single-node Slurm (tests/slurm_cluster.sh): the
4-run sweep tests/data/sweep_tiny.yaml goes through an sbatch job array whose tasks each run
`memlab sweep --index`; then the .sbatch file, the Slurm log and the results store are checked.

Exit 77 (ctest: skipped) with the reason when Slurm cannot start here (see tests/slurm_cluster.py).
usage: check_sweep_slurm.py MEMLAB
"""
import itertools
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import slurm_cluster  # noqa: E402
from checklib import expect, failures, finish  # noqa: E402

MEMLAB = os.path.abspath(sys.argv[1])
SWEEP = os.path.join(HERE, "data", "sweep_tiny.yaml")
NAME = "tiny"
STEPS = 10                                                   # train.steps of the sweep file
GRID = set(itertools.product([1, 2], [1.0e-3, 3.0e-3]))      # (train.seed, train.lr) of the sweep file

# Short: the munge socket path lives under it (unix socket paths are limited to 107 bytes).
tmp = tempfile.mkdtemp(prefix="memlab-sweep-slurm-", dir="/tmp")
os.chmod(tmp, 0o755)
cluster = os.path.join(tmp, "c")
results = os.path.join(tmp, "results")


def array_indexes(spec):
    """The task ids of an sbatch --array spec such as 0-3, 0,2,5-7 or 0-3%2 (step forms 0-7:2 too)."""
    ids = set()
    for part in spec.split("%")[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not m:
            raise ValueError(f"bad --array spec '{spec}'")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        ids.update(range(lo, hi + 1, int(m.group(3) or 1)))
    return ids


def train_keys(config_yaml):
    """(seed, lr) from the train: block of an effective config (memlab's nested YAML dump)."""
    seed = lr = None
    block = None
    for line in config_yaml.splitlines():
        if line and not line[0].isspace():
            block = line.split(":")[0]
        elif block == "train":
            key, _, value = line.strip().partition(":")
            if key == "seed":
                seed = int(value)
            elif key == "lr":
                lr = float(value)
    return seed, lr


with slurm_cluster.running(cluster) as env:
    env["OMP_NUM_THREADS"] = "1"   # one CPU per array task
    cmd = [MEMLAB, "sweep", SWEEP, "--results", results, "--name", NAME, "--slurm", "--submit", "--wait"]
    r = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=900)
    print(f"$ {' '.join(cmd)}\nexit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    expect(r.returncode == 0, f"memlab sweep --slurm --submit --wait: exit {r.returncode}")
    with open(os.path.join(cluster, "log", "slurmctld.log")) as f:
        ctld_log = f.read()

# The job script: an array over the 4 unfinished runs, each task one `memlab sweep --index`.
sbatch = os.path.join(results, "slurm", f"{NAME}.sbatch")
expect(os.path.isfile(sbatch), f"no {sbatch}")
if os.path.isfile(sbatch):
    with open(sbatch) as f:
        script = f.read()
    arrays = re.findall(r"^#SBATCH\s+--array[= ](\S+)", script, re.M)
    expect(len(arrays) == 1, f"{sbatch}: expected one '#SBATCH --array=...' line, found {arrays}")
    if arrays:
        try:
            expect(array_indexes(arrays[0]) == {0, 1, 2, 3}, f"--array={arrays[0]} does not cover runs 0-3")
        except ValueError as e:
            expect(False, f"{sbatch}: {e}")
    expect("--index" in script and "SLURM_ARRAY_TASK_ID" in script,
           f"{sbatch}: no `memlab sweep --index $SLURM_ARRAY_TASK_ID` line")

# Slurm really ran it: 4 array tasks of one job completed with exit status 0.
done_tasks = re.findall(r"_job_complete: JobId=(\d+)_(\d+)\(\d+\) WEXITSTATUS (\d+)", ctld_log)
expect(len({job for job, _, _ in done_tasks}) == 1 and sorted(int(t) for _, t, _ in done_tasks) == [0, 1, 2, 3]
       and all(s == "0" for _, _, s in done_tasks), f"array tasks completed per slurmctld.log: {done_tasks}")

# The results store.
db_path = os.path.join(results, "results.sqlite")
expect(os.path.isfile(db_path), f"no {db_path}")
if os.path.isfile(db_path):
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    members = db.execute("SELECT idx, run_id FROM sweep_runs WHERE sweep = ? ORDER BY idx", (NAME,)).fetchall()
    expect([i for i, _ in members] == [0, 1, 2, 3], f"sweep '{NAME}' indexes {[i for i, _ in members]}")
    ids = [rid for _, rid in members]
    expect(len(set(ids)) == 4, f"sweep '{NAME}' run ids not distinct: {ids}")
    seen = set()
    for rid in ids:
        status = [s for (s,) in db.execute("SELECT status FROM runs WHERE id = ?", (rid,))]
        expect(status == ["done"], f"run {rid}: status rows {status}, expected one 'done'")
        steps = {s for (s,) in db.execute("SELECT DISTINCT step FROM evals WHERE run_id = ?", (rid,))}
        expect(STEPS in steps, f"run {rid}: no eval rows for the final step {STEPS} (steps {sorted(steps)})")
        final = db.execute("SELECT length_min, length_max, n, accuracy FROM evals WHERE run_id = ? AND step = ?",
                           (rid, STEPS)).fetchall()
        expect(any((lo, hi) == (40, 60) for lo, hi, _, _ in final), f"run {rid}: no 40-60 eval row at step {STEPS}")
        expect(all(n == 32 and 0 <= acc <= 1 for _, _, n, acc in final), f"run {rid}: eval rows {final}")
        run_dir = os.path.join(results, "runs", rid)
        expect(os.path.isfile(os.path.join(run_dir, "eval.csv")), f"run {rid}: no {run_dir}/eval.csv")
        cfg = os.path.join(run_dir, "config.yaml")
        if os.path.isfile(cfg):
            with open(cfg) as f:
                seen.add(train_keys(f.read()))
        else:
            expect(False, f"run {rid}: no {cfg}")
    expect(seen == GRID, f"(seed, lr) of the runs {sorted(seen, key=str)}, expected {sorted(GRID)}")
    dups = db.execute("SELECT run_id, step, length_min, length_max, COUNT(*) FROM evals "
                      "GROUP BY run_id, step, length_min, length_max HAVING COUNT(*) > 1").fetchall()
    expect(not dups, f"duplicate eval rows: {dups[:5]}")
    db.close()

if not failures:
    shutil.rmtree(tmp, ignore_errors=True)
finish("memlab sweep --slurm --submit --wait: 4 runs through a real Slurm job array, each done once with its eval rows")
