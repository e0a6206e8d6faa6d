#pragma once
// Token embedding -> N pre-norm blocks (h = x + mixer(norm(x)); out = h + mlp(norm(h))) -> norm -> head.
// model.head = autoencoder (MAD's AutoEncoder backbone, for its compression task): the blocks encode the
// input; the residual stream at each row's last token (right-padded with pad id 0; no norm before the
// pooling, the decoder's first RMSNorm normalises, as in MAD) is broadcast to every position plus a fixed
// sin-cos embedding of that output position, decoded by RMSNorm, Linear(d,d), GELU, RMSNorm, Linear(d,d),
// GELU, then norm -> head. Logits are [B, T, V] like the lm head's; step() throws (no causal recurrence).
#include <torch/torch.h>

#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/kernels.h"

namespace memlab {

class Config;
class Schema;

// Over the last dimension; with K members (dim = K x the member's width) over each member's group of channels.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, Kernels kernels, int64_t members = 1);
  // In x's dtype, or in `out` (projection_input_type() where only linear layers read the result).
  torch::Tensor forward(const torch::Tensor& x, torch::ScalarType out = torch::ScalarType::Undefined);
  torch::Tensor weight;

 private:
  double eps_;
  Kernels kernels_;
  int64_t members_;
};
TORCH_MODULE(RMSNorm);

// SwiGLU MLP: down(SiLU(gate(x)) * up(x)), gate and up as one matmul (ops/swiglu for the gating).
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t dim, int64_t inner, Kernels kernels, int64_t members = 1);  // dim, inner: all members'
  torch::Tensor forward(const torch::Tensor& x);
  Linear gate{nullptr}, up{nullptr}, down{nullptr};

 private:
  Kernels kernels_;
};
TORCH_MODULE(SwiGLU);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(std::shared_ptr<MixerImpl> mixer, int64_t dim, int64_t mlp_inner, double eps, Kernels kernels,
            double dropout = 0.0, int64_t members = 1);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward_reference(const torch::Tensor& x);
  // forward's output at one position per row (rows: see SequenceModelImpl::forward_rows): the mixer reads every
  // position, the MLP only those -> [B, D].
  torch::Tensor forward_rows(const torch::Tensor& x, const torch::Tensor& rows, int64_t members);
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state);

  std::shared_ptr<MixerImpl> mixer;
  RMSNorm norm1{nullptr}, norm2{nullptr};
  SwiGLU mlp{nullptr};  // null when the block has no MLP
  double dropout = 0.0;  // on the mixer's and the MLP's outputs (GPT-2's residual dropout), in training mode

 private:
  torch::Tensor drop(const torch::Tensor& x) { return dropout > 0 ? torch::dropout(x, dropout, is_training()) : x; }
  torch::Tensor mixer_input(const torch::Tensor& x);  // norm1(x)
  torch::Tensor finish(const torch::Tensor& h);       // h + mlp(norm2(h)), or h without an MLP
};
TORCH_MODULE(Block);

// The model.* blocks of a stack of width model.hidden, registered on `owner` as block0, block1, ...; with
// `members` > 1, each block holds that many runs' blocks side by side (MixerShape).
std::vector<Block> make_blocks(const Config& cfg, torch::nn::Module& owner, double dropout = 0.0, int64_t members = 1);
// A lower bound of the blocks' parameter count, read from the config before anything is built: every mixer
// has at least four hidden x hidden projections, plus the MLP's three.
double min_block_params(const Config& cfg);
// fla's initialisation of every linear, embedding and short-conv weight below `owner`, then the blocks'
// residual-output projections rescaled by 1/sqrt(2 * layers).
void init_fla_weights(torch::nn::Module& owner, const std::vector<Block>& blocks, double std);

// A packed model (members > 1) holds K runs of one config side by side, each block's channels and heads
// member-major (MixerShape); it reads tokens [B, T, K] (member k's batch in [..., k]) and returns logits
// [B, T, K, V]. Member k's parameters are every parameter's slice p.view({K, -1})[k], in the member's own
// layout: pack_members and member_parameters move them between it and K models of one member.
class SequenceModelImpl : public torch::nn::Module {
 public:
  SequenceModelImpl(const Config& cfg, int64_t vocab, int64_t members = 1);
  torch::Tensor forward(const torch::Tensor& tokens);  // [B, T] -> logits [B, T, V]
  // The logits at one position per row, rows [B] long ([B, K] packed: member k's row positions) -> [B, V]
  // ([B, K, V]): forward's values there, with the last block's MLP, the final norm and the head run on those rows
  // alone (a loss that reads one position per row needs nothing else). Not for the autoencoder head.
  torch::Tensor forward_rows(const torch::Tensor& tokens, const torch::Tensor& rows);
  torch::Tensor forward_reference(const torch::Tensor& tokens);
  std::vector<MixerState> init_state(int64_t batch, const torch::TensorOptions& opts) const;
  torch::Tensor step(const torch::Tensor& token_t, std::vector<MixerState>& state);  // [B] -> [B, V]
  int64_t num_params() const;  // per member
  bool autoencoder() const { return static_cast<bool>(dec_fc1); }
  int64_t members() const { return members_; }

  torch::nn::Embedding embed{nullptr};  // [K V, D]: member k's table in rows [k V, (k+1) V)
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  Linear head{nullptr};
  // autoencoder head only (null for lm)
  RMSNorm dec_norm1{nullptr}, dec_norm2{nullptr};
  Linear dec_fc1{nullptr}, dec_fc2{nullptr};

 private:
  torch::Tensor embed_tokens(const torch::Tensor& tokens);
  torch::Tensor output(const torch::Tensor& tokens, const torch::Tensor& h);  // the head on the blocks' output
  int64_t members_ = 1;
};
TORCH_MODULE(SequenceModel);

// Member k's parameter slices of a packed model: the tensors of a one-member model's parameters(), in its order,
// as flat views into `packed` (writes through them change the packed model).
std::vector<torch::Tensor> member_parameters(const SequenceModel& packed, int64_t k);
// Copies `solo` (one-member models of the same config, K of them) into the packed model's member slices.
void pack_members(SequenceModel& packed, const std::vector<SequenceModel>& solo);
// The inverse for one member: member k's slices into `solo`.
void unpack_member(const SequenceModel& packed, int64_t k, SequenceModel& solo);

void register_model_keys(Schema& schema);
// weight[tokens] ([V, D], [B, T] -> [B, T, D]); for vocabularies up to 64 the backward is one one-hot matmul
// (ATen's embedding backward sorts the tokens: ~29 kernel launches). With members > 1 the weight is K tables
// [K V, D] and tokens [..., K] index member k's table: -> [..., K D].
torch::Tensor token_embedding(const torch::Tensor& weight, const torch::Tensor& tokens, int64_t members = 1);
// The SwiGLU width fla uses: 256 * ceil(int(hidden * ratio * 2/3) / 256).
int64_t default_mlp_inner(int64_t hidden, int64_t ratio);
// Fixed sin-cos position embedding [T, D]: sin(t w_i) in the first half, cos(t w_i) in the second,
// w_i = 10000^(-i/(D/2)); a last zero column when D is odd.
torch::Tensor sincos_positions(int64_t T, int64_t D, const torch::TensorOptions& opts);

}  // namespace memlab
