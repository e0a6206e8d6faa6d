#!/usr/bin/env python3
"""memlab env visual-match and memlab bench env: frames decode to the right pictures, the oracle wins,
bad input gives one error line. Usage: check_env.py MEMLAB"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklib import error_problems, expect, failures, finish  # noqa: E402

MEMLAB = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="memlab-env-")
PLAYER, BG, WALL = (228, 148, 109), (204, 204, 204), (25, 25, 25)
COLOURS = {(255, 0, 0), (0, 255, 0), (0, 0, 255)}


def run(args, code=0):
    r = subprocess.run([MEMLAB] + args, capture_output=True, text=True, timeout=120)
    expect(r.returncode == code, f"{args}: exit {r.returncode}, wanted {code}; stderr {r.stderr[:300]}")
    return r


def read_png(path):
    """Decode an 8-bit RGB PNG (any filter) into rows of (r, g, b) tuples."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        crc = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind}"
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert (depth, ctype) == (8, 2), path
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * 3, [], bytearray(w * 3)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - 3] if x >= 3 else 0
            b = prev[x]
            c = prev[x - 3] if x >= 3 else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, 3)])
        prev = line
    return w, h, rows


# Frames of a short oracle episode.
out = os.path.join(tmp, "frames")
r = run(["env", "visual-match", "--seed", "3", "--steps", "20", "--distractor", "10", "--policy", "oracle",
         "--render", out, "--scale", "4"])
summary = json.loads(r.stdout.strip().splitlines()[-1])
expect(summary["steps"] == 20 and summary["done"] is False and summary["phase"] == "distractor", f"summary {summary}")
names = sorted(os.listdir(out))
expect(names == sorted([f"grid_{k:05d}.png" for k in range(21)] + [f"view_{k:05d}.png" for k in range(21)]),
       f"frame files {names[:5]}... ({len(names)})")
w, h, view = read_png(os.path.join(out, "view_00000.png"))
expect((w, h) == (20, 20), f"view size {w}x{h}")
cells = [[view[4 * r + 2][4 * c + 2] for c in range(5)] for r in range(5)]
expect(cells[2][2] == PLAYER, f"centre of the view {cells[2][2]}")
flat = [c for row in cells for c in row]
expect(sum(c in COLOURS for c in flat) == 1 and flat.count(WALL) == 7, f"explore view {cells}")
expect(all(c == BG for c in cells[4]), f"bottom row of the explore view {cells[4]}")
w, h, grid = read_png(os.path.join(out, "grid_00000.png"))
expect((w, h) == (44, 28), f"grid size {w}x{h}")
expect(grid[2 * 4 + 2][5 * 4 + 2] == PLAYER, "agent at (2,5) on the board")
expect(grid[2 * 4 + 2][3 * 4] == (0, 0, 0), "view window outline on the board")
# Frame 15 is the first distractor frame: agent at (5,5), border walls below it.
_, _, view15 = read_png(os.path.join(out, "view_00015.png"))
expect(view15[3 * 4 + 2][2 * 4 + 2] == WALL and view15[4 * 4 + 2][2 * 4 + 2] == BG,
       "distractor view: wall row, then the pad row below the board")

# A whole oracle episode wins, in both reward-phase variants; the terminal picture shows the agent.
for variant, length in (("paper", None), ("reference", 15 + 750 + 15)):
    r = run(["env", "visual-match", "--seed", "8", "--policy", "oracle", "--reward-phase", variant])
    s = json.loads(r.stdout.strip().splitlines()[-1])
    expect(s["done"] and s["success"] and s["return"] > 100, f"{variant} oracle episode {s}")
    if length:
        expect(s["steps"] == length, f"{variant} length {s['steps']}")
    else:
        expect(15 + 750 < s["steps"] <= 15 + 750 + 7, f"paper length {s['steps']}")
r = run(["env", "visual-match", "--seed", "1", "--steps", "2", "--ascii"])
expect(r.stdout.count("\x1b[48;2;228;148;109m") == 6 and "explore phase step 2" in r.stdout,
       "terminal pictures: agent once in the board and once in the view, 3 frames")
r1 = run(["env", "visual-match", "--seed", "5", "--distractor", "30"])
r2 = run(["env", "visual-match", "--seed", "5", "--distractor", "30"])
expect(r1.stdout == r2.stdout and json.loads(r1.stdout)["steps"] > 45, "same seed, same random episode")

# The benchmark runs (no timing checked).
r = run(["bench", "env", "--seconds", "0.05", "--n-envs", "8", "--distractor", "20"])
expect("env steps/s" in r.stdout, f"bench output {r.stdout!r}")


def bad(name, args, must):
    target = os.path.join(tmp, "bad_" + name)
    full = [a.replace("OUT", target) for a in args]
    r = subprocess.run([MEMLAB] + full, capture_output=True, text=True, timeout=60)
    ok = not error_problems(r, [must])
    expect(ok and not os.path.exists(target), f"{name}: exit {r.returncode}, stderr {r.stderr.strip()[:300]!r}")
    if ok:
        print(f"ok  {name}: {r.stderr.strip()}")


blocker = os.path.join(tmp, "a_file")
open(blocker, "w").close()
bad("policy", ["env", "visual-match", "--policy", "smart", "--render", "OUT"], "--policy")
bad("apples", ["env", "visual-match", "--apples", "23", "--render", "OUT"], "n_apples = 23 is out of range")
bad("variant", ["env", "visual-match", "--reward-phase", "short", "--render", "OUT"], "paper, reference")
bad("colours", ["env", "visual-match", "--colours", "rgb", "--render", "OUT"], "episode, fixed")
bad("distractor", ["env", "visual-match", "--distractor", "-1", "--render", "OUT"], "distractor_len")
bad("scale", ["env", "visual-match", "--scale", "0", "--render", "OUT"], "--scale")
bad("render_dir", ["env", "visual-match", "--render", os.path.join(blocker, "x")], "cannot be created")
bad("no_env", ["env"], "needs a command (visual-match)")
bad("bench_envs", ["bench", "env", "--n-envs", "0"], "--n-envs")

finish("env checks passed")
