// Packed runs: a packed model's member computes what its solo model computes (outputs and gradients, fp64), the
// packed optimiser step is each member's solo step, a NaN in one member leaves the others bitwise unchanged, and
// a packed `memlab train` run writes each member's directory as its solo run would (CPU, fp32, to rounding),
// resumable alone.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>

#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/run_files.h"
#include "models/sequence_model.h"
#include "tasks/task.h"
#include "tests/test_batches.h"
#include "tests/mixer_check.h"
#include "train/evaluate.h"
#include "train/optimizer.h"
#include "train/train_step.h"
#include "train/trainer.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

constexpr int64_t kVocab = 5;

Config small_config(const std::string& mixer, const std::vector<std::string>& sets = {}) {
  Config c(full_schema());
  c.set_value("model.name", mixer, "test");
  c.set_value("model.hidden", "16", "test");
  c.set_value("model.heads", "2", "test");
  c.set_value("model.layers", "2", "test");
  c.set_value("model.mlp_inner", "24", "test");  // not a multiple of 8: linear_stack pads each member's rows
  c.set_value("model.init_std", "0.3", "test");
  c.set_value("model.kernels", "torch", "test");
  for (const auto& s : sets) c.set(s, "test");
  return c;
}

std::vector<SequenceModel> solo_models(const Config& c, int64_t K) {
  std::vector<SequenceModel> out;
  for (int64_t k = 0; k < K; ++k) {
    torch::manual_seed(static_cast<uint64_t>(10 + k));
    out.push_back(SequenceModel(c, kVocab));
    out.back()->to(torch::kDouble);
  }
  return out;
}

// Per-member mean cross entropy of logits [..., V] against targets.
torch::Tensor member_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), target.reshape({-1}));
}

}  // namespace

// Member k of a packed model equals the k-th solo model: logits and every parameter's gradient, in fp64, for each
// mixer (HQLT in both mixings whose gates are per head or per channel; Mesa with its gated output norm; the mLSTM's
// gates, which read only their member's q, k and v; xLSTM stacking mLSTM and sLSTM blocks).
TEST(PackedModel, MemberEqualsItsSoloModel) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"transformer", {}},
      {"deltanet", {"model.deltanet.short_conv=true", "model.deltanet.out_gate=true"}},
      {"gated_deltanet", {"model.gated_deltanet.short_conv=true"}},
      {"linear_attention", {}},
      {"hqlt", {"model.hqlt.mixing=vector"}},
      {"hqlt", {"model.hqlt.mixing=scalar", "model.hqlt.variant=delayed_stream", "model.hqlt.window=3"}},
      {"mamba2", {}},
      {"mamba2", {"model.mamba2.ngroups=2", "model.mamba2.neg_eigval=true", "model.mamba2.chunk=4"}},
      {"mesa", {"model.mesa.out_gate=true", "model.mesa.chunk=4"}},
      {"slstm", {}},
      {"mlstm", {"model.mlstm.proj_factor=1.5", "model.mlstm.chunk=4"}},
      {"xlstm", {}},
  };
  const int64_t K = 3, B = 2, T = 11;
  for (const auto& [mixer, sets] : cases) {
    SCOPED_TRACE(mixer + (sets.empty() ? "" : " " + sets[0]));
    const Config c = small_config(mixer, sets);
    auto solo = solo_models(c, K);
    {  // xlstm's zero inits of the sLSTM's recurrence and the mLSTM's gate weights would leave them unread
      torch::NoGradGuard ng;
      for (auto& m : solo)
        for (auto& p : m->named_parameters())
          if (p.key().find("recurrent_kernel") != std::string::npos || p.key().find("gate_weight") != std::string::npos)
            p.value().normal_(0, 0.3);
    }
    SequenceModel packed(c, kVocab, K);
    packed->to(torch::kDouble);
    pack_members(packed, solo);
    auto tokens = torch::randint(0, kVocab, {B, T, K});
    auto target = torch::randint(0, kVocab, {B, T, K});
    auto logits = packed->forward(tokens);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{B, T, K, kVocab}));
    torch::Tensor total = torch::zeros({}, torch::kDouble);
    for (int64_t k = 0; k < K; ++k) total = total + member_loss(logits.select(2, k), target.select(2, k));
    total.backward();
    for (int64_t k = 0; k < K; ++k) {
      auto y = solo[k]->forward(tokens.select(2, k));
      EXPECT_LT((y - logits.select(2, k)).abs().max().item<double>(), 1e-10) << "member " << k;
      member_loss(y, target.select(2, k)).backward();
      auto ps = solo[k]->parameters(), pp = packed->parameters();
      ASSERT_EQ(ps.size(), pp.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        ASSERT_TRUE(ps[i].grad().defined());
        auto g = pp[i].grad().view({K, -1}).select(0, k);
        EXPECT_LT((ps[i].grad().reshape(-1) - g).abs().max().item<double>(), 1e-10)
            << "member " << k << ", parameter " << i;
      }
    }
    // member_parameters views the packed slices in the solo shapes' order
    auto views = member_parameters(packed, 1);
    auto ps = solo[1]->parameters();
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(torch::equal(views[i], ps[i].reshape(-1)));
  }
}

