#include "report/rl_curves.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cmath>

#include "core/errors.h"
#include "core/io.h"
#include "core/run_files.h"

namespace memlab {

RlCurve read_rl_curve(const std::string& dir) {
  const std::string path = join_path(dir, "curve.csv");
  if (!path_exists(path)) throw UserError(fmt::format("'{}' holds no curve.csv (is it a memlab rl run?)", dir));
  RlCurve c;
  c.label = dir;
  try {
    const YAML::Node cfg = YAML::LoadFile(join_path(dir, "config.yaml"));
    const std::string label = cfg["label"] ? cfg["label"].as<std::string>() : "";
    c.label = !label.empty() ? label : cfg["model"]["name"].as<std::string>();
    // Seeds of one setting would otherwise share a legend entry.
    if (cfg["rl"] && cfg["rl"]["seed"]) c.label += " s" + cfg["rl"]["seed"].as<std::string>();
  } catch (const std::exception&) {
    // no readable config: the directory names the run
  }
  auto num = [](const std::string& x) { return x.empty() ? std::nan("") : std::stod(x); };
  for (const auto& r : read_csv(path)) {
    if (r.size() < 8) throw UserError(fmt::format("{}: a row has {} columns, not 10", path, r.size()));
    try {
      c.env_steps.push_back(num(r[1]));
      c.ret.push_back(num(r[3]));
      c.success.push_back(num(r[4]));
      c.train_return.push_back(num(r[6]));
      c.train_success.push_back(num(r[7]));
    } catch (const std::exception&) {
      throw UserError(fmt::format("{}: a row holds a value that is not a number", path));
    }
  }
  return c;
}

std::vector<std::pair<std::string, Chart>> rl_charts(const std::vector<RlCurve>& runs, const std::string& title) {
  Chart ret, suc;
  ret.title = title + ": return";
  suc.title = title + ": success rate";
  ret.x_title = suc.x_title = "environment steps";
  ret.y_title = "mean return";
  suc.y_title = "success rate";
  suc.y_span = std::make_pair(0.0, 1.0);
  int style = 0;
  for (const auto& r : runs) {
    ret.series.push_back({r.label + " (greedy eval)", r.env_steps, r.ret, style});
    suc.series.push_back({r.label + " (greedy eval)", r.env_steps, r.success, style});
    ret.series.push_back({r.label + " (training episodes)", r.env_steps, r.train_return, style + 1});
    suc.series.push_back({r.label + " (training episodes)", r.env_steps, r.train_success, style + 1});
    style += 2;
  }
  return {{"curve_return", ret}, {"curve_success", suc}};
}

std::vector<std::string> write_rl_plots(const std::vector<RlCurve>& runs, const std::string& title,
                                        const std::string& dir) {
  require_plotting();
  ensure_writable_dir(dir);
  std::vector<std::string> files;
  for (const auto& [name, chart] : rl_charts(runs, title)) {
    const std::string base = join_path(dir, name);
    write_chart(chart, base);
    files.push_back(base + ".png");
  }
  return files;
}

}  // namespace memlab
