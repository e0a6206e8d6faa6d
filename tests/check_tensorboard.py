#!/usr/bin/env python3
"""TensorBoard event files of memlab train and memlab rl, read back two ways:
  check_tensorboard.py MEMLAB            an independent reader here (TFRecord framing with its masked CRC-32C,
                                         the Event and Summary protobufs), against train.csv, eval.csv, curve.csv;
  check_tensorboard.py MEMLAB --package  TensorBoard's own EventAccumulator; exit 77 (skipped) with the reason
                                         where the tensorboard package cannot be imported."""
import csv
import glob
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import expect, finish  # noqa: E402

MEMLAB = sys.argv[1]
PACKAGE = "--package" in sys.argv[2:]
if PACKAGE:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except Exception as e:  # noqa: BLE001 - any import failure means: skip, and say why
        print(f"skipped: the tensorboard package cannot be imported here ({type(e).__name__}: {e}); "
              "`python3 -m pip install tensorboard` enables this check")
        sys.exit(77)

tmp = tempfile.mkdtemp(prefix="memlab-tb-")
TINY = ["--task", "s3", "--device", "cpu", "--batch-size", "16", "--set", "model.hidden=16", "--set", "model.heads=2",
        "--set", "model.layers=1", "--set", "model.mlp_inner=32", "--set", "eval.n=32", "--set", "task.eval_len=[40,60]",
        "--set", "train.log_every=5", "--set", "eval.every=10"]
RL = ["--device", "cpu", "--distractor", "4", "--set", "model.hidden=16", "--set", "model.layers=1", "--set",
      "model.heads=1", "--set", "model.mlp_inner=16", "--set", "rl.head_hidden=16", "--set", "rl.warmup_episodes=2",
      "--set", "rl.envs=2", "--set", "rl.batch_episodes=4", "--set", "rl.updates_per_step=0.05", "--set",
      "rl.eval_every=2", "--set", "rl.eval_episodes=3", "--no-plot"]


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    """Protobuf wire format: (field number, wire type, value) triples."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield num, wire, v


def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def read_events(path):
    """Every record of one event file: (wall_time, step, {tag: value}, file_version, session_log_status)."""
    out = []
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        expect(struct.unpack("<I", data[i + 8:i + 12])[0] == masked(head), f"{path}: bad length CRC at {i}")
        body = data[i + 12:i + 12 + n]
        expect(struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked(body), f"{path}: bad data CRC at {i}")
        i += 16 + n
        wall, step, scalars, version, status = 0.0, 0, {}, None, None
        for num, wire, v in fields(body):
            if num == 1:
                (wall,) = struct.unpack("<d", v)
            elif num == 2:
                step = v
            elif num == 3:
                version = v.decode()
            elif num == 5:
                for vn, _, value in fields(v):
                    if vn == 1:
                        tag, simple = None, None
                        for fn, _, fv in fields(value):
                            if fn == 1:
                                tag = fv.decode()
                            elif fn == 2:
                                (simple,) = struct.unpack("<f", fv)
                        scalars[tag] = simple
            elif num == 6:
                status = dict((fn, fv) for fn, _, fv in fields(v)).get(1)
        out.append((wall, step, scalars, version, status))
    return out


def scalars(run_dir):
    """tag -> {step: value} over the run's event files in order; a START session log drops later steps."""
    series = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for _, step, sc, version, status in read_events(path):
            if version is not None:
                expect(version == "brain.Event:2", f"{path}: file_version {version}")
            if status == 1:
                for s in series.values():
                    for k in [k for k in s if k >= step]:
                        del s[k]
            for tag, value in sc.items():
                series.setdefault(tag, {})[step] = value
    return series


def package_scalars(run_dir):
    ea = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


read = package_scalars if PACKAGE else scalars
close = lambda a, b: abs(a - b) <= 1e-5 * max(1.0, abs(b))  # noqa: E731 - float32 in the events

