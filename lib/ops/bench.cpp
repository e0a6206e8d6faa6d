#include "ops/bench.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>

#include "core/config.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/memory_budget.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/norm/norm.h"
#include "ops/mlstm/mlstm.h"
#include "ops/slstm/slstm.h"
#include "ops/ssd/ssd.h"
#include "mixers/linear_attention.h"
#include "mixers/mesa.h"
#include "ops/kernels.h"
#include "ops/local_attention/local_attention.h"
#include "ops/profile.h"
#include "models/sequence_model.h"
#include "tasks/task.h"
#include "train/optimizer.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace memlab {
namespace {

struct Row {
  std::string what, form;
  double fwd = 0, fwd_bwd = -1;  // -1: not measured (a step has no backward)
  std::map<std::string, KernelTime> profile;  // of the forward and backward, where asked (--top)
  double profile_ms = 0;
  std::string base;  // what the torch / cuda ratios pair rows by: `what` where empty (one op in several forms)
  const std::string& key() const { return base.empty() ? what : base; }
};

// The leaves' gradients dropped before a backward, so that it stores them as a layer's backward hands them on,
// rather than adding them to the last repetition's (full-size adds that an op does not pay in training).
void drop_grads(const std::vector<torch::Tensor>& leaves) {
  for (const auto& t : leaves)
    if (t.defined()) t.mutable_grad().reset();
}

// A sequence op's row: forward alone (no autograd), then forward and backward of go. run() returns the output;
// leaves are its inputs needing gradients. With a.top > 0, the kernel form's forward and backward are also profiled
// by kernel.
template <typename Run>
Row time_sequence(std::string what, Kernels k, Run run, const std::vector<torch::Tensor>& leaves,
                  const torch::Tensor& go, const torch::Device& dev, const MixerBenchArgs& a) {
  Row r{std::move(what), kernels_name(k)};
  r.fwd = median_ms(
      [&] {
        torch::NoGradGuard ng;
        run();
      },
      dev, a.reps);
  auto fwd_bwd = [&] {
    drop_grads(leaves);
    run().backward(go);
  };
  r.fwd_bwd = median_ms(fwd_bwd, dev, a.reps);
  if (a.top > 0 && k == Kernels::Cuda && dev.is_cuda())
    r.profile = profile_kernels(fwd_bwd, kProfiledSteps, &r.profile_ms);
  return r;
}

// The op a mixer's layer calls, where memlab has a kernel for it.
enum class Op { None, DeltaRule, GatedDeltaRule, SLstm, MLstm, XLstm, Ssd, Mesa, LinearAttention };
Op op_of(const std::string& model) {
  if (model == "deltanet" || model == "hqlt") return Op::DeltaRule;
  if (model == "gated_deltanet") return Op::GatedDeltaRule;
  if (model == "slstm") return Op::SLstm;
  if (model == "mlstm") return Op::MLstm;
  if (model == "xlstm") return Op::XLstm;  // both recurrences
  if (model == "mamba2") return Op::Ssd;
  if (model == "mesa") return Op::Mesa;
  if (model == "linear_attention") return Op::LinearAttention;
  return Op::None;
}

std::vector<Row> time_layer(Config& cfg, const MixerBenchArgs& a, const torch::Device& dev, bool bf16, Kernels k) {
  cfg.set_value("model.kernels", kernels_name(k), "memlab bench");
  const int64_t D = a.heads * a.dim;
  MixerShape shape{D, a.heads, cfg.get_float("model.init_std"), cfg.get_float("model.norm_eps")};
  torch::manual_seed(0);
  auto m = make_mixer(a.model, cfg, shape);
  m->to(dev);
  auto opts = torch::dtype(torch::kFloat).device(dev);
  auto x = torch::randn({a.batch, a.len, D}, opts).requires_grad_(true);
  auto gy = torch::randn({a.batch, a.len, D}, opts);
  Row r{"layer", kernels_name(k)};
  r.fwd = median_ms(
      [&] {
        torch::NoGradGuard ng;
        Bf16Autocast ac(bf16);
        m->forward(x);
      },
      dev, a.reps);
  auto leaves = m->parameters();
  leaves.push_back(x);
  r.fwd_bwd = median_ms(
      [&] {
        drop_grads(leaves);
        torch::Tensor y;
        {
          Bf16Autocast ac(bf16);
          y = m->forward(x);
        }
        y.backward(gy.to(y.scalar_type()));
      },
      dev, a.reps);
  return {r};
}

std::vector<Row> time_op(Op op, const MixerBenchArgs& a, const torch::Device& dev, bool bf16, Kernels k) {
  const auto dt = bf16 ? torch::kBFloat16 : torch::kFloat;
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t B = a.batch, T = a.len, H = a.heads, d = a.dim;
  torch::manual_seed(0);
  auto q = l2_normalize_reference(torch::randn({B, T, H, d}, o)).to(dt).requires_grad_(true);
  auto kk = l2_normalize_reference(torch::randn({B, T, H, d}, o)).to(dt).requires_grad_(true);
  auto v = torch::randn({B, T, H, d}, o).to(dt).requires_grad_(true);
  auto beta = (torch::rand({B, T, H}, o) * 2.0).requires_grad_(true);
  torch::Tensor g;
  if (op == Op::GatedDeltaRule) g = (-torch::rand({B, T, H}, o) * 0.3).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o).to(dt);
  DeltaRuleForm form;
  form.kernels = k;
  form.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::string name = op == Op::GatedDeltaRule ? "gated delta rule" : "delta rule";
  auto sequence = [&](const std::string& what, const torch::Tensor& qs, const torch::Tensor& ks,
                      const DeltaRuleForm& f) {
    return time_sequence(what, k, [&] { return delta_rule(qs, ks, v, beta, f, g).o; }, {qs, ks, v, beta, g}, go,
                         dev, a);
  };
  // As the layers call it: q and k raw, normalised by the rule (in the kernel where it can).
  DeltaRuleForm raw = form;
  raw.qk_l2norm = true;
  auto q_raw = torch::randn({B, T, H, d}, o).to(dt).requires_grad_(true);
  auto k_raw = torch::randn({B, T, H, d}, o).to(dt).requires_grad_(true);
  std::vector<Row> rows{sequence(name, q, kk, form), sequence(name + ", q/k L2 norm in the rule", q_raw, k_raw, raw)};
  // One token from a state, as a rollout steps.
  torch::NoGradGuard ng;
  auto S = torch::zeros({B, H, d, d}, o);
  // Contiguous [B, H, d] inputs, as a layer's projections give them.
  auto q1 = q.select(1, 0).contiguous(), k1 = kk.select(1, 0).contiguous(), v1 = v.select(1, 0).contiguous();
  auto b1 = beta.select(1, 0).contiguous();
  auto g1 = g.defined() ? g.select(1, 0).contiguous() : torch::Tensor();
  auto one = [&] { delta_rule_step(q1, k1, v1, b1, S, form, g1); };
  Row step{name + " step", kernels_name(k)};
  step.fwd = median_ms(one, dev, a.reps);
  rows.push_back(step);
  if (dev.is_cuda()) {
    // As a rollout captured in a CUDA graph replays it: the launches' CPU cost is gone.
    constexpr int kSteps = 16;
    // The tensor-op step rebinds S: the graph's first step reads the state it starts from, so that storage must
    // live as long as the graph.
    torch::Tensor captured_state;
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
      for (int i = 0; i < 3; ++i) one();  // warm-up on the capturing stream
      torch::cuda::synchronize();
      captured_state = S;
      graph.capture_begin();
      for (int i = 0; i < kSteps; ++i) one();
      graph.capture_end();
    }
    Row replayed{name + " step, CUDA-graph replay", kernels_name(k)};
    replayed.fwd = median_ms([&] { graph.replay(); }, dev, a.reps) / kSteps;
    rows.push_back(replayed);
  }
  return rows;
}

