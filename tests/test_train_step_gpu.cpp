// The training step on the GPU with its batch split by length (train.length_buckets): one step's gradients are the
// whole batch's, and captured as a CUDA graph, with batches that do not fit the buckets running whole and eagerly
// between replays, it replays the eager split step exactly. Packed Mesa, sLSTM, mLSTM and xLSTM layers on their
// kernels compute each member's solo model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "models/sequence_model.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/train_step.h"
#include "tests/step_forms.h"
#include "tests/test_batches.h"

using namespace memlab;

namespace {
Config gpu_test_config() {
  Config c(full_schema());
  c.set_value("model.name", "deltanet", "test");
  c.set_value("model.hidden", "64", "test");
  c.set_value("model.heads", "2", "test");
  c.set_value("model.layers", "2", "test");
  return c;
}
}  // namespace

// One eager step from the same weights: the split batch's gradients are the whole batch's, parameter by parameter.
TEST(TrainStepGpu, SplitStepGradientsAsTheWholeBatch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t V = 6, B = 64, T = 24;
  const Config c = gpu_test_config();
  const torch::Device cuda(torch::kCUDA);
  for (int64_t members : {1, 3}) {
    for (bool rows : {true, false}) {
      SCOPED_TRACE(std::string(rows ? "target rows" : "every position") + ", members " + std::to_string(members));
      std::vector<TrainStepOptions> forms;
      for (int64_t buckets : {3, 1}) {
        TrainStepOptions so;
        so.vocab = V;
        if (members > 1) so.member_clip.assign(members, 1.0);
        so.target_rows = rows;
        so.length_buckets = buckets;
        so.bucket_margin = 0;
        forms.push_back(so);
      }
      auto [models, opts, st] = memlab::testing::step_forms(
          c, V, 3, members == 1 ? std::vector<double>{} : std::vector<double>(members, 0.1), cuda, forms);
      std::vector<Batch> b;
      for (int64_t k = 0; k < members; ++k) b.push_back(memlab::testing::varlen_batch(B, T, V, 7 + k, rows));
      for (auto& x : st) x->run(b, std::vector<double>(members, 3e-3));
      EXPECT_EQ(st[0]->length_plan().size(), 3u);
      EXPECT_EQ(st[0]->whole_steps(), 0);
      auto l0 = st[0]->loss_sum.cpu().reshape({-1}), l1 = st[1]->loss_sum.cpu().reshape({-1});
      EXPECT_LT(((l0 - l1).abs() / l1).max().item<double>(), 1e-5);
      auto a = models[0]->named_parameters(), z = models[1]->named_parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        auto ga = a[i].value().grad(), gz = z[i].value().grad();
        ASSERT_TRUE(ga.defined() && gz.defined()) << a[i].key();
        const double scale = gz.abs().max().item<double>() + 1e-12;
        EXPECT_LT((ga - gz).abs().max().item<double>() / scale, 1e-4) << a[i].key();
      }
    }
  }
}

// The graphed step with its batch split by length replays what the eager split step computes, batches that do not
// fit included (they run whole, eagerly, between replays), step after step; and the eager split step is the whole
// batch's (SplitStepGradientsAsTheWholeBatch, and on the CPU LengthBuckets.StepEqualsTheWholeStep). Beside the whole
// batch over many steps they only agree up to a drift: AdamW's early steps magnify rounding differences (on an H200,
// after 12 steps gradient norms differed 2-10% from the whole batch's, and 1-3% with the whole batch's rows reversed).
TEST(TrainStepGpu, GraphedLengthBucketsStepAsTheEagerOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t V = 6, B = 64, T = 24, steps = 12;
  const Config c = gpu_test_config();
  const torch::Device cuda(torch::kCUDA);
  for (int64_t members : {1, 3}) {
    for (bool rows : {true, false}) {
      SCOPED_TRACE(std::string(rows ? "target rows" : "every position") + ", members " + std::to_string(members));
      std::vector<TrainStepOptions> forms;
      for (int form : {0, 1, 2}) {  // split graphed, split eager, whole eager
        TrainStepOptions so;
        so.vocab = V;
        if (members > 1) so.member_clip.assign(members, 1.0);
        so.target_rows = rows;
        so.cuda_graph = form == 0;
        so.graph_length = T;
        so.length_buckets = form == 2 ? 1 : 3;
        so.bucket_margin = 2;  // most batches fit, so the graph is captured by step 4
        forms.push_back(so);
      }
      auto [models, opts, st] = memlab::testing::step_forms(
          c, V, 3, members == 1 ? std::vector<double>{} : std::vector<double>(members, 0.1), cuda, forms);
      for (int64_t s = 0; s < steps; ++s) {
        std::vector<Batch> b;
        // steps 6 and 9 (after the capture): every row as long as the batch, so they run whole
        for (int64_t k = 0; k < members; ++k)
          b.push_back(memlab::testing::varlen_batch(B, T, V, 100 + 17 * k + s, rows, s == 6 || s == 9 ? T : 1));
        for (auto& x : st) x->run(b, std::vector<double>(members, 3e-3));
      }
      EXPECT_EQ(st[0]->mode(), "cuda graph");
      EXPECT_EQ(st[1]->mode(), "eager");
      EXPECT_GE(st[0]->whole_steps(), 2);
      EXPECT_LT(st[0]->whole_steps(), steps - 4);
      EXPECT_EQ(st[0]->whole_steps(), st[1]->whole_steps());
      auto l0 = st[0]->loss_sum.cpu().reshape({-1}), l1 = st[1]->loss_sum.cpu().reshape({-1});
      auto g0 = st[0]->gnorm_sum.cpu().reshape({-1}), g1 = st[1]->gnorm_sum.cpu().reshape({-1});
      EXPECT_LT(((l0 - l1).abs() / l1).max().item<double>(), 1e-5);
      EXPECT_LT(((g0 - g1).abs() / g1).max().item<double>(), 1e-4);
      EXPECT_TRUE(st[0]->scored.cpu().equal(st[2]->scored.cpu()));
      EXPECT_TRUE(st[0]->correct.cpu().equal(st[1]->correct.cpu()));
      auto a = models[0]->parameters(), z = models[1]->parameters();
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LT((a[i] - z[i]).abs().max().item<double>(), 1e-5) << "parameter " << i;
    }
  }
}

