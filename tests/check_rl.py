#!/usr/bin/env python3
"""memlab rl visual-match on CPU with a tiny agent: the run files, determinism per seed, --resume extending a
run, Ctrl-C leaving a resumable checkpoint, rl plot, --print-config and one-line errors for bad input."""
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import error_problems, expect, failures, finish, held_signal  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-rl-")
TINY = ["--device", "cpu", "--distractor", "4", "--set", "model.hidden=16", "--set", "model.layers=1",
        "--set", "model.heads=1", "--set", "model.mlp_inner=16", "--set", "rl.head_hidden=16",
        "--set", "rl.warmup_episodes=2", "--set", "rl.envs=2", "--set", "rl.batch_episodes=4",
        "--set", "rl.updates_per_step=0.05", "--set", "rl.eval_every=2", "--set", "rl.eval_episodes=3",
        "--set", "rl.checkpoint_every=2", "--no-plot"]
CURVE_HEADER = ["episodes", "env_steps", "updates", "return", "success", "length", "train_return", "train_success",
                "elapsed_s", "env_steps_per_s"]


def memlab(*args, timeout=300):
    return subprocess.run([MEMLAB, *args], capture_output=True, text=True, timeout=timeout)


def curve(d):
    with open(os.path.join(d, "curve.csv")) as f:
        r = list(csv.reader(f))
    return r[0], r[1:]


def one_line_error(r, what, needle):
    problems = error_problems(r, [needle])
    expect(not problems, f"{what}: {'; '.join(problems)}: {r.stderr.strip()[:300]!r}")


# --print-config: the paper's agent for the model, the paper's environment.
r = memlab("rl", "visual-match", "--model", "hqlt", "--print-config", "--device", "cpu")
expect(r.returncode == 0, f"--print-config: exit {r.returncode}: {r.stderr}")
for needle in ["layers: 3", "distractor_len: 750", "window: 64", "train_episodes: 2565"]:
    expect(needle in r.stdout, f"--print-config for hqlt lacks '{needle}'")

# A tiny run and its files.
a = os.path.join(tmp, "a")
r = memlab("rl", "visual-match", "--model", "transformer", "--episodes", "4", "--seed", "3", "--out", a, *TINY)
expect(r.returncode == 0, f"tiny run: exit {r.returncode}: {r.stderr[-600:]}")
for f in ["config.yaml", "curve.csv", "train.csv", "summary.md", "log.txt", "checkpoint.pt"]:
    expect(os.path.isfile(os.path.join(a, f)), f"tiny run: no {f}")
