#!/usr/bin/env python3
"""Runs under hostile conditions: a full disk (RLIMIT_FSIZE), kills before the first checkpoint and during the
final evaluation, edited or damaged checkpoints, sizes that cannot fit, and the small contract breaks found in
verification (issue 13). Each must end with one clear `error:` line (exit 2) or resume exactly, and leave no
temporary file behind."""
import os
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import expect, finish  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-safety-")
TINY = ["--task", "parity", "--device", "cpu", "--batch-size", "16", "--set", "model.hidden=16", "--set",
        "model.heads=2", "--set", "model.layers=1", "--set", "model.mlp_inner=32", "--set", "eval.n=32",
        "--set", "task.eval_len=[40,60]", "--set", "train.log_every=5", "--set", "eval.every=10"]
RL_TINY = ["--device", "cpu", "--distractor", "4", "--set", "model.hidden=16", "--set", "model.layers=1",
           "--set", "model.heads=1", "--set", "model.mlp_inner=16", "--set", "rl.head_hidden=16",
           "--set", "rl.warmup_episodes=2", "--set", "rl.batch_episodes=4", "--set", "rl.updates_per_step=0.05",
           "--set", "rl.eval_every=2", "--set", "rl.eval_episodes=3", "--no-plot"]


def run(args, limit_bytes=None, timeout=300):
    def small_disk():  # writes past limit_bytes fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return subprocess.run([MEMLAB, *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=small_disk if limit_bytes else None)


def one_error(r, what, needles=(), code=2):
    """Exit `code` with exactly one 'error:' line holding every needle, and no abort or stack trace."""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    ok = r.returncode == code and len(errors) == 1 and all(n in errors[0] for n in needles)
    ok = ok and not any(bad in r.stderr for bad in ("terminate called", "Aborted", "frame #", "Exception raised"))
    expect(ok, f"{what}: exit {r.returncode}, stderr {r.stderr.strip()[-400:]!r}")


def temporaries(d):
    return [f for dirpath, _, files in os.walk(d) for f in files if ".tmp." in f]


def rows(path):
    with open(path) as f:
        return f.read().strip().splitlines()[1:]


# ---- a full disk while writing the checkpoint: one error line, exit 2, no temporary, on start and on resume
d = os.path.join(tmp, "full")
r = run(["train", *TINY, "--steps", "10", "--out", d], limit_bytes=20000)
one_error(r, "full disk at the checkpoint", ["checkpoint.pt", "File too large"])
expect(not temporaries(d), f"full disk: temporaries left: {temporaries(d)}")
d = os.path.join(tmp, "full_resume")
r = run(["train", *TINY, "--steps", "10", "--out", d])
expect(r.returncode == 0, f"run to resume: {r.stderr[-300:]}")
r = run(["train", "--resume", d, "--steps", "20"], limit_bytes=20000)
one_error(r, "full disk on resume", ["File too large"])
expect(not temporaries(d), f"full disk on resume: temporaries left: {temporaries(d)}")
r = run(["train", "--resume", d, "--steps", "20"])
expect(r.returncode == 0, f"resume after the full disk: {r.stderr[-300:]}")
d = os.path.join(tmp, "full_rl")
r = run(["rl", "visual-match", "--model", "transformer", "--episodes", "2", "--out", d, *RL_TINY], limit_bytes=30000)
one_error(r, "full disk in rl", ["File too large"])
expect(not temporaries(d), f"full disk in rl: temporaries left: {temporaries(d)}")

# ---- temporaries left by a dead writer are removed when the run is resumed; a live writer's are kept
d = os.path.join(tmp, "full_resume")
dead, alive = os.path.join(d, "checkpoint.pt.tmp.999999999"), os.path.join(d, f"train.csv.tmp.{os.getpid()}")
for f in (dead, alive):
    open(f, "w").write("half")
