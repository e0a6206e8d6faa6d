#pragma once
// AdamW (decoupled weight decay) over a parameter list, fused into one kernel per step where the backend
// allows; gradient clipping by global norm; linear warmup + cosine learning-rate schedule.
#include <torch/torch.h>

namespace memlab {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

class AdamW {
 public:
  // decay[i] false exempts params[i] from weight decay (empty: all decay).
  AdamW(std::vector<torch::Tensor> params, AdamWOptions opts, std::vector<bool> decay = {});
  // One update at learning rate lr; skipped (moments and parameters untouched) where found_inf != 0.
  void step(double lr, const torch::Tensor& found_inf);
  void step(const torch::Tensor& lr, const torch::Tensor& found_inf);  // lr as a 0-d tensor (CUDA-graph safe)
  void zero_grad();
  void save(torch::serialize::OutputArchive& ar) const;
  void load(torch::serialize::InputArchive& ar);

 private:
  std::vector<torch::Tensor> params_, m_, v_;
  std::vector<bool> decay_;
  torch::Tensor step_;  // number of updates taken, as a float tensor on the parameters' device
  AdamWOptions opts_;
};

// Scales gradients so their global L2 norm is at most max_norm (when max_norm > 0). Returns the norm
// before clipping as a 0-d tensor, without synchronising with the device.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

// Linear warmup from 0 over `warmup` steps, then cosine decay to peak * min_ratio at `decay_steps`.
double lr_at(int64_t step, double peak, int64_t warmup, int64_t decay_steps, double min_ratio);

}  // namespace memlab
