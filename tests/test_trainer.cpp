// Optimiser pieces: AdamW update against the closed form, clipping, schedule; accuracy counting.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/config.h"
#include "core/errors.h"
#include "mixers/mixer.h"
#include "models/sequence_model.h"
#include "tests/mixer_check.h"
#include "tests/step_forms.h"
#include "tests/test_batches.h"
#include "train/trainer.h"
#include "train/evaluate.h"
#include "train/length_buckets.h"
#include "train/optimizer.h"
#include "train/train_step.h"

using namespace memlab;

TEST(AdamW, MatchesClosedFormForTwoSteps) {
  auto p = torch::tensor({1.0f, -2.0f}).requires_grad_(true);
  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamW opt({p}, o);
  const double lr = 0.01;
  std::vector<double> ref = {1.0, -2.0}, m = {0, 0}, v = {0, 0};
  for (int step = 1; step <= 2; ++step) {
    std::vector<double> g = {0.5 * step, -1.0};
    p.mutable_grad() = torch::tensor({float(g[0]), float(g[1])});
    opt.step(lr, torch::zeros({}));
    for (int i = 0; i < 2; ++i) {
      ref[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(o.beta1, step)), vh = v[i] / (1 - std::pow(o.beta2, step));
      ref[i] -= lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  EXPECT_NEAR(p[0].item<double>(), ref[0], 1e-6);
  EXPECT_NEAR(p[1].item<double>(), ref[1], 1e-6);
}

TEST(AdamW, SkipsUpdateWhenFoundInf) {
  auto p = torch::tensor({1.0f}).requires_grad_(true);
  AdamW opt({p}, {});
  p.mutable_grad() = torch::tensor({1.0f});
  opt.step(0.1, torch::ones({}));
  EXPECT_FLOAT_EQ(p.item<float>(), 1.0f);
}

TEST(AdamW, ExemptParametersGetNoWeightDecay) {
  // Zero gradients: only the decoupled decay moves a parameter, p <- p (1 - lr wd).
  auto a = torch::ones({3}).requires_grad_(true), b = torch::ones({3}).requires_grad_(true);
  a.mutable_grad() = torch::zeros({3});
  b.mutable_grad() = torch::zeros({3});
  AdamWOptions o;
  o.weight_decay = 0.5;
  AdamW opt({a, b}, o, {true, false});
  opt.step(0.1, torch::zeros({}));
  EXPECT_NEAR(a[0].item<double>(), 0.95, 1e-6);
  EXPECT_NEAR(b[0].item<double>(), 1.0, 1e-7);
}

// Decay exemptions are the mixers' own declarations, whatever the parameters are called.
TEST(AdamW, WeightDecayMaskFollowsTheMixers) {
  Config cfg(full_schema());
  cfg.set_value("model.name", "gated_deltanet", "test");
  SequenceModel model(cfg, 8);
  const auto decays = memlab::testing::decays_by_name(*model);
  EXPECT_FALSE(decays.at("block0.mixer.A_log"));
  EXPECT_FALSE(decays.at("block1.mixer.dt_bias"));
  EXPECT_TRUE(decays.at("block0.mixer.q_proj.weight"));
  EXPECT_TRUE(decays.at("embed.weight"));
  int64_t exempt = 0;
  for (const auto& [name, d] : decays) exempt += !d;
  EXPECT_EQ(exempt, 4);  // A_log and dt_bias in each of 2 blocks
}

TEST(Clip, ScalesToMaxNormAndReturnsNormBefore) {
  auto a = torch::zeros({2}).requires_grad_(true), b = torch::zeros({1}).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  auto n = clip_grad_norm({a, b}, 1.0);
  EXPECT_NEAR(n.item<float>(), 5.0f, 1e-5);
  EXPECT_NEAR(a.grad()[0].item<float>(), 0.6f, 1e-5);
  EXPECT_NEAR(b.grad()[0].item<float>(), 0.8f, 1e-5);
  auto n2 = clip_grad_norm({a, b}, 10.0);  // under the limit: unchanged
  EXPECT_NEAR(n2.item<float>(), 1.0f, 1e-4);
  EXPECT_NEAR(b.grad()[0].item<float>(), 0.8f, 1e-5);
}

TEST(Schedule, WarmupThenCosineToFloor) {
  EXPECT_DOUBLE_EQ(lr_at(0, 1.0, 10, 110, 0.001), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(9, 1.0, 10, 110, 0.001), 1.0);
  EXPECT_NEAR(lr_at(10, 1.0, 10, 110, 0.001), 1.0, 1e-12);
  EXPECT_NEAR(lr_at(60, 1.0, 10, 110, 0.001), 0.5005, 1e-9);
  EXPECT_NEAR(lr_at(110, 1.0, 10, 110, 0.001), 0.001, 1e-12);
  EXPECT_NEAR(lr_at(500, 1.0, 10, 110, 0.001), 0.001, 1e-12);
}

TEST(CountCorrect, TargetsAndAcceptSets) {
  // B=1, T=4, V=4; argmax per position: 2, 0, 3, 1
  auto logits = torch::tensor({0.f, 0.f, 1.f, 0.f, 1.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 1.f, 0.f, 1.f, 0.f, 0.f})
                    .reshape({1, 4, 4});
  auto target = torch::tensor({2L, 1L, -1L, 3L}).reshape({1, 4});
  auto [c, n] = count_correct(logits, target);
  EXPECT_EQ(c.item<int64_t>(), 1);
  EXPECT_EQ(n.item<int64_t>(), 3);
  // accept sets: position 1 accepts {0, 3} (right), position 3 accepts {2} (wrong), unscored position 2 ignored
  Batch b;
  b.B = 1;
  b.T = 4;
  b.accept = {0, (1u << 0) | (1u << 3), 1u << 3, 1u << 2};
  auto accept = accept_tensor(b, 5);
  ASSERT_EQ(accept.size(1), 5);
  auto [c2, n2] = count_correct(logits, target, accept.slice(1, 0, 4));
  EXPECT_EQ(c2.item<int64_t>(), 2);  // position 0 by target, position 1 by its set
  EXPECT_EQ(n2.item<int64_t>(), 3);
}

// MAD's metric (torchmetrics' macro multiclass accuracy): the mean of the classes' recalls, a class that is neither a
// target nor a prediction at a scored position left out.
TEST(MadAccuracy, MeanOfClassRecalls) {
  // B=1, T=5, V=4; argmax 0, 1, 1, 3, 2; targets 0, 0, 1, 2, unscored. Recalls: class 0 1/2, class 1 1/1, class 2
  // 0/1, class 3 (predicted, never a target) 0: (0.5 + 1 + 0 + 0) / 4. Over tokens it would be 2/4.
  auto logits = torch::zeros({1, 5, 4});
  const int64_t pred[] = {0, 1, 1, 3, 2};
  for (int t = 0; t < 5; ++t) logits[0][t][pred[t]] = 1;
  auto target = torch::tensor({0L, 0L, 1L, 2L, -1L}).reshape({1, 5});
  auto all = torch::ones({1, 5}, torch::kBool);
  EXPECT_NEAR(mad_accuracy(logits, target, all).item<double>(), 0.375, 1e-6);
  // class 3 neither predicted nor a target where the mask is set (positions 0-2): left out, (0.5 + 1) / 2
  auto first3 = torch::tensor({true, true, true, false, false}).reshape({1, 5});
  EXPECT_NEAR(mad_accuracy(logits, target, first3).item<double>(), 0.75, 1e-6);
  EXPECT_NEAR(mad_accuracy(logits, target, torch::zeros({1, 5}, torch::kBool)).item<double>(), 0.0, 1e-9);
}

TEST(MadAccuracy, MatchesCountsByClass) {
  torch::manual_seed(5);
  const int64_t B = 6, T = 9, V = 7;
  auto logits = torch::randn({B, T, V});
  auto target = torch::randint(-1, V - 2, {B, T});  // classes V-2, V-1 only ever predicted
  auto mask = torch::rand({B, T}).lt(0.8);
  auto p = logits.argmax(-1);
  std::vector<double> support(V), predicted(V), tp(V);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t y = target[b][t].item<int64_t>(), yhat = p[b][t].item<int64_t>();
      if (y < 0 || !mask[b][t].item<bool>()) continue;
      support[y] += 1, predicted[yhat] += 1, tp[y] += y == yhat;
    }
  double sum = 0, classes = 0;
  for (int64_t c = 0; c < V; ++c)
    if (support[c] + predicted[c] > 0) sum += support[c] > 0 ? tp[c] / support[c] : 0.0, classes += 1;
  EXPECT_NEAR(mad_accuracy(logits, target, mask).item<double>(), sum / classes, 1e-6);
}

TEST(CountCorrect, LastScoredPositionOfEachRow) {
  // B=3, T=3, V=2; argmax: row 0 = 1,1,0; row 1 = 0,0,0; row 2 = 1,0,1.
  auto logits = torch::zeros({3, 3, 2});
  for (auto [b, t] : std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {2, 0}, {2, 2}}) logits[b][t][1] = 1;
  for (auto [b, t] : std::vector<std::pair<int, int>>{{0, 2}, {1, 0}, {1, 1}, {1, 2}, {2, 1}}) logits[b][t][0] = 1;
  // row 0: last scored position 1 (right), row 1: position 2 (wrong), row 2: nothing scored
  auto target = torch::tensor({1L, 1L, -1L, 0L, 0L, 1L, -1L, -1L, -1L}).reshape({3, 3});
  const Hits h = count_hits(logits, target);
  EXPECT_EQ(h.correct.item<int64_t>(), 4);
  EXPECT_EQ(h.count.item<int64_t>(), 5);
  EXPECT_EQ(h.correct_last.item<int64_t>(), 1);
  EXPECT_EQ(h.count_last.item<int64_t>(), 2);
}

