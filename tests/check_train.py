#!/usr/bin/env python3
"""memlab train end to end on a tiny model: run files and their columns, the length table, --resume after
the end and after SIGINT, and the clear stop on NaN."""
import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import expect, finish, held_signal  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-train-")
TINY = ["--set", "model.hidden=16", "--set", "model.heads=2", "--set", "model.layers=1", "--set", "model.mlp_inner=32",
        "--batch-size", "16", "--set", "eval.n=32", "--set", "train.log_every=5", "--set", "eval.every=10",
        "--set", "train.warmup=5", "--set", "task.eval_len=[40,60]", "--device", "cpu"]



def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def mixer_names():
    # The allowed list of the error for an unknown model: every registered mixer, so none is forgotten here.
    r = subprocess.run([MEMLAB, "train", "--task", "parity", "--model", "no-such-mixer", "--device", "cpu"],
                       capture_output=True, text=True, timeout=60)
    allowed = r.stderr.split("allowed: ", 1)[1].rsplit(")", 1)[0]
    return [m.strip() for m in allowed.split(",")]


MODELS = mixer_names()
expect({"transformer", "deltanet", "hqlt", "mesa"} <= set(MODELS), f"mixer list looks wrong: {MODELS}")
for model in MODELS:
    for task in ("parity", "mod_arith"):
        out = os.path.join(tmp, f"{task}_{model}")
        r = subprocess.run([MEMLAB, "train", "--task", task, "--model", model, "--steps", "20", "--out", out] + TINY,
                           capture_output=True, text=True, timeout=600)
        expect(r.returncode == 0, f"{task}/{model}: exit {r.returncode}: {r.stderr[-500:]}")
        if r.returncode:
            continue
        for f in ("config.yaml", "train.csv", "eval.csv", "summary.md", "checkpoint.pt", "log.txt"):
            expect(os.path.exists(os.path.join(out, f)), f"{task}/{model}: missing {f}")
        expect(not [f for f in os.listdir(out) if ".tmp." in f], f"{task}/{model}: temporary files left")
        ev = rows(os.path.join(out, "eval.csv"))
        with open(os.path.join(out, "eval.csv")) as f:
            header = f.readline().strip()
        expect(header == "task,model,seed,step,length_min,length_max,n,accuracy,normalized_accuracy,accuracy_all,"
               "normalized_all", f"eval.csv header {header}")
        chance = 0.5 if task == "parity" else 0.2
        for e in ev:
            acc, norm = float(e["accuracy"]), float(e["normalized_accuracy"])
            expect(0 <= acc <= 1, "accuracy in [0,1]")
            expect(abs(norm - (acc - chance) / (1 - chance)) < 1e-5, "normalised accuracy formula")
            acc_all, norm_all = float(e["accuracy_all"]), float(e["normalized_all"])
            expect(abs(norm_all - (acc_all - chance) / (1 - chance)) < 1e-5, "normalised accuracy_all formula")
            if task == "mod_arith":  # one answer per example: every scored position is the last one
                expect(abs(acc_all - acc) < 1e-9, "mod_arith: accuracy_all differs from accuracy")
            expect(e["task"] == task and e["model"] == model and e["seed"] == "1", "eval.csv identity columns")
        expect({int(e["step"]) for e in ev} == {10, 20}, f"eval steps {sorted({e['step'] for e in ev})}")
        expect({(e["length_min"], e["length_max"]) for e in ev} >= {("3", "40"), ("40", "60")}, "eval ranges")
        tr = rows(os.path.join(out, "train.csv"))
        expect([int(t["step"]) for t in tr] == [5, 10, 15, 20], f"train.csv steps {[t['step'] for t in tr]}")
        expect(all(float(t["loss"]) > 0 for t in tr), "losses positive")
        expect("| **40-60** |" in r.stdout and "normalised" in r.stdout, f"length table on stdout: {r.stdout}")
        with open(os.path.join(out, "summary.md")) as f:
            expect("| **40-60** |" in f.read(), "summary.md holds the length table")
        with open(os.path.join(out, "config.yaml")) as f:
            cfg = f.read()
        expect(f"name: {task}" in cfg and f"name: {model}" in cfg and "steps: 20" in cfg, "effective config saved")