TEST(PackedModel, RefusesAnAutoencoderHead) {
  const Config c = small_config("deltanet", {"model.head=autoencoder"});
  try {
    SequenceModel packed(c, kVocab, 2);
    ADD_FAILURE() << "an autoencoder packed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be packed"), std::string::npos) << e.what();
  }
}

namespace {

// A packed model of two deltanet members and its optimiser, with member 0's weight decay and learning rate apart.
struct PackedSetup {
  SequenceModel model{nullptr};
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<TrainStep> step;
};

PackedSetup packed_setup(const Config& c, int64_t K, torch::Dtype dtype = torch::kFloat) {
  PackedSetup s;
  auto solo = solo_models(c, K);
  s.model = SequenceModel(c, kVocab, K);
  pack_members(s.model, solo);
  s.model->to(dtype);
  std::vector<double> decay;
  for (int64_t k = 0; k < K; ++k) decay.push_back(0.1 * static_cast<double>(k));
  s.opt = std::make_unique<AdamW>(s.model->parameters(), AdamWOptions{}, weight_decay_mask(*s.model), decay);
  TrainStepOptions so;
  so.vocab = kVocab;
  for (int64_t k = 0; k < K; ++k) so.member_clip.push_back(k == 0 ? 0.0 : 0.5);
  s.step = std::make_unique<TrainStep>(s.model, *s.opt, torch::Device(torch::kCPU), so, 0);
  return s;
}

Batch random_batch(int64_t B, int64_t T, uint64_t seed) {
  torch::manual_seed(seed);
  Batch b;
  b.B = B;
  b.T = T;
  auto in = torch::randint(1, kVocab, {B * T}), tg = torch::randint(0, kVocab, {B * T});
  b.input.assign(in.data_ptr<int64_t>(), in.data_ptr<int64_t>() + B * T);
  b.target.assign(tg.data_ptr<int64_t>(), tg.data_ptr<int64_t>() + B * T);
  return b;
}

}  // namespace