// Normalised linear attention as the layers call it (linear_attention.h): φ(q), φ(k) in fp32, v in the compute type.
std::vector<Row> time_linear_attention(const MixerBenchArgs& a, const torch::Device& dev, bool bf16, Kernels k) {
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t B = a.batch, T = a.len, H = a.heads, d = a.dim;
  torch::manual_seed(0);
  auto q = elu_plus_one(torch::randn({B, T, H, d}, o)).requires_grad_(true);
  auto kk = elu_plus_one(torch::randn({B, T, H, d}, o)).requires_grad_(true);
  auto v = torch::randn({B, T, H, d}, o).to(bf16 ? torch::kBFloat16 : torch::kFloat).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o).to(v.scalar_type());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  return {time_sequence(
      "linear attention, normalised", k, [&] { return linear_attention(q, kk, v, 64, scale, true, k).o; },
      {q, kk, v}, go, dev, a)};
}

// The sLSTM recurrence on random gate pre-activations (fp32, as the layer computes them), and one token.
std::vector<Row> time_slstm(const MixerBenchArgs& a, const torch::Device& dev, Kernels k) {
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t B = a.batch, T = a.len, H = a.heads, d = a.dim;
  torch::manual_seed(0);
  auto pre = (torch::randn({B, T, H, 4, d}, o) * 2.0).requires_grad_(true);
  auto R = (torch::randn({H, d, 4 * d}, o) / std::sqrt(static_cast<double>(d))).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o);
  Row seq = time_sequence("sLSTM recurrence", k, [&] { return slstm(pre, R, {}, k).h; }, {pre, R}, go, dev, a);
  torch::NoGradGuard ng;
  auto state = slstm_zero_state(B, H, d, o);
  auto pre1 = pre.select(1, 0).contiguous();
  Row step{"sLSTM step", kernels_name(k)};
  step.fwd = median_ms([&] { slstm_step(pre1, R, state, k); }, dev, a.reps);
  return {seq, step};
}

