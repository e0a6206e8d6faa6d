// model.head autoencoder (MAD's AutoEncoder): shape, the decoder reads the pooled last token, pooling of
// right-padded rows, its parameters, and a tiny compression run that beats chance.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "core/config.h"
#include "models/sequence_model.h"
#include "tasks/task.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

const Schema& schema() {
  static const Schema s = [] {
    Schema x;
    register_task_keys(x);
    register_model_keys(x);
    x.add_int("train.seed", 1, "seed", 0);
    return x;
  }();
  return s;
}

SequenceModel model(const std::string& head, const std::string& mixer = "transformer", int64_t vocab = 7) {
  Config c(schema());
  c.set_value("model.name", mixer, "test");
  c.set_value("model.head", head, "test");
  c.set_value("model.hidden", "16", "test");
  c.set_value("model.heads", "2", "test");
  c.set_value("model.layers", "1", "test");
  c.set_value("model.mlp_inner", "32", "test");
  c.set_value("model.init_std", "0.2", "test");
  torch::manual_seed(3);
  return SequenceModel(c, vocab);
}

}  // namespace

TEST(AutoEncoder, ShapeParametersAndStep) {
  auto ae = model("autoencoder"), lm = model("lm");
  auto tokens = torch::randint(1, 7, {3, 9});
  EXPECT_EQ(ae->forward(tokens).sizes(), (std::vector<int64_t>{3, 9, 7}));
  std::set<std::string> extra;
  for (const auto& p : ae->named_parameters()) extra.insert(p.key());
  for (const auto& p : lm->named_parameters()) extra.erase(p.key());
  EXPECT_EQ(extra, (std::set<std::string>{"dec_norm1.weight", "dec_fc1.weight", "dec_fc1.bias", "dec_norm2.weight",
                                          "dec_fc2.weight", "dec_fc2.bias"}));
  EXPECT_EQ(ae->num_params() - lm->num_params(), 2 * (16 * 16 + 16) + 2 * 16);
  auto st = ae->init_state(3, torch::TensorOptions());
  EXPECT_THROW(ae->step(tokens.select(1, 0), st), std::logic_error);
}

TEST(AutoEncoder, FirstOutputReadsTheLastToken) {
  for (const std::string mixer : {"transformer", "deltanet"}) {
    auto ae = model("autoencoder", mixer), lm = model("lm", mixer);
    ae->to(torch::kDouble);
    lm->to(torch::kDouble);
    auto a = torch::randint(1, 7, {2, 8});
    auto b = a.clone();
    b.select(1, 7).remainder_(6).add_(1);  // another last token
    auto change = [&](SequenceModel& m) { return (m->forward(a).select(1, 0) - m->forward(b).select(1, 0)).abs().max().item<double>(); };
    EXPECT_GT(change(ae), 1e-6) << mixer;
    EXPECT_EQ(change(lm), 0.0) << mixer;  // causal: the lm head's first output cannot see it
    EXPECT_LT(rel_err(ae->forward(a), ae->forward_reference(a)), 1e-8) << mixer;
  }
}

TEST(AutoEncoder, PadsPoolAtEachRowsLastToken) {
  auto ae = model("autoencoder");
  ae->to(torch::kDouble);
  auto x = torch::randint(1, 7, {1, 5});
  auto padded = torch::cat({x, torch::zeros({1, 3}, x.options())}, 1);
  EXPECT_LT(rel_err(ae->forward(padded).narrow(1, 0, 5), ae->forward(x)), 1e-10);
}

// MAD compression with 3 symbols and length 6: 5 random tokens and the compression token, all reconstructed
// from the pooled state. Chance is 1/3 on the tokens; a few hundred CPU steps get far above it.
TEST(AutoEncoder, LearnsTinyCompression) {
  Config c(schema());
  c.set_value("task.name", "mad_compression", "test");
  c.set_value("task.mad.vocab", "4", "test");
  auto task = make_task(c);
  auto m = model("autoencoder", "transformer", static_cast<int64_t>(task->vocab().size()));
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(3e-3));
  auto tensors = [&](uint64_t first, int64_t n, Split split) {
    const Batch b = task->batch(split, first, n, {6, 6});
    return std::make_pair(torch::tensor(b.input).view({b.B, b.T}), torch::tensor(b.target).view({b.B, b.T}));
  };
  for (int64_t s = 0; s < 300; ++s) {
    auto [x, y] = tensors(s * 64, 64, Split::Train);
    auto loss = torch::nn::functional::cross_entropy(m->forward(x).flatten(0, 1), y.flatten(),
                                                     torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  torch::NoGradGuard ng;
  auto [x, y] = tensors(0, 512, Split::Test);
  auto tok = y.narrow(1, 0, 5);  // the random tokens, not the fixed compression token
  const double acc = (m->forward(x).narrow(1, 0, 5).argmax(-1) == tok).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(acc, 0.6) << "chance is 1/3";
}
