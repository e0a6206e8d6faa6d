// Mixer registry: the names `--model` accepts and the config keys each mixer family reads.
#include <fmt/format.h>

#include <cmath>

#include "core/config.h"
#include "mixers/attention.h"
#include "mixers/deltanet.h"
#include "mixers/mixer.h"
#include "mixers/mlstm.h"
#include "mixers/slstm.h"
#include "mixers/xlstm.h"

namespace memlab {

std::vector<std::string> mixer_names() { return {"transformer", "deltanet", "mlstm", "slstm", "xlstm"}; }

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
  s.add_int("model.mlstm.chunk", 64, "chunk size of the chunkwise mLSTM training form", 1, 1024);
  s.add_float("model.mlstm.proj_factor", 2.0, "mLSTM up-projection: inner width = round(proj_factor * hidden)", 0.01,
              64.0);
  s.add_int("model.mlstm.conv_size", 4, "mLSTM causal conv kernel on the q/k path; 0 = none", 0, 16);
  s.add_int("model.mlstm.qkv_block", 4, "block size of the block-diagonal q, k, v projections (must divide inner)", 1,
            1 << 16);
  s.add_int("model.slstm.conv_size", 4, "sLSTM causal conv kernel feeding the i, f gates; 0 = none", 0, 16);
  s.add_string("model.xlstm.ratio", "1:1", "xLSTM[m:s]: block l is mLSTM if l mod (m+s) < m, else sLSTM");
}

bool exempt_from_weight_decay(const std::string& param_name) {
  const auto dot = param_name.rfind('.');
  const std::string leaf = dot == std::string::npos ? param_name : param_name.substr(dot + 1);
  // xlstm decays only parameters named "weight" outside norms: its gate biases, learnable skip and sLSTM
  // recurrent kernel are not decayed (the forget-gate bias sets the memory's time scales, like dt_bias).
  return leaf == "A_log" || leaf == "dt_bias" || leaf == "D" || leaf == "igate_bias" || leaf == "fgate_bias" ||
         leaf == "learnable_skip" || leaf == "gate_bias" || leaf == "recurrent_kernel";
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
  throw std::logic_error("mixer not registered: " + name);
}

}  // namespace memlab
