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
  // decay[i] false exempts params[i] from weight decay (empty: all decay). With `member_decay` (K values) the
  // parameters are a packed model's (SequenceModel): member k owns every parameter's slice p.view({K, -1})[k]
  // and has its own weight decay, learning rate, skipped steps and step count, as if it ran alone.
  AdamW(std::vector<torch::Tensor> params, AdamWOptions opts, std::vector<bool> decay = {},
        std::vector<double> member_decay = {});
  // One update at learning rate lr; skipped (moments and parameters untouched) where found_inf != 0.
  void step(double lr, const torch::Tensor& found_inf);
  // lr and found_inf as tensors (CUDA-graph safe): 0-d, or [K] for K members.
  void step(const torch::Tensor& lr, const torch::Tensor& found_inf);
  void zero_grad();
  void save(torch::serialize::OutputArchive& ar) const;
  void load(torch::serialize::InputArchive& ar);
  int64_t members() const { return members_; }
  // Member k's moments and step count into / from a one-member AdamW over that member's parameters.
  void copy_member_to(int64_t k, AdamW& solo) const;
  void copy_member_from(int64_t k, const AdamW& solo);

 private:
  std::vector<torch::Tensor> params_, m_, v_;
  std::vector<bool> decay_;
  std::vector<double> member_decay_;
  int64_t members_ = 1;
  torch::Tensor step_;  // number of updates taken, as a float tensor on the parameters' device ([K] for K members)
  AdamWOptions opts_;
};

// Scales gradients so their global L2 norm is at most max_norm (when max_norm > 0). Returns the norm
// before clipping as a 0-d tensor, without synchronising with the device.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);
// The same per member of a packed model (AdamW): max_norm [K] (0: off), returns the K norms [K].
torch::Tensor clip_grad_norm_members(const std::vector<torch::Tensor>& params, const torch::Tensor& max_norm);

// Linear warmup from 0 over `warmup` steps, then cosine decay to peak * min_ratio at `decay_steps`.
double lr_at(int64_t step, double peak, int64_t warmup, int64_t decay_steps, double min_ratio);

}  // namespace memlab