namespace {

// Batches of one target per row at a random position (row 0 has none), and two copies of a small model of the
// same weights: one trains with target_rows, one on every position.
Batch one_target_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  torch::manual_seed(seed);
  auto in = torch::randint(1, V, {B, T});
  auto tg = torch::full({B, T}, -1, torch::kLong);
  for (int64_t i = 1; i < B; ++i) tg[i][torch::randint(0, T, {1}).item<int64_t>()] = torch::randint(0, V, {1}).item<int64_t>();
  return memlab::testing::tensors_batch(in, tg, std::vector<int64_t>(B, T));
}

Config rows_config(const std::string& mixer, int64_t layers) {
  Config c(full_schema());
  c.set_value("model.name", mixer, "test");
  c.set_value("model.hidden", "16", "test");
  c.set_value("model.heads", "2", "test");
  c.set_value("model.layers", std::to_string(layers), "test");
  c.set_value("model.mlp_inner", "24", "test");
  c.set_value("model.init_std", "0.3", "test");
  c.set_value("model.kernels", "torch", "test");
  return c;
}

}  // namespace

// forward_rows is forward read at one position per row (fp64, solo and packed with each member's own rows), and
// a training step on those rows is the step on every position: losses, counts, gradient norms and parameters
// over three steps (fp32), for an attention, a recurrent and a hybrid mixer, with one and two blocks.
TEST(TargetRows, StepEqualsTheStepOnEveryPosition) {
  constexpr int64_t V = 5, B = 6, T = 7;
  for (const std::string mixer : {"transformer", "deltanet", "hqlt"}) {
    for (int64_t layers : {1, 2}) {
      SCOPED_TRACE(mixer + " layers " + std::to_string(layers));
      const Config c = rows_config(mixer, layers);
      {
        torch::manual_seed(3);
        SequenceModel m(c, V);
        m->to(torch::kDouble);
        const Batch b = one_target_batch(B, T, V, 11);
        auto tokens = torch::tensor(b.input).view({B, T});
        auto rows = torch::randint(0, T, {B});
        auto full = m->forward(tokens).gather(1, rows.view({B, 1, 1}).expand({B, 1, V})).squeeze(1);
        EXPECT_LT((m->forward_rows(tokens, rows) - full).abs().max().item<double>(), 1e-12);
        // packed: member k reads its own tokens [..., k] at its own rows [:, k]
        const int64_t K = 2;
        SequenceModel p(c, V, K);
        std::vector<SequenceModel> solo{m, SequenceModel(c, V)};
        solo[1]->to(torch::kDouble);
        p->to(torch::kDouble);
        pack_members(p, solo);
        auto ptok = torch::stack({tokens, tokens.flip(1)}, -1), prow = torch::stack({rows, rows.flip(0)}, -1);
        auto pfull = p->forward(ptok).gather(1, prow.view({B, 1, K, 1}).expand({B, 1, K, V})).squeeze(1);
        EXPECT_LT((p->forward_rows(ptok, prow) - pfull).abs().max().item<double>(), 1e-12);
      }
      std::vector<TrainStepOptions> forms;
      for (bool rows : {true, false}) {
        TrainStepOptions so;
        so.vocab = V;
        so.clip = 0.5;
        so.target_rows = rows;
        forms.push_back(so);
      }
      auto [models, opts, steps] = memlab::testing::step_forms(c, V, 5, {}, torch::Device(torch::kCPU), forms);
      for (uint64_t s = 0; s < 3; ++s) {
        const Batch b = one_target_batch(B, T, V, 20 + s);
        for (auto& st : steps) st->run(b, 1e-2);
      }
      EXPECT_NEAR(steps[0]->loss_sum.item<double>(), steps[1]->loss_sum.item<double>(), 1e-5);
      const double gnorm = steps[1]->gnorm_sum.item<double>();  // large at this init: fp32 rounding is relative
      EXPECT_NEAR(steps[0]->gnorm_sum.item<double>(), gnorm, 2e-5 * gnorm);
      EXPECT_EQ(steps[0]->correct.item<int64_t>(), steps[1]->correct.item<int64_t>());
      EXPECT_EQ(steps[0]->scored.item<int64_t>(), 3 * (B - 1));
      EXPECT_EQ(steps[1]->scored.item<int64_t>(), 3 * (B - 1));
      auto a = models[0]->parameters(), z = models[1]->parameters();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_LT((a[i] - z[i]).abs().max().item<double>(), 2e-5) << "parameter " << i;
    }
  }
}


