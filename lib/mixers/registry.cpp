// Mixer registry: the names `--model` accepts and the config keys each mixer family reads.
#include <fmt/format.h>

#include "core/config.h"
#include "mixers/attention.h"
#include "mixers/deltanet.h"
#include "mixers/mesa.h"
#include "mixers/mixer.h"

namespace memlab {

std::vector<std::string> mixer_names() { return {"transformer", "deltanet", "mesa"}; }

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
}

bool exempt_from_weight_decay(const std::string& param_name) {
  const auto dot = param_name.rfind('.');
  const std::string leaf = dot == std::string::npos ? param_name : param_name.substr(dot + 1);
  // lambda_params: Mesa's regulariser (fla sets _no_weight_decay on it)
  return leaf == "A_log" || leaf == "dt_bias" || leaf == "D" || leaf == "lambda_params";
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
  throw std::logic_error("mixer not registered: " + name);
}

}  // namespace memlab
