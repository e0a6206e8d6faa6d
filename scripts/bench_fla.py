#!/usr/bin/env python3
"""Times FLA's delta-rule and Mesa kernels on the shapes `memlab bench mixer` uses, so both can be run on one GPU.

FLA (fla-core) and einops need only be importable. On a machine without package access, stage them here:
    python3 -m pip install --no-deps --target .fla fla-core==0.6.0 einops
then carry .fla to the GPU machine and run
    PYTHONPATH=.fla python3 scripts/bench_fla.py --batch 1024 --len 256 --heads 4 --dim 32
Prints forward and forward+backward of chunk_delta_rule (or chunk_gated_delta_rule with --gated) and the
one-token fused_recurrent step: medians of CUDA-event timings after warm-up, bf16 inputs as in training. With
--mesa: chunk_mesa_net (--cg-steps CG iterations) on unit q, k, fp32 gates and lambda, as memlab's Mesa op; with --top N
also its N longest kernels of forward+backward (torch.profiler), beside `memlab bench mixer --top`. FLA's eager time is
often its host's (Python and Triton launches): compare the kernels' sums too.
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


def print_top(fn, n, reps=5):
    """The n longest kernels of fn (CUDA time per call, via torch.profiler), as `memlab bench mixer --top` lists them."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t, c = per.get(e.name, (0.0, 0))
            per[e.name] = (t + e.device_time / 1000.0, c + 1)
    total = sum(t for t, _ in per.values()) / reps
    print(f"\nkernels per call: {total:.3f} ms in all\n\n| kernel | ms per call | launches per call |\n|---|---:|---:|")
    for name, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"| {name[:90]} | {t / reps:.3f} | {c // reps} |")


def fla_ops(module, names):
    """FLA's ops `names` from fla.ops.<module>, or None after saying on stderr why they cannot run here."""
    try:
        import importlib
        import torch
        mod = importlib.import_module("fla.ops." + module)
        ops = [getattr(mod, n) for n in names]
    except Exception as e:  # FLA needs triton and a GPU; say why it cannot run and stop
        print(f"error: FLA does not import here: {e}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("error: FLA's kernels need a CUDA GPU", file=sys.stderr)
        return None
    return ops


def drop_grads(*leaves):
    """Each backward stores the inputs' gradients rather than adding them to the last one's (as memlab's bench)."""
    for t in leaves:
        if t is not None:
            t.grad = None


def unit_qkv(a):
    """Seeded bf16 q, k (unit rows), v [B, T, H, D] needing grads, and an output gradient, on the GPU."""
    import torch
    import torch.nn.functional as F
    B, T, H, D = a.batch, a.len, a.heads, a.dim
    torch.manual_seed(0)
    q = F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).to(torch.bfloat16).requires_grad_()
    k = F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).to(torch.bfloat16).requires_grad_()
    v = torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16).requires_grad_()
    do = torch.randn(B, T, H, D, device="cuda").to(torch.bfloat16)
    return q, k, v, do


def bench_mesa(a):
    ops = fla_ops("mesa_net", ["chunk_mesa_net"])
    if ops is None:
        return 2
    chunk_mesa_net, = ops
    import torch
    import torch.nn.functional as F
    B, T, H, D = a.batch, a.len, a.heads, a.dim
    dev = "cuda"
    q, k, v, do = unit_qkv(a)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev) + 2.0).requires_grad_()
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).requires_grad_()
    lamb = (F.softplus(torch.randn(H, D, device=dev)) + 0.25).requires_grad_()

    def run():
        return chunk_mesa_net(q, k, v, g, beta, lamb, max_CG_iteration=a.cg_steps)

    def fwd():
        with torch.no_grad():
            run()

    def fwd_bwd():
        drop_grads(q, k, v, g, beta, lamb)
        o = run()
        o = o[0] if isinstance(o, tuple) else o
        o.backward(do)

    print(f"FLA {getattr(sys.modules.get('fla'), '__version__', '?')}: chunk_mesa_net, {a.cg_steps} CG steps, "
          f"B{B} T{T} H{H} d{D}, bf16 q k v, {torch.cuda.get_device_name()}, median of {a.reps} after warm-up")
    print("\n| what | forward ms | forward+backward ms |\n|---|---:|---:|")
    print(f"| Mesa (chunk_mesa_net) | {median_ms(fwd, a.reps):.3f} | {median_ms(fwd_bwd, a.reps):.3f} |")
    if a.top:
        print_top(fwd_bwd, a.top)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32, help="head dim (keys and values)")
    ap.add_argument("--gated", action="store_true", help="the gated delta rule")
    ap.add_argument("--mesa", action="store_true", help="chunk_mesa_net instead of the delta rule")
    ap.add_argument("--cg-steps", type=int, default=30, help="CG iterations of chunk_mesa_net (--mesa)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--top", type=int, default=0, help="list the N longest kernels of forward+backward (--mesa)")
    a = ap.parse_args()
    if a.mesa:
        return bench_mesa(a)
    if a.gated:
        ops = fla_ops("gated_delta_rule", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
    else:
        ops = fla_ops("delta_rule", ["chunk_delta_rule", "fused_recurrent_delta_rule"])
    if ops is None:
        return 2
    chunk, recurrent = ops
    import torch
    B, T, H, D = a.batch, a.len, a.heads, a.dim
    dev, dt = "cuda", torch.bfloat16
    q, k, v, do = unit_qkv(a)
    beta = (torch.rand(B, T, H, device=dev) * 2).to(dt).requires_grad_()
    g = (-torch.rand(B, T, H, device=dev) * 0.3).requires_grad_() if a.gated else None
    scale = D ** -0.5

    def run(q, k, v, beta, g, fn, **kw):
        if g is None:
            return fn(q, k, v, beta, scale=scale, **kw)
        return fn(q, k, v, g, beta, scale=scale, **kw)

    def fwd():
        with torch.no_grad():
            run(q, k, v, beta, g, chunk)

    def fwd_bwd():
        drop_grads(q, k, v, beta, g)
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
