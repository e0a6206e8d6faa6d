#!/usr/bin/env python3
"""memlab sweep end to end on CPU: SIGKILL the launcher mid-run and resume; SIGKILL a run's process and see it
fail, be summarised and be retried; finished sweeps run nothing again; every run's rows exactly once. Then the same
kill and resume with runs packed (--pack 2): packs resume together, runs that cannot pack run alone, and packed runs
train as their unpacked selves did; a pack that fails as a whole gives its runs back to run one by one."""
import csv
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import error_problems, expect, finish, held_signal  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-sweep-")
STEPS, EVERY = 120, 20

SWEEP = f"""sweep:
  name: killme
  experiments:
    - {{label: tiny deltanet, set: {{model.name: deltanet}}}}
  grid:
    train.lr: [1.0e-3, 3.0e-3]
    train.seed: [1, 2]
  set: {{task.name: parity, model.hidden: 16, model.heads: 2, model.layers: 1, model.mlp_inner: 32,
        train.batch_size: 16, train.steps: {STEPS}, train.checkpoint_every: {EVERY}, train.log_every: 10,
        eval.every: {EVERY}, eval.n: 32, task.eval_len: [40, 60], train.device: cpu}}
"""
sweep_file = os.path.join(tmp, "killme.yaml")
with open(sweep_file, "w") as f:
    f.write(SWEEP)
RES = os.path.join(tmp, "res")


def db(res=RES):
    return sqlite3.connect(os.path.join(res, "results.sqlite"), timeout=60)


def runs(res=RES, name="killme"):
    try:
        with db(res) as c:
            return c.execute("SELECT id, status, attempts, error FROM runs JOIN sweep_runs ON run_id = id "
                             "WHERE sweep = ? ORDER BY idx", (name,)).fetchall()
    except sqlite3.OperationalError:  # the launcher has created the file but not yet its tables
        return []


def latest_step(run_id, res=RES):
    path = os.path.join(res, "runs", run_id, "train.csv")
    try:
        with open(path) as f:
            rows = list(csv.DictReader(f))
        return int(rows[-1]["step"]) if rows else 0
    except (OSError, KeyError, ValueError, IndexError):
        return 0


def train_processes(res=RES):
    """pids of `memlab train` processes working in this results folder."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[1] == b"train" and any(res.encode() in a for a in args):
            pids.append(int(p))
    return pids


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def state(pid):
    """A process's state letter from /proc (T: stopped; Z: exited, not yet reaped; X: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def wait_for(cond, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return True
        time.sleep(0.05)
    expect(False, f"timed out waiting for {what}")


def kill_pack_mid_run(sweep, res, name):
    """Start `memlab sweep SWEEP --pack 2`, SIGKILL it once a pack of two runs is past its first checkpoint and
    before its last, and wait for the packed process to end with its launcher."""
    proc = subprocess.Popen([MEMLAB, "sweep", sweep, "--results", res, "--pack", "2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    wait_for(lambda: os.path.exists(os.path.join(res, "results.sqlite")) and
             sum(1 for r in runs(res, name) if r[1] == "running" and
                 EVERY < latest_step(r[0], res) < STEPS - EVERY) >= 2, 120, "a pack past its first checkpoint")
    # Stop the packed process outside its checkpoint commit (the members' temporaries written, renamed in turn),
    # so that the kill leaves both checkpoints at one step and the resume packs them again.
    dirs = [os.path.join(res, "runs", r[0]) for r in runs(res, name) if r[1] == "running"]

    def committing():
        return any(".tmp." in f for d in dirs for f in os.listdir(d))

    def stopped_between_commits():
        pids = train_processes(res)
        signal_all(pids, signal.SIGSTOP)
        wait_for(lambda: all(state(pid) in "TXZ" for pid in pids), 10, "SIGSTOP to take hold")
        if any(state(pid) == "T" for pid in pids) and not committing():
            return True
        signal_all(pids, signal.SIGCONT)
        return False

    wait_for(stopped_between_commits, 60, "the packed process stopped outside a checkpoint commit")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not train_processes(res), 10, "the packed process to end with its launcher")


def expect_sweep_errors(cases):
    """Each (args, needle): `memlab sweep ARGS` says one error: line holding needle and exits 2."""
    for args, needle in cases:
        r = subprocess.run([MEMLAB, "sweep", *args], capture_output=True, text=True)
        problems = error_problems(r, [needle])
        expect(not problems, f"memlab sweep {' '.join(args)}: {problems}, stderr {r.stderr!r}")
    return False


def sweep(*extra, timeout=600):
    return subprocess.run([MEMLAB, "sweep", sweep_file, "--results", RES, *extra], capture_output=True, text=True,
                          timeout=timeout)


