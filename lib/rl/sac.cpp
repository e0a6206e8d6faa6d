#include "rl/sac.h"

#include "mixers/ops.h"

namespace memlab {

torch::Tensor policy_log_probs(const torch::Tensor& logits) {
  return torch::softmax(logits, -1).clamp_min(1e-8).log();
}

torch::Tensor soft_value(const torch::Tensor& logits, const torch::Tensor& q1, const torch::Tensor& q2, double alpha) {
  const auto pi = torch::softmax(logits, -1);
  return (pi * (torch::min(q1, q2) - alpha * policy_log_probs(logits))).sum(-1);
}

torch::Tensor critic_target(const torch::Tensor& next_logits, const torch::Tensor& next_q1, const torch::Tensor& next_q2,
                            const torch::Tensor& reward, const torch::Tensor& done, double gamma, double alpha) {
  return reward + (1.0 - done) * gamma * soft_value(next_logits, next_q1, next_q2, alpha);
}

namespace {
torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  return (x * mask).sum() / mask.sum().clamp_min(1.0);
}
}  // namespace

torch::Tensor critic_loss(const torch::Tensor& q1, const torch::Tensor& q2, const torch::Tensor& actions,
                          const torch::Tensor& target, const torch::Tensor& mask) {
  const auto a = actions.unsqueeze(-1);
  const auto e1 = q1.gather(-1, a).squeeze(-1) - target, e2 = q2.gather(-1, a).squeeze(-1) - target;
  return 0.5 * (masked_mean(e1 * e1, mask) + masked_mean(e2 * e2, mask));
}

torch::Tensor actor_loss(const torch::Tensor& logits, const torch::Tensor& q1, const torch::Tensor& q2, double alpha,
                         const torch::Tensor& mask) {
  const auto pi = torch::softmax(logits, -1);
  return masked_mean((pi * (alpha * policy_log_probs(logits) - torch::min(q1, q2))).sum(-1), mask);
}

Sac::Sac(Agent a, const torch::Device& device, SacOptions opts)
    : agent(std::move(a)), device_(device), opts_(opts) {
  agent->to(device_);
  auto& c = *agent->critic;
  target = TwinQ(c.q1->fc1->weight.size(1), c.q1->fc1->weight.size(0), c.q1->out->weight.size(0));
  target->to(device_);
  {
    torch::NoGradGuard ng;
    auto src = agent->critic->parameters(), dst = target->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  for (auto& p : target->parameters()) p.set_requires_grad(false);
  params_ = agent->parameters();
  AdamWOptions ao;  // weight_decay 0: Adam
  opt = std::make_unique<AdamW>(params_, ao);
  const auto fopt = torch::TensorOptions().dtype(torch::kFloat).device(device_);
  lr_ = torch::full({}, opts_.lr, fopt);
  critic_sum = torch::zeros({}, fopt);
  actor_sum = torch::zeros({}, fopt);
  entropy_sum = torch::zeros({}, fopt);
  q_sum = torch::zeros({}, fopt);
  gnorm_sum = torch::zeros({}, fopt);
  bad_updates = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device_));
  graph_ = std::make_unique<GraphedStep>(opts_.cuda_graph && device_.is_cuda());
}

Sac::~Sac() = default;

void Sac::reset_stats() {
  for (auto* t : {&critic_sum, &actor_sum, &entropy_sum, &q_sum, &gnorm_sum, &bad_updates}) t->zero_();
}

namespace {
// fp32 matmul precision for a scope, restored after ("high": TF32 tensor cores). A CUDA graph captures the
// mode of each matmul as it is recorded.
class MatmulPrecision {
 public:
  explicit MatmulPrecision(bool tf32) : saved_(at::globalContext().float32MatmulPrecision()) {
    if (tf32) at::globalContext().setFloat32MatmulPrecision("high");
  }
  ~MatmulPrecision() {
    at::globalContext().setFloat32MatmulPrecision(saved_ == at::Float32MatmulPrecision::HIGHEST ? "highest"
                                                  : saved_ == at::Float32MatmulPrecision::HIGH  ? "high"
                                                                                                : "medium");
  }

 private:
  at::Float32MatmulPrecision saved_;
};
}  // namespace

