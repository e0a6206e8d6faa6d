"""External check: memlab's recurrences against flash-linear-attention's naive reference functions.

fla (pip flash-linear-attention) is code nobody here wrote. This script draws fixed inputs, runs fla's
fla/ops/*/naive.py functions on them, writes inputs and fla's outputs to a fixture file, and runs the
gtest FlaNaive.* of memlab_tests on it, which feeds the same inputs to memlab's chunked forms.

Exit 77 (ctest: skipped) with the reason when fla cannot be imported.
usage: check_fla_naive.py MEMLAB_TESTS_BINARY
"""
import os
import struct
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.linear_attn.naive import naive_recurrent_linear_attn
    from fla.ops.mesa_net.naive import naive_mesa_net_CG, naive_mesa_net_exact
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla
except Exception as e:  # ImportError, or fla failing on import in this environment
    print(f"SKIP: flash-linear-attention's naive functions cannot be imported here: {type(e).__name__}: {e}")
    sys.exit(77)

F = torch.nn.functional


def write_fixture(path, tensors):
    # name ndim dims... \n, then float32 little-endian values; read by tests/test_mixers.cpp.
    with open(path, "wb") as f:
        for name, t in tensors.items():
            t = t.detach().float().contiguous()
            f.write((" ".join([name, str(t.dim())] + [str(s) for s in t.shape]) + "\n").encode())
            f.write(struct.pack(f"<{t.numel()}f", *t.flatten().tolist()))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(0)
    B, T, H, d = 2, 37, 3, 8  # T not a multiple of any chunk size used on the memlab side
    fx = {}
    # Delta rule (fla layout here is [B, H, T, d]; scale d^-1/2 is built in). Keys and queries L2-normalised.
    q, k = F.normalize(torch.randn(B, T, H, d), dim=-1), F.normalize(torch.randn(B, T, H, d), dim=-1)
    v, beta = torch.randn(B, T, H, d), torch.rand(B, T, H) * 2.0
    o, _ = delta_rule_recurrence(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2))
    fx.update(dr_q=q, dr_k=k, dr_v=v, dr_beta=beta, dr_o=o.transpose(1, 2))
    # Gated delta rule, [B, T, H, d], log decays g <= 0 (some strong).
    g = -torch.rand(B, T, H) * 3.0
    o = naive_recurrent_gated_delta_rule(q, k, v, beta, g)[0]
    fx.update(gdr_g=g, gdr_o=o)
    # Mamba-2 SSD = simple GLA with q = C, k = B, v = x * dt, g = dt * A, scale 1 (one group shared by heads).
    P, N = 4, 6
    x, dt = torch.randn(B, T, H, P), F.softplus(torch.randn(B, T, H) - 1.0)
    A = -torch.rand(H) * 4.0 - 0.5
    Bm, Cm = torch.randn(B, T, 1, N), torch.randn(B, T, 1, N)
    o, _ = naive_recurrent_simple_gla(Cm.expand(B, T, H, N), Bm.expand(B, T, H, N), x * dt[..., None],
                                      dt * A, scale=1.0)
    fx.update(ssd_x=x, ssd_dt=dt, ssd_A=A, ssd_B=Bm, ssd_C=Cm, ssd_y=o)
    # Linear attention with ELU+1 features and Katharopoulos' normaliser (default scale d^-1/2).
    fq, fk = F.elu(torch.randn(B, T, H, d)) + 1.0, F.elu(torch.randn(B, T, H, d)) + 1.0
    o, _ = naive_recurrent_linear_attn(fq, fk, v, normalize=True)
    fx.update(la_q=fq, la_k=fk, la_o=o)
    # Mesa: exact solve (any T), and fla's chunked CG (T a multiple of its chunk 16; zero start, eps 1e-5).
    gm, bm = F.logsigmoid(torch.randn(B, T, H) + 2.0), torch.sigmoid(torch.randn(B, T, H))
    lamb = F.softplus(torch.randn(H, d)) + 0.25
    o, _, _ = naive_mesa_net_exact(q, k, v, gm, lamb, bm)
    fx.update(mesa_g=gm, mesa_beta=bm, mesa_lambda=lamb, mesa_exact_o=o)
    Tc = 32
    o, _, _ = naive_mesa_net_CG(q[:, :Tc], k[:, :Tc], v[:, :Tc], gm[:, :Tc], lamb, bm[:, :Tc], chunk_size=16,
                                max_CG_iteration=30)
    fx.update(mesa_cg_o=o)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fla_naive.bin")
        write_fixture(path, fx)
        env = dict(os.environ, MEMLAB_FLA_FIXTURE=path, OMP_NUM_THREADS="2")
        r = subprocess.run([sys.argv[1], "--gtest_filter=FlaNaive.*"], env=env, capture_output=True, text=True)
        print(r.stdout[-4000:] + r.stderr[-2000:])
        if r.returncode != 0 or "[  PASSED  ] 1 test" not in r.stdout:
            print("memlab disagrees with fla's naive functions (see above)")
            sys.exit(1)
    print("memlab's delta rule, gated delta rule, Mamba-2 SSD, linear attention and Mesa agree with fla's naive.py")


if __name__ == "__main__":
    main()
