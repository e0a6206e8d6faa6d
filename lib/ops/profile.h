#pragma once
// Timing and GPU profiles for memlab's benchmarks (bench mixer, step, rl): median wall times by CUDA events, and
// Kineto/CUPTI kernel profiles summed by kernel, by kind of kernel, or by the op that launched them.
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace c10 {
struct Device;
}

namespace memlab {

// Median wall time of fn in ms over reps calls after 5 warm-up calls: CUDA events around each call on a GPU
// (after a device sync), a clock on the CPU.
double median_ms(const std::function<void()>& fn, const c10::Device& dev, int reps);

struct KernelTime {
  double ms = 0, launches = 0;  // per call of the profiled function
};

constexpr int kProfiledSteps = 10;

// GPU time and launches by kernel name over `steps` calls of fn, per call; *total_ms is their sum.
std::map<std::string, KernelTime> profile_kernels(const std::function<void()>& fn, int steps, double* total_ms);

// GPU time of `steps` calls of an eagerly run fn by the op that launched each kernel, labelled "outer > inner".
std::map<std::string, KernelTime> profile_ops(const std::function<void()>& fn, int steps);

// What a kernel's name says it does ("matmul", "delta rule (memlab kernels)", ...).
std::string kernel_family(const std::string& name);
// A kernel's name without return type, namespaces and arguments, cut to about 90 characters.
std::string short_kernel_name(std::string name);

// A profile's entries, longest first.
std::vector<std::pair<std::string, KernelTime>> by_time(const std::map<std::string, KernelTime>& m);

// "1.234" ms, with 4 decimals below 0.1; "-" for a negative (not measured) value.
std::string ms(double x);

// Markdown tables of a profile: the `top` kernels by time, and the kinds of kernel (kernel_family).
void print_kernel_table(const std::map<std::string, KernelTime>& profile, double total_ms, int top);
void print_family_table(const std::map<std::string, KernelTime>& profile, double total_ms);
// "<total> ms of GPU kernels per step in <n> launches, by the op ...", then a Markdown table of profile_ops's `top`
// ops by time.
void print_op_table(const std::map<std::string, KernelTime>& ops, int top);

}  // namespace memlab