// The mLSTM on random q, k, v (bf16 under --precision bf16, as the layer's projections give them) and fp32 gates.
// Its head dim is the layer's: proj_factor x hidden / heads.
std::vector<Row> time_mlstm(const Config& cfg, const MixerBenchArgs& a, const torch::Device& dev, bool bf16, Kernels k) {
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t B = a.batch, T = a.len, H = a.heads;
  const int64_t d = std::llround(cfg.get_float("model.mlstm.proj_factor") * static_cast<double>(H * a.dim)) / H;
  const auto et = bf16 ? torch::kBFloat16 : torch::kFloat;
  torch::manual_seed(0);
  auto qkv = [&] { return (torch::randn({B, T, H, d}, o) + 0.5).to(et).requires_grad_(true); };
  auto q = qkv(), kk = qkv(), v = qkv();
  auto ig = (torch::randn({B, T, H}, o) * 2.0).requires_grad_(true);
  auto fg = (torch::randn({B, T, H}, o) + 3.0).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o).to(et);
  return {time_sequence(fmt::format("mLSTM chunkwise, head dim {}", d), k,
                        [&] { return mlstm(q, kk, v, ig, fg, 64, {}, k).h; }, {q, kk, v, ig, fg}, go, dev, a)};
}

// The SSD of the Mamba-2 layer --heads x --dim wide: its heads, head dim, state size and groups from model.mamba2.*;
// x, B, C bf16 under --precision bf16, dt in mamba's initial range, A in [-16, -1].
std::vector<Row> time_ssd(const Config& cfg, const MixerBenchArgs& a, const torch::Device& dev, bool bf16, Kernels k) {
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t inner = cfg.get_int("model.mamba2.expand") * a.heads * a.dim, hd = cfg.get_int("model.mamba2.head_dim");
  const int64_t B = a.batch, T = a.len, H = hd > 0 ? inner / hd : a.heads, P = inner / H;
  const int64_t N = cfg.get_int("model.mamba2.d_state"), G = cfg.get_int("model.mamba2.ngroups");
  const bool neg = cfg.get_bool("model.mamba2.neg_eigval");
  const auto et = bf16 ? torch::kBFloat16 : torch::kFloat;
  torch::manual_seed(0);
  auto x = torch::randn({B, T, H, P}, o).to(et).requires_grad_(true);
  auto dt = (torch::rand({B, T, H}, o) * 0.1 + 1e-3).requires_grad_(true);
  auto A = (-(torch::rand({H}, o) * 15.0 + 1.0)).requires_grad_(true);
  auto Bm = torch::randn({B, T, G, N}, o).to(et).requires_grad_(true);
  auto Cm = torch::randn({B, T, G, N}, o).to(et).requires_grad_(true);
  auto go = torch::randn({B, T, H, P}, o).to(et);
  const int64_t chunk = cfg.get_int("model.mamba2.chunk");
  return {time_sequence(fmt::format("SSD chunkwise, head dim {}, state {}", P, N), k,
                        [&] { return ssd(x, dt, A, Bm, Cm, chunk, neg, {}, k).y; }, {x, dt, A, Bm, Cm}, go, dev, a)};
}

