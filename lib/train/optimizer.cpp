#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace memlab {

AdamW::AdamW(std::vector<torch::Tensor> params, AdamWOptions opts, std::vector<bool> decay,
             std::vector<double> member_decay)
    : params_(std::move(params)), decay_(std::move(decay)), member_decay_(std::move(member_decay)), opts_(opts) {
  if (decay_.empty()) decay_.assign(params_.size(), true);
  TORCH_CHECK(decay_.size() == params_.size(), "AdamW: one decay flag per parameter");
  members_ = member_decay_.empty() ? 1 : static_cast<int64_t>(member_decay_.size());
  for (const auto& p : params_) {
    TORCH_CHECK(p.is_contiguous() && p.numel() % members_ == 0, "AdamW: parameters of ", members_, " members");
    m_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    v_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
  }
  const auto fopt = params_.at(0).options().dtype(torch::kFloat);
  step_ = member_decay_.empty() ? torch::zeros({}, fopt) : torch::zeros({members_}, fopt);
}

namespace {
torch::Tensor member_slice(const torch::Tensor& t, int64_t K, int64_t k) { return t.view({K, -1}).select(0, k); }
}  // namespace

void AdamW::step(double lr, const torch::Tensor& found_inf) {
  step(torch::full({}, lr, step_.options()), found_inf);
}

void AdamW::step(const torch::Tensor& lr, const torch::Tensor& found_inf) {
  torch::NoGradGuard ng;
  bool any = false;
  for (const auto& p : params_) any = any || p.grad().defined();
  if (!any) return;
  // One run: whole tensors and 0-d lr, step and found_inf. K members: member k's slices and entries, so each
  // member's update is its solo run's arithmetic.
  const bool packed = !member_decay_.empty();
  const int64_t K = members_;
  auto fi = found_inf.to(torch::kFloat).reshape(packed ? std::vector<int64_t>{K} : std::vector<int64_t>{});
  auto lrs = lr.reshape(fi.sizes());
  auto part = [&](const torch::Tensor& t, int64_t k) { return packed ? member_slice(t, K, k) : t; };
  auto entry = [&](const torch::Tensor& t, int64_t k) { return packed ? t.select(0, k) : t; };
  // The step count advances only for applied updates, as torch's GradScaler path does.
  step_.add_(1.0 - fi);
  // Two fused launches per member: parameters with weight decay, and those exempt from it.
  for (int64_t k = 0; k < K; ++k)
    for (bool decayed : {true, false}) {
      std::vector<torch::Tensor> ps, gs, ms, vs, steps;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!params_[i].grad().defined() || decay_[i] != decayed) continue;
        ps.push_back(part(params_[i], k));
        gs.push_back(part(params_[i].grad(), k));
        ms.push_back(part(m_[i], k));
        vs.push_back(part(v_[i], k));
      }
      if (ps.empty()) continue;
      steps.assign(ps.size(), entry(step_, k));
      const double wd = !decayed ? 0.0 : packed ? member_decay_[k] : opts_.weight_decay;
      at::_fused_adamw_(ps, gs, ms, vs, {}, steps, entry(lrs, k), opts_.beta1, opts_.beta2, wd, opts_.eps,
                        /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, entry(fi, k));
    }
}

void AdamW::copy_member_to(int64_t k, AdamW& solo) const {
  torch::NoGradGuard ng;
  TORCH_CHECK(solo.m_.size() == m_.size(), "AdamW: the member's optimiser has other parameters");
  solo.step_.copy_(step_.view({-1}).select(0, k));
  for (size_t i = 0; i < m_.size(); ++i) {
    solo.m_[i].view(-1).copy_(member_slice(m_[i], members_, k));
    solo.v_[i].view(-1).copy_(member_slice(v_[i], members_, k));
  }
}

void AdamW::copy_member_from(int64_t k, const AdamW& solo) {
  torch::NoGradGuard ng;
  TORCH_CHECK(solo.m_.size() == m_.size(), "AdamW: the member's optimiser has other parameters");
  step_.view({-1}).select(0, k).copy_(solo.step_.reshape({}));
  for (size_t i = 0; i < m_.size(); ++i) {
    member_slice(m_[i], members_, k).copy_(solo.m_[i].reshape(-1));
    member_slice(v_[i], members_, k).copy_(solo.v_[i].reshape(-1));
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

torch::Tensor clip_grad_norm_members(const std::vector<torch::Tensor>& params, const torch::Tensor& max_norm) {
  torch::NoGradGuard ng;
  const int64_t K = max_norm.numel();
  std::vector<torch::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().view({K, -1}).to(torch::kFloat).norm(2, {1}));
  if (norms.empty()) return torch::zeros({K}, max_norm.options());
  auto total = torch::stack(norms).norm(2, {0});  // [K]
  auto coef = torch::where(max_norm > 0, torch::clamp_max(max_norm / (total + 1e-6), 1.0), torch::ones_like(total));
  for (const auto& p : params)
    if (p.grad().defined()) p.grad().view({K, -1}).mul_(coef.to(p.grad().scalar_type()).unsqueeze(1));
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
