#include "ops/delta_rule/delta_rule.h"

#include <fmt/format.h>

#include <array>

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"
#include "ops/norm/norm.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/delta_rule/chunk.h"
#include "ops/delta_rule/fused_recurrent.h"
#endif

namespace memlab {

bool delta_rule_kernel_applies(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form,
                               std::string* why) {
  if (auto r = kernels_unavailable(q, form.kernels); !r.empty()) return refuse(why, r);
  if (q.size(-1) > 128) return refuse(why, fmt::format("head dim {} > 128", q.size(-1)));
  if (v.scalar_type() == torch::kDouble) return refuse(why, "fp64 inputs");
  return true;
}

namespace {

// model.kernels=cuda promises the kernel: say why it cannot run rather than fall back silently.
void reference_or_error(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form) {
  std::string why;
  if (form.kernels == Kernels::Cuda && !delta_rule_kernel_applies(q, v, form, &why))
    throw UserError("model.kernels=cuda: no delta-rule kernel for this call: " + why);
}

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtype the kernel reads q, k, v in: bf16 when all three arrive in bf16, else fp32. The norm of
// form.qk_l2norm is taken in fp32 (in the kernel, or by the norm op writing fp32) and unit q and k stay fp32:
// rounding unit vectors to bf16 costs ~20% in the gradient that flows back through the L2 norm (the radial part
// cancels), measured against the fp32 form.
torch::ScalarType kernel_dtype(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const bool bf16 = q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
                    v.scalar_type() == torch::kBFloat16;
  return bf16 ? torch::kBFloat16 : torch::kFloat;
}

kernels::DeltaRuleProblem problem_of(const torch::Tensor& q, const torch::Tensor& v, double scale, bool l2 = false) {
  kernels::DeltaRuleProblem p;
  p.B = static_cast<int>(q.size(0));
  p.T = static_cast<int>(q.size(1));
  p.H = static_cast<int>(q.size(2));
  p.dk = static_cast<int>(q.size(3));
  p.dv = static_cast<int>(v.size(3));
  p.scale = static_cast<float>(scale);
  p.bf16 = v.scalar_type() == torch::kBFloat16;
  p.qk_l2norm = l2;
  p.l2_eps = static_cast<float>(kL2NormEps);
  return p;
}

// Sequences of few heads run the chunkwise tensor-core kernel (head dims up to 64): its serial chain per head is
// T/32 chunks, not T steps. With many heads the recurrent kernel is faster, its per-step work being far smaller
// (H200, ungated fwd+bwd ms, chunkwise / recurrent: B1024 T256 H4 D32 5.66 / 2.65; B64 T780 H2 D50 1.83 / 3.54;
// B8 T2048 H8 D64 3.70 / 9.62). The one-token step is always recurrent.
constexpr int64_t kChunkwiseMaxHeads = 512;
bool uses_chunk_kernel(const kernels::DeltaRuleProblem& p) {
  return !p.linear && kernels::delta_rule_chunk_applies(p) && int64_t{p.B} * p.H < kChunkwiseMaxHeads;
}

// Whether the kernel takes form.qk_l2norm's norm itself: the recurrent kernel can, in the backward only with one
// column group (fused_recurrent.h). Then bf16 q, k, v go to the kernel as they come, unit q and k stay fp32 in
// shared memory, and the norm op and the fp32 copies of v, o, do and dv are gone.
bool kernel_normalises(const torch::Tensor& q, const torch::Tensor& v, bool backward) {
  const auto p = problem_of(q, v, 1.0);
  if (uses_chunk_kernel(p)) return false;
  return !backward || kernels::delta_rule_column_groups(p.dv) == 1;
}

// Training past the chunkwise kernel's head dims: the recurrent kernel keeps a column of each head's dk x dv state
// per thread, which at dk 128 outgrows the registers; its fwd+bwd took 1.5-2.7x the tensor-op chunked form's time
// at each of six shapes, plain and gated (H200, bf16, kernels_h200.md, "Head dims past 64"). Forward alone it won at
// some of them, so evaluation keeps it. model.kernels=cuda still trains on the kernel.
constexpr int64_t kRecurrentTrainsMaxDim = 64;
bool chunked_trains_faster(const torch::Tensor& q, const DeltaRuleForm& form, bool grad) {
  return grad && form.kernels == Kernels::Auto && q.size(-1) > kRecurrentTrainsMaxDim;
}

std::string launch_forward(const kernels::DeltaRuleProblem& p, const kernels::DeltaRuleForwardArgs& a, bool chunkwise,
                           void* stream) {
  return chunkwise ? kernels::delta_rule_chunk_forward(p, a, stream) : kernels::delta_rule_forward(p, a, stream);
}

// The inputs as the kernels read them: q, k, v contiguous in kernel_dtype, the rest contiguous fp32.
struct KernelInputs {
  torch::Tensor q, k, v, beta, g, h0;
  // The caller computes in bf16 (q, k or v arrived in bf16; unit q and k stay fp32 beside bf16 v): the chunkwise
  // kernel's products then take one TF32 pass, whose rounding is still finer than bf16's, where fp32 callers get
  // three.
  bool tf32 = false;
  KernelInputs(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
               const torch::Tensor& beta_in, const torch::Tensor& g_in, const torch::Tensor& h0_in) {
    for (const auto* x : {&q_in, &k_in, &v_in}) tf32 = tf32 || x->scalar_type() == torch::kBFloat16;
    const auto dt = kernel_dtype(q_in, k_in, v_in);
    q = q_in.to(dt).contiguous();
    k = k_in.to(dt).contiguous();
    v = v_in.to(dt).contiguous();
    beta = f32(beta_in);
    g = f32(g_in);
    h0 = f32(h0_in);
  }
  kernels::DeltaRuleProblem problem(double scale, bool l2, bool linear = false) const {
    auto p = problem_of(q, v, scale, l2);
    p.tf32 = tf32;
    p.linear = linear;
    return p;
  }
  // Forward-kernel arguments writing o and hT (u and the chunk states left null).
  kernels::DeltaRuleForwardArgs forward_args(torch::Tensor& o, torch::Tensor& hT) const {
    kernels::DeltaRuleForwardArgs a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.beta = beta.data_ptr<float>();
    a.g = ptr(g);
    a.h0 = ptr(h0);
    a.o = o.defined() ? o.data_ptr() : nullptr;
    a.hT = hT.data_ptr<float>();
    return a;
  }
};

// Autograd takes no undefined tensors as inputs: optional ones go in as std::optional.
std::optional<torch::Tensor> optional_of(const torch::Tensor& t) {
  return t.defined() ? std::optional<torch::Tensor>(t) : std::nullopt;
}

// A gradient the kernels write per column group, [groups, ...], summed over the groups, in the input's dtype.
torch::Tensor fold_groups(const torch::Tensor& t, int groups, int64_t dtype) {
  return (groups > 1 ? t.sum(0) : t.squeeze(0)).to(static_cast<torch::ScalarType>(dtype));
}

class DeltaRuleFunction : public torch::autograd::Function<DeltaRuleFunction> {
 public:
  // Returns {o, final state}. g and h0 are optional (autograd takes no undefined tensors as inputs).
  // l2: q and k are raw and the kernel normalises them. linear: the linear-attention rule (no retrieval term).
  static variable_list forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor beta, std::optional<torch::Tensor> g_opt,
                               std::optional<torch::Tensor> h0_opt, double scale, bool l2, bool linear) {
    const torch::Tensor g = g_opt.value_or(torch::Tensor()), h0 = h0_opt.value_or(torch::Tensor());
    c10::cuda::CUDAGuard guard(q.device());
    const KernelInputs in(q, k, v, beta, g, h0);
    const auto p = in.problem(scale, l2, linear);
    const auto fp32 = in.q.options().dtype(torch::kFloat);
    const bool chunkwise = uses_chunk_kernel(p);
    auto o = torch::empty(in.v.sizes(), in.v.options());
    // The recurrent kernel's backward steps back from stored β(v − k·S) and a state every kDeltaRuleChunk
    // steps; the chunkwise one recomputes each chunk from the state stored before it.
    auto u = chunkwise ? torch::Tensor() : torch::empty(in.v.sizes(), fp32);
    const int chunks = chunkwise ? kernels::delta_rule_chunk_count(p.T) : kernels::delta_rule_chunks(p.T);
    auto anchors = torch::empty({p.B, p.H, chunks, p.dk, p.dv}, fp32);
    auto hT = torch::empty({p.B, p.H, p.dk, p.dv}, fp32);
    auto a = in.forward_args(o, hT);
    a.u = chunkwise ? nullptr : u.data_ptr<float>();
    a.anchors = anchors.data_ptr<float>();
    check_launch(launch_forward(p, a, chunkwise, stream_of(in.q)));
    ctx->set_materialize_grads(false);  // an absent final-state gradient stays null for the kernel: no zeros
    ctx->save_for_backward({in.q, in.k, in.v, in.beta, in.g, u, anchors, hT});
    ctx->saved_data["chunkwise"] = chunkwise;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["l2"] = l2;
    ctx->saved_data["linear"] = linear;
    ctx->saved_data["tf32"] = p.tf32;
    ctx->saved_data["has_h0"] = h0.defined();
    ctx->saved_data["dtypes"] = std::vector<int64_t>{static_cast<int64_t>(q.scalar_type()),
                                                     static_cast<int64_t>(k.scalar_type()),
                                                     static_cast<int64_t>(v.scalar_type()),
                                                     static_cast<int64_t>(beta.scalar_type()),
                                                     static_cast<int64_t>(g.defined() ? g.scalar_type() : torch::kFloat),
                                                     static_cast<int64_t>(h0.defined() ? h0.scalar_type() : torch::kFloat)};
    return {o.to(v.scalar_type()), hT};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &qc = saved[0], &kc = saved[1], &vc = saved[2], &bc = saved[3], &gc = saved[4], &u = saved[5],
         &anchors = saved[6], &hT = saved[7];
    c10::cuda::CUDAGuard guard(qc.device());
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool has_h0 = ctx->saved_data["has_h0"].toBool();
    const auto dtypes = ctx->saved_data["dtypes"].toIntVector();
    auto d_o = grads[0].defined() ? grads[0].to(vc.scalar_type()).contiguous() : torch::zeros_like(vc);
    auto dhT = f32(grads[1]);
    auto p = problem_of(qc, vc, scale, ctx->saved_data["l2"].toBool());
    p.tf32 = ctx->saved_data["tf32"].toBool();
    p.linear = ctx->saved_data["linear"].toBool();
    const bool chunkwise = ctx->saved_data["chunkwise"].toBool();
    const int groups = chunkwise ? kernels::delta_rule_chunk_column_groups(p) : kernels::delta_rule_column_groups(p.dv);
    const auto fp32 = qc.options().dtype(torch::kFloat);
    // With the norm in the kernel (one column group) it writes dq, dk and dv in the inputs' type.
    const auto grad_options = p.qk_l2norm ? qc.options() : fp32;
    auto dq = torch::empty({groups, p.B, p.T, p.H, p.dk}, grad_options);
    auto dk = torch::empty({groups, p.B, p.T, p.H, p.dk}, grad_options);
    auto db = torch::empty({groups, p.B, p.T, p.H}, fp32);
    auto dg = gc.defined() ? torch::empty({groups, p.B, p.T, p.H}, fp32) : torch::Tensor();
    auto dv = torch::empty({p.B, p.T, p.H, p.dv}, grad_options);
    auto dh0 = has_h0 ? torch::empty({p.B, p.H, p.dk, p.dv}, fp32) : torch::Tensor();
    kernels::DeltaRuleBackwardArgs a;
    a.q = qc.data_ptr();
    a.k = kc.data_ptr();
    a.v = vc.data_ptr();
    a.d_o = d_o.data_ptr();
    a.beta = bc.data_ptr<float>();
    a.g = ptr(gc);
    a.u = mut(u);
    a.anchors = anchors.data_ptr<float>();
    a.hT = hT.data_ptr<float>();
    a.dhT = ptr(dhT);
    a.dq = dq.data_ptr();
    a.dk = dk.data_ptr();
    a.dbeta = db.data_ptr<float>();
    a.dg = mut(dg);
    a.dv = dv.data_ptr();
    a.dh0 = mut(dh0);
    check_launch(chunkwise ? kernels::delta_rule_chunk_backward(p, a, stream_of(qc))
                           : kernels::delta_rule_backward(p, a, stream_of(qc)));
    return {fold_groups(dq, groups, dtypes[0]),
            fold_groups(dk, groups, dtypes[1]),
            dv.to(static_cast<torch::ScalarType>(dtypes[2])),
            fold_groups(db, groups, dtypes[3]),
            dg.defined() ? fold_groups(dg, groups, dtypes[4]) : torch::Tensor(),
            dh0.defined() ? dh0.to(static_cast<torch::ScalarType>(dtypes[5])) : torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

// The rule's states before each chunk of kDeltaRuleChunk steps, [B, H, chunks, dk, dv], and its final state, on the
// recurrent kernel with no outputs: what Delayed-Chunk's read needs (delta_rule_delayed_read_states). The states'
// gradient joins the kernel's backward walk where each is reached. l2: k is raw and the kernel normalises it.
// The forward kernel with no outputs: {states, hT}, and u where a backward follows. `in` holds k in q's place too:
// the tiles load q (and normalise it with l2), but nothing reads it.
std::array<torch::Tensor, 3> states_forward(const KernelInputs& in, bool l2, bool with_u) {
  c10::cuda::CUDAGuard guard(in.k.device());
  const auto p = in.problem(1.0, l2);
  const auto fp32 = in.k.options().dtype(torch::kFloat);
  auto u = with_u ? torch::empty(in.v.sizes(), fp32) : torch::Tensor();
  auto states = torch::empty({p.B, p.H, kernels::delta_rule_chunks(p.T), p.dk, p.dv}, fp32);
  auto hT = torch::empty({p.B, p.H, p.dk, p.dv}, fp32);
  torch::Tensor no_outputs;
  auto a = in.forward_args(no_outputs, hT);
  a.u = mut(u);
  a.anchors = states.data_ptr<float>();
  check_launch(kernels::delta_rule_forward(p, a, stream_of(in.k)));
  return {states, hT, u};
}

class DeltaRuleStatesFunction : public torch::autograd::Function<DeltaRuleStatesFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor k, torch::Tensor v, torch::Tensor beta,
                               std::optional<torch::Tensor> h0_opt, bool l2) {
    const torch::Tensor h0 = h0_opt.value_or(torch::Tensor());
    const KernelInputs in(k, k, v, beta, {}, h0);
    auto [states, hT, u] = states_forward(in, l2, /*with_u=*/true);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({in.k, in.v, in.beta, u, states, hT});
    ctx->saved_data["l2"] = l2;
    ctx->saved_data["has_h0"] = h0.defined();
    ctx->saved_data["dtypes"] = std::vector<int64_t>{static_cast<int64_t>(k.scalar_type()),
                                                     static_cast<int64_t>(v.scalar_type()),
                                                     static_cast<int64_t>(beta.scalar_type()),
                                                     static_cast<int64_t>(h0.defined() ? h0.scalar_type() : torch::kFloat)};
    return {states, hT};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &kc = saved[0], &vc = saved[1], &bc = saved[2], &u = saved[3], &states = saved[4], &hT = saved[5];
    c10::cuda::CUDAGuard guard(kc.device());
    const auto dtypes = ctx->saved_data["dtypes"].toIntVector();
    auto d_states = f32(grads[0]), dhT = f32(grads[1]);
    const auto p = problem_of(kc, vc, 1.0, ctx->saved_data["l2"].toBool());
    const int groups = kernels::delta_rule_column_groups(p.dv);
    const auto fp32 = kc.options().dtype(torch::kFloat);
    const auto grad_options = p.qk_l2norm ? kc.options() : fp32;
    auto dk = torch::empty({groups, p.B, p.T, p.H, p.dk}, grad_options);
    auto db = torch::empty({groups, p.B, p.T, p.H}, fp32);
    auto dv = torch::empty({p.B, p.T, p.H, p.dv}, grad_options);
    auto dh0 = ctx->saved_data["has_h0"].toBool() ? torch::empty({p.B, p.H, p.dk, p.dv}, fp32) : torch::Tensor();
    kernels::DeltaRuleBackwardArgs a;
    a.q = kc.data_ptr();  // loaded into the tiles, unused with d_o null: any valid pointer
    a.k = kc.data_ptr();
    a.v = vc.data_ptr();
    a.beta = bc.data_ptr<float>();
    a.u = u.data_ptr<float>();
    a.anchors = states.data_ptr<float>();
    a.hT = hT.data_ptr<float>();
    a.dhT = ptr(dhT);
    a.d_anchors = ptr(d_states);
    a.dk = dk.data_ptr();
    a.dbeta = db.data_ptr<float>();
    a.dv = dv.data_ptr();
    a.dh0 = mut(dh0);
    check_launch(kernels::delta_rule_backward(p, a, stream_of(kc)));
    return {fold_groups(dk, groups, dtypes[0]), dv.to(static_cast<torch::ScalarType>(dtypes[1])),
            fold_groups(db, groups, dtypes[2]),
            dh0.defined() ? dh0.to(static_cast<torch::ScalarType>(dtypes[3])) : torch::Tensor(), torch::Tensor()};
  }
};

// Inference: the forward kernel alone, without storing what a backward needs (u, the chunk states).
DeltaRuleOut forward_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& beta, const torch::Tensor& g, const torch::Tensor& h0, double scale,
                            bool l2, bool linear = false) {
  c10::cuda::CUDAGuard guard(q.device());
  const KernelInputs in(q, k, v, beta, g, h0);
  const auto p = in.problem(scale, l2, linear);
  auto o = torch::empty(in.v.sizes(), in.v.options());
  auto hT = torch::empty({p.B, p.H, p.dk, p.dv}, in.q.options().dtype(torch::kFloat));
  check_launch(launch_forward(p, in.forward_args(o, hT), uses_chunk_kernel(p), stream_of(in.q)));
  return {o.to(v.scalar_type()), hT};
}

torch::Tensor step_kernel(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                          const torch::Tensor& beta_t, const DeltaRuleForm& form, torch::Tensor& state,
                          const torch::Tensor& g_t) {
  c10::cuda::CUDAGuard guard(q_t.device());
  if (state.scalar_type() != torch::kFloat || !state.is_contiguous()) state = state.to(torch::kFloat).contiguous();
  // [B, H, d] is [B, 1, H, d] in the sequence layout; the state is updated in place (each thread reads its
  // column before writing it).
  const KernelInputs in(q_t.unsqueeze(1), k_t.unsqueeze(1), v_t.unsqueeze(1), beta_t, g_t, state);
  auto o = torch::empty(in.v.sizes(), in.v.options());
  auto a = in.forward_args(o, state);
  check_launch(kernels::delta_rule_forward(problem_of(in.q, in.v, form.scale, form.qk_l2norm), a, stream_of(in.q)));
  return o.squeeze(1).to(v_t.scalar_type());
}
#endif

// q or k as the rule reads it: normalised by the norm op, in the compute type, where form.qk_l2norm asks for the
// norm and the kernel does not take it.
torch::Tensor unit(const torch::Tensor& x, const DeltaRuleForm& form, bool in_kernel = false) {
  return form.qk_l2norm && !in_kernel ? l2_normalize(x, compute_type(x), form.kernels) : x;
}

}  // namespace