// The Mesa op (both CG solves in the kernel form) as the layer hands it its inputs: unit q, k and the gates in fp32,
// v bf16 under --precision bf16 (so the op multiplies as in training); the model.mesa.* CG settings and chunk.
std::vector<Row> time_mesa(const Config& cfg, const MixerBenchArgs& a, const torch::Device& dev, bool bf16,
                           Kernels k) {
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t B = a.batch, T = a.len, H = a.heads, d = a.dim;
  const MesaOptions m = mesa_options(cfg);
  torch::manual_seed(0);
  auto unit = [&] { return l2_normalize_reference(torch::randn({B, T, H, d}, o)).requires_grad_(true); };
  auto q = unit(), kk = unit();
  auto v = torch::randn({B, T, H, d}, o).to(bf16 ? torch::kBFloat16 : torch::kFloat).requires_grad_(true);
  auto g = torch::log_sigmoid(torch::randn({B, T, H}, o) + 2.0).requires_grad_(true);
  auto beta = torch::sigmoid(torch::randn({B, T, H}, o)).requires_grad_(true);
  auto lam = (torch::softplus(torch::randn({H, d}, o)) + 0.25).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o).to(v.scalar_type());
  return {time_sequence(fmt::format("Mesa op, {} CG steps, chunk {}", m.cg.steps, m.chunk), k,
                        [&] { return mesa_chunked(q, kk, v, g, beta, lam, m.cg, m.chunk, {}, {}, k).o; },
                        {q, kk, v, g, beta, lam}, go, dev, a)};
}

// The window kernel's forms as `time_local_attention` times them: bf16 on tensor cores (fp32 on CUDA cores), and
// bf16 kept on CUDA cores.
torch::Tensor window_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                            bool chunked) {
  return local_attention_window(q, k, v, S, chunked, /*tensor_cores=*/true);
}
torch::Tensor window_kernel_on_cuda_cores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          int64_t S, bool chunked) {
  return local_attention_window(q, k, v, S, chunked, /*tensor_cores=*/false);
}

// HQLT's KV-memory read, as its layer calls it (under autocast where bf16): memlab's window kernel and ATen's flash
// form (the cuda rows, each where it applies) beside the blocked form (the torch row).
std::vector<Row> time_local_attention(const Config& cfg, const MixerBenchArgs& a, const torch::Device& dev, bool bf16,
                                      Kernels k) {
  auto o = torch::dtype(torch::kFloat).device(dev);
  const int64_t B = a.batch, T = a.len, H = a.heads, d = a.dim, S = cfg.get_int("model.hqlt.window");
  const bool chunked = cfg.get_string("model.hqlt.variant") == "delayed_chunk";
  torch::manual_seed(0);
  auto q = torch::randn({B, T, H, d}, o).requires_grad_(true), kk = torch::randn({B, T, H, d}, o).requires_grad_(true);
  auto v = torch::randn({B, T, H, d}, o).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o).to(bf16 ? torch::kBFloat16 : torch::kFloat);
  const std::string what = fmt::format("local attention, {} of {}", chunked ? "chunks" : "window", S);
  using Form = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, int64_t, bool);
  auto row = [&](const std::string& name, Form form) {
    Row r = time_sequence(what + name, k,
                          [&] {
                            Bf16Autocast ac(bf16);
                            return form(q, kk, v, S, chunked);
                          },
                          {q, kk, v}, go, dev, a);
    r.base = what;  // each fused form beside the blocked one
    return r;
  };
  if (k == Kernels::Torch) return {row(", blocked", local_attention_blocked)};
  std::string no_window, no_flash;
  bool window = false, flash = false;
  {
    Bf16Autocast ac(bf16);
    window = local_attention_kernel_applies(q, kk, v, S, k, &no_window);
    flash = local_attention_flash_applies(q, kk, v, k, &no_flash);
  }
  std::vector<Row> rows;
  if (window) {
    rows.push_back(row(", window kernel", window_kernel));
    if (bf16) rows.push_back(row(", window kernel on CUDA cores", window_kernel_on_cuda_cores));
  } else {
    std::printf("no window kernel for the local attention: %s\n", no_window.c_str());
  }
  if (flash) rows.push_back(row(", flash", local_attention_flash));
  else std::printf("no flash form for the local attention: %s\n", no_flash.c_str());
  return rows;
}