if r.returncode == 0:
    head, rows = curve(a)
    expect(head == CURVE_HEADER, f"curve.csv header {head}")
    expect([int(x[0]) for x in rows] == [0, 2, 4], f"curve.csv evaluates at episodes 0, 2, 4: {[x[0] for x in rows]}")
    steps = [int(x[1]) for x in rows]
    # Episodes are 15 + 4 + (1..15) steps long: the two warm-up and four training episodes bound the count.
    expect(steps == sorted(steps) and 2 * 20 <= steps[0] <= 2 * 34 and 6 * 20 <= steps[-1] <= 6 * 34,
           f"env_steps not plausible: {steps}")
    expect(all(0.0 <= float(x[4]) <= 1.0 for x in rows), "success outside [0, 1]")
    expect(int(rows[-1][2]) > 0, "no SAC updates were made")
    with open(os.path.join(a, "train.csv")) as f:
        trows = list(csv.DictReader(f))
    expect(len(trows) > 0 and all(abs(float(t["critic_loss"])) < 1e9 for t in trows), "train.csv empty or not finite")
    expect("Passive Visual Match" in open(os.path.join(a, "summary.md")).read(), "summary.md lacks its title")

    # Same seed, same episodes, same returns.
    b = os.path.join(tmp, "b")
    r = memlab("rl", "visual-match", "--model", "transformer", "--episodes", "4", "--seed", "3", "--out", b, *TINY)
    expect(r.returncode == 0 and [x[:8] for x in curve(b)[1]] == [x[:8] for x in rows],
           "two runs with one seed differ in curve.csv")

    # --resume with more episodes continues from the checkpoint and keeps what was there. The run's config.yaml
    # loses its rl.tf32 line first, as one written before the key existed: it resumes with fp32 heads.
    cfg_path = os.path.join(a, "config.yaml")
    with open(cfg_path) as f:
        lines = f.readlines()
    expect(any(l.strip() == "tf32: true" for l in lines), "config.yaml has no 'tf32: true' line")
    with open(cfg_path, "w") as f:
        f.writelines(l for l in lines if l.strip() != "tf32: true")
    r = memlab("rl", "visual-match", "--resume", a, "--episodes", "8", "--no-plot")
    expect(r.returncode == 0, f"resume: exit {r.returncode}: {r.stderr[-600:]}")
    with open(cfg_path) as f:
        expect("tf32: false" in f.read(), "a run without rl.tf32 did not resume with rl.tf32 false")
    _, rows2 = curve(a)
    expect([int(x[0]) for x in rows2] == [0, 2, 4, 6, 8], f"resumed curve.csv episodes {[x[0] for x in rows2]}")
    expect([x[:8] for x in rows2[:3]] == [x[:8] for x in rows], "resume rewrote the earlier curve rows")
    expect(int(rows2[-1][1]) > int(rows[-1][1]) and int(rows2[-1][2]) > int(rows[-1][2]),
           "resume did not add environment steps and updates")

    # rl plot: a and b are one label and seed, so they are drawn one line each (--each) and refused as seeds.
    plots = os.path.join(tmp, "plots")
    r = memlab("rl", "plot", a, b, "--out", plots)
    one_line_error(r, "rl plot of one seed twice", "give each seed of a label once")
    r = memlab("rl", "plot", a, b, "--each", "--out", plots)
    expect(r.returncode == 0, f"rl plot --each: exit {r.returncode}: {r.stderr}")
    if r.returncode == 0:
        # a was resumed to 8 episodes (5 evaluations); b has 4 (3 evaluations)
        expect("| transformer | 3 | 5 |" in r.stdout and "| transformer | 3 | 3 |" in r.stdout,
               f"rl plot --each: seeds table {r.stdout[:800]}")
        cairo = "without cairo" not in r.stdout
        expect(os.path.isfile(os.path.join(plots, "curve_success.svg")) == cairo, "rl plot: charts and cairo disagree")
    # Seeds 3 and 4 of one label: their mean over the span both cover, and each one's final and best success.
    a4 = os.path.join(tmp, "seed4")
    r = memlab("rl", "visual-match", "--model", "transformer", "--episodes", "4", "--seed", "4", "--out", a4, *TINY)
    expect(r.returncode == 0, f"seed 4 run: exit {r.returncode}: {r.stderr[-600:]}")
    r = memlab("rl", "plot", a, a4, "--out", plots, "--interval", "t")
    expect(r.returncode == 0, f"rl plot of two seeds: exit {r.returncode}: {r.stderr}")
    if r.returncode == 0:
        runs = {s: curve(d)[1] for s, d in [(3, a), (4, a4)]}
        with open(os.path.join(plots, "seeds.csv")) as f:
            table = [x for x in csv.reader(f) if x[0] == "0"]
        for s, rows_s in runs.items():
            succ = [float(x[4]) for x in rows_s]
            row = [x for x in table if x[2] == str(s)]
            expect(len(row) == 1 and abs(float(row[0][5]) - succ[-1]) < 1e-3 and abs(float(row[0][6]) - max(succ)) < 1e-3,
                   f"seeds.csv row of seed {s}: {row} against successes {succ}")
        with open(os.path.join(plots, "curves.csv")) as f:
            pts = list(csv.DictReader(f))
        span = (max(float(runs[s][0][1]) for s in runs), min(float(runs[s][-1][1]) for s in runs))
        expect(len(pts) == 5 and all(p["label"] == "transformer" and p["seeds"] == "2" for p in pts)
               and abs(float(pts[0]["env_steps"]) - span[0]) < 1 and abs(float(pts[-1]["env_steps"]) - span[1]) < 1,
               f"curves.csv: {pts} over the span {span}")
        def at(rows_s, x):  # a seed's success at env steps x, linear between its evaluations
            xs, ys = [float(v[1]) for v in rows_s], [float(v[4]) for v in rows_s]
            j = next(i for i in range(len(xs)) if xs[i] >= x)
            return ys[j] if xs[j] == x else ys[j - 1] + (x - xs[j - 1]) / (xs[j] - xs[j - 1]) * (ys[j] - ys[j - 1])
        for p in pts:
            want = sum(at(runs[s], float(p["env_steps"])) for s in runs) / 2
            expect(abs(float(p["success_mean"]) - want) < 1e-3, f"curves.csv mean success {p} against {want}")
    r = memlab("rl", "plot", a, a4, "--out", plots, "--interval", "normal")
    one_line_error(r, "rl plot --interval normal", "--interval")

