#!/usr/bin/env python3
"""Checks `memlab tasks sample` output for every example against an answer computed here, independently
of memlab's generator: Python's own integer arithmetic and precedence for Mod Arith (with and without
brackets), a bit count for parity, a digit sum, permutations composed from the vocab's one-line names for the
word problems, a position walk for cycle navigation, direct string checks for a^n b^n (c^n), a Counter for
Majority, the MAD tasks' answers rebuilt from their tokens, and for RegBench consistency of the accept sets
with the strings (the automaton is not printed). Every registered task (read from the CLI's unknown-task
error) gets the generic checks."""
import collections
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


def vocab(task, extra=()):
    out = subprocess.run([MEMLAB, "tasks", "vocab", "--task", task, *extra], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout)


def task_names():
    # The allowed list of the error for an unknown task: every registered task, so none is forgotten here.
    r = subprocess.run([MEMLAB, "tasks", "vocab", "--task", "no-such-task"], capture_output=True, text=True)
    expect(r.returncode != 0 and r.stderr.startswith("error:"), f"unknown task: {r.returncode} {r.stderr!r}")
    allowed = r.stderr.split("allowed: ", 1)[1].rsplit(")", 1)[0]
    return [t.strip() for t in allowed.split(",")]





# Running-answer tasks (parity, sum_mod5, s3, s5, cycle_nav): training sees the last target only unless
# task.<name>.target is every; evaluation splits always carry the running answer at every position.
def check_parity(ex, lo, hi, every):
    inp, tgt = ex["input"], ex["target"]
    L = len(inp) + 1  # the answer slot counts in the length
    expect(lo <= L <= hi, f"parity length {L} outside [{lo},{hi}]")
    expect(len(tgt) == len(inp), "parity target length")
    expect(all(t in (1, 2) for t in inp), "parity input tokens")
    if not every:
        expect(all(t == -1 for t in tgt[:-1]), "parity: only the last position is scored")
    ones = 0
    for i, t in enumerate(inp):
        ones += t == 2
        if every or i == len(inp) - 1:
            expect(tgt[i] == (2 if ones % 2 else 1), f"parity answer wrong at {i} for {inp}")


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
        check_parity(ex, lo, hi, split != "train")
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
    check_parity(ex, 5, 7, False)
for ex in sample("parity", "train", 200, extra=("--set", "task.parity.target=every")):
    check_parity(ex, 3, 40, True)

# determinism in (seed, split, index), and --start addresses the same examples
a, b = sample("mod_arith", "train", 50, seed=3), sample("mod_arith", "train", 50, seed=3)
expect(a == b, "same seed must give the same samples")
expect(a != sample("mod_arith", "train", 50, seed=4), "different seeds must differ")
expect(a != sample("mod_arith", "val", 50, seed=3), "different splits must differ")
tail = subprocess.run([MEMLAB, "tasks", "sample", "--task", "mod_arith", "--n", "10", "--start", "40", "--seed", "3"],
                      check=True, capture_output=True, text=True).stdout
expect([json.loads(l) for l in tail.splitlines()] == a[40:], "--start must address example indices")


# ---- every registered task: vocab, token ranges, the last position scored, determinism, splits differ ----
NAMES = task_names()
expect({"parity", "mod_arith", "mod_arith_brackets", "sum_mod5", "s3", "s5", "cycle_nav", "anbn", "anbncn",
        "majority", "regbench"} <= set(NAMES), f"task list looks wrong: {NAMES}")
for name in NAMES:
    voc = vocab(name)
    expect(isinstance(voc, list) and voc and voc[0] == "<pad>" and all(isinstance(v, str) for v in voc),
           f"{name}: vocab {voc}")
    expect(len(set(voc)) == len(voc), f"{name}: token names must be distinct: {voc}")
    for split in ("train", "test"):
        for ex in sample(name, split, 200):
            inp, tgt = ex["input"], ex["target"]
            expect(len(inp) == len(tgt) and inp, f"{name}: input/target lengths")
            expect(all(0 < t < len(voc) for t in inp), f"{name}: input token outside the vocab")
            expect(all(t == -1 or 0 < t < len(voc) for t in tgt), f"{name}: target outside the vocab")
            expect(any(t >= 0 for t in tgt), f"{name}: no position scored")
            if "accept" in ex:
                acc = ex["accept"]
                expect(len(acc) == len(inp), f"{name}: one accept set per position")
                expect(all(t < 0 or (acc[i] >> t) & 1 for i, t in enumerate(tgt)), f"{name}: target outside its accept set")
    a = sample(name, "val", 30, seed=5, extra=("--set", "task.eval_len=[200,260]"))
    expect(a == sample(name, "val", 30, seed=5, extra=("--set", "task.eval_len=[200,260]")), f"{name}: not deterministic")
    b = sample(name, "test", 30, seed=5, extra=("--set", "task.eval_len=[200,260]"))
    expect(sum(x == y for x, y in zip(a, b)) <= 3, f"{name}: val and test splits coincide")