// Wall-clock ms per call of `reps` calls back to back, as training runs its steps (the host runs ahead of the GPU),
// after a warm-up.
double back_to_back_ms(const std::function<void()>& fn, const torch::Device& dev, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  if (dev.is_cuda()) torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  if (dev.is_cuda()) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// A config's model, optimiser and step, built as `memlab train` builds them, with a few of its batches; with
// members > 1, the packed step of that many runs (seeds train.seed + k), each with its own batches.
struct StepSetup {
  std::vector<std::unique_ptr<Task>> tasks;
  SequenceModel model{nullptr};
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<TrainStep> step;
  std::vector<std::vector<Batch>> batches;  // [8][members]
  std::vector<double> lrs;
  size_t next = 0;
  void run_next() { step->run(batches[next++ % batches.size()], lrs); }
  // As training runs a step: its members' batches made first (member_batches), then the step.
  void run_made() {
    std::vector<const Task*> t;
    for (const auto& task : tasks) t.push_back(task.get());
    const int64_t B = batches[0][0].B;
    step->run(member_batches(t, Split::Train, static_cast<uint64_t>(next++) * B, B, tasks[0]->train_range), lrs);
  }
};

// The step of `cfg` in kernel form k; graph false runs it eagerly whatever the config says.
StepSetup make_step(Config cfg, const torch::Device& dev, Kernels k, bool graph = true, int64_t members = 1) {
  cfg.set_value("model.kernels", kernels_name(k), "memlab bench step");
  if (!graph) cfg.set_value("train.cuda_graph", "false", "memlab bench step --by-op");
  StepSetup s;
  const bool bf16 = bf16_autocast(cfg, "train.precision", dev);
  check_kernels(cfg, dev.is_cuda());
  const int64_t seed = cfg.get_int("train.seed");
  std::vector<SequenceModel> solo;
  for (int64_t m = 0; m < members; ++m) {
    cfg.set_value("train.seed", std::to_string(seed + m), "memlab bench step --members");
    s.tasks.push_back(make_task(cfg));
    torch::manual_seed(static_cast<uint64_t>(seed + m));
    solo.push_back(SequenceModel(cfg, static_cast<int64_t>(s.tasks[0]->vocab().size())));
  }
  if (members == 1) {
    s.model = solo[0];
  } else {
    s.model = SequenceModel(cfg, static_cast<int64_t>(s.tasks[0]->vocab().size()), members);
    pack_members(s.model, solo);
  }
  s.model->to(dev);
  s.model->train();
  auto so = train_step_options(cfg, *s.tasks[0], bf16);
  if (members > 1) {
    s.opt = make_adamw(cfg, s.model, std::vector<double>(members, cfg.get_float("train.weight_decay")));
    so.member_clip.assign(members, cfg.get_float("train.clip"));
  } else {
    s.opt = make_adamw(cfg, s.model);
  }
  s.step = std::make_unique<TrainStep>(s.model, *s.opt, dev, so, 0);
  const int64_t B = cfg.get_int("train.batch_size");
  for (int i = 0; i < 8; ++i) {
    s.batches.emplace_back();
    for (const auto& t : s.tasks)
      s.batches.back().push_back(t->batch(Split::Train, static_cast<uint64_t>(i) * B, B, t->train_range));
  }
  s.lrs.assign(members, cfg.get_float("train.lr"));
  return s;
}

}  // namespace

