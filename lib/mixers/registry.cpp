// Mixer registry: the names `--model` accepts and the config keys each mixer family reads.
#include <fmt/format.h>

#include <cmath>

#include "core/config.h"
#include "mixers/attention.h"
#include "mixers/deltanet.h"
#include "mixers/gated_deltanet.h"
#include "mixers/hqlt.h"
#include "mixers/linear_attention.h"
#include "mixers/mamba2.h"
#include "mixers/mesa.h"
#include "mixers/mixer.h"
#include "mixers/mlstm.h"
#include "mixers/slstm.h"
#include "mixers/xlstm.h"

namespace memlab {

std::vector<std::string> mixer_names() {
  return {"transformer", "deltanet", "linear_attention", "gated_deltanet", "mamba2",
          "mlstm", "slstm", "xlstm", "mesa", "hqlt"};
}

void register_mixer_keys(Schema& s) {
  s.add_int("model.attention.window", 0, "sliding-window size in keys (current one included); 0 = full context", 0);
  s.add_string("model.attention.pos", "rope", "positional encoding of attention", {"rope", "none"});
  s.add_float("model.attention.rope_theta", 10000.0, "RoPE base", 1.0);
  // memlab's default DeltaNet is the state-tracking variant of Grazzi et al.; false gives the classic [0,1] one.
  s.add_bool("model.deltanet.neg_eigval", true, "beta = 2*sigmoid: eigenvalues in [-1,1]; false = sigmoid, [0,1]");
  s.add_bool("model.deltanet.short_conv", false, "short causal depthwise conv on q, k, v");
  s.add_int("model.deltanet.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.deltanet.out_gate", false, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.deltanet.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
  s.add_bool("model.linear_attention.normalize", true,
             "divide by phi(q).sum phi(k) (Katharopoulos normaliser, fla's normalize=True)");
  s.add_bool("model.linear_attention.out_gate", false, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.linear_attention.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
  // Same default as memlab's DeltaNet (fla's GatedDeltaNet defaults to allow_neg_eigval=False).
  s.add_bool("model.gated_deltanet.neg_eigval", true,
             "beta = 2*sigmoid: eigenvalues in [-1,1] (as memlab's DeltaNet default; fla's is false)");
  s.add_bool("model.gated_deltanet.short_conv", true, "short causal depthwise conv (+SiLU) on q, k, v");
  s.add_int("model.gated_deltanet.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.gated_deltanet.out_gate", true, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.gated_deltanet.expand_v", 1, "value head dim = expand_v * hidden/heads (fla: 2)", 1, 8);
  s.add_int("model.gated_deltanet.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
  // Mamba-2. d_state 16 (mamba_ssm: 64) as in Grazzi et al.'s Mamba runs: memlab's models are 16-128 wide.
  s.add_int("model.mamba2.d_state", 16, "SSM state size N per head", 1, 1024);
  s.add_int("model.mamba2.expand", 2, "inner width = expand * model.hidden", 1, 16);
  s.add_int("model.mamba2.head_dim", 0, "SSM head dim P; 0 = expand*hidden/model.heads, else heads = expand*hidden/P",
            0, 1 << 16);
  s.add_int("model.mamba2.d_conv", 4, "causal depthwise conv kernel over x, B, C", 2, 16);
  s.add_bool("model.mamba2.conv_bias", true, "bias in the causal conv (as mamba's conv1d)");
  s.add_int("model.mamba2.chunk", 64, "chunk size of the SSD training form", 1, 1024);
  s.add_int("model.mamba2.ngroups", 1, "groups of B and C shared by the heads", 1, 1024);
  s.add_bool("model.mamba2.neg_eigval", false, "transition 2*exp(dt*A)-1 in (-1,1] (Grazzi et al.); false = exp(dt*A)");
  s.add_int("model.mlstm.chunk", 64, "chunk size of the chunkwise mLSTM training form", 1, 1024);
  s.add_float("model.mlstm.proj_factor", 2.0, "mLSTM up-projection: inner width = round(proj_factor * hidden)", 0.01,
              64.0);
  s.add_int("model.mlstm.conv_size", 4, "mLSTM causal conv kernel on the q/k path; 0 = none", 0, 16);
  s.add_int("model.mlstm.qkv_block", 4, "block size of the block-diagonal q, k, v projections (must divide inner)", 1,
            1 << 16);
  s.add_int("model.slstm.conv_size", 4, "sLSTM causal conv kernel feeding the i, f gates; 0 = none", 0, 16);
  s.add_string("model.xlstm.ratio", "1:1", "xLSTM[m:s]: block l is mLSTM if l mod (m+s) < m, else sLSTM");
  // Mesa (MesaNet): defaults follow fla's MesaNet layer except the CG initial guess (Jacobi, fla's decoding one) and
  // cg_eps (see lib/mixers/mesa.h).
  s.add_int("model.mesa.cg_steps", 30, "conjugate-gradient steps per solve (forward and backward)", 1, 1000);
  s.add_string("model.mesa.cg_init", "jacobi", "CG initial guess: q/(diag(H)+lambda), 0, or q",
               {"jacobi", "zero", "q"});
  s.add_float("model.mesa.cg_eps", 1e-20,
              "added to both CG denominators, relative to |rhs|^2 (fla: 1e-5, which caps the solve's accuracy)",
              1e-30, 1.0);
  s.add_float("model.mesa.lambda_min", 0.25, "lower bound of the regulariser lambda = softplus(.) + lambda_min", 0.0);
  s.add_float("model.mesa.lambda_init", 1.0, "initial lambda (must exceed lambda_min)", 0.0);
  s.add_int("model.mesa.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
  s.add_bool("model.mesa.short_conv", true, "short causal depthwise conv (then SiLU) on q, k");
  s.add_int("model.mesa.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.mesa.out_gate", false, "gate the per-head output norm with SiLU(W_g x)");
  // HQLT defaults: the paper's synthetic-task setting (Synchronous, dynamic vector mixing, window 8, no PE).
  s.add_string("model.hqlt.variant", "synchronous", "how the two memories share the input stream",
               {"synchronous", "delayed_stream", "delayed_chunk"});
  s.add_string("model.hqlt.mixing", "vector", "memory mixing: sum, per-head scalar gates, per-channel vector gate",
               {"sum", "scalar", "vector"});
  s.add_string("model.hqlt.fw_memory", "deltanet", "fast-weight memory (linear_attention: the paper's ablation)",
               {"deltanet", "linear_attention"});
  s.add_int("model.hqlt.window", 8, "KV-memory window S (keys t-S+1..t); Delayed-Chunk: the chunk size", 1, 1 << 20);
  s.add_int("model.hqlt.fw_block", 0,
            "Delayed-Chunk: FW-memory read-state block; 0 = the chunk (paper), 64 = the reference code", 0, 1 << 20);
  s.add_string("model.hqlt.delayed_beta", "current",
               "Delayed-Stream: beta paired with the evicted pair: current = beta_t (paper and code), evicted = beta_{t-S}",
               {"current", "evicted"});
  s.add_string("model.hqlt.pos", "none", "positional encoding of the KV-memory", {"rope", "none"});
  s.add_float("model.hqlt.rope_theta", 10000.0, "RoPE base", 1.0);
  s.add_bool("model.hqlt.neg_eigval", true, "beta = 2*sigmoid (eigenvalues in [-1,1]); false = sigmoid");
  s.add_bool("model.hqlt.short_conv", true, "short causal depthwise conv on q, k, v");
  s.add_int("model.hqlt.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.hqlt.out_gate", true, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.hqlt.chunk", 64, "chunk size of the FW-memory chunkwise form", 1, 1024);
}

bool exempt_from_weight_decay(const std::string& param_name) {
  const auto dot = param_name.rfind('.');
  const std::string leaf = dot == std::string::npos ? param_name : param_name.substr(dot + 1);
  // conv_bias: Mamba-2's conv1d bias; mamba_ssm's param grouping exempts every "*bias" from weight decay.
  // xlstm decays only parameters named "weight" outside norms: its gate biases, learnable skip and sLSTM
  // recurrent kernel are not decayed (the forget-gate bias sets the memory's time scales, like dt_bias).
  // lambda_params: Mesa's regulariser (fla sets _no_weight_decay on it).
  return leaf == "A_log" || leaf == "dt_bias" || leaf == "D" || leaf == "conv_bias" || leaf == "igate_bias" ||
         leaf == "fgate_bias" || leaf == "learnable_skip" || leaf == "gate_bias" || leaf == "recurrent_kernel" ||
         leaf == "lambda_params";
}

std::shared_ptr<MixerImpl> make_mixer(const std::string& name, const Config& cfg, const MixerShape& shape) {
  if (name == "transformer") {
    AttentionOptions o;
    o.window = cfg.get_int("model.attention.window");
    o.rope = cfg.get_string("model.attention.pos") == "rope";
    o.rope_theta = cfg.get_float("model.attention.rope_theta");
    if (o.rope && (shape.hidden / shape.heads) % 2)
      cfg.fail("model.attention.pos", "RoPE needs an even head dimension (model.hidden / model.heads)");
    return std::make_shared<AttentionImpl>(shape, o);
  }
  if (name == "deltanet") {
    DeltaNetOptions o;
    o.neg_eigval = cfg.get_bool("model.deltanet.neg_eigval");
    o.short_conv = cfg.get_bool("model.deltanet.short_conv");
    o.conv_size = cfg.get_int("model.deltanet.conv_size");
    o.out_gate = cfg.get_bool("model.deltanet.out_gate");
    o.chunk = cfg.get_int("model.deltanet.chunk");
    return std::make_shared<DeltaNetImpl>(shape, o);
  }
  if (name == "linear_attention") {
    LinearAttentionOptions o;
    o.normalize = cfg.get_bool("model.linear_attention.normalize");
    o.out_gate = cfg.get_bool("model.linear_attention.out_gate");
    o.chunk = cfg.get_int("model.linear_attention.chunk");
    return std::make_shared<LinearAttentionImpl>(shape, o);
  }
  if (name == "gated_deltanet") {
    GatedDeltaNetOptions o;
    o.neg_eigval = cfg.get_bool("model.gated_deltanet.neg_eigval");
    o.short_conv = cfg.get_bool("model.gated_deltanet.short_conv");
    o.conv_size = cfg.get_int("model.gated_deltanet.conv_size");
    o.out_gate = cfg.get_bool("model.gated_deltanet.out_gate");
    o.expand_v = cfg.get_int("model.gated_deltanet.expand_v");
    o.chunk = cfg.get_int("model.gated_deltanet.chunk");
    return std::make_shared<GatedDeltaNetImpl>(shape, o);
  }
  if (name == "mamba2") {
    Mamba2Options o;
    o.d_state = cfg.get_int("model.mamba2.d_state");
    o.expand = cfg.get_int("model.mamba2.expand");
    o.head_dim = cfg.get_int("model.mamba2.head_dim");
    o.d_conv = cfg.get_int("model.mamba2.d_conv");
    o.conv_bias = cfg.get_bool("model.mamba2.conv_bias");
    o.chunk = cfg.get_int("model.mamba2.chunk");
    o.ngroups = cfg.get_int("model.mamba2.ngroups");
    o.neg_eigval = cfg.get_bool("model.mamba2.neg_eigval");
    const int64_t inner = o.expand * shape.hidden;
    if (o.head_dim > 0 && inner % o.head_dim)
      cfg.fail("model.mamba2.head_dim", fmt::format("must divide expand * model.hidden = {}", inner));
    const int64_t heads = o.head_dim > 0 ? inner / o.head_dim : shape.heads;
    if (o.head_dim == 0 && inner % heads)
      cfg.fail("model.heads", fmt::format("must divide model.mamba2.expand * model.hidden = {}", inner));
    if (heads % o.ngroups)
      cfg.fail("model.mamba2.ngroups", fmt::format("must divide the number of SSM heads ({})", heads));
    return std::make_shared<Mamba2Impl>(shape, o);
  }
  std::string family = name;
  if (name == "xlstm") {  // xLSTM[m:s]: this block's place in the stack picks mLSTM or sLSTM
    auto r = parse_xlstm_ratio(cfg.get_string("model.xlstm.ratio"));
    if (!r) cfg.fail("model.xlstm.ratio", "must be \"m:s\" with non-negative integers m, s and m + s > 0, e.g. 1:1");
    family = xlstm_block_is_mlstm(*r, shape.layer) ? "mlstm" : "slstm";
  }
  if (family == "mlstm") {
    MLstmOptions o;
    o.chunk = cfg.get_int("model.mlstm.chunk");
    o.proj_factor = cfg.get_float("model.mlstm.proj_factor");
    o.conv_size = cfg.get_int("model.mlstm.conv_size");
    o.qkv_block = cfg.get_int("model.mlstm.qkv_block");
    const int64_t inner = std::llround(o.proj_factor * static_cast<double>(shape.hidden));
    if (inner < 1 || inner % shape.heads || inner % o.qkv_block)
      cfg.fail("model.mlstm.proj_factor",
               fmt::format("inner width round(proj_factor * hidden) = {} must be positive and divisible by model.heads "
                           "= {} and model.mlstm.qkv_block = {}",
                           inner, shape.heads, o.qkv_block));
    return std::make_shared<MLstmImpl>(shape, o);
  }
  if (family == "slstm") {
    SLstmOptions o;
    o.conv_size = cfg.get_int("model.slstm.conv_size");
    return std::make_shared<SLstmImpl>(shape, o);
  }
  if (name == "mesa") {
    MesaOptions o;
    o.cg.steps = cfg.get_int("model.mesa.cg_steps");
    const auto init = cfg.get_string("model.mesa.cg_init");
    o.cg.init = init == "zero" ? MesaCGInit::Zero : init == "q" ? MesaCGInit::Query : MesaCGInit::Jacobi;
    o.cg.eps = cfg.get_float("model.mesa.cg_eps");
    o.lambda_min = cfg.get_float("model.mesa.lambda_min");
    o.lambda_init = cfg.get_float("model.mesa.lambda_init");
    if (o.lambda_init <= o.lambda_min)
      cfg.fail("model.mesa.lambda_init", fmt::format("must exceed model.mesa.lambda_min ({})", o.lambda_min));
    o.chunk = cfg.get_int("model.mesa.chunk");
    o.short_conv = cfg.get_bool("model.mesa.short_conv");
    o.conv_size = cfg.get_int("model.mesa.conv_size");
    o.out_gate = cfg.get_bool("model.mesa.out_gate");
    return std::make_shared<MesaImpl>(shape, o);
  }
  if (name == "hqlt") {
    HqltOptions o;
    const auto variant = cfg.get_string("model.hqlt.variant"), mixing = cfg.get_string("model.hqlt.mixing");
    o.variant = variant == "synchronous"      ? HqltVariant::Synchronous
                : variant == "delayed_stream" ? HqltVariant::DelayedStream
                                              : HqltVariant::DelayedChunk;
    o.mixing = mixing == "sum" ? HqltMixing::Sum : mixing == "scalar" ? HqltMixing::Scalar : HqltMixing::Vector;
    o.fw = cfg.get_string("model.hqlt.fw_memory") == "deltanet" ? HqltFastWeight::DeltaNet
                                                                 : HqltFastWeight::LinearAttention;
    if (o.fw == HqltFastWeight::LinearAttention && o.variant != HqltVariant::Synchronous)
      cfg.fail("model.hqlt.fw_memory", "linear_attention is only available with model.hqlt.variant=synchronous");
    o.window = cfg.get_int("model.hqlt.window");
    o.fw_block = cfg.get_int("model.hqlt.fw_block");
    o.evicted_beta = cfg.get_string("model.hqlt.delayed_beta") == "evicted";
    o.rope = cfg.get_string("model.hqlt.pos") == "rope";
    o.rope_theta = cfg.get_float("model.hqlt.rope_theta");
    if (o.rope && (shape.hidden / shape.heads) % 2)
      cfg.fail("model.hqlt.pos", "RoPE needs an even head dimension (model.hidden / model.heads)");
    o.neg_eigval = cfg.get_bool("model.hqlt.neg_eigval");
    o.short_conv = cfg.get_bool("model.hqlt.short_conv");
    o.conv_size = cfg.get_int("model.hqlt.conv_size");
    o.out_gate = cfg.get_bool("model.hqlt.out_gate");
    o.chunk = cfg.get_int("model.hqlt.chunk");
    return std::make_shared<HqltImpl>(shape, o);
  }
  throw std::logic_error("mixer not registered: " + name);
}

}  // namespace memlab
