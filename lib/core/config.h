#pragma once
// Experiment configuration: a schema of known keys (registered by their owners), YAML files,
// `--set a.b=c` overrides and validation with file:line error messages.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace memlab {

enum class KeyType { Int, Float, Bool, String, IntList, RangeList };

struct KeySpec {
  std::string key;  // dotted path, e.g. "model.hidden"
  KeyType type;
  YAML::Node def;   // default value
  std::string help;
  std::optional<double> min, max;    // numeric bounds (inclusive); for lists, bounds of each element
  std::vector<std::string> choices;  // allowed strings, empty = any
  YAML::Node before;  // a key added after runs were saved: what a saved run without it ran with (null: as def)
};

class Schema {
 public:
  Schema& add(KeySpec spec);
  Schema& add_int(const std::string& key, int64_t def, const std::string& help,
                  std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  Schema& add_float(const std::string& key, double def, const std::string& help,
                    std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  Schema& add_bool(const std::string& key, bool def, const std::string& help);
  Schema& add_string(const std::string& key, const std::string& def, const std::string& help,
                     std::vector<std::string> choices = {});
  Schema& add_int_list(const std::string& key, std::vector<int64_t> def, const std::string& help,
                       std::optional<double> min = std::nullopt);
  Schema& add_range_list(const std::string& key, std::vector<std::pair<int64_t, int64_t>> def,
                         const std::string& help, std::optional<double> min = std::nullopt);
  // `key` came after runs were saved, and those ran as `value` (a YAML scalar): resuming one, Config::merge_saved_run
  // sets it so where the run's config lacks the key.
  Schema& before_key(const std::string& key, const std::string& value);
  const KeySpec* find(const std::string& key) const;
  // Keys directly below a prefix ("model" -> hidden, heads, attention, ...), for error messages.
  std::vector<std::string> children(const std::string& prefix) const;
  const std::vector<KeySpec>& keys() const { return keys_; }

 private:
  std::vector<KeySpec> keys_;
};

// UserError naming the place when a mapping anywhere in `node` repeats a key (YAML forbids it; yaml-cpp keeps
// both). `source` names the file.
void reject_duplicate_keys(const YAML::Node& node, const std::string& source);

// The node at a dotted key ("train.lr") of a YAML config, bound to its place in the tree (assigning into it edits
// the tree); an undefined node where a part is missing.
YAML::Node yaml_at(const YAML::Node& root, const std::string& dotted);

// Where a value came from, for error messages.
struct Origin {
  std::string where;  // "file.yaml:12:3", "--set", "default", "--steps"
};

class Config {
 public:
  explicit Config(const Schema& schema);

  // Merge a YAML file (validated). Throws UserError naming file:line.
  void merge_file(const std::string& path);
  // A saved run's config.yaml: merge_file, then each key the file lacks that has a `before` value takes it.
  void merge_saved_run(const std::string& path);
  // Merge a YAML document given as text (validated); `source` names it in errors.
  void merge_text(const std::string& text, const std::string& source);
  // Apply `a.b=c`; c is parsed as a YAML scalar or flow sequence.
  void set(const std::string& assignment, const std::string& source = "--set");
  void set_value(const std::string& key, const std::string& value, const std::string& source);
  // Set a key from a YAML node (a sweep file's value), validated like everything else.
  void set_node(const std::string& key, const YAML::Node& value, const std::string& source);

  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  std::vector<std::pair<int64_t, int64_t>> get_ranges(const std::string& key) const;
  bool has(const std::string& key) const;
  std::string origin(const std::string& key) const;

  // The effective config as YAML (every known key, nested).
  std::string dump() const;
  // Every known key with its value as one-line YAML, sorted by key.
  std::vector<std::pair<std::string, std::string>> flat() const;
  // Error naming where key's value came from.
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

  const Schema& schema() const { return schema_; }

 private:
  void merge_node(const YAML::Node& node, const std::string& prefix, const std::string& file,
                  std::map<std::string, std::string>& assigned);
  void assign(const KeySpec& spec, const YAML::Node& value, const std::string& where);
  const KeySpec& spec(const std::string& key) const;

  const Schema& schema_;
  std::map<std::string, YAML::Node> values_;
  std::map<std::string, std::string> origins_;
};

}  // namespace memlab