int bench_mixer(const MixerBenchArgs& a) {
  Config cfg(full_schema());
  if (!a.config.empty()) cfg.merge_file(a.config);
  for (const auto& s : a.sets) cfg.set(s);
  cfg.set_value("model.name", a.model, "--model");
  const auto dev = pick_device(a.device);
  if (a.precision != "bf16" && a.precision != "fp32") throw UserError("--precision must be bf16 or fp32");
  const bool bf16 = a.precision == "bf16" && dev.is_cuda();
  const Op op = op_of(a.model);
  std::vector<Kernels> forms;
  std::string note;
  if (op != Op::None && dev.is_cuda() && kernels_built()) {
    forms.push_back(Kernels::Cuda);
  } else {
    note = op == Op::None          ? fmt::format("{} has no fused kernel yet", a.model)
           : !kernels_built()      ? "this memlab was built without nvcc"
                                   : "no kernels on the CPU";
  }
  forms.push_back(Kernels::Torch);
  std::printf("memlab bench mixer: %s, B%lld T%lld H%lld d%lld, %s, %s, median of %d after warm-up\n",
              a.model.c_str(), static_cast<long long>(a.batch), static_cast<long long>(a.len),
              static_cast<long long>(a.heads), static_cast<long long>(a.dim), bf16 ? "bf16 autocast" : "fp32",
              device_description(dev).c_str(), a.reps);
  if (!note.empty()) std::printf("only the tensor-op form: %s\n", note.c_str());
  std::vector<Row> rows;
  for (Kernels k : forms) {
    for (auto& r : time_layer(cfg, a, dev, bf16, k)) rows.push_back(r);
    if (op == Op::SLstm || op == Op::XLstm)
      for (auto& r : time_slstm(a, dev, k)) rows.push_back(r);
    if (op == Op::MLstm || op == Op::XLstm)
      for (auto& r : time_mlstm(cfg, a, dev, bf16, k)) rows.push_back(r);
    if (op == Op::DeltaRule || op == Op::GatedDeltaRule)
      for (auto& r : time_op(op, a, dev, bf16, k)) rows.push_back(r);
    if (a.model == "hqlt")
      for (auto& r : time_local_attention(cfg, a, dev, bf16, k)) rows.push_back(r);
    if (op == Op::Ssd)
      for (auto& r : time_ssd(cfg, a, dev, bf16, k)) rows.push_back(r);
    if (op == Op::Mesa)
      for (auto& r : time_mesa(cfg, a, dev, bf16, k)) rows.push_back(r);
    if (op == Op::LinearAttention)
      for (auto& r : time_linear_attention(a, dev, bf16, k)) rows.push_back(r);
  }
  std::printf("\n| what | form | forward ms | forward+backward ms |\n|---|---|---:|---:|\n");
  for (const auto& r : rows)
    std::printf("| %s | %s | %s | %s |\n", r.what.c_str(), r.form.c_str(), ms(r.fwd).c_str(), ms(r.fwd_bwd).c_str());
  for (const auto& r : rows) {
    if (r.profile.empty()) continue;
    std::printf("\n%s, %s, forward+backward: %s ms of GPU kernels\n", r.what.c_str(), r.form.c_str(),
                ms(r.profile_ms).c_str());
    print_kernel_table(r.profile, r.profile_ms, a.top);
  }
  if (forms.size() == 2) {
    std::printf("\n| what | torch / cuda, forward | torch / cuda, forward+backward |\n|---|---:|---:|\n");
    for (const auto& c : rows) {
      if (c.form != kernels_name(Kernels::Cuda)) continue;
      for (const auto& t : rows)
        if (t.form == kernels_name(Kernels::Torch) && t.key() == c.key())
          std::printf("| %s | %.1fx | %s |\n", c.what.c_str(), t.fwd / c.fwd,
                      c.fwd_bwd < 0 || t.fwd_bwd < 0 ? "-" : fmt::format("{:.1f}x", t.fwd_bwd / c.fwd_bwd).c_str());
    }
  }
  return 0;
}