// The plan against a direct reading of the sorted lengths, and assignment: every row once, each within its bucket.
TEST(LengthBuckets, PlanAndAssignment) {
  std::vector<int64_t> a{5, 1, 9, 3, 3, 7, 2, 8, 10, 4}, z{2, 2, 2, 2, 2, 6, 6, 6, 6, 6};
  // margin 0: bucket j ends at the longest of its rows (the longer member's); the last at `longest`
  auto p = plan_length_buckets({a}, 2, 12, 0);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].rows, 5);
  EXPECT_EQ(p[0].len, 4);  // sorted a: 1 2 3 3 4 | 5 7 8 9 10
  EXPECT_EQ(p[1].rows, 5);
  EXPECT_EQ(p[1].len, 12);
  p = plan_length_buckets({a, z}, 2, 12, 0);
  EXPECT_EQ(p[0].len, 4);
  p = plan_length_buckets({z, a}, 3, 10, 0);  // rows 3, 3, 4; ends at ranks 2 and 5
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].len, 3);
  EXPECT_EQ(p[1].len, 6);
  EXPECT_EQ(p[0].rows + p[1].rows + p[2].rows, 10);
  // a margin of one standard deviation (sqrt(10 x 0.5 x 0.5) = 1.58, so 2 rows further on)
  p = plan_length_buckets({a}, 2, 12, 1);
  EXPECT_EQ(p[0].len, 7);
  // a bucket as long as the next is merged into it: equal lengths give one bucket
  p = plan_length_buckets({std::vector<int64_t>(8, 6)}, 4, 6, 0);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].rows, 8);
  p = plan_length_buckets({a}, 2, 12, 10);  // a margin past the last row: no split, even below `longest`
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].len, 12);

  p = plan_length_buckets({a}, 3, 10, 0);
  for (const auto& needed : {a, std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 10}}) {
    auto rows = assign_length_buckets(needed, p);
    ASSERT_EQ(rows.size(), p.size());
    std::vector<int> seen(needed.size(), 0);
    for (size_t j = 0; j < rows.size(); ++j) {
      EXPECT_EQ(static_cast<int64_t>(rows[j].size()), p[j].rows);
      for (int64_t r : rows[j]) {
        ++seen[r];
        if (j + 1 < rows.size()) EXPECT_LE(needed[r], p[j].len);
      }
    }
    for (int c : seen) EXPECT_EQ(c, 1);
  }
  EXPECT_TRUE(assign_length_buckets({9, 9, 9, 9, 9, 9, 9, 9, 9, 9}, p).empty());  // too long for the first buckets

  Batch b = memlab::testing::varlen_batch(6, 5, 4, 3, false);
  auto n = needed_lengths(b);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(n[i], b.lengths[i]);
  b.target.assign(30, -1);
  EXPECT_EQ(needed_lengths(b), std::vector<int64_t>(6, 1));
}

