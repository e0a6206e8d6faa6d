#include "sweep/plan.h"

#include <fmt/format.h>
#include <glob.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <set>

#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"

namespace memlab {

namespace {

std::string where(const std::string& file, const YAML::Node& n) {
  return n.Mark().is_null() ? file : fmt::format("{}:{}", file, n.Mark().line + 1);
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string stem_of(const std::string& path) {
  std::string s = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  for (const char* ext : {".yaml", ".yml"})
    if (s.size() > std::string(ext).size() && s.compare(s.size() - std::string(ext).size(), std::string::npos, ext) == 0)
      return s.substr(0, s.size() - std::string(ext).size());
  return s;
}

std::string relative_to(const std::string& base_dir, const std::string& p) {
  return !p.empty() && p[0] == '/' ? p : join_path(base_dir, p);
}

YAML::Node load_yaml(const std::string& path) {
  if (!path_exists(path)) throw UserError(fmt::format("cannot read sweep file '{}': no such file", path));
  if (is_directory(path)) throw UserError(fmt::format("sweep file '{}' is a directory, not a YAML file", path));
  YAML::Node root;
  try {
    root = YAML::Load(read_file(path));
  } catch (const YAML::ParserException& e) {
    throw UserError(fmt::format("{}:{}: malformed YAML: {}", path, e.mark.line + 1, e.msg));
  }
  if (root.IsNull()) throw UserError(fmt::format("sweep file '{}' is empty", path));
  reject_duplicate_keys(root, path);
  return root;
}

// One value assignment with the place it came from.
struct Assignment {
  std::string key;
  YAML::Node value;
  std::string source;
};

// {a: {b: 1}} and {a.b: 1} both give a.b = 1; a key given both ways is an error.
void flatten(const YAML::Node& node, const std::string& prefix, const std::string& file,
             std::vector<Assignment>& out) {
  if (!node.IsMap()) throw UserError(fmt::format("{}: expected a map of config keys", where(file, node)));
  for (const auto& kv : node) {
    const std::string key = prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>();
    if (kv.second.IsMap()) {
      flatten(kv.second, key, file, out);
      continue;
    }
    for (const auto& a : out)
      if (a.key == key)
        throw UserError(fmt::format("{}: '{}' is given twice (also at {})", where(file, kv.second), key, a.source));
    out.push_back({key, kv.second, where(file, kv.second)});
  }
}

struct Experiment {
  std::string config_file;  // empty: defaults only
  std::string label;
  std::vector<Assignment> sets;
};

struct Axis {
  std::string key;
  std::vector<YAML::Node> values;
  std::string source;
};

struct SweepSpec {
  std::string name;
  std::vector<Experiment> experiments;
  std::vector<Axis> grid;
  std::vector<Assignment> sets;
};

std::vector<std::string> expand_glob(const std::string& pattern, const std::string& source) {
  if (pattern.find_first_of("*?[") == std::string::npos) {
    if (!path_exists(pattern)) throw UserError(fmt::format("{}: config file '{}' does not exist", source, pattern));
    return {pattern};
  }
  glob_t g{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) throw UserError(fmt::format("{}: '{}' matches no file", source, pattern));
  return out;  // glob sorts
}

void read_sweep(const std::string& file, const YAML::Node& root, SweepSpec& spec, int depth) {
  if (depth > 8) throw UserError(fmt::format("{}: sweep files extend each other in a loop", file));
  const YAML::Node s = root["sweep"];
  if (!s.IsMap()) throw UserError(fmt::format("{}: 'sweep' must be a map", where(file, s)));
  static const std::set<std::string> known{"name", "extends", "experiments", "grid", "set"};
  for (const auto& kv : s) {
    const auto k = kv.first.as<std::string>();
    if (!known.count(k))
      throw UserError(fmt::format("{}: unknown sweep key '{}' (allowed: name, extends, experiments, grid, set)",
                                  where(file, kv.first), k));
  }
  const std::string base = dir_of(file);
  if (s["extends"]) {
    const std::string parent = relative_to(base, s["extends"].as<std::string>());
    YAML::Node proot = load_yaml(parent);
    if (!proot.IsMap() || !proot["sweep"])
      throw UserError(fmt::format("{}: extends '{}', which is not a sweep file", where(file, s["extends"]), parent));
    read_sweep(parent, proot, spec, depth + 1);
  }
  spec.name = s["name"] ? s["name"].as<std::string>() : stem_of(file);
  if (s["experiments"]) {
    const YAML::Node ex = s["experiments"];
    if (!ex.IsSequence())
      throw UserError(fmt::format("{}: 'experiments' must be a list of config files or maps", where(file, ex)));
    spec.experiments.clear();
    for (const auto& e : ex) {
      const std::string src = where(file, e);
      if (e.IsScalar()) {
        for (const auto& f : expand_glob(relative_to(base, e.as<std::string>()), src)) spec.experiments.push_back({f, "", {}});
        continue;
      }
      if (!e.IsMap()) throw UserError(fmt::format("{}: an experiment is a config file or a map", src));
      for (const auto& kv : e) {
        const auto k = kv.first.as<std::string>();
        if (k != "config" && k != "label" && k != "set")
          throw UserError(fmt::format("{}: unknown experiment key '{}' (allowed: config, label, set)", src, k));
      }
      Experiment x;
      if (e["label"]) x.label = e["label"].as<std::string>();
      if (e["set"]) flatten(e["set"], "", file, x.sets);
      if (e["config"]) {
        for (const auto& f : expand_glob(relative_to(base, e["config"].as<std::string>()), src)) {
          x.config_file = f;
          spec.experiments.push_back(x);
        }
      } else {
        spec.experiments.push_back(x);
      }
    }
  }
  if (s["grid"]) {
    const YAML::Node g = s["grid"];
    if (!g.IsMap()) throw UserError(fmt::format("{}: 'grid' must map config keys to lists of values", where(file, g)));
    for (const auto& kv : g) {
      Axis a{kv.first.as<std::string>(), {}, where(file, kv.second)};
      if (!kv.second.IsSequence() || kv.second.size() == 0)
        throw UserError(fmt::format("{}: grid axis '{}' needs a non-empty list of values", a.source, a.key));
      for (const auto& v : kv.second) a.values.push_back(v);
      auto same = std::find_if(spec.grid.begin(), spec.grid.end(), [&](const Axis& b) { return b.key == a.key; });
      if (same != spec.grid.end())
        *same = a;  // a sweep that extends another replaces that axis
      else
        spec.grid.push_back(a);
    }
  }
  if (s["set"]) flatten(s["set"], "", file, spec.sets);
}

Axis parse_cli_axis(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    throw UserError(fmt::format("--grid '{}': expected KEY=V1,V2,... or KEY=[V1, V2]", text));
  Axis a{text.substr(0, eq), {}, "--grid"};
  std::string vals = text.substr(eq + 1);
  if (vals[0] != '[') vals = "[" + vals + "]";
  YAML::Node n;
  try {
    n = YAML::Load(vals);
  } catch (const YAML::ParserException& e) {
    throw UserError(fmt::format("--grid '{}': malformed values: {}", text, e.msg));
  }
  if (!n.IsSequence() || n.size() == 0) throw UserError(fmt::format("--grid '{}': needs at least one value", text));
  for (const auto& v : n) a.values.push_back(v);
  return a;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string default_text(const Config& cfg, const std::string& key) {
  YAML::Emitter e;
  e << YAML::Flow << cfg.schema().find(key)->def;
  return e.c_str();
}

}  // namespace

const std::set<std::string>& keys_ids_ignore() {
  static const std::set<std::string> ignored{"label",           "train.device",           "train.log_every",
                                             "train.cuda_graph", "train.checkpoint_every", "train.tensorboard",
                                             "eval.batch_size",  "eval.threshold",         "model.kernels",
                                             "train.target_rows",  "train.length_buckets"};
  return ignored;
}

std::string run_id(const Config& cfg) {
  const auto& ignored = keys_ids_ignore();
  // Keys added after sweeps had stored runs count only away from their default, so that those runs keep their ids.
  static const std::set<std::string> added_later{"eval.average"};
  std::string canon;
  for (const auto& [key, value] : cfg.flat()) {
    if (ignored.count(key)) continue;
    if (added_later.count(key) && value == default_text(cfg, key)) continue;
    // Keys of another mixer's or task's namespace (model.mamba2.* in a DeltaNet run) count only when set to
    // something other than their default, so adding a mixer or task to memlab leaves existing ids alone.
    const auto d1 = key.find('.'), d2 = key.find('.', d1 == std::string::npos ? 0 : d1 + 1);
    if (d2 != std::string::npos) {
      const std::string section = key.substr(0, d1), ns = key.substr(d1 + 1, d2 - d1 - 1);
      if ((section == "model" || section == "task") && cfg.has(section + ".name") &&
          cfg.get_string(section + ".name") != ns && value == default_text(cfg, key))
        continue;
    }
    canon += key + "=" + value + "\n";
  }
  return fmt::format("{:016x}", fnv1a(canon));
}

Plan make_plan(const Schema& schema, const PlanRequest& req) {
  if (req.files.empty()) throw UserError("memlab sweep needs at least one sweep or experiment file");
  Plan plan;
  std::vector<std::string> names;
  std::vector<std::pair<SweepSpec, std::string>> specs;
  for (const auto& file : req.files) {
    YAML::Node root = load_yaml(file);
    SweepSpec spec;
    if (root.IsMap() && root["sweep"]) {
      read_sweep(file, root, spec, 0);
      if (spec.experiments.empty())
        throw UserError(fmt::format("sweep file '{}' lists no experiments (sweep.experiments: config files or maps)",
                                    file));
    } else {
      spec.name = stem_of(file);
      spec.experiments.push_back({file, "", {}});
    }
    names.push_back(spec.name);
    specs.emplace_back(std::move(spec), file);
  }
  plan.name = !req.name.empty() ? req.name : names.size() == 1 ? names[0] : names[0] + "+" + std::to_string(names.size() - 1);
  std::vector<Axis> cli_axes;
  for (const auto& g : req.grid) cli_axes.push_back(parse_cli_axis(g));

  std::set<std::string> seen;
  for (const auto& [spec, file] : specs) {
    std::vector<Axis> axes = spec.grid;
    for (const auto& a : cli_axes) {
      auto same = std::find_if(axes.begin(), axes.end(), [&](const Axis& b) { return b.key == a.key; });
      if (same != axes.end())
        *same = a;
      else
        axes.push_back(a);
    }
    size_t points = 1;
    for (const auto& a : axes) points *= a.values.size();
    for (const auto& ex : spec.experiments) {
      for (size_t p = 0; p < points; ++p) {
        Config cfg(schema);
        if (!ex.config_file.empty()) cfg.merge_file(ex.config_file);
        for (const auto& s : spec.sets) cfg.set_node(s.key, s.value, s.source);
        for (const auto& s : ex.sets) cfg.set_node(s.key, s.value, s.source);
        if (!ex.label.empty()) cfg.set_node("label", YAML::Node(ex.label), file);
        size_t rest = p;
        for (size_t i = axes.size(); i-- > 0;) {  // last axis fastest
          const auto& a = axes[i];
          cfg.set_node(a.key, a.values[rest % a.values.size()], a.source);
          rest /= a.values.size();
        }
        for (const auto& s : req.sets) cfg.set(s);
        if (req.validate) req.validate(cfg);
        RunRecord r;
        r.id = run_id(cfg);
        if (!seen.insert(r.id).second) {
          ++plan.duplicates;
          continue;
        }
        r.label = cfg.get_string("label");
        r.task = cfg.get_string("task.name");
        r.model = cfg.get_string("model.name");
        r.lr = cfg.get_float("train.lr");
        r.seed = cfg.get_int("train.seed");
        r.config = cfg.dump();
        plan.runs.push_back(std::move(r));
      }
    }
  }
  return plan;
}

}  // namespace memlab
