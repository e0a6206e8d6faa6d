#!/usr/bin/env python3
"""The subquadratic Table 13 layout end to end on CPU: configs/subquadratic/table13_quick.yaml (five models,
six tasks, two seeds, tiny models) through `memlab sweep`; every run's summary.md has the per-length table
and the longest-length line; `memlab report --protocol subquadratic` has one row per model and length with
the best seed's accuracy, which this script recomputes from the runs' eval.csv files."""
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
tmp = tempfile.mkdtemp(prefix="memlab-sq-")
RES = os.path.join(tmp, "sq")
MODELS = ["Mamba-2", "Gated DeltaNet", "Gated DeltaNet [-1,1]", "xLSTM[1:0]", "xLSTM[1:1]"]
TASKS = ["anbn", "anbncn", "majority", "parity", "sum_mod5", "s3"]
TITLES = ["AnBn", "AnBnCn", "Majority", "Parity", "Mod-5 Sum", "S3"]

r = subprocess.run([MEMLAB, "sweep", os.path.join(ROOT, "configs/subquadratic/table13_quick.yaml"), "--results", RES,
                    "--gpus", "none", "--workers", "2"], capture_output=True, text=True, timeout=1800)
expect(r.returncode == 0, f"quick sweep failed ({r.returncode}): {r.stdout[-3000:]} {r.stderr[-2000:]}")
N = len(MODELS) * len(TASKS) * 2  # two seeds
expect(f"{N}/{N} done" in r.stdout, f"expected {N} finished runs: {r.stdout[-500:]}")

# Independent aggregation: per (label, task, length) the max over seeds of the final step's accuracy.
best, best_all = {}, {}  # the answer at the last position; every scored position
for run in glob.glob(os.path.join(RES, "runs", "*")):
    summary = open(os.path.join(run, "summary.md")).read()
    expect("| 16-16 |" in summary and "| 256-256 |" in summary and "Longest length with accuracy >= 0.9" in summary,
           f"{run}/summary.md lacks the per-length table:\n{summary}")
    label = [ln.split(":", 1)[1].split("#")[0].strip().strip('"') for ln in open(os.path.join(run, "config.yaml"))
             if ln.startswith("label:")][0]
    rows = list(csv.DictReader(open(os.path.join(run, "eval.csv"))))
    last = max(int(x["step"]) for x in rows)
    for x in rows:
        if int(x["step"]) == last:
            key = (label, x["task"], int(x["length_min"]))
            best[key] = max(best.get(key, -1.0), float(x["accuracy"]))
            best_all[key] = max(best_all.get(key, -1.0), float(x["accuracy_all"]))

r = subprocess.run([MEMLAB, "report", RES, "--protocol", "subquadratic"], capture_output=True, text=True, timeout=300)
expect(r.returncode == 0, f"report failed: {r.stderr}")
tables = [t for t in r.stdout.split("\n\n") if t.lstrip().startswith("|")]
# --positions both (the default here): per-length and longest-length tables at the last position, then at every one
expect(len(tables) == 4, f"expected the per-length and the longest-length tables, twice:\n{r.stdout}")
for table, want_of in ((tables[0], best), (tables[2], best_all)) if len(tables) == 4 else ():
    lines = [ln for ln in table.strip().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    expect(header == ["Model", "Length"] + TITLES, f"columns: {header}")
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    expect([row[0] for row in body] == [m for m in MODELS for _ in range(3)], f"rows: {[row[:2] for row in body]}")
    for row in body:
        for task, cell in zip(TASKS, row[2:]):
            want = want_of[(row[0], task, int(row[1]))]
            expect(abs(float(cell) - want) < 6e-4, f"{row[0]} {task} at {row[1]}: report {cell}, eval.csv max {want}")
for table in (tables[1], tables[3]) if len(tables) == 4 else ():
    lines = [ln for ln in table.strip().splitlines() if ln.startswith("|")]
    expect(len(lines) == 2 + len(MODELS) and all("(2)" in ln for ln in lines[2:]), f"longest-length table:\n{table}")
expect("at the answer's last position" in r.stdout and "at every scored position" in r.stdout,
       "the tables do not say which positions they score")
# the running answer differs from the last position somewhere (s3 and sum_mod5 score every position)
expect(any(abs(best[k] - best_all[k]) > 1e-9 for k in best), "accuracy_all never differs from accuracy")
r = subprocess.run([MEMLAB, "report", RES, "--protocol", "subquadratic", "--positions", "last"], capture_output=True,
                   text=True, timeout=300)
expect(r.returncode == 0 and len([t for t in r.stdout.split("\n\n") if t.lstrip().startswith("|")]) == 2,
       f"--positions last: {r.stderr}")
r = subprocess.run([MEMLAB, "report", RES, "--positions", "both"], capture_output=True, text=True, timeout=300)
expect(r.returncode == 2 and r.stderr.startswith("error:") and "subquadratic" in r.stderr, f"both with hqlt: {r.stderr}")

r = subprocess.run([MEMLAB, "report", RES, "--protocol", "subquadratic", "--plot"], capture_output=True, text=True)
expect(r.returncode != 0 and r.stderr.startswith("error:") and "--plot" in r.stderr, f"--plot: {r.stderr}")
r = subprocess.run([MEMLAB, "report", RES, "--protocol", "table13"], capture_output=True, text=True)
expect(r.returncode != 0 and "allowed: hqlt, subquadratic, mad" in r.stderr, f"bad protocol: {r.stderr}")
finish(f"subquadratic Table 13 quick sweep and report OK ({tmp})")