// train.length_buckets auto splits only a packed step of 6 or more runs on CUDA, and never an autoencoder's batch;
// explicit values pass through, and the autoencoder refuses them.
TEST(LengthBuckets, AutoSplitsOnlyAFullGpuStep) {
  EXPECT_EQ(auto_length_buckets(6, true), 3);
  EXPECT_EQ(auto_length_buckets(12, true), 3);
  EXPECT_EQ(auto_length_buckets(5, true), 1);
  EXPECT_EQ(auto_length_buckets(6, false), 1);
  Config c = rows_config("deltanet", 1);
  c.set_value("task.name", "parity", "test");
  auto task = make_task(c);
  EXPECT_EQ(c.get_string("train.length_buckets"), "auto");  // the default
  EXPECT_EQ(train_step_options(c, *task, false).length_buckets, 0);
  c.set_value("train.length_buckets", "2", "test");
  EXPECT_EQ(train_step_options(c, *task, false).length_buckets, 2);
  c.set_value("model.head", "autoencoder", "test");
  EXPECT_THROW(train_step_options(c, *task, false), UserError);
  c.set_value("train.length_buckets", "auto", "test");
  EXPECT_EQ(train_step_options(c, *task, false).length_buckets, 1);
  // on the CPU, auto leaves a packed step of 6 whole, where 3 buckets would split its batches
  c.set_value("model.head", "lm", "test");
  for (const std::string n : {"auto", "3"}) {
    c.set_value("train.length_buckets", n, "test");
    torch::manual_seed(1);
    SequenceModel m(c, 4, 6);
    AdamW opt(m->parameters(), AdamWOptions{}, weight_decay_mask(*m), std::vector<double>(6, 0.0));
    TrainStepOptions so = train_step_options(c, *task, false);
    so.vocab = 4;
    so.member_clip.assign(6, 1.0);
    so.bucket_margin = 0;
    TrainStep st(m, opt, torch::Device(torch::kCPU), so, 0);
    std::vector<Batch> b;
    for (int64_t k = 0; k < 6; ++k) b.push_back(memlab::testing::varlen_batch(12, 9, 4, 20 + k, so.target_rows));
    st.run(b, std::vector<double>(6, 1e-3));
    EXPECT_EQ(st.length_plan().size(), n == "auto" ? 1u : 3u) << n;
  }
}

