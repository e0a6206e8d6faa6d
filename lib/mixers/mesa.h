#pragma once
// Mesa layer / MesaNet (von Oswald et al. 2025, specs/mesanet.md §1). Per head, with forget gate γ_t = exp(g_t) and
// input gate β_t:
//   H_t = γ_t H_{t-1} + β_t k_t k_t^T   [dk, dk]        G_t = γ_t G_{t-1} + β_t k_t v_t^T   [dk, dv]
//   o_t = G_t^T (H_t + diag(λ))^{-1} q_t                 (the solve by a fixed number of conjugate-gradient steps)
// Layer (fla's fla/layers/mesa_net.py): q, k = L2(SiLU(conv(W x))), v = W_v x (no conv, no activation),
// β = sigmoid(W_b x + b_b), g = logsigmoid(W_a x + b_a), λ = softplus(λ') + lambda_min per key dim and head
// (λ' initialised so that λ = lambda_init), per-head RMSNorm (optionally SiLU-gated), output projection.
//
// Forms: forward = chunkwise parallel CG (all tokens at once; the CG mat-vec (H_t + Λ) p is a GLA-style chunked read,
// H_t is never materialised per token), with a custom backward (implicit differentiation: a second CG solve with the
// same system, never autograd through the CG iterations); step = one token of the recurrence with the same CG on the
// materialised H_t (mesa_step; mesa_recurrent loops it over time); forward_reference = the recurrence with an exact
// solve (mesa_exact), i.e. the layer's definition: forward == reference holds once the CG has converged
// (cg_steps >= head dim, as in the registry's default 30 for heads of <= 30 dims), step == forward always.
#include "mixers/mixer.h"
#include "mixers/ops.h"

namespace memlab {

// Initial guess x_0 of the CG iteration: 0 (fla's chunk kernel since e57585f1), q (the paper's "0 steps = GLA"
// reading) or Jacobi q / (diag(H_t) + λ) (fla's decoding kernel and naive_mesa_net_decoding_one_step).
enum class MesaCGInit { Zero, Query, Jacobi };

struct MesaCG {
  int64_t steps = 30;
  // Added to both CG denominators (p·Ap + eps, δ_old + eps), as in fla, where it is 1e-5. It caps the attainable
  // relative residual near sqrt(eps): once |r|^2 < eps the iteration turns into slow steepest descent, so fla's 1e-5
  // leaves relative solve errors of about 5e-4 (1.6e-3 with λ = 0.25) however many steps run. memlab's default only
  // guards 0/0 (converged rows, zero padding) and lets the CG converge to the working precision.
  // With normalize_rhs the right-hand side is scaled to unit norm first (the solution scaled back), so eps is
  // relative to |b|^2 and the backward solve, whose right-hand side G_t do_t scales with the loss gradient, is not
  // stalled by an absolute eps (fla's backward solve uses the same absolute 1e-5 on dq: for small loss gradients,
  // |G do|^2 << 1e-5, its CG barely moves from its initial guess 0).
  double eps = 1e-20;
  MesaCGInit init = MesaCGInit::Jacobi;
  bool normalize_rhs = true;  // false: fla's convention (absolute eps) for any |q|
};

struct MesaOut {
  torch::Tensor o;     // [B, T, H, dv]
  torch::Tensor h_kk;  // [B, H, dk, dk] after the last token (H_T)
  torch::Tensor h_kv;  // [B, H, dk, dv] after the last token (G_T, fla's K x V layout)
};

// Layout as fla: q, k [B, T, H, dk]; v [B, T, H, dv]; g (log forget gate, <= 0) and beta [B, T, H]; lambda [H, dk];
// optional initial states h_kk [B, H, dk, dk] (symmetric, as every H_t; the CG assumes it), h_kv [B, H, dk, dv]. q and k arrive L2-normalised (fla's
// use_qk_l2norm_in_kernel=False). Computes in fp32 (fp64 for fp64 inputs); o comes back in v's dtype, states fp32/64.
//
// mesa_chunked corresponds to fla's naive_mesa_net_CG(q, k, v, g, lamb, beta, chunk_size, max_CG_iteration,
// h_kk_init, h_kv_init) and chunk_mesa_net (note fla's argument order: lamb before beta): same recurrences, same CG
// update formulas with eps in both denominators. To reproduce fla's naive CG: cg.init = Zero, cg.eps = 1e-5,
// cg.normalize_rhs = false (a test runs that setting). Differences by default: (1) the initial guess (fla's naive CG and chunk kernel use x_0 = 0, pass cg.init = Zero to match;
// memlab's default is Jacobi, as fla's decoding step); (2) normalize_rhs (on by default) solves for q/|q| and scales
// back, identical to fla when |q| = 1 as in the layer, and makes the backward solve's eps relative; (3) any T (fla's
// naive needs T % chunk == 0; here the tail is zero-padded, which leaves states and outputs unchanged); (4) gradients
// by implicit differentiation: dq = (H_t + Λ)^{-1} G_t do_t by CG, dλ = -Σ dq ⊙ q*, and k, v, β, g through the
// GLA-form adjoints of §1.8 — also with respect to the initial and final states; (5) cg.eps 1e-20 (fla: 1e-5).
// Where `kernels` allows it (CUDA, head dims and chunk up to 64, and a GPU that gives a block the adjoint kernel's
// shared memory: 188 KB at 64 and 64, more than an A100's 163) the whole op runs in kernels: both CG solves in
// ops/mesa/cg.cu, the boundary states, reads and adjoints in ops/mesa/chunk.cu. They read q, k, v (fp32 or bf16) and
// the output's gradient where they lie and write o (in v's dtype) and the gradients there; their own intermediates
// and the statistics are fp32 in memory. Their products are fp32-accurate (3xTF32) for fp32 q, k, v; when any of them
// is bf16 (training under autocast) they multiply on fp16 operands scaled into range (TF32's 11-bit significand; the
// chunk kernels stay in TF32 for chunks under 33 or head dims under 17).
MesaOut mesa_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& g,
                     const torch::Tensor& beta, const torch::Tensor& lambda, const MesaCG& cg, int64_t chunk,
                     const torch::Tensor& h_kk_init = {}, const torch::Tensor& h_kv_init = {},
                     Kernels kernels = Kernels::Auto);