// The packed optimiser step is each member's solo step (its lr, weight decay, clipping), and a member made NaN
// stops alone: the other members' parameters are bitwise those of the same steps without the NaN.
void check_packed_steps(const Config& c, torch::Dtype dtype) {
  const int64_t K = 3, steps = 3;
  // fp32: rounding, which Adam's first steps magnify where a gradient is near 0 (a wrong learning rate or weight
  // decay moves parameters by 1e-3 or more); in fp64, the step's fp32 sums and clip scales
  const bool fp64 = dtype == torch::kDouble;
  const double loss_tol = fp64 ? 5e-6 : 1e-5, gnorm_tol = fp64 ? 1e-6 : 2e-5, param_tol = fp64 ? 1e-7 : 2e-4;
  auto clean = packed_setup(c, K, dtype), poisoned = packed_setup(c, K, dtype);
  {
    torch::NoGradGuard ng;
    member_parameters(poisoned.model, 1)[3].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  // each member's solo run of the same steps, for the clean pack
  std::vector<SequenceModel> solo = solo_models(c, K);
  std::vector<std::unique_ptr<AdamW>> solo_opt;
  std::vector<std::unique_ptr<TrainStep>> solo_step;
  for (int64_t k = 0; k < K; ++k) {
    solo[k]->to(dtype);
    AdamWOptions o;
    o.weight_decay = 0.1 * static_cast<double>(k);
    solo_opt.push_back(std::make_unique<AdamW>(solo[k]->parameters(), o, weight_decay_mask(*solo[k])));
    TrainStepOptions so;
    so.vocab = kVocab;
    so.clip = k == 0 ? 0.0 : 0.5;
    solo_step.push_back(std::make_unique<TrainStep>(solo[k], *solo_opt[k], torch::Device(torch::kCPU), so, 0));
  }
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<Batch> batches;
    std::vector<double> lrs;
    for (int64_t k = 0; k < K; ++k) {
      batches.push_back(random_batch(4, 6 + k, static_cast<uint64_t>(100 * s + k)));  // lengths differ: padded
      lrs.push_back(1e-2 * static_cast<double>(k + 1));
      solo_step[k]->run(batches.back(), lrs.back());
    }
    clean.step->run(batches, lrs);
    poisoned.step->run(batches, lrs);
  }
  EXPECT_TRUE(torch::equal(clean.step->first_bad, torch::full({K}, -1, torch::kLong)));
  EXPECT_EQ(poisoned.step->first_bad[1].item<int64_t>(), 1);
  EXPECT_EQ(poisoned.step->first_bad[0].item<int64_t>(), -1);
  EXPECT_EQ(poisoned.step->first_bad[2].item<int64_t>(), -1);
  for (int64_t k : {0, 2}) {
    auto a = member_parameters(clean.model, k), b = member_parameters(poisoned.model, k);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "member " << k << " parameter " << i;
    EXPECT_EQ(clean.step->loss_sum[k].item<double>(), poisoned.step->loss_sum[k].item<double>());
  }
  for (int64_t k = 0; k < K; ++k) {
    SCOPED_TRACE("member " + std::to_string(k));
    EXPECT_NEAR(clean.step->loss_sum[k].item<double>(), solo_step[k]->loss_sum.item<double>(), loss_tol);
    const double gnorm = solo_step[k]->gnorm_sum.item<double>();
    EXPECT_NEAR(clean.step->gnorm_sum[k].item<double>(), gnorm, gnorm_tol * gnorm);
    EXPECT_EQ(clean.step->correct[k].item<int64_t>(), solo_step[k]->correct.item<int64_t>());
    auto packed_p = member_parameters(clean.model, k);
    auto solo_p = solo[k]->parameters();
    for (size_t i = 0; i < solo_p.size(); ++i)
      EXPECT_LT((packed_p[i] - solo_p[i].reshape(-1)).abs().max().item<double>(), param_tol) << "parameter " << i;
  }
}

// fp32 for DeltaNet, as training runs; fp64 for every recurrent mixer, whose fp32 steps differ from the solo
// runs' by rounding that Adam magnifies (Mesa at this test's init has gradient norms near 130)
TEST(PackedStep, MembersStepAsAloneAndANanStaysInItsMember) {
  const std::vector<std::pair<std::string, torch::Dtype>> cases = {
      {"deltanet", torch::kFloat}, {"deltanet", torch::kDouble}, {"mamba2", torch::kDouble},
      {"mesa", torch::kDouble},    {"slstm", torch::kDouble},    {"mlstm", torch::kDouble},
      {"xlstm", torch::kDouble}};
  for (const auto& [mixer, dtype] : cases) {
    SCOPED_TRACE(mixer + (dtype == torch::kDouble ? " fp64" : " fp32"));
    std::vector<std::string> sets;
    if (mixer == "deltanet") sets = {"model.deltanet.short_conv=true"};
    if (mixer == "mesa") sets = {"model.mesa.out_gate=true", "model.mesa.chunk=4"};
    if (mixer == "mlstm") sets = {"model.mlstm.chunk=4"};
    check_packed_steps(small_config(mixer, sets), dtype);
  }
}