# resume a finished run for more steps: no duplicated rows, step count continues
out = os.path.join(tmp, "parity_deltanet")
r = subprocess.run([MEMLAB, "train", "--resume", out, "--steps", "30"], capture_output=True, text=True, timeout=600)
expect(r.returncode == 0, f"resume: exit {r.returncode}: {r.stderr[-400:]}")
expect("resuming" in r.stderr and "from step 20" in r.stderr, "resume message")
tr = rows(os.path.join(out, "train.csv"))
expect([int(t["step"]) for t in tr] == [5, 10, 15, 20, 25, 30], f"after resume train.csv steps {[t['step'] for t in tr]}")
ev = rows(os.path.join(out, "eval.csv"))
expect(sorted({int(e["step"]) for e in ev}) == [10, 20, 30], "after resume eval steps")
expect(len(ev) == 3 * len({(e["length_min"], e["length_max"]) for e in ev}), "no duplicated eval rows")

# killed between the step-30 checkpoint and its evaluation: the resumed run evaluates step 30 first
with open(os.path.join(out, "eval.csv")) as f:
    lines = f.read().splitlines(keepends=True)
with open(os.path.join(out, "eval.csv"), "w") as f:
    f.writelines([lines[0]] + [l for l in lines[1:] if l.split(",")[3] != "30"])
r = subprocess.run([MEMLAB, "train", "--resume", out, "--steps", "40"], capture_output=True, text=True, timeout=600)
expect(r.returncode == 0, f"resume after a lost evaluation: exit {r.returncode}: {r.stderr[-400:]}")
ev = rows(os.path.join(out, "eval.csv"))
expect(sorted({int(e["step"]) for e in ev}) == [10, 20, 30, 40], f"lost evaluation redone: {[e['step'] for e in ev]}")
expect(len(ev) == 4 * len({(e["length_min"], e["length_max"]) for e in ev}), "no duplicated eval rows")

