#include "ops/profile.h"

#include <ATen/cuda/CUDAEvent.h>
#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <vector>

namespace memlab {

namespace {

// Kineto's record (CPU ops and CUPTI's GPU activity) of `steps` calls of fn.
std::unique_ptr<torch::autograd::profiler::ProfilerResult> profiled(const std::function<void()>& fn, int steps) {
  namespace prof = torch::profiler::impl;
  namespace ap = torch::autograd::profiler;
  const prof::ProfilerConfig pc(prof::ProfilerState::KINETO);
  const std::set<prof::ActivityType> acts{prof::ActivityType::CPU, prof::ActivityType::CUDA};
  torch::cuda::synchronize();
  ap::prepareProfiler(pc, acts);
  ap::enableProfiler(pc, acts);
  for (int i = 0; i < steps; ++i) fn();
  torch::cuda::synchronize();
  return ap::disableProfiler();
}

// Adds one GPU event of a `steps`-call profile to k, per call.
void count(KernelTime& k, const torch::autograd::profiler::KinetoEvent& e, int steps) {
  k.ms += static_cast<double>(e.durationNs()) / 1e6 / steps;
  k.launches += 1.0 / steps;
}

}  // namespace

double median_ms(const std::function<void()>& fn, const c10::Device& dev, int reps) {
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

// What a kernel's name says it does, for the profile's summary.
std::string kernel_family(const std::string& n) {
  auto has = [&](const char* w) { return n.find(w) != std::string::npos; };
  if (has("delta_rule")) return "delta rule (memlab kernels)";
  if (has("slstm")) return "sLSTM (memlab kernels)";
  if (has("mlstm")) return "mLSTM (memlab kernels)";
  if (has("ssd_")) return "SSD (memlab kernels)";
  if (has("mesa_cg")) return "Mesa CG (memlab kernels)";
  if (has("mesa_")) return "Mesa states, reads, adjoints (memlab kernels)";
  if (has("causal_conv")) return "short convolutions (memlab kernels)";
  if (has("row_norm")) return "RMS and L2 norms (memlab kernels)";
  if (has("silu_mul")) return "SwiGLU gating (memlab kernels)";
  if (has("gemm") || has("cutlass") || has("xmma") || has("nvjet") || has("cublas") || has("Kernel2")) return "matmul";
  if (has("multi_tensor_apply") || has("adam") || has("Adam")) return "optimiser (fused AdamW)";
  if (has("softmax") || has("nll_loss") || has("cross_entropy")) return "softmax and loss";
  if (has("reduce_kernel") || has("Reduce") || has("norm")) return "reductions and norms";
  if (has("Memcpy") || has("Memset") || has("copy") || has("Copy") || has("cat") || has("index") || has("gather") ||
      has("scatter") || has("pad"))
    return "copies, indexing, padding";
  if (has("conv")) return "convolution";
  if (has("elementwise") || has("unrolled") || has("vectorized")) return "elementwise";
  return "other";
}

// A kernel's name without its return type, namespaces, arguments and template arguments past ~90 characters.
std::string short_kernel_name(std::string n) {
  if (n.rfind("void ", 0) == 0) n = n.substr(5);
  for (const std::string ns : {"(anonymous namespace)::", "at::native::", "memlab::kernels::"})
    for (size_t at; (at = n.find(ns)) != std::string::npos;) n.erase(at, ns.size());
  int depth = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    if (n[i] == '<') ++depth;
    if (n[i] == '>') --depth;
    if (n[i] == '(' && depth == 0) {
      n = n.substr(0, i);
      break;
    }
  }
  return n.size() > 90 ? n.substr(0, 87) + "..." : n;
}

// GPU time and launches by kernel over `steps` calls of fn, from the Kineto profiler (CUPTI), per call.
std::map<std::string, KernelTime> profile_kernels(const std::function<void()>& fn, int steps, double* total_ms) {
  const auto result = profiled(fn, steps);
  std::map<std::string, KernelTime> by_name;
  *total_ms = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    count(by_name[e.name()], e, steps);
    *total_ms += static_cast<double>(e.durationNs()) / 1e6 / steps;
  }
  return by_name;
}

