#!/usr/bin/env python3
"""The committed quick configs on CPU: DeltaNet [-1,1] learns parity on lengths 3-40 and generalises to
40-256 (normalised accuracy >= 0.9), the Transformer stays near chance there. Also: every committed config
is valid (memlab train --print-config)."""
import csv
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import failures, finish  # noqa: E402

MEMLAB = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tmp = tempfile.mkdtemp(prefix="memlab-quick-")

def has_top_key(text, key):
    return text.lstrip("\n").startswith(key + ":") or f"\n{key}:" in text


for cfg in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
    if os.path.relpath(cfg, ROOT).startswith(os.path.join("configs", "papers") + os.sep):
        continue  # a paper's values for memlab report --paper: tests/check_report.py reads each of them
    text = open(cfg).read()
    if has_top_key(text, "sweep"):
        # A sweep file is valid when every run it expands to is (`--list` checks them all, runs nothing).
        res = os.path.join(tmp, "sweep_" + os.path.basename(cfg))
        r = subprocess.run([MEMLAB, "sweep", cfg, "--results", res, "--list", "--set", "train.device=cpu"],
                           capture_output=True, text=True)
    elif has_top_key(text, "rl") or has_top_key(text, "env"):
        # RL experiments have their own schema (model.*, rl.*, env.*).
        r = subprocess.run([MEMLAB, "rl", "visual-match", "--config", cfg, "--print-config", "--device", "cpu"],
                           capture_output=True, text=True)
    else:
        r = subprocess.run([MEMLAB, "train", "--config", cfg, "--print-config", "--device", "cpu"],
                           capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{os.path.relpath(cfg, ROOT)} is not valid: {r.stderr.strip()}")


def final_norm(name):
    out = os.path.join(tmp, name)
    r = subprocess.run([MEMLAB, "train", "--config", os.path.join(ROOT, "configs", "quick", name + ".yaml"),
                        "--out", out, "--device", "cpu"], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        failures.append(f"{name}: exit {r.returncode}: {r.stderr[-400:]}")
        return None
    with open(os.path.join(out, "eval.csv")) as f:
        rows = list(csv.DictReader(f))
    last = max(int(x["step"]) for x in rows)
    row = [x for x in rows if int(x["step"]) == last and x["length_min"] == "40" and x["length_max"] == "256"][0]
    print(f"{name}: normalised accuracy on 40-256 after {last} steps = {float(row['normalized_accuracy']):.3f}")
    return float(row["normalized_accuracy"])


d = final_norm("parity_deltanet_neg")
t = final_norm("parity_transformer")
if d is not None and d < 0.9:
    failures.append(f"DeltaNet [-1,1] reached only {d:.3f} on 40-256")
if t is not None and abs(t) > 0.2:
    failures.append(f"Transformer is not near chance on 40-256: {t:.3f}")

finish("quick parity: DeltaNet [-1,1] generalises, Transformer at chance; all configs valid")