DeltaRuleForm layer_rule_form(double scale, int64_t chunk, Kernels kernels) {
  DeltaRuleForm form;
  form.scale = scale;
  form.chunk = chunk;
  form.kernels = kernels;
  form.qk_l2norm = true;
  return form;
}

namespace {

// [B, T, H, d] read and update halves of each chunk of C tokens, one after the other: [B, 2T, H, d].
torch::Tensor interleave(const torch::Tensor& read, const torch::Tensor& update, int64_t C) {
  const int64_t T = read.size(1), full = T / C * C;
  std::vector<torch::Tensor> parts;
  if (full > 0) {
    auto chunks = [&](const torch::Tensor& x) { return x.narrow(1, 0, full).unflatten(1, {full / C, C}); };
    parts.push_back(torch::stack({chunks(read), chunks(update)}, 2).flatten(1, 3));
  }
  if (T > full) {  // the last, shorter chunk
    parts.push_back(read.narrow(1, full, T - full));
    parts.push_back(update.narrow(1, full, T - full));
  }
  return torch::cat(parts, 1);
}

// The read halves' rows of interleave's layout: [B, 2T, H, d] -> [B, T, H, d].
torch::Tensor reads_of(const torch::Tensor& x, int64_t T, int64_t C) {
  const int64_t full = T / C * C;
  std::vector<torch::Tensor> parts;
  if (full > 0) parts.push_back(x.narrow(1, 0, 2 * full).unflatten(1, {full / C, 2, C}).select(2, 0).flatten(1, 2));
  if (T > full) parts.push_back(x.narrow(1, 2 * full, T - full));
  return torch::cat(parts, 1);
}

}  // namespace