// A step on a batch split by length is the step on the whole batch (fp32): losses, counts, gradient norms and
// parameters over several steps, solo for an attention, a recurrent and a hybrid mixer, on every position and at
// target rows, and packed. Some batches fit the buckets and some run whole. The model's output on a prefix is
// checked in fp64; in fp32 DeltaNet's form rounds differently at other lengths (about 1e-4 of the gradient norm
// at this init), hence the wider bounds than TargetRows'.
TEST(LengthBuckets, StepEqualsTheWholeStep) {
  constexpr int64_t V = 5, B = 12, T = 9, K = 2;
  for (const std::string mixer : {"transformer", "deltanet", "hqlt", "mamba2"}) {
    for (bool rows : {true, false}) {
      for (int64_t members : {int64_t{1}, K}) {
        if (members > 1 && mixer != "deltanet" && mixer != "hqlt") continue;
        SCOPED_TRACE(mixer + (rows ? " target rows" : " every position") + " members " + std::to_string(members));
        const Config c = rows_config(mixer, 2);
        if (rows && members == 1) {  // fp64: the model read on a prefix is the prefix of the model's output
          torch::manual_seed(4);
          SequenceModel m(c, V);
          m->to(torch::kDouble);
          auto tokens = torch::randint(1, V, {B, T});
          auto whole = m->forward(tokens);
          for (int64_t L : {1, 4, 7})
            EXPECT_LT((m->forward(tokens.narrow(1, 0, L)) - whole.narrow(1, 0, L)).abs().max().item<double>(), 1e-11)
                << "prefix " << L;
        }
        std::vector<TrainStepOptions> forms;
        for (int64_t buckets : {3, 1}) {
          TrainStepOptions so;
          so.vocab = V;
          so.clip = 0.5;
          if (members > 1) so.member_clip = {0.5, 0.0};
          so.target_rows = rows;
          so.length_buckets = buckets;
          so.bucket_margin = 0;
          forms.push_back(so);
        }
        auto [models, opts, steps] = memlab::testing::step_forms(
            c, V, 5, members == 1 ? std::vector<double>{} : std::vector<double>{0.0, 0.1}, torch::Device(torch::kCPU),
            forms);
        constexpr int n_steps = 5;
        for (uint64_t s = 0; s < n_steps; ++s) {
          std::vector<Batch> b;
          // at step 2 every row is as long as the batch: it cannot fit the buckets
          for (int64_t k = 0; k < members; ++k)
            b.push_back(memlab::testing::varlen_batch(B, T, V, 60 + 10 * k + s, rows, s == 2 ? T : 1));
          for (auto& st : steps) st->run(b, std::vector<double>(members, 1e-2));
        }
        EXPECT_GE(steps[0]->whole_steps(), 1);
        EXPECT_LT(steps[0]->whole_steps(), n_steps);
        EXPECT_EQ(steps[1]->whole_steps(), 0);
        for (int64_t k = 0; k < members; ++k) {
          auto pick = [&](const torch::Tensor& t) { return members == 1 ? t : t[k]; };
          const double loss = pick(steps[1]->loss_sum).item<double>();
          EXPECT_NEAR(pick(steps[0]->loss_sum).item<double>(), loss, 1e-5 * loss);
          const double gnorm = pick(steps[1]->gnorm_sum).item<double>();
          EXPECT_NEAR(pick(steps[0]->gnorm_sum).item<double>(), gnorm, 5e-4 * gnorm);
          EXPECT_EQ(pick(steps[0]->correct).item<int64_t>(), pick(steps[1]->correct).item<int64_t>());
          EXPECT_EQ(pick(steps[0]->scored).item<int64_t>(), pick(steps[1]->scored).item<int64_t>());
        }
        auto a = models[0]->parameters(), z = models[1]->parameters();
        for (size_t i = 0; i < a.size(); ++i)
          EXPECT_LT((a[i] - z[i]).abs().max().item<double>(), 1e-4) << "parameter " << i;
      }
    }
  }
}