# ---- per-task answers, computed here ----
def length_ok(name, L, lo, hi):
    expect(lo <= L <= hi, f"{name}: length {L} outside [{lo},{hi}]")


def only_last(name, tgt):
    expect(all(t == -1 for t in tgt[:-1]), f"{name}: only the last position is scored")


def check_brackets(ex, lo, hi, voc, mult):
    inp, tgt = ex["input"], ex["target"]
    length_ok("mod_arith_brackets", len(inp) + 1, lo, hi)
    only_last("mod_arith_brackets", tgt)
    expect(voc[inp[-1]] == "=", "mod_arith_brackets: input must end with '='")
    text = "".join(voc[t] for t in inp[:-1])
    expect(set(text) <= set("01234+-()" + ("*" if mult else "")), f"mod_arith_brackets: tokens in {text}")
    value = eval(text) % 5  # Python's own parser: brackets, unary minus, * before + and -
    expect(voc[tgt[-1]] == str(value), f"mod_arith_brackets: {voc[tgt[-1]]} != {value} for {text}")


def check_sum_mod5(ex, lo, hi, voc, every):
    inp, tgt = ex["input"], ex["target"]
    length_ok("sum_mod5", len(inp) + 1, lo, hi)
    if not every:
        only_last("sum_mod5", tgt)
    total = 0
    for i, t in enumerate(inp):
        total += int(voc[t])
        if every or i == len(inp) - 1:
            expect(voc[tgt[i]] == str(total % 5), f"sum_mod5: position {i}")


def check_word_problem(name, ex, lo, hi, voc, every):
    inp, tgt = ex["input"], ex["target"]
    length_ok(name, len(inp) + 1, lo, hi)
    if not every:
        only_last(name, tgt)
    n = len(voc[1])
    state = list(range(n))
    for i, t in enumerate(inp):
        g = [int(c) for c in voc[t]]  # one-line notation: g maps i to g[i]
        state = [g[x] for x in state]  # g applied after the elements before it
        if every or i == len(inp) - 1:
            expect(voc[tgt[i]] == "".join(map(str, state)), f"{name}: position {i}")


def check_cycle(ex, lo, hi, voc, every):
    inp, tgt = ex["input"], ex["target"]
    length_ok("cycle_nav", len(inp) + 1, lo, hi)
    if not every:
        only_last("cycle_nav", tgt)
    pos = 0
    for i, t in enumerate(inp):
        pos = (pos + {"stay": 0, "+1": 1, "-1": -1}[voc[t]]) % 5
        if every or i == len(inp) - 1:
            expect(voc[tgt[i]] == f"p{pos}", f"cycle_nav: {voc[tgt[i]]} != p{pos} at {i}")


def check_counting(name, ex, lo, hi, voc, k):
    inp, tgt = ex["input"], ex["target"]
    L = len(inp) + 1
    length_ok(name, L, lo, hi)
    expect((L - 2) % k == 0, f"{name}: length {L} is not {k}n+2")
    only_last(name, tgt)
    expect(voc[inp[-1]] == "=", f"{name}: input must end with '='")
    s = "".join(voc[t] for t in inp[:-1])
    n = len(s) // k
    member = n >= 1 and s == "".join(c * n for c in "abc"[:k])
    expect(voc[tgt[-1]] == ("accept" if member else "reject"), f"{name}: {voc[tgt[-1]]} for {s}")
    return member


