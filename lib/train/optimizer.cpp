#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace memlab {

AdamW::AdamW(std::vector<torch::Tensor> params, AdamWOptions opts, std::vector<bool> decay)
    : params_(std::move(params)), decay_(std::move(decay)), opts_(opts) {
  if (decay_.empty()) decay_.assign(params_.size(), true);
  TORCH_CHECK(decay_.size() == params_.size(), "AdamW: one decay flag per parameter");
  for (const auto& p : params_) {
    m_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    v_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  }
  step_ = torch::zeros({}, params_.at(0).options().dtype(torch::kFloat));
}

void AdamW::step(double lr, const torch::Tensor& found_inf) {
  step(torch::full({}, lr, step_.options()), found_inf);
}

void AdamW::step(const torch::Tensor& lr, const torch::Tensor& found_inf) {
  torch::NoGradGuard ng;
  auto fi = found_inf.to(torch::kFloat).reshape({});
  bool any = false;
  for (const auto& p : params_) any = any || p.grad().defined();
  if (!any) return;
  // The step count advances only for applied updates, as torch's GradScaler path does.
  step_.add_(1.0 - fi);
  // Two fused launches: parameters with weight decay, and those exempt from it.
  for (bool decayed : {true, false}) {
    std::vector<torch::Tensor> ps, gs, ms, vs, steps;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined() || decay_[i] != decayed) continue;
      ps.push_back(params_[i]);
      gs.push_back(params_[i].grad());
      ms.push_back(m_[i]);
      vs.push_back(v_[i]);
    }
    if (ps.empty()) continue;
    steps.assign(ps.size(), step_);
    at::_fused_adamw_(ps, gs, ms, vs, {}, steps, lr.reshape({}), opts_.beta1, opts_.beta2,
                      decayed ? opts_.weight_decay : 0.0, opts_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, fi);
  }
}

void AdamW::zero_grad() {
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
}

void AdamW::save(torch::serialize::OutputArchive& ar) const {
  ar.write("adamw.step", step_);
  for (size_t i = 0; i < params_.size(); ++i) {
    ar.write("adamw.m." + std::to_string(i), m_[i]);
    ar.write("adamw.v." + std::to_string(i), v_[i]);
  }
}

void AdamW::load(torch::serialize::InputArchive& ar) {
  torch::NoGradGuard ng;
  torch::Tensor t;
  ar.read("adamw.step", t);
  step_.copy_(t);
  for (size_t i = 0; i < params_.size(); ++i) {
    ar.read("adamw.m." + std::to_string(i), t);
    m_[i].copy_(t);
    ar.read("adamw.v." + std::to_string(i), t);
    v_[i].copy_(t);
  }
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return torch::zeros({});
  auto norms = at::_foreach_norm(grads, 2);
  auto total = torch::stack(norms).to(torch::kFloat).norm();
  if (max_norm > 0) {
    auto coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
    // One multi-tensor launch where the gradients share a dtype (one launch per gradient cost ~30 per step).
    const bool same = std::all_of(grads.begin(), grads.end(),
                                  [&](const torch::Tensor& g) { return g.scalar_type() == grads[0].scalar_type(); });
    if (same)
      at::_foreach_mul_(grads, coef.to(grads[0].scalar_type()));
    else
      for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  }
  return total;
}

double lr_at(int64_t step, double peak, int64_t warmup, int64_t decay_steps, double min_ratio) {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (decay_steps <= warmup) return peak;
  const double p = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps - warmup));
  const double lo = peak * min_ratio;
  return lo + 0.5 * (peak - lo) * (1.0 + std::cos(M_PI * p));
}

}  // namespace memlab