# memlab train, then resumed to more steps
run = os.path.join(tmp, "train")
r = subprocess.run([MEMLAB, "train", *TINY, "--steps", "20", "--out", run], capture_output=True, text=True)
expect(r.returncode == 0, f"train: {r.stderr[-300:]}")
r = subprocess.run([MEMLAB, "train", "--resume", run, "--steps", "30"], capture_output=True, text=True)
expect(r.returncode == 0, f"resume: {r.stderr[-300:]}")
expect(len(glob.glob(os.path.join(run, "events.out.tfevents.*"))) == 2, "one event file per process")
got = read(run)
for name, column in [("train/loss", "loss"), ("train/accuracy", "accuracy"), ("train/lr", "lr"),
                     ("train/grad_norm", "grad_norm"), ("train/ms_per_step", "ms_per_step")]:
    want = {int(x["step"]): float(x[column]) for x in rows(os.path.join(run, "train.csv"))}
    have = got.get(name, {})
    tol = 1e-3 if column == "ms_per_step" else 1e-5  # train.csv keeps 4 digits of it
    expect(sorted(have) == sorted(want) and all(abs(have[s] - want[s]) <= tol * max(1.0, abs(want[s])) for s in want),
           f"{name}: events {have} vs train.csv {want}")
for x in rows(os.path.join(run, "eval.csv")):
    rng, step = f"{x['length_min']}-{x['length_max']}", int(x["step"])
    for tag, column in [("eval/accuracy/", "accuracy"), ("eval/normalized_accuracy/", "normalized_accuracy"),
                        ("eval/accuracy_all/", "accuracy_all")]:
        have = got.get(tag + rng, {}).get(step)
        expect(have is not None and close(have, float(x[column])), f"{tag}{rng} at {step}: {have} vs {x[column]}")

# a run killed after its checkpoint at step 10 and resumed: the points after 10 of the first file are dropped
run = os.path.join(tmp, "train_kill")
r = subprocess.run([MEMLAB, "train", *TINY, "--steps", "20", "--set", "train.checkpoint_every=10", "--out", run],
                   capture_output=True, text=True)
os.remove(os.path.join(run, "checkpoint.pt"))  # as if killed before the last checkpoint: resume from step 10
subprocess.run([MEMLAB, "train", *TINY, "--steps", "10", "--out", os.path.join(tmp, "ten")], capture_output=True)
os.replace(os.path.join(tmp, "ten", "checkpoint.pt"), os.path.join(run, "checkpoint.pt"))
r = subprocess.run([MEMLAB, "train", "--resume", run, "--steps", "20"], capture_output=True, text=True)
expect(r.returncode == 0, f"resume from step 10: {r.stderr[-300:]}")
loss = read(run).get("train/loss", {})
want = {int(x["step"]): float(x["loss"]) for x in rows(os.path.join(run, "train.csv"))}
expect(sorted(loss) == [5, 10, 15, 20] and all(close(loss[s], want[s]) for s in want),
       f"after resuming from step 10 the events hold {loss}, train.csv {want}")

# memlab rl
run = os.path.join(tmp, "rl")
r = subprocess.run([MEMLAB, "rl", "visual-match", "--model", "deltanet", "--episodes", "4", "--out", run, *RL],
                   capture_output=True, text=True)
expect(r.returncode == 0, f"rl: {r.stderr[-300:]}")
got = read(run)
curve = rows(os.path.join(run, "curve.csv"))
for tag, column in [("eval/return", "return"), ("eval/success", "success")]:
    want = {int(x["env_steps"]): float(x[column]) for x in curve}
    have = got.get(tag, {})
    expect(sorted(have) == sorted(want) and all(close(have[s], want[s]) for s in want), f"{tag}: {have} vs {want}")
stats = rows(os.path.join(run, "train.csv"))
for tag, column in [("sac/critic_loss", "critic_loss"), ("sac/entropy", "entropy")]:
    want = {int(x["env_steps"]): float(x[column]) for x in stats}
    have = got.get(tag, {})
    expect(sorted(have) == sorted(want) and all(close(have[s], want[s]) for s in want), f"{tag}: {have} vs {want}")

# off when asked
run = os.path.join(tmp, "off")
subprocess.run([MEMLAB, "train", *TINY, "--steps", "5", "--set", "train.tensorboard=false", "--out", run],
               capture_output=True)
expect(not glob.glob(os.path.join(run, "events.out.tfevents.*")), "train.tensorboard=false wrote event files")

finish(f"TensorBoard event files read back {'by tensorboard' if PACKAGE else 'independently'} ({tmp})")
