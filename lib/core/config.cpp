#include "core/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "core/errors.h"
#include "core/io.h"

namespace memlab {
namespace {

std::string join(const std::vector<std::string>& xs, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? sep : "") + xs[i];
  return out;
}

std::string where_of(const std::string& file, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  if (file.empty() || file == "--set" || m.line < 0) return file;
  return fmt::format("{}:{}:{}", file, m.line + 1, m.column + 1);
}

std::string type_name(KeyType t) {
  switch (t) {
    case KeyType::Int: return "an integer";
    case KeyType::Float: return "a number";
    case KeyType::Bool: return "true or false";
    case KeyType::String: return "a string";
    case KeyType::IntList: return "a list of integers, e.g. [1, 2]";
    case KeyType::RangeList: return "a list of [min, max] integer pairs, e.g. [[3, 40], [40, 256]]";
  }
  return "?";
}

std::string shown(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

std::string bounds_text(const KeySpec& s) {
  if (s.min && s.max) return fmt::format("between {} and {}", *s.min, *s.max);
  if (s.min) return fmt::format(">= {}", *s.min);
  if (s.max) return fmt::format("<= {}", *s.max);
  return "any";
}

bool as_int(const YAML::Node& n, int64_t& out) {
  if (!n.IsScalar()) return false;
  try {
    out = n.as<int64_t>();
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

bool as_float(const YAML::Node& n, double& out) {
  if (!n.IsScalar()) return false;
  try {
    out = n.as<double>();
    return std::isfinite(out);
  } catch (const YAML::Exception&) {
    return false;
  }
}

}  // namespace

YAML::Node yaml_at(const YAML::Node& root, const std::string& dotted) {
  YAML::Node n = root;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string part = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!n.IsMap() || !n[part]) return YAML::Node();
    n.reset(n[part]);  // rebinds; `n = ...` would overwrite the node in the tree
    if (dot == std::string::npos) return n;
    start = dot + 1;
  }
}

void reject_duplicate_keys(const YAML::Node& node, const std::string& source) {
  if (node.IsSequence()) {
    for (const auto& e : node) reject_duplicate_keys(e, source);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : node) {
    if (kv.first.IsScalar()) {
      const std::string k = kv.first.Scalar();
      const auto [it, fresh] = seen.emplace(k, kv.first.Mark());
      if (!fresh)
        throw UserError(fmt::format("{}: key '{}' is given twice (first at line {})", where_of(source, kv.first), k,
                                    it->second.line + 1));
    }
    reject_duplicate_keys(kv.second, source);
  }
}

Schema& Schema::add(KeySpec spec) {
  if (find(spec.key)) throw std::logic_error("config key registered twice: " + spec.key);
  keys_.push_back(std::move(spec));
  return *this;
}

Schema& Schema::add_int(const std::string& key, int64_t def, const std::string& help,
                        std::optional<double> min, std::optional<double> max) {
  return add({key, KeyType::Int, YAML::Node(def), help, min, max, {}});
}
namespace {
// Floats are kept as their shortest round-trip text (0.2, not yaml-cpp's 0.20000000000000001).
YAML::Node float_node(double x) { return YAML::Node(fmt::format("{}", x)); }
}  // namespace

Schema& Schema::add_float(const std::string& key, double def, const std::string& help,
                          std::optional<double> min, std::optional<double> max) {
  return add({key, KeyType::Float, float_node(def), help, min, max, {}});
}
Schema& Schema::add_bool(const std::string& key, bool def, const std::string& help) {
  return add({key, KeyType::Bool, YAML::Node(def), help, std::nullopt, std::nullopt, {}});
}
Schema& Schema::add_string(const std::string& key, const std::string& def, const std::string& help,
                           std::vector<std::string> choices) {
  return add({key, KeyType::String, YAML::Node(def), help, std::nullopt, std::nullopt, std::move(choices)});
}
Schema& Schema::add_int_list(const std::string& key, std::vector<int64_t> def, const std::string& help,
                             std::optional<double> min) {
  YAML::Node n(YAML::NodeType::Sequence);
  for (auto v : def) n.push_back(v);
  return add({key, KeyType::IntList, n, help, min, std::nullopt, {}});
}
Schema& Schema::add_range_list(const std::string& key, std::vector<std::pair<int64_t, int64_t>> def,
                               const std::string& help, std::optional<double> min) {
  YAML::Node n(YAML::NodeType::Sequence);
  for (auto [a, b] : def) {
    YAML::Node p(YAML::NodeType::Sequence);
    p.push_back(a);
    p.push_back(b);
    n.push_back(p);
  }
  return add({key, KeyType::RangeList, n, help, min, std::nullopt, {}});
}

const KeySpec* Schema::find(const std::string& key) const {
  for (const auto& k : keys_)
    if (k.key == key) return &k;
  return nullptr;
}

std::vector<std::string> Schema::children(const std::string& prefix) const {
  std::vector<std::string> out;
  const std::string p = prefix.empty() ? "" : prefix + ".";
  for (const auto& k : keys_) {
    if (k.key.compare(0, p.size(), p) != 0) continue;
    std::string rest = k.key.substr(p.size());
    rest = rest.substr(0, rest.find('.'));
    if (std::find(out.begin(), out.end(), rest) == out.end()) out.push_back(rest);
  }
  return out;
}

Schema& Schema::before_key(const std::string& key, const std::string& value) {
  for (auto& k : keys_)
    if (k.key == key) {
      k.before = YAML::Load(value);
      return *this;
    }
  throw std::logic_error("before_key: unknown key " + key);
}

Config::Config(const Schema& schema) : schema_(schema) {
  for (const auto& k : schema_.keys()) {
    values_[k.key] = YAML::Clone(k.def);
    origins_[k.key] = "default";
  }
}

void Config::set_node(const std::string& key, const YAML::Node& value, const std::string& source) {
  const KeySpec* s = schema_.find(key);
  if (!s) {
    YAML::Emitter e;
    e << YAML::Flow << value;
    set_value(key, e.c_str(), source);  // the unknown-key error
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << value;
  assign(*s, value, source + " " + key + "=" + e.c_str());
}

std::vector<std::pair<std::string, std::string>> Config::flat() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : values_) {
    YAML::Emitter e;
    e << YAML::Flow << v;
    out.emplace_back(k, e.c_str());
  }
  return out;
}

