#include "report/paper_values.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/config.h"
#include "core/errors.h"
#include "report/aggregate.h"
#include "report/table.h"

namespace memlab {

namespace {

std::string where(const std::string& path, const YAML::Node& n) {
  return fmt::format("{}:{}:{}", path, n.Mark().line + 1, n.Mark().column + 1);
}

double number(const std::string& s, const std::string& place) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  while (used < s.size() && s[used] == ' ') ++used;
  if (used == 0 || used != s.size())
    throw UserError(fmt::format("{}: '{}' is not a number (nor 'value ± spread')", place, s));
  return v;
}

PaperValue parse_value(const YAML::Node& n, const std::string& place) {
  if (!n.IsScalar()) throw UserError(fmt::format("{}: a value must be a number or 'value ± spread'", place));
  PaperValue p;
  p.text = n.Scalar();
  auto split = p.text.find(kPlusMinus);  // two bytes in UTF-8, as "+-"
  if (split == std::string::npos) split = p.text.find("+-");
  if (split == std::string::npos) {
    p.value = number(p.text, place);
  } else {
    p.value = number(p.text.substr(0, split), place);
    auto rest = p.text.substr(split + 2);
    while (!rest.empty() && rest.front() == ' ') rest.erase(rest.begin());
    p.spread = number(rest, place);
  }
  return p;
}

// A key or the title as text; UserError where it is a list or a map.
std::string scalar(const YAML::Node& n, const std::string& path, const char* what) {
  if (!n.IsScalar()) throw UserError(fmt::format("{}: {} must be a plain name", where(path, n), what));
  return n.Scalar();
}

}  // namespace

const PaperValue* PaperValues::find(const std::string& table, const std::string& label, const std::string& task,
                                    const std::string& length) const {
  const Key k{table, label, task, length};
  auto it = values.find(k);
  if (it == values.end()) return nullptr;
  shown.insert(k);
  return &it->second;
}

PaperValues read_paper_values(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw UserError(fmt::format("cannot read the paper's values from {}", path));
  } catch (const YAML::Exception& e) {
    throw UserError(fmt::format("{}: not YAML: {}", path, e.what()));
  }
  reject_duplicate_keys(root, path);
  if (!root.IsMap())
    throw UserError(fmt::format("{}: expected tables of the report (best, median, summary) as keys", path));
  PaperValues out;
  for (const auto& table : root) {
    const std::string name = scalar(table.first, path, "a table's name");
    if (name == "title") {
      out.title = scalar(table.second, path, "the title");
      continue;
    }
    if (name == "metric") {
      out.metric = scalar(table.second, path, "the metric");
      if (out.metric != "normalized" && out.metric != "accuracy")
        throw UserError(fmt::format("{}: metric must be normalized or accuracy, not '{}'", where(path, table.second),
                                    out.metric));
      continue;
    }
    if (!table.second.IsMap())
      throw UserError(fmt::format("{}: '{}' must map labels to their values", where(path, table.second), name));
    for (const auto& row : table.second) {
      const std::string label = scalar(row.first, path, "a label");
      if (!row.second.IsMap())
        throw UserError(fmt::format("{}: '{}' must map task names to values", where(path, row.second), label));
      for (const auto& cell : row.second) {
        const std::string task = scalar(cell.first, path, "a task name");
        if (cell.second.IsMap()) {  // per evaluation length
          for (const auto& at : cell.second) {
            const std::string length = scalar(at.first, path, "a length");
            number(length, where(path, at.first));
            out.values[{name, label, task, length}] = parse_value(at.second, where(path, at.second));
          }
        } else {
          out.values[{name, label, task, ""}] = parse_value(cell.second, where(path, cell.second));
        }
      }
    }
  }
  if (out.values.empty()) throw UserError(fmt::format("{}: no values", path));
  return out;
}

void add_paper_columns(TextTable& t, const std::string& table, const std::vector<std::string>& tasks,
                       bool length_column, const PaperValues& paper) {
  // right to left, so that the columns still to visit keep their index
  for (size_t c = t.header.size(); c-- > (length_column ? 2u : 1u);) {
    std::string task;
    for (const auto& name : tasks)
      if (t.header[c] == task_title(name)) task = name;
    if (task.empty()) continue;
    std::vector<std::string> cells;
    bool any = false;
    for (const auto& row : t.rows) {
      const PaperValue* v = paper.find(table, row[0], task, length_column ? row[1] : "");
      cells.push_back(v ? v->text : "");
      any = any || v;
    }
    if (!any) continue;
    t.header.insert(t.header.begin() + static_cast<long>(c) + 1, "paper");
    for (size_t r = 0; r < t.rows.size(); ++r)
      t.rows[r].insert(t.rows[r].begin() + static_cast<long>(c) + 1, cells[r]);
  }
}

std::string unshown_paper_values(const PaperValues& paper) {
  std::vector<std::string> names;
  for (const auto& [k, v] : paper.values) {
    if (paper.shown.count(k)) continue;
    const auto& [table, label, task, length] = k;
    names.push_back(fmt::format("{} / {} / {}{} ({})", table, label, task, length.empty() ? "" : " at " + length, v.text));
  }
  if (names.empty()) return "";
  std::string list;
  for (size_t i = 0; i < names.size() && i < 3; ++i) list += (i ? "; " : "") + names[i];
  return fmt::format("{} of the {} values of {} are not shown, as the report has no such table, row or column: {}{}",
                     names.size(), paper.values.size(), paper.title.empty() ? "the paper" : paper.title, list,
                     names.size() > 3 ? "; ..." : "");
}

}  // namespace memlab