namespace {

// The step with its batches split by length (train.length_buckets) beside the whole batch, solo and packed.
void bench_length_buckets(const Config& cfg, const torch::Device& dev, Kernels first_form, const StepBenchArgs& a) {
  const Kernels form = first_form == Kernels::Cuda ? Kernels::Auto : first_form;  // as training picks kernels
  std::vector<int64_t> ks{1}, ns{1};
  for (int64_t K : a.members)
    if (std::find(ks.begin(), ks.end(), K) == ks.end()) ks.push_back(K);
  for (int64_t N : a.length_buckets)
    if (std::find(ns.begin(), ns.end(), N) == ns.end()) ns.push_back(N);
  std::printf("\nLength buckets (%s form): each batch split by length into N buckets of rows, each padded to its own "
              "length, against the whole batch (N = 1) in the same call\n\n"
              "| runs K | N | buckets: rows to length | step mode | ms per step | vs whole batch | steps run whole |\n"
              "|---:|---:|---|---|---:|---:|---:|\n",
              kernels_name(form));
  for (int64_t K : ks) {
    double whole = -1;
    for (int64_t N : ns) {
      Config c = cfg;
      c.set_value("train.length_buckets", std::to_string(N), "memlab bench step --length-buckets");
      if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
      StepSetup s = make_step(c, dev, form, true, K);
      const double t = median_ms([&] { s.run_next(); }, dev, a.reps);
      if (N == 1) whole = t;
      const std::string plan = describe_length_buckets(s.step->length_plan());
      std::printf("| %lld | %lld | %s | %s | %s | %.2fx | %lld |\n", static_cast<long long>(K),
                  static_cast<long long>(N), plan.c_str(), s.step->mode().c_str(), ms(t).c_str(), t / whole,
                  static_cast<long long>(s.step->whole_steps()));
    }
  }
}

}  // namespace

