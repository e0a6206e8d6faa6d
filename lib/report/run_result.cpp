#include "report/run_result.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <set>
#include <tuple>

#include "core/config.h"
#include "core/errors.h"

namespace memlab {

std::string range_name(const Range& r) { return fmt::format("{}-{}", r.min, r.max); }

namespace {

template <typename T>
T need(const YAML::Node& root, const std::string& key, const std::string& source) {
  const YAML::Node n = yaml_at(root, key);
  if (!n || !n.IsScalar()) throw UserError(fmt::format("run '{}': its config has no value for {}", source, key));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw UserError(fmt::format("run '{}': its config holds a malformed {}: '{}'", source, key, n.Scalar()));
  }
}

Range need_range(const YAML::Node& root, const std::string& key, const std::string& source) {
  const YAML::Node n = yaml_at(root, key);
  try {
    if (n && n.IsSequence() && n.size() == 2) return {n[0].as<int64_t>(), n[1].as<int64_t>()};
  } catch (const YAML::Exception&) {
  }
  throw UserError(fmt::format("run '{}': its config needs {} as [min, max]", source, key));
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

// Leaves below a section (lists count as leaves), keyed by their path below it.
void collect_model_keys(const YAML::Node& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  for (const auto& kv : n) {
    const std::string key = prefix + kv.first.as<std::string>();
    if (kv.second.IsMap())
      collect_model_keys(kv.second, key + ".", out);
    else
      out[key] = scalar_text(kv.second);
  }
}

}  // namespace

void read_run_config(RunResult& run, const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("run '{}': its config is not valid YAML (line {}: {})", source, e.mark.line + 1, e.msg));
  }
  if (!root.IsMap()) throw UserError(fmt::format("run '{}': its config is not a YAML mapping", source));
  run.source = source;
  const YAML::Node label = yaml_at(root, "label");
  run.label = label && label.IsScalar() ? label.Scalar() : "";
  run.task = need<std::string>(root, "task.name", source);
  run.model = need<std::string>(root, "model.name", source);
  run.lr = need<double>(root, "train.lr", source);
  run.seed = need<int64_t>(root, "train.seed", source);
  const YAML::Node steps = yaml_at(root, "train.steps");
  run.steps = steps && steps.IsScalar() ? steps.as<int64_t>(0) : 0;
  std::string avg = "tokens";  // runs from before the key averaged over tokens
  if (const YAML::Node a = yaml_at(root, "eval.average"); !a.IsNull()) avg = scalar_text(a);
  if (avg != "tokens" && avg != "mad")
    throw UserError(fmt::format("run '{}': its config holds a malformed eval.average: '{}' (allowed: tokens, mad)",
                                source, avg));
  run.mad_average = avg == "mad";
  run.train_len = need_range(root, "task.train_len", source);
  run.eval_len = need_range(root, "task.eval_len", source);
  run.model_keys.clear();
  std::map<std::string, std::string> keys;
  collect_model_keys(root["model"], "", keys);
  keys.erase("name");
  // The mixer's own section reads without its prefix: "variant" rather than "hqlt.variant".
  const std::string own = run.model + ".";
  for (const auto& [k, v] : keys) run.model_keys[k.rfind(own, 0) == 0 ? k.substr(own.size()) : k] = v;
  run.task_keys.clear();
  collect_model_keys(root["task"], "", run.task_keys);
  run.task_keys.erase("name");
}

void assign_labels(std::vector<RunResult>& runs) {
  // Keys whose values differ among the unlabelled runs of one (task, model).
  std::map<std::pair<std::string, std::string>, std::set<std::string>> differing;
  std::map<std::pair<std::string, std::string>, const RunResult*> first;
  for (const auto& r : runs) {
    if (!r.label.empty()) continue;
    const auto group = std::make_pair(r.task, r.model);
    auto [it, fresh] = first.emplace(group, &r);
    if (fresh) continue;
    const auto& a = it->second->model_keys;
    auto& diff = differing[group];
    for (const auto& [k, v] : r.model_keys) {
      auto f = a.find(k);
      if (f == a.end() || f->second != v) diff.insert(k);
    }
    for (const auto& [k, v] : a)
      if (!r.model_keys.count(k)) diff.insert(k);
  }
  for (auto& r : runs) {
    if (!r.label.empty()) continue;
    r.label = r.model;
    auto d = differing.find({r.task, r.model});
    if (d == differing.end() || d->second.empty()) continue;
    std::string extra;
    for (const auto& k : d->second) {
      auto f = r.model_keys.find(k);
      extra += fmt::format("{}{}={}", extra.empty() ? "" : ", ", k, f == r.model_keys.end() ? "-" : f->second);
    }
    r.label += " (" + extra + ")";
  }
}

}  // namespace memlab