DeltaRuleOut delta_rule_delayed_read_interleaved(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& beta,
                                                 const DeltaRuleForm& form, const torch::Tensor& g,
                                                 const torch::Tensor& initial_state) {
  const int64_t T = q.size(1), C = form.chunk;
  DeltaRuleForm inner = form;
  inner.with_intra = true;
  auto qr = q, kn = k;
  if (g.defined()) {
    // The reads see exp(G_t) q_t with G the cumulative log-decay since the chunk's start: the unit q is scaled,
    // so the norm runs here.
    qr = unit(q, form);
    kn = unit(k, form);
    inner.qk_l2norm = false;
    const int64_t n = (T + C - 1) / C;
    auto G = torch::constant_pad_nd(g.to(compute_type(g)), {0, 0, 0, n * C - T}).unflatten(1, {n, C}).cumsum(2);
    qr = qr * G.flatten(1, 2).narrow(1, 0, T).exp().unsqueeze(-1);
  }
  auto zero = [](const torch::Tensor& x) { return torch::zeros_like(x); };
  auto r = delta_rule(interleave(qr, zero(qr), C), interleave(zero(kn), kn, C), interleave(zero(v), v, C),
                      interleave(zero(beta), beta, C), inner, g.defined() ? interleave(zero(g), g, C) : g,
                      initial_state);
  return {reads_of(r.o, T, C), r.state};
}

