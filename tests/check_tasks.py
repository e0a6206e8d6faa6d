#!/usr/bin/env python3
"""Checks `memlab tasks sample` output for every example against an answer computed here, independently
of memlab's generator: Python's own integer arithmetic and precedence for Mod Arith, a bit count for parity."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import expect, finish  # noqa: E402


MEMLAB = sys.argv[1]


def sample(task, split, n, seed=1, extra=()):
    out = subprocess.run([MEMLAB, "tasks", "sample", "--task", task, "--split", split, "--n", str(n),
                          "--seed", str(seed), *extra], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def vocab(task):
    out = subprocess.run([MEMLAB, "tasks", "vocab", "--task", task], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)





def check_parity(ex, lo, hi):
    inp, tgt = ex["input"], ex["target"]
    L = len(inp) + 1  # the answer slot counts in the length
    expect(lo <= L <= hi, f"parity length {L} outside [{lo},{hi}]")
    expect(len(tgt) == len(inp), "parity target length")
    expect(all(t in (1, 2) for t in inp), "parity input tokens")
    expect(all(t == -1 for t in tgt[:-1]), "parity: only the last position is scored")
    ones = sum(1 for t in inp if t == 2)
    expect(tgt[-1] == (2 if ones % 2 else 1), f"parity answer wrong for {inp}")


def check_mod_arith(ex, lo, hi, voc):
    inp, tgt = ex["input"], ex["target"]
    L = len(inp) + 1
    expect(L % 2 == 1, f"mod_arith length {L} not odd")
    # odd sizes 2*U{(lo+1)//2, (hi+1)//2} - 1
    expect(2 * ((lo + 1) // 2) - 1 <= L <= 2 * ((hi + 1) // 2) - 1, f"mod_arith length {L} outside range")
    expect(voc[inp[-1]] == "=", "mod_arith input must end with '='")
    expect(all(t == -1 for t in tgt[:-1]), "mod_arith: only '=' is scored")
    expr = inp[:-1]
    for i, t in enumerate(expr):
        s = voc[t]
        expect((s in "01234") if i % 2 == 0 else (s in "+-*"), f"mod_arith token {s} at {i}")
    text = "".join(voc[t] for t in expr)
    value = eval(text) % 5  # Python: * before + and -, exact integers, non-negative %
    expect(voc[tgt[-1]] == str(value), f"mod_arith answer {voc[tgt[-1]]} != {value} for {text}")


pv, mv = vocab("parity"), vocab("mod_arith")
expect(pv == ["<pad>", "0", "1"], f"parity vocab {pv}")
expect(mv == ["<pad>", "+", "-", "*", "=", "0", "1", "2", "3", "4"], f"mod_arith vocab {mv}")

counts = 0
for split, (lo, hi), n in [("train", (3, 40), 3000), ("val", (40, 256), 500), ("test", (40, 256), 500)]:
    for ex in sample("parity", split, n):
        check_parity(ex, lo, hi)
        counts += 1
    for ex in sample("mod_arith", split, n):
        check_mod_arith(ex, lo, hi, mv)
        counts += 1

# lengths: every allowed training length appears
lens = {len(e["input"]) + 1 for e in sample("parity", "train", 3000)}
expect(lens == set(range(3, 41)), f"parity train lengths seen: {sorted(lens)}")
lens = {len(e["input"]) + 1 for e in sample("mod_arith", "train", 3000)}
expect(lens == set(range(3, 40, 2)), f"mod_arith train lengths seen: {sorted(lens)}")
# overridden ranges are honoured
for ex in sample("parity", "train", 200, extra=("--set", "task.train_len=[5,7]")):
    check_parity(ex, 5, 7)

# determinism in (seed, split, index), and --start addresses the same examples
a, b = sample("mod_arith", "train", 50, seed=3), sample("mod_arith", "train", 50, seed=3)
expect(a == b, "same seed must give the same samples")
expect(a != sample("mod_arith", "train", 50, seed=4), "different seeds must differ")
expect(a != sample("mod_arith", "val", 50, seed=3), "different splits must differ")
tail = subprocess.run([MEMLAB, "tasks", "sample", "--task", "mod_arith", "--n", "10", "--start", "40", "--seed", "3"],
                      check=True, capture_output=True, text=True).stdout
expect([json.loads(l) for l in tail.splitlines()] == a[40:], "--start must address example indices")

finish(f"checked {counts} samples independently: all correct", limit=20)
