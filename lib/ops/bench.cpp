#include "ops/bench.h"

#include <ATen/cuda/CUDAEvent.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "core/config.h"
#include "core/device.h"
#include "core/errors.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/kernels.h"
#include "train/trainer.h"

namespace memlab {
namespace {

// Median wall time of fn in ms: CUDA events around each call on a GPU (after a device sync), a clock on the CPU.
double median_ms(const std::function<void()>& fn, const torch::Device& dev, int reps) {
  for (int i = 0; i < 5; ++i) fn();  // warm-up: allocator, cuBLAS handles, autocast caches
  if (dev.is_cuda()) torch::cuda::synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    if (dev.is_cuda()) {
      at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
      start.record();
      fn();
      end.record();
      end.synchronize();
      ms.push_back(start.elapsed_time(end));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string what, form;
  double fwd = 0, fwd_bwd = -1;  // -1: not measured (a step has no backward)
};

// The op a mixer's layer calls, where memlab has a kernel for it.
enum class Op { None, DeltaRule, GatedDeltaRule };
Op op_of(const std::string& model) {
  if (model == "deltanet" || model == "hqlt") return Op::DeltaRule;
  if (model == "gated_deltanet") return Op::GatedDeltaRule;
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
  r.fwd_bwd = median_ms(
      [&] {
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
  auto q = l2_normalize(torch::randn({B, T, H, d}, o)).to(dt).requires_grad_(true);
  auto kk = l2_normalize(torch::randn({B, T, H, d}, o)).to(dt).requires_grad_(true);
  auto v = torch::randn({B, T, H, d}, o).to(dt).requires_grad_(true);
  auto beta = (torch::rand({B, T, H}, o) * 2.0).requires_grad_(true);
  torch::Tensor g;
  if (op == Op::GatedDeltaRule) g = (-torch::rand({B, T, H}, o) * 0.3).requires_grad_(true);
  auto go = torch::randn({B, T, H, d}, o).to(dt);
  DeltaRuleForm form;
  form.kernels = k;
  form.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::string name = op == Op::GatedDeltaRule ? "gated delta rule" : "delta rule";
  Row seq{name, kernels_name(k)};
  seq.fwd = median_ms(
      [&] {
        torch::NoGradGuard ng;
        delta_rule(q, kk, v, beta, form, g);
      },
      dev, a.reps);
  seq.fwd_bwd = median_ms([&] { delta_rule(q, kk, v, beta, form, g).o.backward(go); }, dev, a.reps);
  // One token from a state, as a rollout steps.
  torch::NoGradGuard ng;
  auto S = torch::zeros({B, H, d, d}, o);
  // Contiguous [B, H, d] inputs, as a layer's projections give them.
  auto q1 = q.select(1, 0).contiguous(), k1 = kk.select(1, 0).contiguous(), v1 = v.select(1, 0).contiguous();
  auto b1 = beta.select(1, 0).contiguous();
  auto g1 = g.defined() ? g.select(1, 0).contiguous() : torch::Tensor();
  Row step{name + " step", kernels_name(k)};
  step.fwd = median_ms([&] { delta_rule_step(q1, k1, v1, b1, form.scale, S, g1, k); }, dev, a.reps);
  return {seq, step};
}

std::string ms(double x) { return x < 0 ? "-" : x < 0.1 ? fmt::format("{:.4f}", x) : fmt::format("{:.3f}", x); }

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
    if (op != Op::None)
      for (auto& r : time_op(op, a, dev, bf16, k)) rows.push_back(r);
  }
  std::printf("\n| what | form | forward ms | forward+backward ms |\n|---|---|---:|---:|\n");
  for (const auto& r : rows)
    std::printf("| %s | %s | %s | %s |\n", r.what.c_str(), r.form.c_str(), ms(r.fwd).c_str(), ms(r.fwd_bwd).c_str());
  if (forms.size() == 2) {
    std::printf("\n| what | torch / cuda, forward | torch / cuda, forward+backward |\n|---|---:|---:|\n");
    const size_t n = rows.size() / 2;
    for (size_t i = 0; i < n; ++i) {
      const auto &c = rows[i], &t = rows[i + n];
      std::printf("| %s | %.1fx | %s |\n", c.what.c_str(), t.fwd / c.fwd,
                  c.fwd_bwd < 0 ? "-" : fmt::format("{:.1f}x", t.fwd_bwd / c.fwd_bwd).c_str());
    }
  }
  return 0;
}

}  // namespace memlab