torch::Tensor delta_rule_read_states(const torch::Tensor& q, const torch::Tensor& states, int64_t C, double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), N = states.size(2), dv = states.size(4);
  if (N != (T + C - 1) / C) throw std::invalid_argument("delta_rule_read_states: states do not match T and C");
  const auto ct = states.scalar_type();
  // [B, T, H, dk] -> chunks [B, H, N, C, dk] (zero rows past T), times each chunk's state [B, H, N, dk, dv].
  auto qc = torch::constant_pad_nd(q.to(ct), {0, 0, 0, 0, 0, N * C - T}).view({B, N, C, H, dk}).permute({0, 3, 1, 2, 4});
  auto o = torch::matmul(qc, states) * scale;  // [B, H, N, C, dv]
  return o.permute({0, 2, 3, 1, 4}).reshape({B, N * C, H, dv}).narrow(1, 0, T);
}

bool delayed_read_by_states_applies(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form,
                                    const torch::Tensor& g) {
#ifdef MEMLAB_CUDA_KERNELS
  if (g.defined() || form.chunk != kernels::kDeltaRuleChunk || !delta_rule_kernel_applies(q, v, form)) return false;
  return !uses_chunk_kernel(problem_of(q, v, form.scale));
#else
  (void)q, (void)v, (void)form, (void)g;
  return false;
#endif
}