# rl.reward_scale: scaling the rewards by 0.1 in the learner is the same run as an environment that pays a tenth
# (same actions, so the same steps and successes), with returns still reported in the environment's units.
runs = {}
for name, sets in [("scaled", ["env.final_reward=100", "env.apple_reward=1", "rl.reward_scale=0.1"]),
                   ("tenth", ["env.final_reward=10", "env.apple_reward=0.1", "rl.reward_scale=1"])]:
    d = os.path.join(tmp, name)
    r = memlab("rl", "visual-match", "--model", "deltanet", "--episodes", "6", "--out", d, *TINY,
               *[x for s in sets for x in ("--set", s)])
    expect(r.returncode == 0, f"reward_scale run {name}: exit {r.returncode}: {r.stderr[-400:]}")
    runs[name] = curve(d)[1] if r.returncode == 0 else []
if runs["scaled"] and runs["tenth"]:
    expect([x[:3] + [x[4]] for x in runs["scaled"]] == [x[:3] + [x[4]] for x in runs["tenth"]],
           "rl.reward_scale=0.1 does not act like rewards of a tenth")
    expect(all(abs(float(a[3]) - 10 * float(b[3])) < 1e-3 * max(1.0, abs(float(a[3])))
               for a, b in zip(runs["scaled"], runs["tenth"])), "returns under rl.reward_scale are not unscaled")
    q = {}
    for name in runs:
        with open(os.path.join(tmp, name, "train.csv")) as f:
            q[name] = [float(x["q_mean"]) for x in csv.DictReader(f)]
    expect(len(q["scaled"]) > 0 and len(q["scaled"]) == len(q["tenth"]) and all(
        abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(q["scaled"], q["tenth"])),
        f"the critics' values differ under rl.reward_scale: {q['scaled']} vs {q['tenth']}")