# SIGINT: checkpoint, exit 130, then resume to the end
out = os.path.join(tmp, "interrupted")
p = subprocess.Popen([MEMLAB, "train", "--task", "parity", "--steps", "100000", "--out", out] + TINY,
                     stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline:
    line = p.stderr.readline()
    if line.startswith("step"):
        break
p.send_signal(signal.SIGINT)
_, err = p.communicate(timeout=120)
expect(p.returncode == 130, f"SIGINT exit code {p.returncode}")
expect("--resume" in err, "SIGINT message names --resume")
tr = rows(os.path.join(out, "train.csv"))
last = int(tr[-1]["step"])
r = subprocess.run([MEMLAB, "train", "--resume", out, "--steps", str(last + 10)], capture_output=True, text=True,
                   timeout=600)
expect(r.returncode == 0, f"resume after SIGINT: {r.stderr[-300:]}")
expect(int(rows(os.path.join(out, "train.csv"))[-1]["step"]) == last + 10, "resumed run reaches its steps")

# SIGINT during an evaluation between training steps: the run still checkpoints that step before it stops
out = os.path.join(tmp, "interrupted_eval")
p = subprocess.Popen([MEMLAB, "train", "--task", "parity", "--steps", "100000", "--out", out] + TINY +
                     ["--set", "eval.n=20000", "--set", "train.checkpoint_every=0"],
                     stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline:
    line = p.stderr.readline()
    if not line or "step     10/" in line:
        break
time.sleep(0.3)  # inside the step-10 evaluation of 20,000 examples a range
p.send_signal(signal.SIGINT)
_, err = p.communicate(timeout=300)
expect(p.returncode == 130, f"SIGINT during an evaluation: exit code {p.returncode}")
expect(os.path.exists(os.path.join(out, "checkpoint.pt")),
       "SIGINT during an evaluation: no checkpoint written, though the run said it saved one")
r = subprocess.run([MEMLAB, "train", "--resume", out, "--steps", "20", "--set", "eval.n=32"], capture_output=True,
                   text=True, timeout=600)
expect(r.returncode == 0 and "step     20/20" in r.stderr, f"resume after SIGINT in an evaluation: {r.stderr[-300:]}")

# A stop that comes before the run has set itself up (a sweep's deadline TERM during a run's start): the signal is
# sent at once, held by a mask the run inherits, and taken when memlab catches it. The run writes its checkpoint at
# the step it starts from and exits 130, fresh and resumed alike; resumed, it is the run never stopped.
def eval_rows_to(d, last):
    return [r for r in rows(os.path.join(d, "eval.csv")) if int(r["step"]) <= last]


out = os.path.join(tmp, "stopped_at_start")
for what, args, sig in (("fresh", ["train", "--task", "parity", "--model", "deltanet", "--steps", "20", "--out", out]
                         + TINY, signal.SIGTERM),
                        ("resumed", ["train", "--resume", out, "--steps", "20"], signal.SIGINT)):
    rc, err = held_signal([MEMLAB, *args], sig)
    expect(rc == 130 and "interrupted at step 0" in err, f"a stop before a {what} run's first step: exit {rc}: {err[-300:]}")
    expect(os.path.exists(os.path.join(out, "checkpoint.pt")), f"a stop before a {what} run's first step: no checkpoint")
r = subprocess.run([MEMLAB, "train", "--resume", out, "--steps", "20"], capture_output=True, text=True, timeout=600)
expect(r.returncode == 0, f"resume after a stop at the start: exit {r.returncode}: {r.stderr[-300:]}")
if r.returncode == 0:
    expect(eval_rows_to(out, 20) == eval_rows_to(os.path.join(tmp, "parity_deltanet"), 20),
           "a run stopped before its first step and resumed differs from one never stopped (eval.csv)")

# NaN: zero weights and a zero-epsilon norm give NaN at the first step: a clear stop, exit 3
out = os.path.join(tmp, "nan")
r = subprocess.run([MEMLAB, "train", "--task", "parity", "--steps", "20", "--out", out, "--set", "model.init_std=0",
                    "--set", "model.norm_eps=0"] + TINY, capture_output=True, text=True, timeout=600)
expect(r.returncode == 3, f"NaN run exit {r.returncode}")
err_lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
expect(len(err_lines) == 1 and "NaN/Inf at step 1" in err_lines[0] and "no checkpoint was written" in err_lines[0],
       f"NaN message: {r.stderr[-300:]}")
expect(not os.path.exists(os.path.join(out, "summary.md")), "no summary after a NaN stop")

# memlab bench step on the CPU: a config's training step in the tensor-op form (the GPU profile needs CUDA)
cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "hqlt", "parity_deltanet_neg.yaml")
r = subprocess.run([MEMLAB, "bench", "step", "--config", cfg, "--device", "cpu", "--reps", "1", "--set",
                    "train.batch_size=4", "--set", "model.hidden=16", "--set", "model.heads=2"],
                   capture_output=True, text=True, timeout=600)
expect(r.returncode == 0 and "| torch | eager |" in r.stdout and "no kernels on the CPU" in r.stdout,
       f"bench step: exit {r.returncode}: {r.stdout[-400:]} {r.stderr[-400:]}")

# ... with its batches split by length beside the whole batch: a row per N, each with its bucket plan
r = subprocess.run([MEMLAB, "bench", "step", "--config", cfg, "--device", "cpu", "--reps", "1", "--set",
                    "train.batch_size=64", "--set", "model.hidden=16", "--set", "model.heads=2",
                    "--length-buckets", "2"], capture_output=True, text=True, timeout=600)
rows = [l for l in r.stdout.splitlines() if l.startswith("| 1 | ")]
expect(r.returncode == 0 and len(rows) == 2 and "| 1 | 1 | 64 to 39 |" in rows[0] and rows[1].startswith("| 1 | 2 | 32 to "),
       f"bench step --length-buckets: exit {r.returncode}: {r.stdout[-600:]} {r.stderr[-400:]}")

# ... and packed beside one run: a row per K, with the steps back to back on batches made before and at each step
r = subprocess.run([MEMLAB, "bench", "step", "--config", cfg, "--device", "cpu", "--reps", "2", "--set",
                    "train.batch_size=8", "--set", "model.hidden=16", "--set", "model.heads=2", "--members", "2"],
                   capture_output=True, text=True, timeout=600)
rows = [l.split("|") for l in r.stdout.splitlines() if re.match(r"\| [12] \| (eager|graph)", l)]
expect(r.returncode == 0 and [c[1].strip() for c in rows] == ["1", "2"] and
       all(re.fullmatch(r" [0-9.]+ / [0-9.]+ ", c[6]) for c in rows),
       f"bench step --members 2: exit {r.returncode}: {r.stdout[-900:]} {r.stderr[-400:]}")

finish("train/resume/interrupt/NaN checks passed")