def check_majority(ex, lo, hi, voc):
    inp, tgt = ex["input"], ex["target"]
    length_ok("majority", len(inp) + 1, lo, hi)
    only_last("majority", tgt)
    expect(voc[inp[-1]] == "=", "majority: input must end with '='")
    top = collections.Counter(voc[t] for t in inp[:-1]).most_common()
    expect(len(top) == 1 or top[0][1] > top[1][1], f"majority: tie in {top}")
    expect(voc[tgt[-1]] == top[0][0], f"majority: {voc[tgt[-1]]} != {top[0][0]}")


RANGES = [("train", (3, 40), 1000), ("val", (40, 256), 200), ("test", (40, 256), 200)]
for mult in (False, True):
    extra = ("--set", f"task.mod_arith_brackets.mult={'true' if mult else 'false'}")
    voc = vocab("mod_arith_brackets")
    for split, (lo, hi), n in RANGES:
        for ex in sample("mod_arith_brackets", split, n, extra=extra):
            check_brackets(ex, lo, hi, voc, mult)
            counts += 1
for every in (False, True):
    extra = ("--set", f"task.sum_mod5.target={'every' if every else 'last'}")
    voc = vocab("sum_mod5")
    for split, (lo, hi), n in RANGES:
        for ex in sample("sum_mod5", split, n, extra=extra):
            check_sum_mod5(ex, lo, hi, voc, every or split != "train")
            counts += 1
    for name, size in (("s3", 6), ("s5", 120)):
        voc = vocab(name)
        expect(len(voc) == size + 1 and voc[1] == "".join(map(str, range(len(voc[1])))), f"{name}: vocab {voc[:3]}")
        extra = ("--set", f"task.{name}.target={'every' if every else 'last'}")
        for split, (lo, hi), n in RANGES:
            for ex in sample(name, split, n, extra=extra):
                check_word_problem(name, ex, lo, hi, voc, every or split != "train")
                counts += 1
voc = vocab("cycle_nav")
for every in (False, True):
    for split, (lo, hi), n in RANGES:
        for ex in sample("cycle_nav", split, n, extra=("--set", f"task.cycle_nav.target={'every' if every else 'last'}")):
            check_cycle(ex, lo, hi, voc, every or split != "train")
            counts += 1
# counting: the default ranges and the subquadratic protocol's lengths (train 128, test 512 and 2048)
for name, k in (("anbn", 2), ("anbncn", 3)):
    voc = vocab(name)
    accepted = total = 0
    for split, (lo, hi), n in RANGES + [("train", (128, 128), 600), ("test", (2048, 2048), 40)]:
        extra = ("--set", f"task.{'train' if split == 'train' else 'eval'}_len=[{lo},{hi}]")
        for ex in sample(name, split, n, extra=extra):
            accepted += check_counting(name, ex, lo, hi, voc, k)
            total += 1
            counts += 1
    expect(abs(accepted / total - 0.5) < 0.04, f"{name}: accepted {accepted} of {total}, classes must be balanced")
for symbols in (4, 3):
    extra = ("--set", f"task.majority.symbols={symbols}")
    voc = vocab("majority", extra)
    expect(voc == ["<pad>"] + list("abcd"[:symbols]) + ["="], f"majority vocab {voc}")
    answers = collections.Counter()
    for split, (lo, hi), n in RANGES:
        for ex in sample("majority", split, n, extra=extra):
            check_majority(ex, lo, hi, voc)
            answers[ex["target"][-1]] += 1
            counts += 1
    expect(len(answers) == symbols and max(answers.values()) < 1.25 * 1400 / symbols, f"majority answers {answers}")


# ---- MAD (tasks/mad.h): answers rebuilt from the tokens, by name (k* key, v* value, n* noise, t* token) ----
def cls(voc, t):
    name = voc[t]
    return name[0] if len(name) > 1 and name[1].isdigit() else name


def mad_sample(name, split, n, L, seed=1, sets=()):
    extra = ["--set", f"task.{'train' if split == 'train' else 'eval'}_len=[{L},{L}]"]
    for s in sets:
        extra += ["--set", s]
    return sample(name, split, n, seed=seed, extra=extra), vocab(name, tuple(extra))


