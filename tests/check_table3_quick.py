#!/usr/bin/env python3
"""The HQLT Table 3 layout end to end on CPU: configs/sweeps/hqlt_table3_quick.yaml (every row of the paper's
table on both tasks, tiny models) through `memlab sweep`, then `memlab report` has the paper's rows in its
order (then the sweep's experiments beyond the paper's) and the two task columns, in every format, with the plots."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import expect, finish  # noqa: E402

MEMLAB = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tmp = tempfile.mkdtemp(prefix="memlab-table3-")
RES = os.path.join(tmp, "t3")
# The paper's rows in its order; experiments the sweep adds beyond the paper's table come after them, in the sweep's
# order (their labels and the run count are read from the sweep's plan, so that adding one changes no test).
PAPER_ROWS = ["Transformer", "Mamba [-1,1]", "Mamba [0,1]", "DeltaNet [-1,1]", "DeltaNet [0,1]", "HQLT Delayed-Stream",
              "HQLT Delayed-Chunk", "HQLT Synchronous", "HQLT Synchronous w. Linear Attn."]
QUICK = os.path.join(ROOT, "configs/sweeps/hqlt_table3_quick.yaml")

r = subprocess.run([MEMLAB, "sweep", QUICK, "--list", "--results", RES], capture_output=True, text=True, timeout=300)
plan = [ln.split(None, 6) for ln in r.stdout.splitlines()[1:] if ln.strip()]
expect(r.returncode == 0 and len(plan) >= 4 * len(PAPER_ROWS), f"--list of the quick sweep: {r.stdout[-500:]} {r.stderr}")
ROWS = PAPER_ROWS + [label for label in dict.fromkeys(p[6] for p in plan) if label not in PAPER_ROWS]

r = subprocess.run([MEMLAB, "sweep", QUICK, "--results", RES, "--gpus", "none", "--workers", "2"], capture_output=True,
                   text=True, timeout=1200)
expect(r.returncode == 0, f"quick sweep failed ({r.returncode}): {r.stdout[-3000:]} {r.stderr[-2000:]}")
expect(f"{len(plan)}/{len(plan)} done" in r.stdout, f"expected {len(plan)} finished runs: {r.stdout[-500:]}")

r = subprocess.run([MEMLAB, "report", RES], capture_output=True, text=True, timeout=300)
expect(r.returncode == 0, f"report failed: {r.stderr}")
md = r.stdout
tables = [t for t in md.split("\n\n") if t.lstrip().startswith("|")]
expect(len(tables) >= 2, f"expected the best and the median tables:\n{md}")
for t in tables[:2]:
    lines = [ln for ln in t.strip().splitlines() if ln.startswith("|")]
    header = [c.strip().lower() for c in lines[0].strip("|").split("|")]
    expect(any("parity" in c for c in header) and any(c.replace("_", " ") == "mod arith" for c in header),
           f"columns should be the two tasks: {lines[0]}")
    labels = [ln.strip("|").split("|")[0].strip() for ln in lines[2:]]
    expect(labels == ROWS, f"rows should be the paper's, in its order: {labels}")

for fmt in ("csv", "tex"):
    r = subprocess.run([MEMLAB, "report", RES, "--format", fmt], capture_output=True, text=True, timeout=300)
    expect(r.returncode == 0 and all(row.replace("[", "").split(" ")[0] in r.stdout for row in ROWS),
           f"--format {fmt}: {r.stderr}")

out = os.path.join(tmp, "report")
r = subprocess.run([MEMLAB, "report", RES, "--plot", "--out", out], capture_output=True, text=True, timeout=300)
if r.returncode != 0 and "without cairo" in r.stderr:
    print("note: this memlab was built without cairo; plots not checked")
else:
    expect(r.returncode == 0, f"report --plot failed: {r.stderr}")
    for task in ("parity", "mod_arith"):
        for kind in ("length", "learning", "loss"):
            for ext, magic in (("png", b"\x89PNG"), ("svg", b"<")):
                path = os.path.join(out, f"{task}_{kind}.{ext}")
                ok = os.path.exists(path) and open(path, "rb").read(64).lstrip().startswith(magic)
                expect(ok, f"missing or malformed {path}")
finish(f"HQLT Table 3 quick sweep and report OK ({tmp})")
