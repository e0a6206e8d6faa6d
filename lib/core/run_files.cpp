#include "core/run_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "core/errors.h"
#include "core/io.h"

namespace memlab {

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  if (!path_exists(path)) return rows;
  std::istringstream in(read_file(path));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, ',')) cells.push_back(c);
    rows.push_back(cells);
  }
  return rows;
}

namespace {
// Calls f on every row of `path` whose column count is one of `columns`.
template <typename F>
void parse_rows(const std::string& path, std::initializer_list<size_t> columns, F&& f) {
  size_t line = 1;
  for (const auto& c : read_csv(path)) {
    ++line;
    if (std::find(columns.begin(), columns.end(), c.size()) == columns.end())
      throw UserError(fmt::format("{}:{}: expected {} columns, found {}", path, line, *(columns.end() - 1), c.size()));
    try {
      f(c);
    } catch (const std::logic_error&) {
      throw UserError(fmt::format("{}:{}: malformed number", path, line));
    }
  }
}
}  // namespace

std::vector<TrainRecord> read_train_csv(const std::string& run_dir) {
  std::vector<TrainRecord> out;
  parse_rows(join_path(run_dir, "train.csv"), {7}, [&](const std::vector<std::string>& c) {
    out.push_back({"", std::stoll(c[0]), std::stod(c[1]), std::stod(c[2]), std::stod(c[3]), std::stod(c[4]),
                   std::stod(c[5]), std::stod(c[6])});
  });
  return out;
}

std::vector<EvalRecord> read_eval_csv(const std::string& run_dir) {
  std::vector<EvalRecord> out;
  parse_rows(join_path(run_dir, "eval.csv"), {9, 11}, [&](const std::vector<std::string>& c) {
    EvalRecord e{"", std::stoll(c[3]), std::stoll(c[4]), std::stoll(c[5]), std::stoll(c[6]), std::stod(c[7]),
                 std::stod(c[8])};
    if (c.size() == 11) {
      e.accuracy_all = std::stod(c[9]);
      e.normalized_all = std::stod(c[10]);
    }
    out.push_back(e);
  });
  return out;
}

}  // namespace memlab
