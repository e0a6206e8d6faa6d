#!/usr/bin/env python3
"""Every kind of bad input: exit code 2, exactly one clear line on stderr, nothing written."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import error_problems, failures, finish  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-cli-")


def write(name, text):
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def check(name, args, must_contain, code=2):
    out_dir = os.path.join(tmp, "out_" + name)
    full = [MEMLAB] + args
    if args[0] == "train" and "--out" not in args:
        full += ["--out", out_dir]
    r = subprocess.run(full, capture_output=True, text=True, timeout=120)
    problems = error_problems(r, must_contain, code)
    for bad in ("terminate called", "Traceback", "Aborted", "Exception raised from", "frame #"):
        if bad in r.stderr:
            problems.append(f"stack trace/abort text {bad!r}")
    if os.path.exists(out_dir):
        problems.append("output directory was created")
    if problems:
        failures.append(f"{name}: {'; '.join(problems)}\n      stderr: {r.stderr.strip()[:400]}")
    else:
        print(f"ok  {name}: {r.stderr.strip()}")


bad_key = write("bad_key.yaml", "task:\n  name: parity\nmodel:\n  hidden: 64\n  hiden: 3\n")
bad_type = write("bad_type.yaml", "train:\n  steps: many\n")
bad_range = write("bad_range.yaml", "train:\n  lr: -0.5\n")
malformed = write("malformed.yaml", "model:\n  hidden: [64,\n  heads: 2\n")
not_map = write("not_map.yaml", "- 1\n- 2\n")
good = write("good.yaml", "train:\n  steps: 2\n")

check("unknown_key_yaml", ["train", "--config", bad_key], ["bad_key.yaml:5:3", "unknown key 'model.hiden'", "hidden"])
check("unknown_key_set", ["train", "--set", "model.hiden=3"], ["unknown key 'model.hiden'", "allowed under 'model'"])
check("unknown_section_set", ["train", "--set", "modle.hidden=3"], ["unknown key 'modle.hidden'"])
check("wrong_type_yaml", ["train", "--config", bad_type], ["bad_type.yaml:2:10", "train.steps must be an integer"])
check("wrong_type_set", ["train", "--set", "model.hidden=1.5"], ["model.hidden must be an integer"])
check("wrong_type_flag", ["train", "--steps", "ten"], ["--steps", "train.steps must be an integer"])
check("wrong_bool", ["train", "--set", "model.mlp=perhaps"], ["model.mlp must be true or false"])
check("out_of_range_yaml", ["train", "--config", bad_range], ["bad_range.yaml:2:7", "out of range", "between 0 and 10"])
check("out_of_range_set", ["train", "--set", "model.layers=0"], ["model.layers", "out of range"])
check("bad_length_range", ["train", "--set", "task.train_len=[40,3]"], ["task.train_len", "max must be >= min"])
check("malformed_yaml", ["train", "--config", malformed], ["malformed.yaml:", "malformed YAML"])
check("top_level_not_map", ["train", "--config", not_map], ["not_map.yaml", "mapping"])
check("unknown_task", ["train", "--task", "nosuch"], ["task.name = 'nosuch' is not known", "allowed: anbn, anbncn, cycle_nav, mad_compression, mad_fuzzy_recall, mad_memorization, mad_noisy_recall, mad_recall, mad_selective_copy, majority, mod_arith, mod_arith_brackets, parity, regbench, s3, s5, sum_mod5)"])
check("bad_task_key", ["train", "--task", "majority", "--set", "task.majority.symbols=1"],
      ["task.majority.symbols", "out of range"])
check("bad_target_mode", ["train", "--task", "s5", "--set", "task.s5.target=all"], ["task.s5.target", "last, every"])
check("unknown_model", ["train", "--model", "nosuch"], ["model.name = 'nosuch' is not known", "transformer"])
check("unknown_task_sample", ["tasks", "sample", "--task", "nosuch"], ["'nosuch' is not known"])
check("unknown_task_vocab", ["tasks", "vocab", "--task", "nosuch"], ["'nosuch' is not known"])
check("bad_split", ["tasks", "sample", "--task", "parity", "--split", "dev"], ["--split"])
check("missing_config", ["train", "--config", os.path.join(tmp, "nope.yaml")], ["cannot read config file", "nope.yaml"])
check("heads_not_dividing", ["train", "--set", "model.hidden=30", "--set", "model.heads=4"],
      ["model.heads", "must divide model.hidden = 30"])
check("bf16_on_cpu", ["train", "--device", "cpu", "--set", "train.precision=bf16"], ["train.precision", "CUDA"])
check("kernels_cuda_on_cpu", ["train", "--device", "cpu", "--set", "model.kernels=cuda"], ["model.kernels", "cuda"])
check("kernels_unknown", ["train", "--set", "model.kernels=triton"], ["model.kernels", "triton"])
check("length_buckets_autoencoder", ["train", "--task", "mad_compression", "--set", "model.head=autoencoder", "--set",
      "train.length_buckets=2"], ["train.length_buckets", "needs model.head lm", "autoencoder"])
check("bench_mixer_bad_model", ["bench", "mixer", "--model", "nope"], ["model.name", "nope"])
check("bench_step_bad_key", ["bench", "step", "--config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
      "configs", "hqlt", "parity_deltanet_neg.yaml"), "--set", "model.nope=1"], ["model.nope"])
blocker = write("a_file", "x")
check("unwritable_out", ["train", "--config", good, "--out", os.path.join(blocker, "run")], ["output directory", "a_file"])
check("unwritable_out_proc", ["train", "--config", good, "--out", "/proc/memlab-run"], ["/proc/memlab-run"])
nonempty = os.path.join(tmp, "nonempty")
os.makedirs(nonempty)
write("nonempty/x", "keep")
check("nonempty_out", ["train", "--config", good, "--out", nonempty], ["not empty", "--resume"])
if sorted(os.listdir(nonempty)) != ["x"]:
    failures.append("nonempty_out: the existing directory was modified")
check("resume_without_run", ["train", "--resume", os.path.join(tmp, "nothing")], ["cannot resume", "config.yaml"])
check("unknown_flag", ["train", "--stepz", "3"], ["--stepz"])
check("no_subcommand", ["frobnicate"], ["frobnicate"])
check("missing_value", ["train", "--set"], ["--set"])

for args in (["--help"], ["train", "--help"], ["tasks", "sample", "--help"], ["tasks", "vocab", "--help"]):
    r = subprocess.run([MEMLAB] + args, capture_output=True, text=True)
    if r.returncode != 0 or "Usage" not in r.stdout + r.stderr:
        failures.append(f"{' '.join(args)}: exit {r.returncode}")
    else:
        print(f"ok  memlab {' '.join(args)}")

finish("all error cases give one line and exit code 2")