# 1. SIGKILL the launcher while both of its runs are between checkpoints.
proc = subprocess.Popen([MEMLAB, "sweep", sweep_file, "--results", RES, "--workers", "2"], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
wait_for(lambda: os.path.exists(os.path.join(RES, "results.sqlite")) and
         sum(1 for r in runs() if r[1] == "running" and EVERY < latest_step(r[0]) < STEPS - EVERY) >= 1,
         120, "a run past its first checkpoint")
proc.send_signal(signal.SIGKILL)
proc.wait()
# Its runs die with it (no orphan keeps training).
wait_for(lambda: not train_processes(), 10, "the launcher's runs to end with it")
killed = [r for r in runs() if r[1] == "running"]
expect(len(killed) >= 1, f"expected runs left 'running' by the killed launcher, got {runs()}")
partial = {r[0]: latest_step(r[0]) for r in killed}

# 2. The same command again: resumes those runs from their checkpoints and does the rest.
t0 = time.time()
r = sweep("--workers", "2")
took = time.time() - t0
expect(r.returncode == 0, f"resumed sweep failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
final = runs()
expect(all(s == "done" for _, s, _, _ in final), f"not every run done after resuming: {final}")
attempts = {i: a for i, _, a, _ in final}
for rid, step in partial.items():
    expect(attempts[rid] == 2, f"run {rid} killed at step {step} should have 2 attempts, has {attempts[rid]}")
    log = open(os.path.join(RES, "logs", rid + ".log")).read()
    # at step == EVERY the kill may fall between that train.csv row and its checkpoint: past it, one exists
    if step > EVERY:
        expect("resuming its checkpoint" in log, f"run {rid} (killed at step {step}) did not resume its checkpoint")
    tlog = open(os.path.join(RES, "runs", rid, "log.txt")).read()
    expect(step <= EVERY or "resuming" in tlog, f"run {rid}: the trainer's log does not show the resume")

# 3. Complete results, each exactly once, identical to the run directories' files.
def check_rows(final, res=RES):
    with db(res) as c:
        for rid, _, _, _ in final:
            rows = c.execute("SELECT step, length_min, length_max, n, accuracy, normalized FROM evals WHERE run_id = ? "
                             "ORDER BY step, length_min, length_max", (rid,)).fetchall()
            keys = [(s, a, b) for s, a, b, _, _, _ in rows]
            expect(len(keys) == len(set(keys)), f"run {rid}: duplicate evaluation rows")
            steps = sorted({s for s, _, _ in keys})
            expect(steps == list(range(EVERY, STEPS + 1, EVERY)), f"run {rid}: evaluation steps {steps}")
            with open(os.path.join(res, "runs", rid, "eval.csv")) as f:
                file_rows = [(int(x["step"]), int(x["length_min"]), int(x["length_max"])) for x in csv.DictReader(f)]
            expect(sorted(file_rows) == sorted(keys), f"run {rid}: the store and eval.csv disagree")
            tsteps = [s for (s,) in c.execute("SELECT step FROM train WHERE run_id = ? ORDER BY step", (rid,))]
            expect(tsteps == list(range(10, STEPS + 1, 10)), f"run {rid}: training rows at steps {tsteps}")


check_rows(final)


def device_time(res, ids):
    with db(res) as c:
        dev = dict(c.execute("SELECT id, device_seconds FROM runs"))
    return [dev[i] for i in ids]


# Each run's device time is its attempts' wall time, shared among the runs of its process: the resumed call's two
# workers cannot have spent more than twice its time (the killed launcher's attempts went unrecorded). The report
# gives the total as recorded.
dev = device_time(RES, [i for i, _, _, _ in final])
expect(all(d > 0 for d in dev) and sum(dev) <= 2 * took + 1, f"device time {dev} for a call of {took:.1f} s on 2 workers")
r = subprocess.run([MEMLAB, "report", RES], capture_output=True, text=True, timeout=120)
expect(r.returncode == 0 and "device time" in r.stdout and "4 finished runs" in r.stdout and "recorded:" in r.stdout,
       f"the report's device time: {r.stdout[-600:]}")

# A sweep started with SIGINT held (blocked by the mask it inherits) takes it once it catches it, before it claims a run:
# it stops at once (exit 130) and starts nothing.
HELD = os.path.join(tmp, "res_held")
rc, err = held_signal([MEMLAB, "sweep", sweep_file, "--results", HELD], signal.SIGINT)
held_runs = runs(HELD)
expect(rc == 130 and held_runs and all(s == "pending" and a == 0 for _, s, a, _ in held_runs),
       f"a sweep with SIGINT held: exit {rc}, runs {held_runs}, {err[-300:]}")

# 4. A finished sweep runs nothing again.
r = sweep("--workers", "2")
expect(r.returncode == 0 and "4 done, 0 failed, 0 to run" in r.stdout, f"second run of a finished sweep: {r.stdout}")
expect({i: a for i, _, a, _ in runs()} == attempts, "a finished sweep started runs again")

# 5. SIGKILL a run's own process with --retries 0: the run fails, the summary names it, --retry-failed resumes it.
one = os.path.join(tmp, "one.yaml")
with open(one, "w") as f:
    f.write(SWEEP.replace("name: killme", "name: one").replace("[1.0e-3, 3.0e-3]", "[2.0e-3]").replace("[1, 2]", "[3]"))
proc = subprocess.Popen([MEMLAB, "sweep", one, "--results", RES, "--retries", "0"], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)


def one_run():
    try:
        with db() as c:
            return c.execute("SELECT id, status FROM runs JOIN sweep_runs ON run_id = id WHERE sweep = 'one'").fetchone()
    except sqlite3.OperationalError:
        return None


wait_for(lambda: os.path.exists(os.path.join(RES, "results.sqlite")) and one_run() is not None and
         EVERY < latest_step(one_run()[0]) < STEPS - EVERY, 120, "the single run past a checkpoint")
for pid in train_processes():
    os.kill(pid, signal.SIGKILL)
out, _ = proc.communicate(timeout=120)
expect(proc.returncode == 1, f"a sweep with a failed run should exit 1, got {proc.returncode}: {out}")
expect("failed" in out and "killed by signal 9" in out and "--retry-failed" in out,
       f"the summary should name the failed run and its error: {out}")
st = subprocess.run([MEMLAB, "sweep", "--results", RES, "--name", "one", "--status"], capture_output=True, text=True)
expect(st.returncode == 0 and "1 failed" in st.stdout and "killed by signal 9" in st.stdout, f"--status: {st.stdout}")
r = subprocess.run([MEMLAB, "sweep", one, "--results", RES, "--retry-failed"], capture_output=True, text=True,
                   timeout=300)
expect(r.returncode == 0, f"--retry-failed: {r.stdout} {r.stderr}")
rid, status = one_run()
expect(status == "done", f"retried run is {status}")
expect("resuming its checkpoint" in open(os.path.join(RES, "logs", rid + ".log")).read(), "the retry did not resume")

# 6. Clear errors.
expect_sweep_errors([([], "needs sweep files"), ([sweep_file, "--results", RES, "--grid", "train.seed"], "--grid"),
                     (["--results", RES, "--name", "killme", "--index", "99"], "out of range"),
                     (["--results", os.path.join(tmp, "nothing")], "results.sqlite")])

# 7. Packed (--pack 2): SIGKILL the launcher while a pack is between checkpoints, then resume. The DeltaNet runs pack
# in twos; an autoencoder head does not pack, so its runs train alone.
RES2 = os.path.join(tmp, "res_packed")
packed_file = os.path.join(tmp, "packed.yaml")
with open(packed_file, "w") as f:
    f.write(SWEEP.replace("name: killme", "name: packed").replace(
        "    - {label: tiny deltanet, set: {model.name: deltanet}}",
        "    - {label: tiny deltanet, set: {model.name: deltanet}}\n"
        "    - {label: tiny autoencoder, set: {model.name: deltanet, model.head: autoencoder}}"))
kill_pack_mid_run(packed_file, RES2, "packed")
killed = [r for r in runs(RES2, "packed") if r[1] == "running"]
expect(len(killed) == 2, f"expected one pack of two runs left 'running', got {runs(RES2, 'packed')}")
partial = {r[0]: latest_step(r[0], RES2) for r in killed}
t0 = time.time()
r = subprocess.run([MEMLAB, "sweep", packed_file, "--results", RES2, "--pack", "2", "--workers", "2"],
                   capture_output=True, text=True, timeout=600)
took = time.time() - t0
expect(r.returncode == 0, f"resumed packed sweep failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
final2 = runs(RES2, "packed")
expect(len(final2) == 8 and all(s == "done" for _, s, _, _ in final2), f"packed sweep not all done: {final2}")
attempts2 = {i: a for i, _, a, _ in final2}
for rid, step in partial.items():
    expect(attempts2[rid] == 2, f"packed run {rid} killed at step {step}: {attempts2[rid]} attempts, wanted 2")
    log = open(os.path.join(RES2, "logs", rid + ".log")).read()
    heads = [line for line in log.splitlines() if line.startswith("== memlab sweep: attempt")]
    expect(len(heads) == 2 and all("packed into one process" in h and all(k in h for k in partial) for h in heads),
           f"run {rid}: both attempts should pack the two killed runs together: {heads}")
    expect(step <= EVERY or "resuming its checkpoint" in log.split("== memlab sweep: attempt 2")[-1],
           f"packed run {rid} (killed at step {step}) did not resume its checkpoint")
check_rows(final2, RES2)
# The two runs resumed as one pack share its process's time: each holds half of that attempt's wall time (claim to
# finish, the store's started and finished; the first attempts died unrecorded with their launcher).
dev = device_time(RES2, [i for i, _, _, _ in final2])
with db(RES2) as c:
    walls = [c.execute("SELECT finished - started FROM runs WHERE id = ?", (i,)).fetchone()[0] for i in partial]
pair = device_time(RES2, list(partial))
expect(all(d > 0 for d in dev) and sum(dev) <= 2 * took + 1 and
       all(abs(d - w / 2) <= 0.1 * w + 0.3 for d, w in zip(pair, walls)),
       f"packed device time {dev} (the resumed pack's {pair}, its walls {walls}) for a call of {took:.1f} s on 2 workers")
with db(RES2) as c:
    labels = dict(c.execute("SELECT id, label FROM runs"))
for rid, _, _, _ in final2:
    log = open(os.path.join(RES2, "logs", rid + ".log")).read()
    expect(("packed into one process" in log) == (labels[rid] == "tiny deltanet"),
           f"run {rid} ({labels[rid]}): packed {'packed into one process' in log}, wanted only the lm-head runs packed")
# The same DeltaNet runs (same ids) trained unpacked in RES: a packed run trains as its solo run, to fp32 rounding.
for rid, _, _, _ in final:
    with open(os.path.join(RES, "runs", rid, "train.csv")) as f:
        solo = [float(x["loss"]) for x in csv.DictReader(f)]
    with open(os.path.join(RES2, "runs", rid, "train.csv")) as f:
        packed = [float(x["loss"]) for x in csv.DictReader(f)]
    worst = max(abs(a - b) / abs(a) for a, b in zip(solo, packed)) if len(solo) == len(packed) else float("inf")
    expect(worst < 1e-3, f"run {rid}: packed losses differ from the unpacked run's by {worst:.2e} relative")

# 8. --pack errors.
expect_sweep_errors([([packed_file, "--results", RES2, "--pack", "0"], "--pack '0'"),
                     ([packed_file, "--results", RES2, "--pack", "two"], "--pack 'two'"),
                     (["--results", RES2, "--name", "packed", "--index", "0", "--pack", "2"], "--pack goes with")])

# 9. A pack that fails as a whole gives its runs back to run one by one. After a packed kill, one run's config.yaml
# is changed (model.hidden), so the packed resume refuses the pair; alone, the other run resumes its checkpoint and
# finishes, and the changed one fails with its own error.
RES3 = os.path.join(tmp, "res_whole")
whole_file = os.path.join(tmp, "whole.yaml")
with open(whole_file, "w") as f:
    f.write(SWEEP.replace("name: killme", "name: whole").replace("train.lr: [1.0e-3, 3.0e-3]", "train.lr: [1.0e-3]"))
kill_pack_mid_run(whole_file, RES3, "whole")
kept, changed = [r[0] for r in runs(RES3, "whole")]
cfg_path = os.path.join(RES3, "runs", changed, "config.yaml")
with open(cfg_path) as f:
    cfg, n = re.subn(r"(\n\s*hidden:\s*)16\b", r"\g<1>32", f.read())
expect(n == 1, f"{cfg_path}: no 'hidden: 16' to change")
with open(cfg_path, "w") as f:
    f.write(cfg)
r = subprocess.run([MEMLAB, "sweep", whole_file, "--results", RES3, "--pack", "2"], capture_output=True, text=True,
                   timeout=600)
expect(r.returncode == 1 and "a pack of 2 runs failed" in r.stdout and "will run one by one" in r.stdout,
       f"the refused pack: rc {r.returncode}, {r.stdout[-1500:]} {r.stderr[-500:]}")
final3 = {i: (s, e) for i, s, _, e in runs(RES3, "whole")}
expect(final3[kept][0] == "done", f"run {kept} alone: {final3[kept]}")
expect(final3[changed][0] == "failed" and "model.hidden" in final3[changed][1],
       f"run {changed} (config changed): {final3[changed]}, wanted failed naming model.hidden")
last = open(os.path.join(RES3, "logs", kept + ".log")).read().split("== memlab sweep: attempt")[-1]
expect("packed into one process" not in last.splitlines()[0] and "resuming its checkpoint" in last.splitlines()[0],
       f"run {kept}: its last attempt should resume its checkpoint alone: {last.splitlines()[0]!r}")

# 10. --deadline. A first call on a fresh sweep starts "long" (nothing has finished, so nothing says it will not fit)
# and stops it at the deadline: it checkpoints and goes back to pending. Once "short" has finished, a call whose
# deadline is shorter than long's steps left at short's pace declines it, leaving the run as it was, and starts
# "short2", a later run, in its place where that would end in time; the next call with time enough resumes long, and
# a kill from outside is still retried there (--retries 1): the deadline's stop is not held against the run.
RES4 = os.path.join(tmp, "res_deadline")
deadline_file = os.path.join(tmp, "deadline.yaml")
LONG = 30 * STEPS
with open(deadline_file, "w") as f:
    f.write(SWEEP.replace("name: killme", "name: deadline").replace("train.lr: [1.0e-3, 3.0e-3]", "train.lr: [1.0e-3]")
            .replace("train.seed: [1, 2]", "train.seed: [1]")
            .replace("- {label: tiny deltanet, set: {model.name: deltanet}}",
                     f"- {{label: long, set: {{model.name: deltanet, train.steps: {LONG}}}}}\n"
                     "    - {label: short, set: {model.name: deltanet}}\n"
                     "    - {label: short2, set: {model.name: deltanet, train.weight_decay: 0.05}}"))  # a run of its own


def deadline_sweep(*extra):
    return subprocess.run([MEMLAB, "sweep", deadline_file, "--results", RES4, *extra], capture_output=True, text=True,
                          timeout=600)


def run_of(label):
    return db(RES4).execute("SELECT id, status, attempts FROM runs WHERE label = ?", (label,)).fetchone()


r = deadline_sweep("--deadline", "8")
long_id, status, attempts = run_of("long")
step = latest_step(long_id, RES4)
expect(r.returncode == 130 and "stopped at its deadline" in r.stdout and "signal" not in r.stdout,
       f"--deadline 8 on a fresh sweep: rc {r.returncode}, {r.stdout[-1500:]} {r.stderr[-500:]}")
expect((status, attempts) == ("pending", 1) and 0 < step < LONG and
       os.path.exists(os.path.join(RES4, "runs", long_id, "checkpoint.pt")) and run_of("short")[1:] == ("pending", 0)
       and run_of("short2")[1:] == ("pending", 0),
       f"after the deadline: long {status}, {attempts} attempts, step {step}; short {run_of('short')}; wanted long "
       f"pending with a checkpoint, short not started")
r = deadline_sweep("--index", "1")
expect(r.returncode == 0 and run_of("short")[1] == "done", f"--index 1 (short): rc {r.returncode}, {r.stdout[-1000:]}")
short_s = db(RES4).execute("SELECT finished - started FROM runs WHERE label = 'short'").fetchone()[0]
expect(short_s > 0, f"the short run's wall time in the store: {short_s}")
r = deadline_sweep("--deadline", str(short_s))  # long has far more than STEPS steps left
expect(r.returncode == 130 and "no more runs start" in r.stdout and run_of("long")[1:] == ("pending", 1) and
       run_of("short2")[1:] == ("pending", 0),  # short2 would take short's time: too long with a fifth to spare
       f"--deadline {short_s}: rc {r.returncode}, long {run_of('long')}, short2 {run_of('short2')}, "
       f"{r.stdout[-1500:]} {r.stderr[-500:]}")
r = deadline_sweep("--deadline", str(4 * short_s))  # short2 fits, long still does not: short2 goes first
expect(r.returncode == 130 and "runs after it that would end in time may start first" in r.stdout and
       run_of("long")[1:] == ("pending", 1) and run_of("short2")[1:] == ("done", 1),
       f"--deadline {4 * short_s}: rc {r.returncode}, long {run_of('long')}, short2 {run_of('short2')}, "
       f"{r.stdout[-1500:]} {r.stderr[-500:]}")
# --fill: where no run would end in time, one starts anyway while at least SECS are left, trains until the deadline
# and checkpoints; with less than SECS left, none starts.
r = deadline_sweep("--deadline", str(short_s), "--fill", str(10 * short_s))
expect(r.returncode == 130 and "no more runs start" in r.stdout and run_of("long")[1:] == ("pending", 1),
       f"--fill {10 * short_s} with {short_s} s: rc {r.returncode}, long {run_of('long')}, {r.stdout[-1500:]}")
before_fill = latest_step(long_id, RES4)
r = deadline_sweep("--deadline", str(max(3.0, 2 * short_s)), "--fill", "0")  # long does not fit 4 * short_s (above)
expect(r.returncode == 130 and "starts alone anyway (--fill)" in r.stdout and "stopped at its deadline" in r.stdout and
       "signal" not in r.stdout and
       run_of("long")[1:] == ("pending", 2) and latest_step(long_id, RES4) > before_fill and
       os.path.exists(os.path.join(RES4, "runs", long_id, "checkpoint.pt")),
       f"--fill 0: rc {r.returncode}, long {run_of('long')}, step {before_fill} -> {latest_step(long_id, RES4)}, "
       f"{r.stdout[-1500:]} {r.stderr[-500:]}")
# The deadline's stop is not held against --retries: with --retries 1, a kill from outside after it is resumed.
stopped_at = latest_step(long_id, RES4)
# It also turns TensorBoard off, a key the run id ignores: the pending run resumes with it, the done one keeps its own.
proc = subprocess.Popen([MEMLAB, "sweep", deadline_file, "--results", RES4, "--retries", "1", "--deadline", "600",
                         "--set", "train.tensorboard=false"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
wait_for(lambda: stopped_at + EVERY < latest_step(long_id, RES4) < LONG - EVERY, 120, "the long run past a checkpoint")
for pid in train_processes(RES4):
    os.kill(pid, signal.SIGKILL)
out, _ = proc.communicate(timeout=600)
stops = db(RES4).execute("SELECT stops FROM runs WHERE id = ?", (long_id,)).fetchone()[0]
expect(proc.returncode == 0 and "it will be resumed" in out and run_of("long")[1:] == ("done", 4) and stops == 2,
       f"killed after a deadline's stop, --retries 1: rc {proc.returncode}, long {run_of('long')}, {stops} stops, "
       f"{out[-1500:]}")
log = open(os.path.join(RES4, "logs", long_id + ".log")).read()
expect(log.count("resuming its checkpoint") >= 2, f"the stopped run did not resume its checkpoint: {log[-1500:]}")
stored = dict(db(RES4).execute("SELECT label, config FROM runs").fetchall())
run_cfg = open(os.path.join(RES4, "runs", long_id, "config.yaml")).read()
expect("tensorboard: false" in stored["long"] and "tensorboard: false" in run_cfg and
       "tensorboard: true" in stored["short"],
       f"a key the id ignores, changed while long was pending: its store config and config.yaml should say "
       f"tensorboard false, short's (done) true: long {'tensorboard: false' in stored['long']}, config.yaml "
       f"{'tensorboard: false' in run_cfg}, short {'tensorboard: true' in stored['short']}")
expect_sweep_errors([([deadline_file, "--results", RES4, "--deadline", "0"], "--deadline"),
                     ([deadline_file, "--results", RES4, "--deadline", "5", "--list"], "--deadline goes with"),
                     ([deadline_file, "--results", RES4, "--fill", "60"], "--fill goes with --deadline")])

# 11. --deadline with --pack: a finished pack's time is shared among its members, so a pack that does not fit before
# the deadline starts with as many of its runs as do. Runs 0 and 1 run for real, then the store says they were one
# pack of 2 that took 100 s: the next pack of 2 (100 s) does not fit in 80 s, one of its runs (55 s) does.
RES5 = os.path.join(tmp, "res_deadline_pack")
pack_file = os.path.join(tmp, "deadline_pack.yaml")
with open(pack_file, "w") as f:
    f.write(SWEEP.replace("name: killme", "name: dpack").replace("train.lr: [1.0e-3, 3.0e-3]", "train.lr: [1.0e-3]")
            .replace("train.seed: [1, 2]", "train.seed: [1, 2, 3, 4]"))
for i in (0, 1):
    r = subprocess.run([MEMLAB, "sweep", pack_file, "--results", RES5, "--index", str(i)], capture_output=True,
                       text=True, timeout=600)
    expect(r.returncode == 0, f"--index {i}: rc {r.returncode}, {r.stdout[-1000:]} {r.stderr[-500:]}")
with db(RES5) as c:
    c.execute("UPDATE runs SET worker = 'elsewhere:1', started = 1000.0, finished = 1100.0, seconds = 100.0 "
              "WHERE status = 'done'")
# --status: the device time so far, as recorded for the two runs, and what is left at their pace (50 s a run).
r = subprocess.run([MEMLAB, "sweep", pack_file, "--results", RES5, "--status"], capture_output=True, text=True,
                   timeout=120)
expect(r.returncode == 0 and "spent: device time" in r.stdout and "2 finished runs" in r.stdout and
       "recorded:" in r.stdout and "left: about 1m40s of device time for the 2 runs pending or running" in r.stdout,
       f"--status with 2 runs done: {r.stdout[-1000:]} {r.stderr[-500:]}")
r = subprocess.run([MEMLAB, "sweep", pack_file, "--results", RES5, "--pack", "2", "--deadline", "80"],
                   capture_output=True, text=True, timeout=600)
states = [s for _, s, _, _ in runs(RES5, "dpack")]
expect(r.returncode == 0 and "1 of the pack of 2 fit before the deadline" in r.stdout and states == ["done"] * 4,
       f"--pack 2 --deadline 80: rc {r.returncode}, runs {states}, {r.stdout[-1500:]} {r.stderr[-500:]}")

# 12. scripts/sweep_slice.sh --store: the results folder travels as one tarball. A first slice (no tarball yet) runs
# the sweep and writes it; with the folder gone, as on a fresh machine, the next slice unpacks it into results/NAME
# and runs only the run added since. The tarball holds the folder's files but finished runs' checkpoints, TensorBoard
# files and the launcher's logs/ (anchored: a results folder may itself be called logs). A tarball of another sweep's
# folder, of two folders or of nothing readable is refused with one error line, and leaves the folder that is there
# as it was, and none where there was none. --grace: a sweep that ignores Ctrl-C is killed SECS + G + 15 s in.
SLICE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "sweep_slice.sh")
cwd6 = os.path.join(tmp, "slice_machine")
os.makedirs(cwd6)
tarball = os.path.join(tmp, "slice_store.txz")
slice_file = os.path.join(tmp, "slice.yaml")


def write_slice_sweep(seeds, name="slice"):
    with open(slice_file, "w") as f:
        f.write(SWEEP.replace("name: killme", f"name: {name}")
                .replace("train.lr: [1.0e-3, 3.0e-3]", "train.lr: [1.0e-3]")
                .replace("train.seed: [1, 2]", f"train.seed: {seeds}"))


def slice_call(*extra, store=tarball, memlab=MEMLAB, secs="600", grace="60"):
    return subprocess.run(["bash", SLICE, "--memlab", os.path.abspath(memlab), "--store", store, "--grace", grace,
                           secs, slice_file, *extra], capture_output=True, text=True, timeout=900, cwd=cwd6)


def tar_names(store=tarball):
    return subprocess.run(["tar", "tJf", store], capture_output=True, text=True, check=True).stdout.split()


def files_under(top, name):
    """The folder's files as tar names them (name/...), less what --store leaves out."""
    out = set()
    for d, _, fs in os.walk(os.path.join(top, name)):
        for f in fs:
            rel = os.path.relpath(os.path.join(d, f), top)
            if not (f == "checkpoint.pt" or f.startswith("events.out") or rel.startswith(name + "/logs/")):
                out.add(rel)
    return out


RES6 = os.path.join(cwd6, "results", "slice")
write_slice_sweep("[1, 2]")
r = slice_call()
folder = files_under(os.path.join(cwd6, "results"), "slice")  # before this test's reads add SQLite's -wal and -shm
names = tar_names() if os.path.exists(tarball) else []
expect(r.returncode == 0 and [s for _, s, _, _ in runs(RES6, "slice")] == ["done"] * 2,
       f"first slice: rc {r.returncode}, runs {runs(RES6, 'slice')}, {r.stdout[-1500:]} {r.stderr[-500:]}")
left_out = [n for n in names if n.endswith("checkpoint.pt") or "events.out" in n or n.startswith("slice/logs/")]
expect(folder == {n for n in names if not n.endswith("/")} and
       "slice/results.sqlite" in names and not left_out and
       any(f.startswith("events.out") for _, _, fs in os.walk(RES6) for f in fs) and os.path.isdir(RES6 + "/logs"),
       f"first slice's tarball: {names}, folder {sorted(folder)}")
with open(os.path.join(RES6, "runs", runs(RES6, "slice")[0][0], "eval.csv")) as f:
    eval_before = f.read()
shutil.rmtree(os.path.join(cwd6, "results"))
write_slice_sweep("[1, 2, 3]")
r = slice_call("--fill", "60")  # an option of the sweep's alone: the slice's --list of the store must not get it
folder = files_under(os.path.join(cwd6, "results"), "slice")
after = runs(RES6, "slice")
expect(r.returncode == 0 and "unpacked into results/slice (2 done, 0 failed, 1 to run)" in r.stdout and
       [s for _, s, _, _ in after] == ["done"] * 3,
       f"second slice: rc {r.returncode}, runs {after}, {r.stdout[-1500:]} {r.stderr[-500:]}")
with open(os.path.join(RES6, "runs", after[0][0], "eval.csv")) as f:
    expect(f.read() == eval_before, "the first run's eval.csv changed on its way through the tarball")
expect(folder == {n for n in tar_names() if not n.endswith("/")},
       f"second slice's tarball: {tar_names()}")
# Refused: another sweep's tarball. The folder there stays as it was; with none there, none is made.
with open(os.path.join(RES6, "results.sqlite"), "rb") as f:
    store_before = f.read()
write_slice_sweep("[1, 2, 3]", name="another")
r = slice_call()
problems = error_problems(r, ["results/another", "--results"])
with open(os.path.join(RES6, "results.sqlite"), "rb") as f:
    expect(not problems and f.read() == store_before and sorted(os.listdir(os.path.join(cwd6, "results"))) == ["slice"],
           f"another sweep's tarball over a folder: {problems}, {r.stderr!r}")
shutil.rmtree(os.path.join(cwd6, "results"))
r = slice_call()
problems = error_problems(r, ["results/another", "--results"])
expect(not problems and os.listdir(cwd6) == [], f"another sweep's tarball: {problems}, left {os.listdir(cwd6)}")
# A results folder called logs keeps its files.
write_slice_sweep("[1]")
logs_store = os.path.join(tmp, "logs_store.txz")
r = slice_call("--results", os.path.join(tmp, "x", "logs"), store=logs_store)
expect(r.returncode == 0 and "logs/results.sqlite" in (tar_names(logs_store) if os.path.exists(logs_store) else []),
       f"a results folder called logs: rc {r.returncode}, {r.stdout[-800:]} {r.stderr[-500:]}")
two = os.path.join(tmp, "two")
os.makedirs(os.path.join(two, "a"))
os.makedirs(os.path.join(two, "b"))
subprocess.run(["tar", "cJf", tarball, "-C", two, "a", "b"], check=True)
r = slice_call()
problems = error_problems(r, ["one results folder"])
expect(not problems, f"a tarball of two folders: {problems}, {r.stderr!r}")
with open(tarball, "w") as f:
    f.write("not a tarball\n")
r = slice_call()
problems = error_problems(r, ["cannot read"])
expect(not problems, f"a file that is no tarball: {problems}, {r.stderr!r}")

def stand_in(name, body):
    """A stand-in memlab that lists no store (--list prints nothing) and otherwise runs the bash `body`."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("#!/usr/bin/env bash\nfor a in \"$@\"; do [[ $a == --list ]] && exit 0; done\n" + body)
    os.chmod(path, 0o755)
    return path


def signalled_slice(args, sig, group=False, after=2, timeout=60):
    """sweep_slice.sh ARGS, sent `sig` `after` seconds in (to its process group, as a terminal's Ctrl-C is, where
    group): (rc, stdout, stderr, seconds from the signal to its end)."""
    p = subprocess.Popen(["bash", SLICE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd6,
                         start_new_session=group)
    time.sleep(after)
    t0 = time.time()
    if group:
        os.killpg(p.pid, sig)
    else:
        p.send_signal(sig)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err, time.time() - t0


# --grace: a stand-in memlab that ignores SIGINT is interrupted at 1 + 1 s, killed 15 s later.
deaf = stand_in("deaf_memlab", "trap '' INT\nsleep 60\n")
t0 = time.time()
r = slice_call(store=os.path.join(tmp, "deaf.txz"), memlab=deaf, secs="1", grace="1")
took = time.time() - t0
expect(16 <= took < 40 and "killed 16 s past its deadline" in r.stdout,
       f"--grace 1 on a sweep deaf to Ctrl-C: {took:.1f} s, rc {r.returncode}, {r.stdout!r} {r.stderr!r}")

# Ctrl-C or TERM sent to sweep_slice.sh reaches the sweep, which runs in timeout's own process group: the stand-in
# records the INT it gets and stops, and the slice ends within seconds, not at its grace's end.
marker = os.path.join(tmp, "got_int")
hearing = stand_in("hearing_memlab", f"sleep 60 & trap 'touch {marker}; kill $!; exit 130' INT\nwait\n")
for sig in (signal.SIGINT, signal.SIGTERM):
    if os.path.exists(marker):
        os.remove(marker)
    rc, out, err, took = signalled_slice(
        ["--memlab", hearing, "--store", os.path.join(tmp, "hearing.txz"), "--grace", "60", "600", slice_file], sig)
    expect(os.path.exists(marker) and took < 10 and "stopped within 600 s" in out,
           f"{sig.name} to sweep_slice.sh: reached the sweep {os.path.exists(marker)}, {took:.1f} s, {out!r} {err!r}")
# With the real sweep: TERM to the slice stops it as its deadline does, and the store is still written.
write_slice_sweep("[1]")
with open(slice_file) as f:
    long_slice = f.read().replace(f"train.steps: {STEPS}", "train.steps: 100000")
with open(slice_file, "w") as f:
    f.write(long_slice)
term_store = os.path.join(tmp, "term.txz")
term_args = ["--memlab", os.path.abspath(MEMLAB), "--store", term_store, "600", slice_file, "--results",
             os.path.join(tmp, "term")]
rc, out, err, took = signalled_slice(term_args, signal.SIGTERM, after=3, timeout=180)
names = tar_names(term_store) if os.path.exists(term_store) else []
expect(rc == 0 and took < 60 and "stopped within 600 s" in out and "term/results.sqlite" in names,
       f"TERM to a slice: rc {rc}, {took:.1f} s, store {names}, {out[-800:]!r} {err[-400:]!r}")
# A Ctrl-C (to the terminal's process group) while the store is being unpacked and checked leaves nothing behind:
# neither the unpacked folder nor the results/ folder the slice made for it.
slow = os.path.join(tmp, "slow_list_memlab")
with open(slow, "w") as f:
    f.write("#!/usr/bin/env bash\nfor a in \"$@\"; do [[ $a == --list ]] && sleep 30; done\nexit 0\n")
os.chmod(slow, 0o755)
os.makedirs(os.path.join(tmp, "one", "slice"))
with open(os.path.join(tmp, "one", "slice", "results.sqlite"), "w") as f:
    f.write("x")
one = os.path.join(tmp, "one.txz")
subprocess.run(["tar", "cJf", one, "-C", os.path.join(tmp, "one"), "slice"], check=True)
rc, out, err, took = signalled_slice(["--memlab", slow, "--store", one, "600", slice_file], signal.SIGINT, group=True)
expect(rc != 0 and took < 10 and os.listdir(cwd6) == [],
       f"Ctrl-C while unpacking: rc {rc}, left {os.listdir(cwd6)}, {out!r} {err!r}")

finish(f"memlab sweep: kill/resume, failure and retry, exactly-once rows, packed kill/resume, a failed pack run one by "
       f"one, --deadline alone and with packs, sweep_slice.sh --store all OK ({tmp})")