def check_recall_like(name, ex, voc, train, multi, fuzzy):
    inp, tgt = ex["input"], ex["target"]
    seq = inp + [tgt[-1]]  # the whole sequence: the last target is its last token in both splits
    if train:
        expect(tgt == seq[1:], f"{name}: train targets are the next tokens")
        return 0
    # split the sequence into (key run, value run) pairs; noise pairs, pads and the copy token between them
    pairs, i, noise = [], 0, 0
    while i < len(seq):
        c = cls(voc, seq[i])
        if c in ("pad", "copy"):
            i += 1
            continue
        if c == "n":
            expect(cls(voc, seq[i + 1]) == "n", f"{name}: noise comes in pairs")
            noise += 1
            i += 2
            continue
        j = i
        while j < len(seq) and cls(voc, seq[j]) == "k":
            j += 1
        e = j
        while e < len(seq) and cls(voc, seq[e]) == "v":
            e += 1
        expect(j > i and e > j, f"{name}: a key run then a value run at {i}: {[voc[t] for t in seq[i:i + 4]]}")
        if not fuzzy:
            expect(j - i == 1 and e - j == 1, f"{name}: single-token keys and values")
        pairs.append((tuple(seq[i:j]), tuple(seq[j:e]), j))
        i = e
    if not multi:
        expect(voc[seq[len(seq) - len(pairs[-1][0]) - len(pairs[-1][1]) - 1]] == "copy", f"{name}: copy before the probe")
    want, seen = [-1] * len(seq), {}
    for n_, (k, v, at) in enumerate(pairs):
        last = n_ == len(pairs) - 1
        if k in seen:
            expect(seen[k] == v, f"{name}: key {k} has two values")
            if multi or last:
                want[at:at + len(v)] = list(v)
        elif last:
            expect(False, f"{name}: the probe's key never appeared before")
        seen[k] = v
    expect(tgt == want[1:], f"{name}: evaluation targets differ from the values of keys seen before")
    return noise


# recall, noisy recall, fuzzy recall at MAD's baseline seq_len 128, both target modes
for name, fuzzy in (("mad_recall", False), ("mad_noisy_recall", False), ("mad_fuzzy_recall", True)):
    for multi in (True, False):
        sets = (f"task.mad.multi_query={'true' if multi else 'false'}",)
        noise = 0
        for split in ("train", "test"):
            exs, voc = mad_sample(name, split, 150, 128, sets=sets)
            want_len = 128 if (fuzzy or not multi) else 127
            for ex in exs:
                expect(len(ex["input"]) == want_len, f"{name}: input length {len(ex['input'])} != {want_len}")
                noise += check_recall_like(name, ex, voc, split == "train", multi, fuzzy)
                counts += 1
        expect((noise > 0) == (name == "mad_noisy_recall"), f"{name}: {noise} noise pairs")
# selective copying: the non-blank tokens before 'copy', in order, are the targets of the last n positions
for n in (16, 5):
    exs, voc = mad_sample("mad_selective_copy", "test", 200, 256, sets=(f"task.mad.copy={n}",))
    for ex in exs:
        inp, tgt = ex["input"], ex["target"]
        at = inp.index(voc.index("copy"))
        toks = [t for t in inp[:at] if voc[t] != "blank"]
        expect(len(inp) == 256 and at == 256 - n - 1 and len(toks) == n, "mad_selective_copy: layout")
        expect(all(voc[t] == "blank" for t in inp[at + 1:]), "mad_selective_copy: blanks after 'copy'")
        expect(tgt == [-1] * (256 - n) + toks, "mad_selective_copy: targets are the tokens in order")
        counts += 1
# compression: the target is the input; the last token is 'compress'
exs, voc = mad_sample("mad_compression", "val", 200, 32)
for ex in exs:
    expect(ex["target"] == ex["input"] and voc[ex["input"][-1]] == "compress" and len(ex["input"]) == 32,
           "mad_compression: targets are the inputs")
    counts += 1
# memorisation: one key -> value function over seeds and splits, injective
facts = {}
for seed in (1, 2):
    for split in ("train", "test"):
        exs, voc = mad_sample("mad_memorization", split, 100, 32, seed=seed)
        for ex in exs:
            inp, tgt = ex["input"], ex["target"]
            expect(len(inp) == 32 and all(voc[t] == "insert" for t in inp[1::2]), "mad_memorization: (key, insert) pairs")
            expect(all(t == -1 for t in tgt[0::2]), "mad_memorization: only 'insert' is scored")
            for k, v in zip(inp[0::2], tgt[1::2]):
                expect(cls(voc, k) == "k" and cls(voc, v) == "v", "mad_memorization: key and value tokens")
                expect(facts.setdefault(k, v) == v, f"mad_memorization: key {voc[k]} has two values")
            counts += 1