# Ctrl-C: exit 130 after saving a checkpoint and a summary that says how far it got; --resume then finishes it.
c = os.path.join(tmp, "c")
p = subprocess.Popen([MEMLAB, "rl", "visual-match", "--model", "deltanet", "--episodes", "100000", "--out", c, *TINY],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline and not os.path.isfile(os.path.join(c, "checkpoint.pt")) and p.poll() is None:
    time.sleep(0.2)
p.send_signal(signal.SIGINT)
out, err = p.communicate(timeout=120)
expect(p.returncode == 130, f"Ctrl-C: exit {p.returncode}: {err[-400:]}")
expect("--resume" in err, "Ctrl-C: the message does not say how to continue")
expect("Stopped at training episode" in open(os.path.join(c, "summary.md")).read() if os.path.isfile(
    os.path.join(c, "summary.md")) else False, "Ctrl-C: summary.md missing or does not say where it stopped")
summary_c = open(os.path.join(c, "summary.md")).read() if os.path.isfile(os.path.join(c, "summary.md")) else ""
done = int(summary_c.split("Stopped at training episode ")[1].split(" ")[0]) if "Stopped at" in summary_c else 0
r = memlab("rl", "visual-match", "--resume", c, "--episodes", str(done + 2), "--no-plot")
expect(r.returncode == 0 and int(curve(c)[1][-1][0]) == done + 2, f"resume after Ctrl-C: exit {r.returncode}: "
       f"{r.stderr[-400:]}")

# SIGTERM between two evaluations, then --resume: the same run as one never stopped (no evaluation is made at
# the stop, which would shift the evaluation episodes' seeds; the window since the last one is checkpointed).
ONE = TINY + ["--set", "rl.envs=1", "--set", "rl.eval_every=3", "--set", "rl.checkpoint_every=1"]
whole = os.path.join(tmp, "whole")
r = memlab("rl", "visual-match", "--model", "deltanet", "--episodes", "10", "--out", whole, *ONE)
expect(r.returncode == 0, f"uninterrupted run: exit {r.returncode}: {r.stderr[-300:]}")
stopped = os.path.join(tmp, "stopped")
p = subprocess.Popen([MEMLAB, "rl", "visual-match", "--model", "deltanet", "--episodes", "10", "--out", stopped, *ONE],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
deadline = time.time() + 120
while time.time() < deadline and p.poll() is None and not os.path.isfile(os.path.join(stopped, "checkpoint.pt")):
    time.sleep(0.05)
p.send_signal(signal.SIGTERM)
p.communicate(timeout=120)
expect(p.returncode in (0, 130), f"SIGTERM: exit {p.returncode}")
r = memlab("rl", "visual-match", "--resume", stopped, "--episodes", "10", "--no-plot")
expect(r.returncode == 0, f"resume after SIGTERM: exit {r.returncode}: {r.stderr[-300:]}")
if os.path.isfile(os.path.join(whole, "curve.csv")) and os.path.isfile(os.path.join(stopped, "curve.csv")):
    expect([x[:8] for x in curve(stopped)[1]] == [x[:8] for x in curve(whole)[1]],
           "a run stopped by SIGTERM and resumed differs from one never stopped (curve.csv)")

# A stop before the run has set itself up, fresh and resumed (held_signal): exit 130 with a checkpoint, before the
# warm-up; resumed, the run never stopped.
held = os.path.join(tmp, "held")
for what, args, sig in (("fresh", ["--model", "deltanet", "--episodes", "10", "--out", held, *ONE], signal.SIGTERM),
                        ("resumed", ["--resume", held, "--episodes", "10", "--no-plot"], signal.SIGINT)):
    rc, err = held_signal([MEMLAB, "rl", "visual-match", *args], sig)
    expect(rc == 130 and "interrupted at training episode 0" in err,
           f"a stop before a {what} run's setup: exit {rc}: {err[-300:]}")
    expect(os.path.isfile(os.path.join(held, "checkpoint.pt")), f"a stop before a {what} run's setup: no checkpoint")
r = memlab("rl", "visual-match", "--resume", held, "--episodes", "10", "--no-plot")
expect(r.returncode == 0, f"resume after a stop at the start: exit {r.returncode}: {r.stderr[-300:]}")
if r.returncode == 0 and os.path.isfile(os.path.join(whole, "curve.csv")):
    expect([x[:8] for x in curve(held)[1]] == [x[:8] for x in curve(whole)[1]],
           "a run stopped before its setup and resumed differs from one never stopped (curve.csv)")

# memlab bench rl on the CPU: every part of the loop is timed (no figure checked), the eager update's phases are
# the ones Sac names, and two runs go round the loop side by side on two threads.
BENCH_TINY = [a for a in TINY if a not in ("--no-plot", "--distractor", "4")]
r = memlab("bench", "rl", "--set", "env.distractor_len=4", *BENCH_TINY, "--reps", "2", "--rounds", "1", "--runs", "2")
expect(r.returncode == 0, f"bench rl: exit {r.returncode}: {r.stderr[-300:]}")
for needle in ["| environment alone", "| rollout through the agent's dynamic step()",
               "| rollout through the fixed-shape step (eager)", "| replay sample", "| SAC update (eager)",
               "| whole loop", "| encoder and blocks |", "| backward |", "| gradient norm, Adam, target critics |",
               "2 runs (seeds", "| 2 | "]:
    expect(needle in r.stdout, f"bench rl output lacks {needle!r}: {r.stdout[-600:]}")
one_line_error(memlab("bench", "rl", "--set", "rl.nope=1"), "bench rl unknown key", "rl.nope")

# Bad input: one clear line, non-zero exit, nothing written.
one_line_error(memlab("rl", "visual-match", "--model", "lstmx", "--print-config"), "unknown model", "lstmx")
one_line_error(memlab("rl", "visual-match", "--set", "env.nope=1", "--print-config"), "unknown key", "env.nope")
one_line_error(memlab("rl", "visual-match", "--set", "rl.gamma=2", "--print-config"), "gamma out of range",
               "rl.gamma")
one_line_error(memlab("rl", "visual-match", "--config", os.path.join(tmp, "missing.yaml")), "missing config",
               "missing.yaml")
if os.path.isdir(a):
    one_line_error(memlab("rl", "visual-match", "--out", a, *TINY), "non-empty --out", "not empty")
one_line_error(memlab("rl", "visual-match", "--resume", os.path.join(tmp, "nothing")), "resume nothing",
               "config.yaml")
one_line_error(memlab("rl", "plot", os.path.join(tmp, "nothing"), "--out", os.path.join(tmp, "p2")), "plot nothing",
               "nothing")
d = os.path.join(tmp, "d")
r = memlab("rl", "visual-match", "--out", d, "--set", "rl.precision=bf16", "--device", "cpu")
one_line_error(r, "bf16 on CPU", "rl.precision")
expect(not os.path.exists(d), "a rejected run left its directory behind")

finish("memlab rl: run files, determinism, resume, Ctrl-C, plot and errors")