void Config::merge_file(const std::string& path) {
  if (!path_exists(path)) throw UserError(fmt::format("cannot read config file '{}': no such readable file", path));
  if (is_directory(path)) throw UserError(fmt::format("config file '{}' is a directory, not a YAML file", path));
  merge_text(read_file(path), path);
}

void Config::merge_saved_run(const std::string& path) {
  merge_file(path);
  for (const auto& k : schema_.keys()) {
    if (!k.before.IsDefined() || k.before.IsNull()) continue;
    const std::string& from = origins_[k.key];
    if (from == path || from.rfind(path + ":", 0) == 0) continue;  // the run's config has it
    set_node(k.key, k.before, "a run from before " + k.key + ":");
  }
}

void Config::merge_text(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw UserError(fmt::format("{}:{}:{}: malformed YAML: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (root.IsNull()) return;  // empty file
  if (!root.IsMap())
    throw UserError(fmt::format("{}: the top level must be a mapping of keys (allowed: {})", where_of(source, root),
                                join(schema_.children(""))));
  reject_duplicate_keys(root, source);
  std::map<std::string, std::string> assigned;
  merge_node(root, "", source, assigned);
}

void Config::merge_node(const YAML::Node& node, const std::string& prefix, const std::string& file,
                        std::map<std::string, std::string>& assigned) {
  for (const auto& kv : node) {
    std::string name;
    try {
      name = kv.first.as<std::string>();
    } catch (const YAML::Exception&) {
      throw UserError(fmt::format("{}: keys must be plain names", where_of(file, kv.first)));
    }
    const std::string full = prefix.empty() ? name : prefix + "." + name;
    if (const KeySpec* s = schema_.find(full)) {
      const std::string at = where_of(file, kv.second);
      const auto [it, fresh] = assigned.emplace(full, at);
      if (!fresh)  // a.b: 1 beside a: {b: 2}
        throw UserError(fmt::format("{}: '{}' is given twice (also at {})", at, full, it->second));
      assign(*s, kv.second, at);
      continue;
    }
    auto kids = schema_.children(full);
    if (!kids.empty()) {
      if (kv.second.IsNull()) continue;
      if (!kv.second.IsMap())
        throw UserError(fmt::format("{}: '{}' is a section and needs a mapping (keys: {})", where_of(file, kv.second),
                                    full, join(kids)));
      merge_node(kv.second, full, file, assigned);
      continue;
    }
    throw UserError(fmt::format("{}: unknown key '{}' (allowed{}: {})", where_of(file, kv.first), full,
                                prefix.empty() ? "" : " under '" + prefix + "'", join(schema_.children(prefix))));
  }
}

void Config::assign(const KeySpec& s, const YAML::Node& v, const std::string& where) {
  const std::string at = where.empty() ? "" : where + ": ";
  auto bad_type = [&]() {
    throw UserError(fmt::format("{}{} must be {}, got {}", at, s.key, type_name(s.type), shown(v)));
  };
  auto check_bounds = [&](double x) {
    if ((s.min && x < *s.min) || (s.max && x > *s.max))
      throw UserError(fmt::format("{}{} = {} is out of range (allowed: {})", at, s.key, shown(v), bounds_text(s)));
  };
  YAML::Node stored;
  switch (s.type) {
    case KeyType::Int: {
      int64_t x;
      if (!as_int(v, x)) bad_type();
      check_bounds(static_cast<double>(x));
      stored = YAML::Node(x);
      break;
    }
    case KeyType::Float: {
      double x;
      if (!as_float(v, x)) bad_type();
      check_bounds(x);
      stored = float_node(x);
      break;
    }
    case KeyType::Bool: {
      if (!v.IsScalar()) bad_type();
      bool b;
      try {
        b = v.as<bool>();
      } catch (const YAML::Exception&) {
        bad_type();
      }
      stored = YAML::Node(b);
      break;
    }
    case KeyType::String: {
      if (!v.IsScalar()) bad_type();
      const std::string x = v.Scalar();
      if (!s.choices.empty() && std::find(s.choices.begin(), s.choices.end(), x) == s.choices.end())
        throw UserError(fmt::format("{}{} = '{}' is not known (allowed: {})", at, s.key, x, join(s.choices)));
      stored = YAML::Node(x);
      break;
    }
    case KeyType::IntList: {
      if (!v.IsSequence()) bad_type();
      stored = YAML::Node(YAML::NodeType::Sequence);
      for (const auto& e : v) {
        int64_t x;
        if (!as_int(e, x)) bad_type();
        check_bounds(static_cast<double>(x));
        stored.push_back(x);
      }
      break;
    }
    case KeyType::RangeList: {
      if (!v.IsSequence()) bad_type();
      stored = YAML::Node(YAML::NodeType::Sequence);
      for (const auto& e : v) {
        int64_t a, b;
        if (!e.IsSequence() || e.size() != 2 || !as_int(e[0], a) || !as_int(e[1], b)) bad_type();
        check_bounds(static_cast<double>(a));
        if (b < a)
          throw UserError(fmt::format("{}{}: range [{}, {}] has max < min", at, s.key, a, b));
        YAML::Node p(YAML::NodeType::Sequence);
        p.push_back(a);
        p.push_back(b);
        stored.push_back(p);
      }
      break;
    }
  }
  // Rebind the entry: assigning through it (values_[key] = stored) would write into the YAML node that copies
  // of this Config share with it (yaml-cpp nodes are references), changing the copy it was copied from.
  values_.erase(s.key);
  values_.emplace(s.key, stored);
  origins_[s.key] = where.empty() ? "--set" : where;
}

void Config::set(const std::string& assignment, const std::string& source) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError(fmt::format("{} '{}': expected key=value, e.g. model.hidden=64", source, assignment));
  set_value(assignment.substr(0, eq), assignment.substr(eq + 1), source);
}

void Config::set_value(const std::string& key, const std::string& value, const std::string& source) {
  const KeySpec* s = schema_.find(key);
  if (!s) {
    std::string parent = key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
    while (!parent.empty() && schema_.children(parent).empty())
      parent = parent.substr(0, parent.rfind('.') == std::string::npos ? 0 : parent.rfind('.'));
    throw UserError(fmt::format("{} {}: unknown key '{}' (allowed{}: {})", source, key, key,
                                parent.empty() ? "" : " under '" + parent + "'", join(schema_.children(parent))));
  }
  YAML::Node v;
  try {
    v = YAML::Load(value);
  } catch (const YAML::ParserException& e) {
    throw UserError(fmt::format("{} {}={}: malformed value: {}", source, key, value, e.msg));
  }
  if (v.IsNull() && s->type == KeyType::String) v = YAML::Node(value);
  assign(*s, v, source + " " + key + "=" + value);
}

const KeySpec& Config::spec(const std::string& key) const {
  const KeySpec* s = schema_.find(key);
  if (!s) throw std::logic_error("config key not registered: " + key);
  return *s;
}

bool Config::has(const std::string& key) const { return schema_.find(key) != nullptr; }

int64_t Config::get_int(const std::string& key) const {
  spec(key);
  return values_.at(key).as<int64_t>();
}
double Config::get_float(const std::string& key) const {
  spec(key);
  return values_.at(key).as<double>();
}
bool Config::get_bool(const std::string& key) const {
  spec(key);
  return values_.at(key).as<bool>();
}
std::string Config::get_string(const std::string& key) const {
  spec(key);
  return values_.at(key).as<std::string>();
}
std::vector<int64_t> Config::get_int_list(const std::string& key) const {
  spec(key);
  std::vector<int64_t> out;
  for (const auto& e : values_.at(key)) out.push_back(e.as<int64_t>());
  return out;
}
std::vector<std::pair<int64_t, int64_t>> Config::get_ranges(const std::string& key) const {
  spec(key);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& e : values_.at(key)) out.emplace_back(e[0].as<int64_t>(), e[1].as<int64_t>());
  return out;
}
std::string Config::origin(const std::string& key) const {
  auto it = origins_.find(key);
  return it == origins_.end() ? "" : it->second;
}

void Config::fail(const std::string& key, const std::string& what) const {
  const std::string o = origin(key);
  if (o.empty() || o == "default") throw UserError(fmt::format("{}: {}", key, what));
  throw UserError(fmt::format("{}: {}: {}", o, key, what));
}

std::string Config::dump() const {
  // Nest keys in registration order.
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& k : schema_.keys()) {
    std::stringstream ss(k.key);
    std::string part;
    std::vector<std::string> parts;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node next = chain.back()[parts[i]];
      if (!next.IsMap()) next = YAML::Node(YAML::NodeType::Map);
      chain.back()[parts[i]] = next;
      chain.push_back(chain.back()[parts[i]]);
    }
    chain.back()[parts.back()] = YAML::Clone(values_.at(k.key));
  }
  YAML::Emitter e;
  e.SetSeqFormat(YAML::Flow);
  e << root;
  return std::string(e.c_str()) + "\n";
}

}  // namespace memlab