int bench_step(const StepBenchArgs& a) {
  Config cfg(full_schema());
  cfg.merge_file(a.config);
  for (const auto& s : a.sets) cfg.set(s);
  if (a.device != "auto") cfg.set_value("train.device", a.device, "--device");
  const auto dev = pick_device(cfg.get_string("train.device"));
  const std::string model = cfg.get_string("model.name");
  const bool has_kernel = op_of(model) != Op::None;
  std::vector<Kernels> forms;
  // The norm and SwiGLU kernels serve every model, so a mixer without a kernel still has a kernel form.
  if (dev.is_cuda() && kernels_built()) forms.push_back(Kernels::Cuda);
  forms.push_back(Kernels::Torch);
  std::printf("memlab bench step: %s (model %s, task %s, batch %lld), %s, median of %d steps after warm-up\n",
              a.config.c_str(), model.c_str(), cfg.get_string("task.name").c_str(),
              static_cast<long long>(cfg.get_int("train.batch_size")), device_description(dev).c_str(), a.reps);
  if (forms.size() == 1)
    std::printf("only the tensor-op form: %s\n", !kernels_built() ? "this memlab was built without nvcc"
                                                                   : "no kernels on the CPU");
  else if (!has_kernel)
    std::printf("%s has no fused mixer kernel: its cuda form runs memlab's norm and SwiGLU kernels around the "
                "mixer's tensor ops\n", model.c_str());
  struct Timed {
    Kernels form;
    std::string mode;
    double ms;
  };
  std::vector<Timed> timed;
  std::map<std::string, KernelTime> profile;
  double profiled_ms = 0, profiled_launches = 0;
  for (Kernels k : forms) {
    StepSetup s = make_step(cfg, dev, k);
    auto one = [&] { s.run_next(); };
    const double t = median_ms(one, dev, a.reps);
    timed.push_back({k, s.step->mode(), t});
    if (k == forms.front() && dev.is_cuda()) {
      profile = profile_kernels(one, kProfiledSteps, &profiled_ms);
      for (const auto& [name, kt] : profile) profiled_launches += kt.launches;
    }
  }
  std::printf("\n| form | step mode | ms per step |\n|---|---|---:|\n");
  for (const auto& t : timed)
    std::printf("| %s | %s | %s |\n", kernels_name(t.form), t.mode.c_str(), ms(t.ms).c_str());
  if (timed.size() == 2) std::printf("\ntorch / cuda: %.2fx\n", timed[1].ms / timed[0].ms);
  if (!a.members.empty()) {
    // Packed runs in the first form (auto rather than cuda: as training picks kernels)
    const Kernels form = forms.front() == Kernels::Cuda ? Kernels::Auto : forms.front();
    std::printf("\nPacked runs (%s form): K runs of the config trained together in one step on whole batches "
                "(train.length_buckets 1; --length-buckets times the split), against K = 1 in the same call; back to back: wall-clock ms per step of steps run one after another as "
                "training runs them, on batches made before / made at each step as training makes them\n\n"
                "| runs K | step mode | ms per step | ms per run-step | time vs one run | back to back: batches made "
                "before / at each step | peak GPU memory |\n|---:|---|---:|---:|---:|---:|---:|\n",
                kernels_name(form));
    std::vector<int64_t> ks{1};  // one run first: the baseline of the last column
    for (int64_t K : a.members)
      if (K != 1) ks.push_back(K);
    double one_run = -1, packed_ms = 0;
    std::map<std::string, KernelTime> packed_profile;
    for (int64_t K : ks) {
      if (dev.is_cuda()) {
        c10::cuda::CUDACachingAllocator::emptyCache();  // the previous K's graph pool is gone
        c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index() < 0 ? 0 : dev.index());
      }
      Config whole = cfg;
      whole.set_value("train.length_buckets", "1", "memlab bench step --members");
      StepSetup s = make_step(whole, dev, form, true, K);
      const double t = median_ms([&] { s.run_next(); }, dev, a.reps);
      // what the step allocates at its peak (model, optimiser, batches, activations), for --pack auto's limit
      const double peak =
          dev.is_cuda()
              ? static_cast<double>(c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index() < 0 ? 0 : dev.index())
                                        .allocated_bytes[0]
                                        .peak)
              : -1;
      if (K == 1) one_run = t;
      if (K == ks.back() && K > 1 && dev.is_cuda())
        packed_profile = profile_kernels([&] { s.run_next(); }, kProfiledSteps, &packed_ms);
      const double before = back_to_back_ms([&] { s.run_next(); }, dev, a.reps),
                   made = back_to_back_ms([&] { s.run_made(); }, dev, a.reps);
      std::printf("| %lld | %s | %s | %s | %.2fx | %s / %s | %s |\n", static_cast<long long>(K),
                  s.step->mode().c_str(), ms(t).c_str(), ms(t / static_cast<double>(K)).c_str(), t / one_run,
                  ms(before).c_str(), ms(made).c_str(), peak < 0 ? "-" : format_bytes(peak).c_str());
    }
    if (!packed_profile.empty()) {
      std::printf("\nProfile of the K = %lld step: %.3f ms of GPU kernels per step\n",
                  static_cast<long long>(ks.back()), packed_ms);
      print_kernel_table(packed_profile, packed_ms, a.top);
    }
  }
  if (!a.length_buckets.empty()) bench_length_buckets(cfg, dev, forms.front(), a);
  if (profile.empty()) {
    if (dev.is_cuda()) std::printf("\nthe profiler saw no GPU kernels\n");
    return 0;
  }
  std::printf("\nProfile of the %s form, %d steps (Kineto/CUPTI): %.3f ms of GPU kernels per step in %.0f kernel "
              "launches (%.0f%% of the step's %.3f ms)\n",
              kernels_name(forms.front()), kProfiledSteps, profiled_ms, profiled_launches,
              100.0 * profiled_ms / timed.front().ms, timed.front().ms);
  print_family_table(profile, profiled_ms);
  print_kernel_table(profile, profiled_ms, a.top);
  if (!a.by_op) return 0;
  StepSetup s = make_step(cfg, dev, forms.front(), /*graph=*/false);
  auto one = [&] { s.run_next(); };
  for (int w = 0; w < 5; ++w) one();
  std::printf("\nThe same form run eagerly, ");
  print_op_table(profile_ops(one, kProfiledSteps), a.top);
  return 0;
}

}  // namespace memlab
