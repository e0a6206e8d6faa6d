#pragma once
// Sizes that cannot fit are refused before anything is allocated or written: a batch of 10^12 examples,
// lengths of 10^8 or model.hidden = 65536 stop with one error naming the keys, instead of an allocation
// failure, a partial run directory or the OOM killer. Each need is a lower bound of what its part takes,
// so a refusal is never wrong; what passes may still run out of memory later, which the runs report.
#include <string>
#include <vector>

namespace memlab {

struct MemoryNeed {
  std::string what;    // "the training batches (train.batch_size 10^12 x length 40)"
  std::string keys;    // the keys to lower: "train.batch_size or task.train_len"
  double bytes = 0;
  bool on_device = false;  // GPU memory (when the run uses one), else host memory
};

// Physical memory of this machine, capped by its cgroup's limit.
double host_memory_bytes();

// UserError for the first need above its memory (device_bytes <= 0: no GPU, every need is host memory).
void check_memory_needs(const std::vector<MemoryNeed>& needs, double device_bytes);

// "1.5 GiB"
std::string format_bytes(double bytes);

}  // namespace memlab