// Per-token recurrence with CG on the materialised H_t + Λ (the same CG as mesa_chunked; differentiable by autograd
// through the unrolled iterations). Matches fla's naive_mesa_net_decoding_one_step applied token by token when
// cg.init = Jacobi and normalize_rhs = false. Tests only.
MesaOut mesa_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& g,
                       const torch::Tensor& beta, const torch::Tensor& lambda, const MesaCG& cg,
                       const torch::Tensor& h_kk_init = {}, const torch::Tensor& h_kv_init = {});

// Per-token recurrence with an exact solve (torch::linalg_solve): fla's naive_mesa_net_exact. Tests only (the
// layer's forward_reference).
MesaOut mesa_exact(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& g,
                   const torch::Tensor& beta, const torch::Tensor& lambda, const torch::Tensor& h_kk_init = {},
                   const torch::Tensor& h_kv_init = {});

// One token: q_t, k_t [B, H, dk], v_t [B, H, dv], g_t, beta_t [B, H]; updates h_kk [B, H, dk, dk] and
// h_kv [B, H, dk, dv] (fp32/64) and returns o_t [B, H, dv] in v's dtype.
torch::Tensor mesa_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                        const torch::Tensor& g_t, const torch::Tensor& beta_t, const torch::Tensor& lambda,
                        const MesaCG& cg, torch::Tensor& h_kk, torch::Tensor& h_kv);

struct MesaOptions {
  MesaCG cg;
  double lambda_min{}, lambda_init{};
  int64_t chunk{};
  bool short_conv{};
  int64_t conv_size{};
  bool out_gate{};
  Kernels kernels{};  // the forms of the CG solves, the short convs and the norms
};

// model.mesa.* keys, the Mesa options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_mesa_keys(Schema& s);
MesaOptions mesa_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_mesa(const Config& cfg, const MixerShape& shape);

class MesaImpl : public MixerImpl {
 public:
  MesaImpl(const MixerShape& shape, const MesaOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: H [B, H, d, d], G [B, H, d, d] (fp32/64), then the q and k conv tails when short_conv.
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }
  torch::Tensor lambda() const;  // [H, d], >= lambda_min

 private:
  struct Inputs {
    torch::Tensor q, k, v, g, beta, lambda;  // [B, T, H, d] (q, k normalised); g, beta [B, T, H]; lambda [H, d]
  };
  Inputs project(const torch::Tensor& x);
  torch::Tensor finish(const torch::Tensor& o, const torch::Tensor& x);  // norm, gate, o_proj

  MixerShape shape_;
  MesaOptions opts_;
  int64_t head_dim_;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, a_proj{nullptr}, b_proj{nullptr},
      g_proj{nullptr}, o_proj{nullptr};
  ShortConv q_conv{nullptr}, k_conv{nullptr};
  torch::Tensor lambda_params;  // [H * d], λ = softplus(.) + lambda_min; exempt from weight decay as in fla
  torch::Tensor o_norm;         // [d], or [members d] packed
};

}  // namespace memlab