DeltaRuleOut delta_rule_delayed_read_states(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const torch::Tensor& beta, const DeltaRuleForm& form,
                                            const torch::Tensor& initial_state) {
  if (!delayed_read_by_states_applies(q, v, form, {}))
    throw std::invalid_argument("delta_rule_delayed_read_states: the recurrent kernel does not apply");
#ifdef MEMLAB_CUDA_KERNELS
  AutocastOff no_autocast;
  const bool grad = recorded({q, k, v, beta, initial_state});
  const bool l2 = form.qk_l2norm && (!grad || kernels::delta_rule_column_groups(static_cast<int>(v.size(3))) == 1);
  const auto kn = unit(k, form, l2);
  torch::Tensor states, hT;
  if (grad) {
    auto r = DeltaRuleStatesFunction::apply(kn, v, beta, optional_of(initial_state), l2);
    states = r[0];
    hT = r[1];
  } else {
    auto r = states_forward(KernelInputs(kn, kn, v, beta, {}, initial_state), l2, /*with_u=*/false);
    states = r[0];
    hT = r[1];
  }
  return {delta_rule_read_states(unit(q, form), states, form.chunk, form.scale).to(v.scalar_type()), hT};
#else
  (void)k, (void)beta, (void)initial_state;
  return {};
#endif
}

