// Mixer registry: one entry per mixer (its name, its config keys, how it is built). A new mixer is its file,
// one line here and one in CMakeLists.txt.

#include <set>

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
namespace {

struct MixerEntry {
  const char* name;  // model.name
  void (*register_keys)(Schema&);
  std::shared_ptr<MixerImpl> (*make)(const Config&, const MixerShape&);  // every layer holds MixerShape::members
};

// In the order of `memlab train --help`. xlstm stacks mlstm and slstm blocks, whose keys those entries add.
const std::vector<MixerEntry>& mixers() {
  static const std::vector<MixerEntry> m = {
      {"transformer", register_attention_keys, make_attention},
      {"deltanet", register_deltanet_keys, make_deltanet},
      {"linear_attention", register_linear_attention_keys, make_linear_attention},
      {"gated_deltanet", register_gated_deltanet_keys, make_gated_deltanet},
      {"mamba2", register_mamba2_keys, make_mamba2},
      {"mlstm", register_mlstm_keys, make_mlstm},
      {"slstm", register_slstm_keys, make_slstm},
      {"xlstm", register_xlstm_keys, make_xlstm},
      {"mesa", register_mesa_keys, make_mesa},
      {"hqlt", register_hqlt_keys, make_hqlt},
  };
  return m;
}

}  // namespace

std::vector<std::string> mixer_names() {
  std::vector<std::string> out;
  for (const auto& m : mixers()) out.push_back(m.name);
  return out;
}

void register_mixer_keys(Schema& s) {
  for (const auto& m : mixers()) m.register_keys(s);
}

std::vector<bool> weight_decay_mask(torch::nn::Module& model) {
  std::set<const void*> skip;
  for (const auto& m : model.modules())
    if (const auto* mixer = dynamic_cast<const MixerImpl*>(m.get()))
      for (const auto& t : mixer->no_decay()) skip.insert(t.unsafeGetTensorImpl());
  std::vector<bool> out;
  for (const auto& p : model.parameters()) out.push_back(!skip.count(p.unsafeGetTensorImpl()));
  return out;
}

std::shared_ptr<MixerImpl> make_mixer(const std::string& name, const Config& cfg, const MixerShape& shape) {
  for (const auto& m : mixers())
    if (name == m.name) return m.make(cfg, shape);
  throw std::logic_error("mixer not registered: " + name);
}

}  // namespace memlab