namespace {

Config run_config(const std::string& mixer, int64_t seed, double lr) {
  Config c = small_config(mixer, {"task.name=parity", "task.train_len=[3, 12]", "task.eval_len=[12, 20]",
                                  "train.steps=6", "train.batch_size=16", "train.warmup=2", "train.log_every=1",
                                  "train.checkpoint_every=3", "eval.every=3", "eval.n=32", "eval.batch_size=16",
                                  "train.device=cpu", "train.tensorboard=false"});
  c.set_value("train.seed", std::to_string(seed), "test");
  c.set_value("train.lr", fmt::format("{}", lr), "test");
  return c;
}

std::string temp_dir(const std::string& name) {
  auto d = ::testing::TempDir() + "memlab_packed_" + name + "_" + std::to_string(::getpid());
  remove_tree(d);
  return d;
}

}  // namespace

// memlab train with --seeds/--lrs: every member's directory holds the files of its solo run, its loss curve and
// evaluation equal the solo run's to fp32 rounding, and a member resumes alone.
TEST(PackedRun, MembersWriteTheirSoloRuns) {
  for (const std::string mixer : {"deltanet", "transformer"}) {
    SCOPED_TRACE(mixer);
    const std::string root = temp_dir(mixer);
    const std::vector<std::pair<int64_t, double>> grid = {{1, 3e-3}, {2, 1e-2}, {3, 3e-3}};
    std::vector<Config> cfgs;
    std::vector<const Config*> ptrs;
    std::vector<std::string> dirs;
    for (const auto& [seed, lr] : grid) cfgs.push_back(run_config(mixer, seed, lr));
    for (size_t k = 0; k < grid.size(); ++k) {
      ptrs.push_back(&cfgs[k]);
      dirs.push_back(join_path(root, "packed" + std::to_string(k)));
      TrainRequest req;
      req.out_dir = join_path(root, "solo" + std::to_string(k));
      ASSERT_EQ(run_training(cfgs[k], req), 0);
    }
    ASSERT_EQ(run_packed_training(ptrs, dirs, false), 0);
    for (size_t k = 0; k < grid.size(); ++k) {
      const std::string solo = join_path(root, "solo" + std::to_string(k));
      for (const char* f : {"config.yaml", "train.csv", "eval.csv", "summary.md", "checkpoint.pt", "log.txt"})
        EXPECT_TRUE(path_exists(join_path(dirs[k], f))) << dirs[k] << "/" << f;
      EXPECT_EQ(read_file(join_path(solo, "config.yaml")), read_file(join_path(dirs[k], "config.yaml")));
      auto a = read_train_csv(solo), b = read_train_csv(dirs[k]);
      ASSERT_EQ(a.size(), 6u);
      ASSERT_EQ(b.size(), a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(a[i].loss, b[i].loss, 1e-4 * std::abs(a[i].loss)) << "member " << k << " step " << a[i].step;
        EXPECT_NEAR(a[i].grad_norm, b[i].grad_norm, 1e-3 * std::abs(a[i].grad_norm)) << "step " << a[i].step;
        EXPECT_DOUBLE_EQ(a[i].lr, b[i].lr);
      }
      auto ea = read_eval_csv(solo), eb = read_eval_csv(dirs[k]);
      ASSERT_EQ(ea.size(), eb.size());
      for (size_t i = 0; i < ea.size(); ++i) EXPECT_NEAR(ea[i].accuracy, eb[i].accuracy, 1.0 / 32 + 1e-9);
    }
    // a member resumes alone, as its solo run would
    Config more = cfgs[1];
    more.set_value("train.steps", "8", "test");
    TrainRequest req;
    req.out_dir = dirs[1];
    req.resume = true;
    ASSERT_EQ(run_training(more, req), 0);
    EXPECT_EQ(read_train_csv(dirs[1]).size(), 8u);
    remove_tree(root);
  }
}