DeltaRuleOut delta_rule(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& beta, const DeltaRuleForm& form, const torch::Tensor& g,
                        const torch::Tensor& initial_state) {
  MEMLAB_PROFILED_OP("memlab::delta_rule");
#ifdef MEMLAB_CUDA_KERNELS
  const bool grad = recorded({q, k, v, beta, g, initial_state});
  if (delta_rule_kernel_applies(q, v, form) && !chunked_trains_faster(q, form, grad)) {
    if (!form.with_intra) {
      // With many heads the recurrent kernel walks T steps once and the reads are one product with its states;
      // else (few heads, gates, other chunks) the full rule runs on twice the tokens.
      if (delayed_read_by_states_applies(q, v, form, g))
        return delta_rule_delayed_read_states(q, k, v, beta, form, initial_state);
      return delta_rule_delayed_read_interleaved(q, k, v, beta, form, g, initial_state);
    }
    AutocastOff no_autocast;
    const bool l2 = form.qk_l2norm && kernel_normalises(q, v, grad);
    const auto qn = unit(q, form, l2), kn = unit(k, form, l2);
    if (!grad) return forward_kernel(qn, kn, v, beta, g, initial_state, form.scale, l2);
    auto r =
        DeltaRuleFunction::apply(qn, kn, v, beta, optional_of(g), optional_of(initial_state), form.scale, l2, false);
    return {r[0], r[1]};
  }
#endif
  reference_or_error(q, v, form);
  return delta_rule_chunked(unit(q, form), unit(k, form), v, beta, form.chunk, form.scale, initial_state,
                            form.with_intra, g);
}

