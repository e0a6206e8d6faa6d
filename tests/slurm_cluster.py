"""The Python side of tests/slurm_cluster.sh: a private single-node Slurm for the duration of a with-block.

    with slurm_cluster.running(tmpdir) as env:      # env: os.environ with this cluster's SLURM_CONF
        subprocess.run(["sbatch", "--wait", ...], env=env)

When the cluster cannot start here (not root, Slurm or munge not installed, a daemon dies), prints the
reason and exits 77 (ctest: skipped); with MEMLAB_REQUIRE_SLURM=1 set that is a failure (exit 1) instead.
The cluster is stopped on leaving the block, also on an exception or sys.exit.
"""
import contextlib
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm_cluster.sh")
SKIP = 77


def _run(action, directory, timeout):
    return subprocess.run(["bash", SCRIPT, action, directory], capture_output=True, text=True, timeout=timeout)


def start(directory):
    """Starts the cluster in directory and returns the client environment; exits 77 (or 1) if it cannot."""
    try:
        r = _run("start", directory, 180)
        out = (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired as e:
        r, out = None, f"slurm_cluster.sh start did not finish in {e.timeout} s"
    if r is None or r.returncode != 0:
        if r is None:
            stop(directory)
        required = os.environ.get("MEMLAB_REQUIRE_SLURM") == "1"
        print(("FAIL" if required else "SKIP") + f": cannot start a single-node Slurm here:\n{out}")
        sys.exit(1 if required else SKIP)
    print(out)
    # Not the settings of a Slurm this may itself run under (SBATCH_* options, SLURM_* of an enclosing job).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = os.path.join(os.path.abspath(directory), "slurm.conf")
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
    return env


def stop(directory):
    """Stops the cluster; returns (ok, message)."""
    try:
        r = _run("stop", directory, 120)
    except subprocess.TimeoutExpired as e:
        return False, f"slurm_cluster.sh stop did not finish in {e.timeout} s"
    return r.returncode == 0, (r.stdout + r.stderr).strip()


@contextlib.contextmanager
def running(directory):
    env = start(directory)
    try:
        yield env
    except BaseException:
        print(stop(directory)[1])
        raise
    ok, msg = stop(directory)
    print(msg)
    if not ok:
        print("FAIL: the test cluster did not stop cleanly")
        sys.exit(1)