TEST(PackedRun, RefusesMembersThatDifferInShapeOrDoNotPack) {
  const std::string root = temp_dir("shape");
  Config a = run_config("deltanet", 1, 1e-3), b = run_config("deltanet", 2, 1e-3);
  b.set_value("model.hidden", "32", "test");
  try {
    run_packed_training({&a, &b}, {join_path(root, "a"), join_path(root, "b")}, false);
    ADD_FAILURE() << "packed runs of two widths";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hidden"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(path_exists(join_path(root, "a")));
  // a model that does not pack (an autoencoder head) is refused before any directory is written
  Config c = run_config("deltanet", 1, 1e-3), d = run_config("deltanet", 2, 1e-3);
  for (Config* x : {&c, &d}) x->set_value("model.head", "autoencoder", "test");
  try {
    run_packed_training({&c, &d}, {join_path(root, "c"), join_path(root, "d")}, false);
    ADD_FAILURE() << "packed autoencoder runs";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be packed"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(path_exists(join_path(root, "c")));
  remove_tree(root);
}

// --pack auto on an H200's memory: the Table 3 setting (batch 1024, hidden 128) fills the GPU with one run's step,
// so its runs pack 12 to a process for the starts and evaluations saved; a small batch packs by its step's work; a
// GPU too small for 12 does not pack a saturating config; the CPU never packs.
TEST(PackedRun, AutoPackLimit) {
  const double h200 = 139.0 * (1 << 30);
  auto table3 = [](const std::string& task, int64_t layers, int64_t batch) {
    Config c(full_schema());
    c.set_value("task.name", task, "test");
    c.set_value("task.train_len", "[3, 40]", "test");
    c.set_value("task.eval_len", "[40, 256]", "test");
    c.set_value("model.name", "deltanet", "test");
    c.set_value("model.hidden", "128", "test");
    c.set_value("model.heads", "4", "test");
    c.set_value("model.layers", std::to_string(layers), "test");
    c.set_value("model.mlp_inner", "0", "test");
    c.set_value("train.batch_size", std::to_string(batch), "test");
    c.set_value("train.device", "cuda", "test");
    c.set_value("eval.batch_size", "1024", "test");
    c.set_value("eval.ranges", "[[3, 40], [40, 256], [40, 64], [65, 128], [129, 256]]", "test");
    return c;
  };
  EXPECT_EQ(auto_pack_limit(table3("parity", 2, 1024), h200), 12);
  EXPECT_EQ(auto_pack_limit(table3("mod_arith", 3, 1024), h200), 12);
  // batch 64: 3.2e7 / (64 x 40 x 128 x 2) = 48 runs' work, capped at 16
  EXPECT_EQ(auto_pack_limit(table3("parity", 2, 64), h200), 16);
  EXPECT_EQ(auto_pack_limit(table3("parity", 2, 1024), 2.0 * (1 << 30)), 1);
  Config cpu = table3("parity", 2, 1024);
  cpu.set_value("train.device", "cpu", "test");
  EXPECT_EQ(auto_pack_limit(cpu, h200), 1);
  // a step split into length buckets counts its activations twice (a misfit batch runs whole beside the buckets'
  // graph pool); auto splits from 6 runs, so where 6 split runs do not fit it packs 5 whole ones
  auto limits = [&](double gib) {
    std::vector<int64_t> k;
    for (const char* n : {"1", "3", "auto"}) {
      Config c = table3("parity", 2, 64);
      c.set_value("train.length_buckets", n, "test");
      k.push_back(auto_pack_limit(c, gib * (1 << 30)));
    }
    return k;
  };
  EXPECT_EQ(limits(9.25), (std::vector<int64_t>{5, 4, 5}));
  EXPECT_EQ(limits(11.25), (std::vector<int64_t>{6, 5, 5}));
  EXPECT_EQ(limits(11.5), (std::vector<int64_t>{6, 6, 6}));
  // batch 256 with small evaluation batches, where the step's activations are most of a run's memory: 7 whole runs
  // fit, 4 split ones, so auto packs 5 whole; without a CUDA graph a misfit batch sits beside no pool
  auto small_eval = [&](const char* buckets, bool graph) {
    Config c = table3("parity", 2, 256);
    c.set_value("eval.batch_size", "16", "test");
    c.set_value("train.length_buckets", buckets, "test");
    c.set_value("train.cuda_graph", graph ? "true" : "false", "test");
    return auto_pack_limit(c, 3.0 * (1 << 30));
  };
  EXPECT_EQ(small_eval("1", true), 7);
  EXPECT_EQ(small_eval("3", true), 4);
  EXPECT_EQ(small_eval("auto", true), 5);
  EXPECT_EQ(small_eval("3", false), 7);
  // a saturating step packs 12 or nothing, split or not
  bool differ = false;
  for (double gib = 4; gib < 139; gib += 0.25) {
    Config whole = table3("parity", 2, 1024), split = whole;
    whole.set_value("train.length_buckets", "1", "test");
    const int64_t a = auto_pack_limit(whole, gib * (1 << 30)), b = auto_pack_limit(split, gib * (1 << 30));
    EXPECT_TRUE((a == 1 || a == 12) && (b == 1 || b == 12) && b <= a) << gib << " GiB: " << a << ", " << b;
    differ = differ || a != b;
  }
  EXPECT_TRUE(differ);
}

// A packed evaluation's batches hold, in [..., k], member k's solo batches (the same examples in the same order),
// padded further to the pack's longest; what a run keeps across evaluations is this once-made set.
TEST(PackedEval, BatchesHoldEachMembersSoloBatches) {
  const auto tasks = seeded_tasks("mod_arith", {1, 2});
  EvalSpec spec;
  spec.ranges = {{3, 9}, {20, 31}};
  spec.n = 50;
  spec.batch_size = 16;
  const auto packed = eval_batches({tasks[0].get(), tasks[1].get()}, spec);
  ASSERT_EQ(packed.ranges.size(), 2u);
  int64_t bytes = 0;
  for (int64_t k = 0; k < 2; ++k) {
    const auto solo = eval_batches({tasks[k].get()}, spec);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_EQ(packed.ranges[r].size(), 4u);  // 16 + 16 + 16 + 2 rows
      ASSERT_EQ(solo.ranges[r].size(), 4u);
      for (size_t i = 0; i < 4; ++i) {
        const EvalBatch &p = packed.ranges[r][i], &s = solo.ranges[r][i];
        SCOPED_TRACE(fmt::format("member {}, range {}, batch {}", k, r, i));
        ASSERT_EQ(p.input.dim(), 3);
        ASSERT_EQ(p.input.scalar_type(), torch::kInt);
        const int64_t B = s.input.size(0), T = s.input.size(1);
        ASSERT_EQ(p.input.size(0), B);
        ASSERT_GE(p.input.size(1), T);
        auto in = p.input.select(2, k), tg = p.target[k];
        EXPECT_TRUE(torch::equal(in.slice(1, 0, T), s.input));
        EXPECT_TRUE(torch::equal(tg.slice(1, 0, T), s.target[0]));
        EXPECT_TRUE(in.slice(1, T).eq(tasks[k]->pad_id()).all().item<bool>());
        EXPECT_TRUE(tg.slice(1, T).eq(-1).all().item<bool>());
        EXPECT_FALSE(p.accept[k].defined());
        // sorted by length: a row's last scored position does not come before the previous row's
        const auto last = (tg.ge(0).to(torch::kLong) * torch::arange(1, tg.size(1) + 1)).amax(1);
        EXPECT_TRUE(last.slice(0, 1).ge(last.slice(0, 0, -1)).all().item<bool>());
        if (k == 0) bytes += 4 * (p.input.numel() + p.target[0].numel() + p.target[1].numel());
      }
    }
  }
  EXPECT_EQ(packed.bytes(), bytes);
  EXPECT_FALSE(torch::equal(packed.ranges[1][0].input.select(2, 0), packed.ranges[1][0].input.select(2, 1)));
}