torch::Tensor delta_rule_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                              const torch::Tensor& beta_t, torch::Tensor& state, const DeltaRuleForm& form,
                              const torch::Tensor& g_t) {
  MEMLAB_PROFILED_OP("memlab::delta_rule_step");
  // The step kernel has no backward: a step that autograd records runs the tensor-op form.
  const bool grad = recorded({q_t, k_t, v_t, beta_t, state, g_t});
#ifdef MEMLAB_CUDA_KERNELS
  if (!grad && delta_rule_kernel_applies(q_t, v_t, form)) return step_kernel(q_t, k_t, v_t, beta_t, form, state, g_t);
#endif
  if (!grad) reference_or_error(q_t, v_t, form);
  return delta_rule_step_reference(unit(q_t, form), unit(k_t, form), v_t, beta_t, form.scale, state, g_t);
}

bool linear_rule_kernel_applies(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form,
                                std::string* why) {
  if (!delta_rule_kernel_applies(q, v, form, why)) return false;
  // With few heads the walk over T steps leaves the GPU idle where the chunked form's products do not.
  if (form.kernels != Kernels::Cuda && q.size(0) * q.size(2) < kLinearRuleMinHeads)
    return refuse(why, fmt::format("{} heads, fewer than {}", q.size(0) * q.size(2), kLinearRuleMinHeads));
  return true;
}

DeltaRuleOut linear_rule(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const DeltaRuleForm& form, const torch::Tensor& initial_state) {
  MEMLAB_PROFILED_OP("memlab::linear_rule");
  std::string why;
  if (!linear_rule_kernel_applies(q, v, form, &why))
    throw UserError("linear rule: no kernel for this call (" + why + "); use linear_attention_chunked");
#ifdef MEMLAB_CUDA_KERNELS
  AutocastOff no_autocast;
  auto beta = torch::ones({q.size(0), q.size(1), q.size(2)}, q.options().dtype(torch::kFloat));
  if (!recorded({q, k, v, initial_state}))
    return forward_kernel(q, k, v, beta, {}, initial_state, form.scale, false, true);
  auto r = DeltaRuleFunction::apply(q, k, v, beta, std::nullopt, optional_of(initial_state), form.scale, false, true);
  return {r[0], r[1]};
#else
  return {};  // unreachable: linear_rule_kernel_applies refuses without kernels
#endif
}

}  // namespace memlab
