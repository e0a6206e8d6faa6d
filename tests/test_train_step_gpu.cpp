// The training step on the GPU with its batch split by length (train.length_buckets): captured as a CUDA graph,
// with batches that do not fit the buckets running whole and eagerly between replays, it moves the weights as the
// eager step on the whole batch does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "models/sequence_model.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/train_step.h"
#include "tests/test_batches.h"

using namespace memlab;

TEST(TrainStepGpu, GraphedLengthBucketsStepAsTheWholeBatch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t V = 6, B = 64, T = 24, steps = 12;
  Config c(full_schema());
  c.set_value("model.name", "deltanet", "test");
  c.set_value("model.hidden", "64", "test");
  c.set_value("model.heads", "2", "test");
  c.set_value("model.layers", "2", "test");
  const torch::Device cuda(torch::kCUDA);
  for (int64_t members : {1, 3}) {
    for (bool rows : {true, false}) {
      SCOPED_TRACE(std::string(rows ? "target rows" : "every position") + ", members " + std::to_string(members));
      std::vector<SequenceModel> models;
      std::vector<std::unique_ptr<AdamW>> opts;
      std::vector<std::unique_ptr<TrainStep>> st;
      for (bool split : {true, false}) {
        torch::manual_seed(3);
        models.push_back(members == 1 ? SequenceModel(c, V) : SequenceModel(c, V, members));
        models.back()->to(cuda);
        opts.push_back(std::make_unique<AdamW>(models.back()->parameters(), AdamWOptions{},
                                               weight_decay_mask(*models.back()),
                                               members == 1 ? std::vector<double>{} : std::vector<double>(members, 0.1)));
        TrainStepOptions so;
        so.vocab = V;
        if (members > 1) so.member_clip.assign(members, 1.0);
        so.target_rows = rows;
        so.cuda_graph = split;
        so.graph_length = T;
        so.length_buckets = split ? 3 : 1;
        so.bucket_margin = 2;  // most batches fit, so the graph is captured by step 4
        st.push_back(std::make_unique<TrainStep>(models.back(), *opts.back(), cuda, so, 0));
      }
      for (int64_t s = 0; s < steps; ++s) {
        std::vector<Batch> b;
        // steps 6 and 9 (after the capture): every row as long as the batch, so they run whole
        for (int64_t k = 0; k < members; ++k)
          b.push_back(memlab::testing::varlen_batch(B, T, V, 100 + 17 * k + s, rows, s == 6 || s == 9 ? T : 1));
        for (auto& x : st) x->run(b, std::vector<double>(members, 3e-3));
      }
      EXPECT_EQ(st[0]->mode(), "cuda graph");
      EXPECT_GE(st[0]->whole_steps(), 2);
      EXPECT_LT(st[0]->whole_steps(), steps - 4);
      auto l0 = st[0]->loss_sum.cpu().reshape({-1}), l1 = st[1]->loss_sum.cpu().reshape({-1});
      auto g0 = st[0]->gnorm_sum.cpu().reshape({-1}), g1 = st[1]->gnorm_sum.cpu().reshape({-1});
      EXPECT_LT(((l0 - l1).abs() / l1).max().item<double>(), 1e-4);
      EXPECT_LT(((g0 - g1).abs() / g1).max().item<double>(), 1e-3);
      EXPECT_TRUE(st[0]->scored.cpu().equal(st[1]->scored.cpu()));
      // AdamW moves a weight of near-zero gradient by about lr whichever way rounding tips it: a looser bound
      auto a = models[0]->parameters(), z = models[1]->parameters();
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LT((a[i] - z[i]).abs().max().item<double>(), 2e-3) << "parameter " << i;
    }
  }
}
