#!/usr/bin/env python3
"""memlab eval: a trained run's checkpoint evaluated again at other lengths, splits and precisions, its rows in
evaluation.csv (replaced, not repeated, when measured again), the training files untouched, and the same
numbers as the training run's own final evaluation when asked the same."""
import csv
import hashlib
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import error_problems, expect, finish  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-eval-")
run = os.path.join(tmp, "run")
r = subprocess.run([MEMLAB, "train", "--task", "s3", "--steps", "20", "--batch-size", "16", "--device", "cpu",
                    "--set", "model.hidden=16", "--set", "model.heads=2", "--set", "model.layers=1",
                    "--set", "model.mlp_inner=32", "--set", "eval.n=48", "--set", "task.eval_len=[40,60]",
                    "--out", run], capture_output=True, text=True)
expect(r.returncode == 0, f"train: {r.stderr[-300:]}")
TRAINING = ["config.yaml", "train.csv", "eval.csv", "summary.md", "checkpoint.pt", "log.txt"]


def digest():
    return {f: hashlib.sha256(open(os.path.join(run, f), "rb").read()).hexdigest() for f in TRAINING}


def rows(name):
    with open(os.path.join(run, name)) as f:
        return list(csv.DictReader(f))


before = digest()
# The training run's own final evaluation, asked again: the same numbers.
r = subprocess.run([MEMLAB, "eval", run, "--lengths", "40-60,3-40"], capture_output=True, text=True)
expect(r.returncode == 0 and "| **40-60** |" in r.stdout and "every position" in r.stdout, f"eval: {r.stderr[-300:]}")
final = {(x["length_min"], x["length_max"]): x for x in rows("eval.csv") if x["step"] == "20"}
for x in rows("evaluation.csv"):
    want = final[(x["length_min"], x["length_max"])]
    for col in ("accuracy", "normalized_accuracy", "accuracy_all", "normalized_all"):
        expect(abs(float(x[col]) - float(want[col])) < 1e-9, f"{col} at {x['length_min']}-{x['length_max']}: "
               f"eval {x[col]}, training {want[col]}")
    expect(x["split"] == "val" and x["step"] == "20" and x["n"] == "48", f"evaluation.csv row {x}")

# Other lengths and the test split; again, to see rows replaced rather than repeated.
for _ in range(2):
    r = subprocess.run([MEMLAB, "eval", run, "--lengths", "100,200-210", "--split", "test", "--n", "16"],
                       capture_output=True, text=True)
    expect(r.returncode == 0, f"eval at other lengths: {r.stderr[-300:]}")
got = [(x["split"], x["length_min"], x["length_max"], x["n"]) for x in rows("evaluation.csv")]
expect(sorted(got) == sorted([("val", "40", "60", "48"), ("val", "3", "40", "48"), ("test", "100", "100", "16"),
                              ("test", "200", "210", "16")]), f"evaluation.csv rows {got}")
expect(all(0 <= float(x["accuracy"]) <= 1 for x in rows("evaluation.csv")), "accuracy outside [0, 1]")
with open(os.path.join(run, "evaluation.md")) as f:
    md = f.read()
expect("| 100-100 |" in md and "test split" in md, f"evaluation.md: {md[:300]}")
# MAD's average beside the tokens' one: its own rows (the average column), not a replacement.
r = subprocess.run([MEMLAB, "eval", run, "--lengths", "40-60", "--average", "mad"], capture_output=True, text=True)
expect(r.returncode == 0 and "MAD's average" in r.stdout, f"eval --average mad: {r.stderr[-300:]}")
got = sorted((x["split"], x["length_min"], x["n"], x["average"]) for x in rows("evaluation.csv"))
expect(got == sorted([("val", "40", "48", "tokens"), ("val", "3", "48", "tokens"), ("test", "100", "16", "tokens"),
                      ("test", "200", "16", "tokens"), ("val", "40", "48", "mad")]), f"evaluation.csv rows {got}")
# The precision the evaluation ran in is a column: on a CPU, auto and --precision fp32 are the same fp32 evaluation,
# so asking for fp32 replaces those rows rather than adding beside them.
expect(all(x["precision"] == "fp32" for x in rows("evaluation.csv")), "CPU evaluation rows not marked fp32")
r = subprocess.run([MEMLAB, "eval", run, "--lengths", "40-60", "--precision", "fp32"], capture_output=True, text=True)
expect(r.returncode == 0 and "fp32" in r.stdout, f"eval --precision fp32: {r.stderr[-300:]}")
expect(sorted((x["split"], x["length_min"], x["n"], x["average"]) for x in rows("evaluation.csv")) == got,
       "eval --precision fp32 on a CPU added rows beside the fp32 ones it measured again")
# Rows of an older memlab (13 columns, no precision) are kept with it empty and not taken for this call's.
with open(os.path.join(run, "evaluation.csv")) as f:
    lines = f.read().splitlines()
with open(os.path.join(run, "evaluation.csv"), "w") as f:
    f.write("".join(line.rsplit(",", 1)[0] + "\n" for line in lines))
r = subprocess.run([MEMLAB, "eval", run, "--lengths", "100", "--split", "test", "--n", "16"], capture_output=True,
                   text=True)
expect(r.returncode == 0, f"eval beside 13-column rows: {r.stderr[-300:]}")
got = sorted((x["split"], x["length_min"], x["n"], x["average"], x["precision"]) for x in rows("evaluation.csv"))
expect(got == sorted([("val", "40", "48", "tokens", ""), ("val", "3", "48", "tokens", ""),
                      ("test", "100", "16", "tokens", ""), ("test", "200", "16", "tokens", ""),
                      ("val", "40", "48", "mad", ""), ("test", "100", "16", "tokens", "fp32")]),
       f"evaluation.csv rows beside an older memlab's {got}")
expect(digest() == before, "memlab eval changed a training file")

# Bad input: one error line, exit 2.
bare = os.path.join(tmp, "bare")
os.makedirs(bare)
open(os.path.join(bare, "config.yaml"), "w").write(open(os.path.join(run, "config.yaml")).read())
for args, needle in [([os.path.join(tmp, "nothing")], "config.yaml"), ([run, "--lengths", "40-"], "--lengths"),
                     ([run, "--n", "0"], "eval.n"), ([run, "--split", "train"], "--split"),
                     ([bare], "checkpoint.pt"), ([run, "--device", "gpu"], "train.device"),
                     ([run, "--average", "macro"], "--average"), ([run, "--precision", "fp16"], "--precision"),
                     ([run, "--precision", "bf16", "--device", "cpu"], "train.precision")]:
    r = subprocess.run([MEMLAB, "eval", *args], capture_output=True, text=True)
    problems = error_problems(r, [needle])
    expect(not problems, f"memlab eval {' '.join(args)}: {'; '.join(problems)}: {r.stderr.strip()[:300]!r}")

# MAD's average needs one right answer a position: RegBench's are sets, refused before anything is written.
out = os.path.join(tmp, "regbench")
r = subprocess.run([MEMLAB, "train", "--task", "regbench", "--steps", "1", "--device", "cpu", "--set", "eval.average=mad",
                    "--out", out], capture_output=True, text=True)
problems = error_problems(r, ["eval.average"])
expect(not problems and not os.path.exists(out), f"train regbench with eval.average=mad: {'; '.join(problems)}: "
       f"{r.stderr.strip()[:300]!r}")

finish(f"memlab eval checks passed ({tmp})")