// A batch with two targets in a row is a task's bug under target_rows: the step refuses it instead of scoring one.
TEST(TargetRows, RefusesARowOfTwoTargets) {
  const Config c = rows_config("deltanet", 1);
  SequenceModel m(c, 5);
  AdamW opt(m->parameters(), AdamWOptions{}, weight_decay_mask(*m));
  TrainStepOptions so;
  so.vocab = 5;
  so.target_rows = true;
  TrainStep step(m, opt, torch::Device(torch::kCPU), so, 0);
  Batch b = one_target_batch(3, 4, 5, 1);
  b.target[2 * 4 + 0] = 1;
  b.target[2 * 4 + 3] = 2;
  EXPECT_THROW(step.run(b, 1e-2), std::logic_error);
}

// Packed: each member's loss, counts, gradient norm and parameters step as on every position, with the members'
// batches putting their targets at different positions.
TEST(TargetRows, PackedStepEqualsThePackedStepOnEveryPosition) {
  constexpr int64_t V = 5, B = 5, T = 6, K = 2;
  const Config c = rows_config("deltanet", 2);
  std::vector<TrainStepOptions> forms;
  for (bool rows : {true, false}) {
    TrainStepOptions so;
    so.vocab = V;
    so.member_clip = {0.5, 0.0};
    so.target_rows = rows;
    forms.push_back(so);
  }
  auto [models, opts, steps] = memlab::testing::step_forms(c, V, 7, {0.0, 0.1}, torch::Device(torch::kCPU), forms);
  for (uint64_t s = 0; s < 3; ++s) {
    const std::vector<Batch> b{one_target_batch(B, T, V, 40 + s), one_target_batch(B, T, V, 50 + s)};
    for (auto& st : steps) st->run(b, {1e-2, 3e-3});
  }
  for (int64_t k = 0; k < K; ++k) {
    SCOPED_TRACE("member " + std::to_string(k));
    EXPECT_NEAR(steps[0]->loss_sum[k].item<double>(), steps[1]->loss_sum[k].item<double>(), 1e-5);
    const double gnorm = steps[1]->gnorm_sum[k].item<double>();
    EXPECT_NEAR(steps[0]->gnorm_sum[k].item<double>(), gnorm, 2e-5 * gnorm);
    EXPECT_EQ(steps[0]->correct[k].item<int64_t>(), steps[1]->correct[k].item<int64_t>());
    EXPECT_EQ(steps[0]->scored[k].item<int64_t>(), 3 * (B - 1));
  }
  auto a = models[0]->parameters(), z = models[1]->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT((a[i] - z[i]).abs().max().item<double>(), 2e-5) << "parameter " << i;
}
