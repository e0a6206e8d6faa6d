#!/usr/bin/env python3
"""MAD end to end on CPU: configs/sweeps/mesanet_mad_quick.yaml (all six MAD tasks, two settings each, three
models, two learning rates) through `memlab sweep`, then `memlab report --protocol mad`, whose mean over
settings of the best run per setting this script recomputes from the runs' config.yaml and eval.csv."""
import csv
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import expect, finish  # noqa: E402

MEMLAB = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tmp = tempfile.mkdtemp(prefix="memlab-mad-")
RES = os.path.join(tmp, "mad")
TASKS = ["mad_recall", "mad_noisy_recall", "mad_fuzzy_recall", "mad_selective_copy", "mad_compression",
         "mad_memorization"]

r = subprocess.run([MEMLAB, "sweep", os.path.join(ROOT, "configs/sweeps/mesanet_mad_quick.yaml"), "--results", RES,
                    "--gpus", "none", "--workers", "2"], capture_output=True, text=True, timeout=1800)
expect(r.returncode == 0, f"quick sweep failed ({r.returncode}): {r.stdout[-3000:]} {r.stderr[-2000:]}")
N = len(TASKS) * 2 * 3 * 2  # tasks x settings x models x learning rates, as the docstring says
expect(f"{N}/{N} done" in r.stdout, f"expected {N} finished runs: {r.stdout[-500:]}")


def task_section(config_text):
    """The lines of the config's task: section (its setting), without task.name."""
    out, inside = [], False
    for ln in config_text.splitlines():
        if ln.startswith("task:"):
            inside = True
        elif inside and ln and not ln.startswith(" "):
            break
        elif inside and not ln.strip().startswith("name:"):
            out.append(ln)
    return "\n".join(out)


best = {}  # (model, task, setting) -> best accuracy %
for run in glob.glob(os.path.join(RES, "runs", "*")):
    text = open(os.path.join(run, "config.yaml")).read()
    rows = list(csv.DictReader(open(os.path.join(run, "eval.csv"))))
    last = max(int(x["step"]) for x in rows)
    acc = [float(x["accuracy"]) for x in rows if int(x["step"]) == last]
    expect(len(acc) == 1, f"{run}: one evaluated range expected")
    model = rows[0]["model"]
    key = (model, rows[0]["task"], task_section(text))
    best[key] = max(best.get(key, -1.0), 100 * acc[0])
expect(len({k[2] for k in best if k[1] == "mad_recall"}) == 2, "recall should have two settings")

r = subprocess.run([MEMLAB, "report", RES, "--protocol", "mad"], capture_output=True, text=True, timeout=300)
expect(r.returncode == 0, f"report failed: {r.stderr}")
tables = [t for t in r.stdout.split("\n\n") if t.lstrip().startswith("|")]
expect(len(tables) == 1 + len(TASKS), f"expected the summary and one table per task:\n{r.stdout}")
lines = [ln for ln in tables[0].strip().splitlines() if ln.startswith("|")]
header = [c.strip() for c in lines[0].strip("|").split("|")]
expect(len(header) == 2 + len(TASKS) and header[-1] == "Avg.", f"summary columns: {header}")
for ln in lines[2:]:
    cells = [c.strip() for c in ln.strip("|").split("|")]
    model, means = cells[0], []
    for task, cell in zip(TASKS, cells[1:-1]):
        vals = [v for (m, t, s), v in best.items() if m == model and t == task]
        want = sum(vals) / len(vals)
        means.append(want)
        expect(abs(float(cell) - want) < 0.051, f"{model} {task}: report {cell}, recomputed {want:.2f}")
    expect(abs(float(cells[-1]) - sum(means) / len(means)) < 0.051, f"{model} Avg.: {cells[-1]}")
finish(f"MAD quick sweep and report OK ({tmp})")
