#pragma once
// A paper's published numbers, shown beside a report's own (memlab report --paper FILE). The file is YAML,
// table -> label -> task -> value:
//
//   title: the HQLT paper (Tables 3 and 6)       # optional: named in the note on values not shown
//   metric: normalized                           # optional: the values' metric (normalized or accuracy)
//   best:                                        # hqlt: best and median; subquadratic: best; mad: summary
//     "DeltaNet [-1,1]": {parity: 100.0, mod_arith: 97.1}
//   median:
//     "DeltaNet [-1,1]": {parity: "99.9 ± 0.6"}  # a median with its MAD
//
// Labels are the report's rows, tasks are task names. A subquadratic value is per evaluation length:
// {parity: {2048: 0.472}} (a single length, not a range). Values are shown as written; "v ± s" (or "v +- s") is a
// value and its spread. They are the paper's at the answer's last position.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace memlab {

struct TextTable;

struct PaperValue {
  std::string text;   // as written in the file
  double value = 0;   // its number, and the spread after "±" where there is one
  std::optional<double> spread;
};

struct PaperValues {
  std::string title;
  std::string metric;  // normalized | accuracy, or "" where the file does not say
  // (table, label, task, length): length "" where the table has no length column
  using Key = std::tuple<std::string, std::string, std::string, std::string>;
  std::map<Key, PaperValue> values;
  mutable std::set<Key> shown;  // the values some table has shown, for the note on the rest
  const PaperValue* find(const std::string& table, const std::string& label, const std::string& task,
                         const std::string& length = "") const;  // marks it shown
};

// UserError naming the file and the key for anything but the form above.
PaperValues read_paper_values(const std::string& path);

// Inserts after each of `tasks`' columns of `t` (the columns whose header is the task's title) a "paper" column
// with the value for the row's label (column 0) and, with `length_column`, the length in column 1; "" where the
// file has none. Nothing when no value of `table` matches.
void add_paper_columns(TextTable& t, const std::string& table, const std::vector<std::string>& tasks,
                       bool length_column, const PaperValues& paper);

// A note naming the values that no table showed (a label, task or length the report lacks, or a misspelt name);
// "" when every value was shown.
std::string unshown_paper_values(const PaperValues& paper);

}  // namespace memlab