r = run(["train", "--resume", d, "--steps", "30"])
expect(r.returncode == 0 and not os.path.exists(dead) and os.path.exists(alive),
       f"temporaries after --resume: {temporaries(d)} {r.stderr[-200:]}")
os.remove(alive)

# ---- killed before its first checkpoint: --resume starts it again from the beginning
d = os.path.join(tmp, "early")
p = subprocess.Popen([MEMLAB, "train", *TINY, "--steps", "100000", "--set", "train.checkpoint_every=0", "--out", d],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists(os.path.join(d, "train.csv")):
    time.sleep(0.05)
p.kill()
p.wait()
expect(not os.path.exists(os.path.join(d, "checkpoint.pt")), "the early kill came after a checkpoint")
r = run(["train", "--resume", d, "--steps", "10"])
expect(r.returncode == 0 and "holds no checkpoint yet" in r.stderr, f"--resume of a run without checkpoint: {r.stderr[-300:]}")
expect([ln.split(",")[0] for ln in rows(os.path.join(d, "train.csv"))] == ["5", "10"],
       "the restarted run kept rows of the killed one")

# ---- SIGTERM during the final evaluation: the checkpoint is already written, the signal is not ignored, and
# --resume finishes the evaluation alone
d = os.path.join(tmp, "final_eval")
p = subprocess.Popen([MEMLAB, "train", *TINY, "--steps", "10", "--set", "eval.every=0", "--set", "eval.n=100000",
                      "--out", d], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seen = ""
deadline = time.time() + 120
while time.time() < deadline and "step     10/10" not in seen:
    line = p.stderr.readline()
    if not line:
        break
    seen += line
time.sleep(0.5)
p.send_signal(signal.SIGTERM)
try:
    p.wait(timeout=60)
except subprocess.TimeoutExpired:
    p.kill()
    expect(False, "SIGTERM during the final evaluation was ignored")
expect(p.returncode == -signal.SIGTERM, f"SIGTERM during the final evaluation: exit {p.returncode}")
expect(os.path.exists(os.path.join(d, "checkpoint.pt")) and not os.path.exists(os.path.join(d, "summary.md")),
       "the final checkpoint was not written before the final evaluation")
r = run(["train", "--resume", d, "--set", "eval.n=32"])
expect(r.returncode == 0 and "(0 in this call)" in r.stderr and os.path.exists(os.path.join(d, "summary.md")),
       f"--resume after the final evaluation was stopped: {r.stderr[-300:]}")
expect(any(ln.split(",")[3] == "10" for ln in rows(os.path.join(d, "eval.csv"))), "no final evaluation rows")

# ---- resuming a run that changed, or whose checkpoint is damaged
base = os.path.join(tmp, "base")
r = run(["train", *TINY, "--steps", "10", "--out", base])
expect(r.returncode == 0, f"base run: {r.stderr[-300:]}")


def copy_of(name):
    d = os.path.join(tmp, name)
    subprocess.run(["cp", "-r", base, d], check=True)
    return d


d = copy_of("edited_lr")
cfg = open(os.path.join(d, "config.yaml")).read()
open(os.path.join(d, "config.yaml"), "w").write(cfg.replace("lr: 0.01", "lr: 0.02"))
one_error(run(["train", "--resume", d, "--steps", "20"]), "edited train.lr", ["train.lr", "0.01", "0.02"])
d = copy_of("edited_hidden")
open(os.path.join(d, "config.yaml"), "w").write(cfg.replace("hidden: 16", "hidden: 32"))
one_error(run(["train", "--resume", d, "--steps", "20"]), "edited model.hidden", ["model.hidden"])
one_error(run(["train", "--resume", copy_of("set_on_resume"), "--steps", "20", "--set", "train.weight_decay=0.5"]),
          "--set of a training key on resume", ["train.weight_decay"])
d = copy_of("more_steps")
expect(run(["train", "--resume", d, "--steps", "20", "--set", "eval.n=16"]).returncode == 0,
       "--steps and eval.* may change on resume")
d = copy_of("flipped")
ck = os.path.join(d, "checkpoint.pt")
data = bytearray(open(ck, "rb").read())
data[len(data) // 2] ^= 0xFF
open(ck, "wb").write(bytes(data))
one_error(run(["train", "--resume", d, "--steps", "20"]), "flipped bytes", ["checkpoint.pt", "CRC-32"])
d = copy_of("truncated")
ck = os.path.join(d, "checkpoint.pt")
open(ck, "wb").write(open(os.path.join(base, "checkpoint.pt"), "rb").read()[:3000])
one_error(run(["train", "--resume", d, "--steps", "20"]), "truncated checkpoint", ["truncated"])
one_error(run(["train", "--resume", copy_of("fewer_steps"), "--steps", "5"]), "--steps below the run's step",
          ["at step 10 already"])

# ---- sizes that cannot fit: refused before anything is written
for name, sets, needle in [("batch", ["train.batch_size=1000000000000"], "train.batch_size"),
                           ("eval_n", ["eval.n=1000000000"], "eval.n"),
                           ("length", ["task.train_len=[3,100000000]"], "task.train_len"),
                           ("eval_length", ["task.eval_len=[40,100000000]"], "evaluation lengths"),
                           ("hidden", ["model.hidden=65536"], "model.hidden")]:
    d = os.path.join(tmp, "size_" + name)
    r = run(["train", *TINY, "--steps", "10", "--out", d, *[x for s in sets for x in ("--set", s)]], timeout=60)
    one_error(r, f"size {name}", [needle, "memory"])
    expect(not os.path.exists(d), f"size {name}: the run directory was created")

# ---- --config naming a folder, --out '', unknown nested commands, negative seeds
folder = os.path.join(tmp, "a_folder")
os.makedirs(folder)
for what, args in [("train", ["train", "--config", folder]), ("tasks", ["tasks", "sample", "--task", "parity",
                                                                         "--config", folder]),
                   ("rl", ["rl", "visual-match", "--config", folder]), ("sweep", ["sweep", folder])]:
    one_error(run(args), f"--config folder ({what})", ["directory"])
one_error(run(["train", "--out", ""]), "--out ''", ["--out"])
one_error(run(["tasks", "smaple"]), "tasks smaple", ["smaple", "sample, vocab"])
one_error(run(["env", "visual-match", "--seed", "-1"]), "env --seed -1", ["--seed"])

# ---- duplicate YAML keys
dup = os.path.join(tmp, "dup.yaml")
open(dup, "w").write("train:\n  steps: 3\n  steps: 4\n")
one_error(run(["train", "--config", dup]), "duplicate key", ["steps", "twice", "dup.yaml:3"])
open(dup, "w").write("train.steps: 3\ntrain:\n  steps: 4\n")
one_error(run(["train", "--config", dup]), "a key given dotted and nested", ["train.steps", "twice"])

# ---- sweeps: empty files, no experiments, bad options; none of them creates a store
res = os.path.join(tmp, "sweep_res")
empty = os.path.join(tmp, "empty.yaml")
open(empty, "w").write("")
one_error(run(["sweep", empty, "--results", res]), "empty sweep file", ["empty"])
noexp = os.path.join(tmp, "noexp.yaml")
open(noexp, "w").write("sweep:\n  name: x\n")
one_error(run(["sweep", noexp, "--results", res]), "sweep without experiments", ["no experiments"])
tiny_sweep = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sweep_tiny.yaml")
for args, needle in [(["--gpus", "foo"], "--gpus"), (["--gpus", "7"], "--gpus"), (["--index", "-1"], "--index"),
                     (["--index", "999"], "out of range"), (["--status"], "no results store")]:
    one_error(run(["sweep", tiny_sweep, "--results", res, *args]), f"sweep {' '.join(args)}", [needle])
for args in (["--status"], ["--name", "tiny"]):
    one_error(run(["sweep", "--results", res, *args]), f"sweep --results missing {args[0]}", ["results store"])
expect(not os.path.exists(res), "a rejected sweep created its results folder")
r = run(["sweep", tiny_sweep, "--results", res, "--list"])
expect(r.returncode == 0 and r.stdout.count("pending") == 4 and not os.path.exists(res),
       f"--list before the first run: {r.stdout} {r.stderr}")

# ---- --status names the runs of a launcher that is gone
slow_sweep = os.path.join(tmp, "slow.yaml")
open(slow_sweep, "w").write(open(tiny_sweep).read().replace("train.steps: 10", "train.steps: 100000"))
res = os.path.join(tmp, "gone_res")
p = subprocess.Popen([MEMLAB, "sweep", slow_sweep, "--results", res, "--workers", "1"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
deadline = time.time() + 60
while time.time() < deadline and not [f for f in os.listdir(os.path.join(res, "runs")) if True] \
        if os.path.isdir(os.path.join(res, "runs")) else True:
    time.sleep(0.1)
time.sleep(1)
p.kill()
p.wait()
time.sleep(0.5)
r = run(["sweep", "--results", res, "--status"])
expect(r.returncode == 0 and "1 stopped" in r.stdout and "0 running" in r.stdout and "is gone" in r.stdout,
       f"--status after the launcher died: {r.stdout}")

# ---- --retry-failed tries each failed run once per call, then exits 1 with the list
nan_sweep = os.path.join(tmp, "nan.yaml")
open(nan_sweep, "w").write(open(tiny_sweep).read().replace("train.device: cpu",
                                                           "train.device: cpu\n    model.init_std: 0\n    model.norm_eps: 0"))
res = os.path.join(tmp, "nan_res")
r = run(["sweep", nan_sweep, "--results", res, "--workers", "2"], timeout=300)
expect(r.returncode == 1 and "4 failed" in r.stdout, f"NaN sweep: {r.returncode} {r.stdout[-300:]}")
r = run(["sweep", nan_sweep, "--results", res, "--workers", "2", "--retry-failed"], timeout=300)
expect(r.returncode == 1 and "failed" in r.stdout, f"--retry-failed of runs that always fail: {r.stdout[-300:]}")
attempts = [a for (a,) in sqlite3.connect(os.path.join(res, "results.sqlite")).execute("SELECT attempts FROM runs")]
expect(attempts == [2, 2, 2, 2], f"--retry-failed attempts {attempts}, wanted each run twice")

# ---- the results store and reports: foreign files, garbage configs
foreign = os.path.join(tmp, "foreign")
os.makedirs(foreign)
con = sqlite3.connect(os.path.join(foreign, "results.sqlite"))
con.execute("CREATE TABLE runs(x)")
con.commit()
con.close()
one_error(run(["report", foreign]), "report on a foreign SQLite file", ["not a memlab results store"])
one_error(run(["sweep", "--results", foreign, "--status"]), "status on a foreign SQLite file", ["not a memlab"])
garbage = copy_of("garbage")
open(os.path.join(garbage, "config.yaml"), "wb").write(b"model: [\x00\xff\n")
one_error(run(["report", garbage]), "report on a garbage config", ["garbage"])

# ---- floats keep their shortest form; one thread is one thread
r = run(["train", "--print-config", "--set", "train.lr=0.2", "--set", "train.weight_decay=0.1"])
expect("lr: 0.2\n" in r.stdout and "weight_decay: 0.1\n" in r.stdout and "0000000" not in r.stdout,
       f"floats in config.yaml: {re.findall(r'lr: .*', r.stdout)}")
expect("0000000" not in run(["train", "--help"]).stdout, "floats in --help print 17 digits")
r = subprocess.run([MEMLAB, "train", *TINY, "--steps", "5", "--out", os.path.join(tmp, "one_thread")],
                   capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
expect("(1 thread)" in r.stderr and "(1 threads)" not in r.stderr, "thread count wording")

finish(f"run safety checks passed ({tmp})")