// Mesa, sLSTM, mLSTM and xLSTM packed on their CUDA kernels: member k of a packed model computes what the k-th solo
// model computes (logits and every parameter's gradient, fp32, an odd length), the kernels seeing the members' heads
// side by side (the packed mLSTM's projection runs tensor ops, one product per member; the solo one the kernel).
TEST(PackedModelGpu, RecurrentMixersMembersAsTheirSoloModels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t V = 6, K = 3, B = 4, T = 37;
  const torch::Device cuda(torch::kCUDA);
  for (const char* mixer : {"mesa", "slstm", "mlstm", "xlstm"}) {
    SCOPED_TRACE(mixer);
    Config c = gpu_test_config();
    c.set_value("model.name", mixer, "test");
    c.set_value("model.kernels", "cuda", "test");
    c.set_value("model.init_std", "0.1", "test");
    std::vector<SequenceModel> solo;
    for (int64_t k = 0; k < K; ++k) {
      torch::manual_seed(static_cast<uint64_t>(20 + k));
      solo.push_back(SequenceModel(c, V));
      torch::NoGradGuard ng;
      for (auto& p : solo.back()->named_parameters())  // weights that start at zero: give them values to read
        if (p.key().find("recurrent_kernel") != std::string::npos || p.key().find("gate_weight") != std::string::npos)
          p.value().normal_(0, 0.3);
    }
    SequenceModel packed(c, V, K);
    pack_members(packed, solo);
    packed->to(cuda);
    for (auto& m : solo) m->to(cuda);
    torch::manual_seed(5);
    auto tokens = torch::randint(0, V, {B, T, K}).to(cuda);
    auto target = torch::randint(0, V, {B, T, K}).to(cuda);
    auto ce = [](const torch::Tensor& logits, const torch::Tensor& t) {
      return torch::nn::functional::cross_entropy(logits.reshape({-1, V}), t.reshape({-1}));
    };
    auto logits = packed->forward(tokens);
    torch::Tensor total = torch::zeros({}, logits.options());
    for (int64_t k = 0; k < K; ++k) total = total + ce(logits.select(2, k), target.select(2, k));
    total.backward();
    for (int64_t k = 0; k < K; ++k) {
      auto y = solo[k]->forward(tokens.select(2, k));
      const double ys = y.abs().max().item<double>();
      EXPECT_LT((y - logits.select(2, k)).abs().max().item<double>() / ys, 1e-4) << "member " << k;
      ce(y, target.select(2, k)).backward();
      auto ps = solo[k]->named_parameters();
      auto pp = packed->parameters();
      ASSERT_EQ(ps.size(), pp.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        auto g = ps[i].value().grad();
        ASSERT_TRUE(g.defined()) << ps[i].key();
        auto gp = pp[i].grad().view({K, -1}).select(0, k);
        const double scale = g.abs().max().item<double>() + 1e-12;
        EXPECT_LT((g.reshape(-1) - gp).abs().max().item<double>() / scale, 1e-3) << "member " << k << ", " << ps[i].key();
      }
    }
  }
}
