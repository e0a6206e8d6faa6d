#!/usr/bin/env python3
"""Times FLA's delta-rule kernels on the shapes `memlab bench mixer` uses, so both can be run on one GPU.

FLA (fla-core) and einops need only be importable. On a machine without package access, stage them here:
    python3 -m pip install --no-deps --target .fla fla-core==0.6.0 einops
then carry .fla to the GPU machine and run
    PYTHONPATH=.fla python3 scripts/bench_fla.py --batch 1024 --len 256 --heads 4 --dim 32
Prints forward and forward+backward of chunk_delta_rule (or chunk_gated_delta_rule with --gated) and the
one-token fused_recurrent step: medians of CUDA-event timings after warm-up, bf16 inputs as in training.
"""
import argparse
import statistics
import sys


def median_ms(fn, reps):
    import torch
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32, help="head dim (keys and values)")
    ap.add_argument("--gated", action="store_true", help="the gated delta rule")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        if a.gated:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as chunk
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as recurrent
        else:
            from fla.ops.delta_rule import chunk_delta_rule as chunk
            from fla.ops.delta_rule import fused_recurrent_delta_rule as recurrent
    except Exception as e:  # FLA needs triton and a GPU; say why it cannot run and stop
        print(f"error: FLA does not import here: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: FLA's kernels need a CUDA GPU", file=sys.stderr)
        return 2
    B, T, H, D = a.batch, a.len, a.heads, a.dim
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    q = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(dt).requires_grad_()
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(dt).requires_grad_()
    v = torch.randn(B, T, H, D, device=dev).to(dt).requires_grad_()
    beta = (torch.rand(B, T, H, device=dev) * 2).to(dt).requires_grad_()
    g = (-torch.rand(B, T, H, device=dev) * 0.3).requires_grad_() if a.gated else None
    do = torch.randn(B, T, H, D, device=dev).to(dt)
    scale = D ** -0.5

    def run(q, k, v, beta, g, fn, **kw):
        if g is None:
            return fn(q, k, v, beta, scale=scale, **kw)
        return fn(q, k, v, g, beta, scale=scale, **kw)

    def fwd():
        with torch.no_grad():
            run(q, k, v, beta, g, chunk)

    def fwd_bwd():
        o, _ = run(q, k, v, beta, g, chunk)
        o.backward(do)

    S = torch.zeros(B, H, D, D, device=dev)
    q1, k1, v1, b1 = (x[:, :1].detach().contiguous() for x in (q, k, v, beta))
    g1 = g[:, :1].detach().contiguous() if g is not None else None

    def step():
        with torch.no_grad():
            run(q1, k1, v1, b1, g1, recurrent, initial_state=S, output_final_state=True)

    name = "gated delta rule" if a.gated else "delta rule"
    print(f"FLA {getattr(sys.modules.get('fla'), '__version__', '?')}: {name}, B{B} T{T} H{H} d{D}, bf16, "
          f"{torch.cuda.get_device_name()}, median of {a.reps} after warm-up")
    print("\n| what | forward ms | forward+backward ms |\n|---|---:|---:|")
    def timed(fn, digits):  # FLA refuses some cases (e.g. gated backward on Hopper with Triton < 3.7.1, #640)
        try:
            return f"{median_ms(fn, a.reps):.{digits}f}"
        except Exception as e:
            return "fails: " + str(e).splitlines()[0][:120]

    print(f"| {name} (chunk) | {timed(fwd, 3)} | {timed(fwd_bwd, 3)} |")
    print(f"| {name} step (fused_recurrent, T=1) | {timed(step, 4)} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