void Sac::compute() {
  auto phase = [this](const char* name) {
    if (on_phase) on_phase(name);
  };
  phase("encoder and blocks");
  agent->train();
  torch::Tensor h;
  {
    Bf16Autocast autocast(opts_.bf16);
    h = agent->forward(in_.obs);
  }
  h = h.to(torch::kFloat);
  // The heads read h as a leaf of its own: their forward and backward run under the heads' matmul precision
  // (TF32 where asked: their fp32 GEMMs on CUDA cores took about 3 ms of a SAC update on an H200), then the
  // gradient that reaches the leaf goes back through the sequence model under its own.
  const auto hl = h.detach().requires_grad_(true);
  const int64_t T = in_.actions.size(1);
  torch::Tensor q1, q2, logits, lc, la;
  {
    MatmulPrecision heads(opts_.tf32 && device_.is_cuda());
    // Every head reads all T+1 states, whole: a contiguous input runs each layer as one GEMM with its bias added
    // in the GEMM (a slice of the states took a GEMM, a bias add and a reduction over rows per layer); the
    // critics' last row and the target critics' first go unused.
    phase("critics");
    std::tie(q1, q2) = agent->critic(hl);
    q1 = q1.narrow(1, 0, T), q2 = q2.narrow(1, 0, T);
    // The actor once over all T+1 states: its first T rows feed the actor loss, its last T (detached) the target.
    phase("actor");
    const auto logits_all = agent->actor(opts_.freeze_critic ? hl.detach() : hl);
    logits = logits_all.narrow(1, 0, T);
    phase("target critics and losses");
    torch::Tensor y;
    {
      torch::NoGradGuard ng;
      auto [t1, t2] = target(hl.detach());
      t1 = t1.narrow(1, 1, T), t2 = t2.narrow(1, 1, T);
      y = critic_target(logits_all.narrow(1, 1, T).detach(), t1, t2, in_.rewards, in_.done, opts_.gamma,
                        opts_.alpha);
    }
    lc = critic_loss(q1, q2, in_.actions, y, in_.mask);
    la = opts_.freeze_critic ? actor_loss(logits, q1.detach(), q2.detach(), opts_.alpha, in_.mask)
                             : actor_loss(logits, q1, q2, opts_.alpha, in_.mask);
    phase("backward");
    opt->zero_grad();
    (lc + la).backward();
  }
  h.backward(hl.grad());
  phase("gradient norm, Adam, target critics");
  const auto gnorm = clip_grad_norm(params_, opts_.clip);
  const auto bad = gnorm.isfinite().logical_and(lc.isfinite()).logical_and(la.isfinite()).logical_not();
  opt->step(lr_, bad);
  torch::NoGradGuard ng;
  const auto w = bad.logical_not().to(torch::kFloat) * opts_.tau;  // no target move after a skipped update
  auto src = agent->critic->parameters(), dst = target->parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].lerp_(src[i], w);
  phase("statistics");
  const auto logp = policy_log_probs(logits.detach());
  const auto ent = -(torch::softmax(logits.detach(), -1) * logp).sum(-1);
  const auto n = in_.mask.sum().clamp_min(1.0);
  critic_sum.add_(lc.detach());
  actor_sum.add_(la.detach());
  entropy_sum.add_((ent * in_.mask).sum() / n);
  q_sum.add_((q1.detach().gather(-1, in_.actions.unsqueeze(-1)).squeeze(-1) * in_.mask).sum() / n);
  gnorm_sum.add_(gnorm);
  bad_updates.add_(bad.to(torch::kLong));
  phase("end");
}

void Sac::update(const SacBatch& b) {
  const bool same = in_.obs.defined() && in_.obs.sizes() == b.obs.sizes();
  if (graph_->active() && same) {
    in_.obs.copy_(b.obs, true);
    in_.actions.copy_(b.actions, true);
    in_.rewards.copy_(b.rewards, true);
    in_.done.copy_(b.done, true);
    in_.mask.copy_(b.mask, true);
  } else {
    if (graph_->captured()) graph_->drop("a batch of another shape than the captured one");
    in_ = SacBatch{b.obs.to(device_), b.actions.to(device_), b.rewards.to(device_), b.done.to(device_),
                   b.mask.to(device_)};
  }
  graph_->run([this] { compute(); });
}

}  // namespace memlab