expect(len(set(facts.values())) == len(facts) > 100, f"mad_memorization: {len(facts)} keys, map not injective")
# an impossible setting: one error line naming the key
r = subprocess.run([MEMLAB, "tasks", "sample", "--task", "mad_selective_copy", "--set", "task.mad.copy=64",
                    "--set", "task.train_len=[128,128]"], capture_output=True, text=True)
expect(r.returncode != 0 and r.stderr.startswith("error:") and "task.train_len" in r.stderr and "130" in r.stderr
       and not r.stdout and len(r.stderr.strip().splitlines()) == 1, f"mad copy too long: {r.returncode} {r.stderr!r}")


# RegBench: strings over a..r joined by '|'; next-letter targets, never a '|'; the accept set after a prefix is
# a function of the prefix (same prefix of the same automaton, same set) that holds every letter ever read next.
def check_regbench(examples, voc, lo, hi):
    after = {}  # prefix -> accept set, over all examples given (all of one automaton)
    for ex in examples:
        inp, tgt, acc = ex["input"], ex["target"], ex["accept"]
        length_ok("regbench", len(inp), lo, hi)
        text = "".join(voc[t] for t in inp)
        expect(set(text) <= set("abcdefghijklmnopqr|") and "||" not in text and text[0] != "|", f"regbench: {text}")
        prefix = ""
        for i, c in enumerate(text):
            prefix = "" if c == "|" else prefix + c
            nxt = text[i + 1] if i + 1 < len(text) else None
            expect(tgt[i] == (-1 if nxt in (None, "|") else inp[i + 1]), f"regbench: target at {i} of {text}")
            expect(acc[i] & ~(((1 << 18) - 1) << 1) == 0 and 1 <= bin(acc[i]).count("1") <= 3,
                   f"regbench: accept set {acc[i]:#x} at {i}")
            if nxt not in (None, "|"):
                expect((acc[i] >> (voc.index(nxt))) & 1, f"regbench: '{nxt}' read after '{prefix}' outside its accept set")
            expect(after.setdefault(prefix, acc[i]) == acc[i], f"regbench: two accept sets after '{prefix}'")


voc = vocab("regbench")
expect(voc == ["<pad>"] + list("abcdefghijklmnopqr") + ["|"], f"regbench vocab {voc}")
full = ("--set", "task.train_len=[3,1024]", "--set", "task.eval_len=[3,1024]")
for split in ("train", "val", "test"):
    for ex in sample("regbench", split, 60, extra=full):
        check_regbench([ex], voc, 19, 949)  # 10..19 strings of 1..49 letters
        counts += 1
# val cycles through its 250 held-out automata: examples i and i + 250 share theirs
for i in range(0, 40, 7):
    pair = [sample("regbench", "val", 1, extra=(*full, "--start", str(start)))[0] for start in (i, i + 250)]
    check_regbench(pair, voc, 19, 949)
    counts += 2
for ex in sample("regbench", "test", 40, extra=("--set", "task.eval_len=[1200,1300]")):
    check_regbench([ex], voc, 1200, 1300)
    counts += 1

# a bad value of a per-task key: one error line naming the key and what is allowed
r = subprocess.run([MEMLAB, "tasks", "sample", "--task", "s3", "--set", "task.s3.target=sometimes"],
                   capture_output=True, text=True)
expect(r.returncode != 0 and r.stderr.startswith("error:") and "task.s3.target" in r.stderr and "every" in r.stderr
       and not r.stdout, f"bad task.s3.target: {r.returncode} {r.stderr!r}")

# regbench keys that cannot go together: one error line naming the key
r = subprocess.run([MEMLAB, "tasks", "sample", "--task", "regbench", "--set", "task.regbench.max_out_degree=4"],
                   capture_output=True, text=True)
expect(r.returncode != 0 and r.stderr.startswith("error:") and "task.regbench.max_out_degree" in r.stderr
       and not r.stdout, f"bad task.regbench.max_out_degree: {r.returncode} {r.stderr!r}")

finish(f"checked {counts} samples independently: all correct", limit=20)