// GPU time of `steps` calls of an eagerly run fn by the op that launched each kernel, labelled "outer > inner":
// inner is the op that launched it, outer the outermost op around it on its thread (a forward op such as
// aten::linear, or the autograd node in the backward). Graph replay has no ops, hence the eager step.
std::map<std::string, KernelTime> profile_ops(const std::function<void()>& fn, int steps) {
  const auto result = profiled(fn, steps);
  const auto& events = result->events();
  struct Op {
    uint64_t start, end, thread;
    std::string name;
    size_t outer;
  };
  std::vector<Op> ops;
  std::map<uint64_t, size_t> by_correlation;
  for (const auto& e : events)
    if (e.activityType() == static_cast<uint8_t>(libkineto::ActivityType::CPU_OP) && e.endNs() > e.startNs()) {
      by_correlation[e.correlationId()] = ops.size();
      ops.push_back({e.startNs(), e.endNs(), e.startThreadId(), e.name(), ops.size()});
    }
  // Outermost enclosing op per thread: sweep ops by start time, keeping the open ones on a stack.
  std::vector<size_t> order(ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = ops[a], &y = ops[b];
    return x.thread != y.thread ? x.thread < y.thread : x.start != y.start ? x.start < y.start : x.end > y.end;
  });
  std::vector<size_t> open;
  for (size_t i : order) {
    while (!open.empty() && (ops[open.back()].thread != ops[i].thread || ops[open.back()].end < ops[i].end))
      open.pop_back();
    ops[i].outer = open.empty() ? i : ops[open.front()].outer;
    open.push_back(i);
  }
  auto trim = [](std::string n) {
    const std::string node = "autograd::engine::evaluate_function: ";
    if (n.rfind(node, 0) == 0) n = n.substr(node.size());
    return n;
  };
  std::map<std::string, KernelTime> by_op;
  for (const auto& e : events) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    std::string label = "(no op)";
    if (auto it = by_correlation.find(e.linkedCorrelationId()); it != by_correlation.end()) {
      const Op& op = ops[it->second];
      const std::string outer = trim(ops[op.outer].name), inner = trim(op.name);
      label = outer == inner ? inner : outer + " > " + inner;
    }
    count(by_op[label], e, steps);
  }
  return by_op;
}

std::vector<std::pair<std::string, KernelTime>> by_time(const std::map<std::string, KernelTime>& m) {
  std::vector<std::pair<std::string, KernelTime>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
  return v;
}

std::string ms(double x) { return x < 0 ? "-" : x < 0.1 ? fmt::format("{:.4f}", x) : fmt::format("{:.3f}", x); }

// The `top` kernels of a profile by GPU time, as a markdown table.
void print_kernel_table(const std::map<std::string, KernelTime>& profile, double total_ms, int top) {
  std::printf("\n| kernel | ms per step | share | launches per step |\n|---|---:|---:|---:|\n");
  int n = 0;
  for (const auto& [name, kt] : by_time(profile)) {
    if (n++ == top) break;
    std::printf("| `%s` | %s | %.1f%% | %.0f |\n", short_kernel_name(name).c_str(), ms(kt.ms).c_str(),
                100.0 * kt.ms / total_ms, kt.launches);
  }
}

void print_family_table(const std::map<std::string, KernelTime>& profile, double total_ms) {
  std::map<std::string, KernelTime> families;
  for (const auto& [name, kt] : profile) {
    auto& f = families[kernel_family(name)];
    f.ms += kt.ms;
    f.launches += kt.launches;
  }
  std::printf("\n| kind of kernel | ms per step | share | launches per step |\n|---|---:|---:|---:|\n");
  for (const auto& [name, kt] : by_time(families))
    std::printf("| %s | %s | %.1f%% | %.0f |\n", name.c_str(), ms(kt.ms).c_str(), 100.0 * kt.ms / total_ms,
                kt.launches);
}

void print_op_table(const std::map<std::string, KernelTime>& ops, int top) {
  double total = 0, launches = 0;
  for (const auto& [name, kt] : ops) total += kt.ms, launches += kt.launches;
  std::printf("%.3f ms of GPU kernels per step in %.0f launches, by the op that launched them (outermost op > "
              "launching op):\n\n| op | ms per step | share | launches per step |\n|---|---:|---:|---:|\n",
              total, launches);
  int n = 0;
  for (const auto& [name, kt] : by_time(ops)) {
    if (n++ == top) break;
    std::printf("| %s | %s | %.1f%% | %.1f |\n", name.c_str(), ms(kt.ms).c_str(), 100.0 * kt.ms / total, kt.launches);
  }
}

}  // namespace memlab
