#include "report/rl_curves.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/errors.h"
#include "core/io.h"
#include "core/rng.h"
#include "core/run_files.h"
#include "report/table.h"

namespace memlab {

std::string RlCurve::name() const { return seed.empty() ? label : label + " s" + seed; }

RlCurve read_rl_curve(const std::string& dir) {
  const std::string path = join_path(dir, "curve.csv");
  if (!path_exists(path)) throw UserError(fmt::format("'{}' holds no curve.csv (is it a memlab rl run?)", dir));
  RlCurve c;
  c.dir = dir;
  c.label = dir;
  try {
    const YAML::Node cfg = YAML::LoadFile(join_path(dir, "config.yaml"));
    const std::string label = cfg["label"] ? cfg["label"].as<std::string>() : "";
    c.label = !label.empty() ? label : cfg["model"]["name"].as<std::string>();
    if (cfg["rl"] && cfg["rl"]["seed"]) c.seed = cfg["rl"]["seed"].as<std::string>();
  } catch (const std::exception&) {
    // no readable config: the directory names the run
  }
  auto num = [](const std::string& x) { return x.empty() ? std::nan("") : std::stod(x); };
  for (const auto& r : read_csv(path)) {
    if (r.size() < 8) throw UserError(fmt::format("{}: a row has {} columns, where curve.csv has 10", path, r.size()));
    try {
      c.episodes.push_back(num(r[0]));
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

RlInterval parse_rl_interval(const std::string& s) {
  if (s == "bootstrap") return RlInterval::Bootstrap;
  if (s == "t") return RlInterval::T;
  throw UserError(fmt::format("unknown interval '{}' (allowed: bootstrap, t)", s));
}

namespace {

// t(0.975, df): the table for df <= 30, then the Cornish-Fisher series (within 2e-4 of the exact value there).
double t975(int df) {
  static const double table[] = {12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
                                 2.2010,  2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
                                 2.0796,  2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423};
  if (df <= 30) return table[df - 1];
  const double z = 1.959964, v = df;
  return z + (z * z * z + z) / (4 * v) + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * v * v);
}

// numpy.percentile's default (linear between the order statistics), q in [0, 1], sorted input.
double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i]);
}

std::vector<double> bootstrap_means(const std::vector<double>& v) {
  const size_t n = v.size();
  std::vector<double> means;
  if (n <= 6) {  // every resample once: n^n index tuples, counted in base n
    std::vector<size_t> idx(n, 0);
    while (true) {
      double s = 0;
      for (size_t i : idx) s += v[i];
      means.push_back(s / static_cast<double>(n));
      size_t d = 0;
      while (d < n && ++idx[d] == n) idx[d++] = 0;
      if (d == n) break;
    }
  } else {
    Rng rng = make_rng(0, 0, 0);  // the same draws on every platform
    for (int r = 0; r < 20000; ++r) {
      double s = 0;
      for (size_t i = 0; i < n; ++i) s += v[static_cast<size_t>(uniform_int(rng, 0, static_cast<int64_t>(n) - 1))];
      means.push_back(s / static_cast<double>(n));
    }
  }
  std::sort(means.begin(), means.end());
  return means;
}

// An interval of a rate held to [0, 1]; NaN (no interval) stays NaN.
std::pair<double, double> held_to_rate(std::pair<double, double> iv) {
  if (std::isfinite(iv.first)) iv = {std::clamp(iv.first, 0.0, 1.0), std::clamp(iv.second, 0.0, 1.0)};
  return iv;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// Trailing moving average over `w` points (fewer at the start), NaN points left out.
std::vector<double> smoothed(const std::vector<double>& y, int w) {
  if (w <= 1) return y;
  std::vector<double> out(y.size(), std::nan(""));
  for (size_t k = 0; k < y.size(); ++k) {
    double s = 0;
    int n = 0;
    for (size_t j = k + 1 > static_cast<size_t>(w) ? k + 1 - w : 0; j <= k; ++j)
      if (std::isfinite(y[j])) s += y[j], ++n;
    if (n) out[k] = s / n;
  }
  return out;
}

// One point per env step (x sorted): where several evaluations share one, the last with a value stands for them.
std::pair<std::vector<double>, std::vector<double>> distinct_steps(const std::vector<double>& xs,
                                                                  const std::vector<double>& ys) {
  std::vector<double> dx, dy;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (!dx.empty() && dx.back() == xs[k]) {
      if (std::isfinite(ys[k]) || !std::isfinite(dy.back())) dy.back() = ys[k];
      continue;
    }
    dx.push_back(xs[k]);
    dy.push_back(ys[k]);
  }
  return {dx, dy};
}

// y at x by linear interpolation between points of distinct x (sorted); NaN outside them or next to a gap.
double interpolate(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (xs.empty() || x < xs.front() || x > xs.back()) return std::nan("");
  const size_t j = static_cast<size_t>(std::lower_bound(xs.begin(), xs.end(), x) - xs.begin());
  if (xs[j] == x) return ys[j];
  const double f = (x - xs[j - 1]) / (xs[j] - xs[j - 1]);
  return ys[j - 1] + f * (ys[j] - ys[j - 1]);
}

// clamp: the interval's bounds are held to [0, 1] (a success rate).
RlBand band(const std::vector<const RlCurve*>& runs, const std::vector<double>& grid, RlInterval kind,
            const RlGroupOptions& opt, std::vector<double> RlCurve::*field, bool clamp = false) {
  RlBand b;
  std::vector<std::pair<std::vector<double>, std::vector<double>>> pts;
  for (const RlCurve* r : runs) pts.push_back(distinct_steps(r->env_steps, smoothed(r->*field, opt.smooth)));
  for (double x : grid) {
    std::vector<double> v;
    for (size_t i = 0; i < runs.size(); ++i) {
      const double y = interpolate(pts[i].first, pts[i].second, x);
      if (std::isfinite(y)) v.push_back(y);
    }
    const auto iv = mean_interval(v, kind);
    const auto [lo, hi] = clamp ? held_to_rate(iv) : iv;
    b.mean.push_back(v.empty() ? std::nan("") : mean_of(v));
    b.lo.push_back(lo);
    b.hi.push_back(hi);
    b.seeds.push_back(static_cast<int>(v.size()));
  }
  return b;
}

std::string num(double x, const char* spec = "{:.3f}") { return std::isfinite(x) ? fmt::format(fmt::runtime(spec), x) : ""; }

}  // namespace

std::pair<double, double> mean_interval(const std::vector<double>& v, RlInterval kind) {
  if (v.size() < 2) return {std::nan(""), std::nan("")};
  if (kind == RlInterval::Bootstrap) {
    const auto means = bootstrap_means(v);
    return {percentile(means, 0.025), percentile(means, 0.975)};
  }
  const double m = mean_of(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  const double n = static_cast<double>(v.size());
  const double half = t975(static_cast<int>(v.size()) - 1) * std::sqrt(ss / (n - 1)) / std::sqrt(n);
  return {m - half, m + half};
}

std::vector<RlGroup> group_rl_curves(const std::vector<RlCurve>& runs, const RlGroupOptions& opt) {
  std::vector<RlGroup> groups;
  std::map<std::string, size_t> seen;  // name -> run index
  for (size_t i = 0; i < runs.size(); ++i) {
    if (opt.each) {
      groups.push_back({});
      groups.back().label = runs[i].name();
      groups.back().runs = {i};
      continue;
    }
    const auto [it, fresh] = seen.emplace(runs[i].name(), i);
    if (!fresh)
      throw UserError(fmt::format("'{}' and '{}' are both {}: give each seed of a label once (or draw them with --each)",
                                  runs[it->second].dir, runs[i].dir, runs[i].name()));
    auto g = std::find_if(groups.begin(), groups.end(), [&](const RlGroup& x) { return x.label == runs[i].label; });
    if (g == groups.end()) {
      groups.push_back({});
      g = groups.end() - 1;
      g->label = runs[i].label;
    }
    g->runs.push_back(i);
  }
  for (auto& g : groups) {
    std::vector<const RlCurve*> rs;
    const double inf = std::numeric_limits<double>::infinity();
    double lo = -inf, hi = inf;  // the span every seed covers
    size_t rows = 0;
    for (size_t i : g.runs) {
      const RlCurve& r = runs[i];
      for (size_t k = 0; k < r.env_steps.size(); ++k) {
        if (!std::isfinite(r.env_steps[k]))
          throw UserError(fmt::format("{}/curve.csv: row {} has no env steps", r.dir, k + 2));
        if (k > 0 && r.env_steps[k] < r.env_steps[k - 1])
          throw UserError(fmt::format("{}/curve.csv: the env steps go down at row {}", r.dir, k + 2));
      }
      if (r.env_steps.empty()) throw UserError(fmt::format("{}/curve.csv holds no evaluation yet", r.dir));
      rs.push_back(&r);
      lo = std::max(lo, r.env_steps.front());
      hi = std::min(hi, r.env_steps.back());
      rows = std::max(rows, r.env_steps.size());
    }
    if (hi < lo)
      throw UserError(fmt::format("the seeds of '{}' cover no common span of env steps (one ends before another starts)",
                                  g.label));
    // A span of one point (a seed evaluated once) is a grid of one point.
    const size_t n = hi == lo ? 1 : opt.points > 0 ? static_cast<size_t>(opt.points) : rows;
    if (rs.size() == 1 && opt.points == 0) {
      g.env_steps = rs[0]->env_steps;  // one run: its own evaluations
    } else {
      for (size_t k = 0; k < n; ++k)
        g.env_steps.push_back(n == 1 ? hi : std::round(lo + (hi - lo) * static_cast<double>(k) / static_cast<double>(n - 1)));
    }
    g.ret = band(rs, g.env_steps, opt.interval, opt, &RlCurve::ret);
    g.success = band(rs, g.env_steps, opt.interval, opt, &RlCurve::success, /*clamp=*/true);
  }
  return groups;
}

std::pair<std::string, std::string> rl_seed_tables(const std::vector<RlCurve>& runs, const std::vector<RlGroup>& groups,
                                                   RlInterval interval) {
  TextTable per_run{"Greedy evaluations of each run: the last one (final) and the best one", {}, {}};
  per_run.header = {"label", "seed", "evaluations", "env steps", "final success", "best success", "best at env steps",
                    "final return", "best return"};
  struct Ends {
    double final_success = std::nan(""), best_success = std::nan(""), best_at = std::nan("");
    double final_return = std::nan(""), best_return = std::nan("");
  };
  std::vector<Ends> ends(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const RlCurve& r = runs[i];
    Ends& e = ends[i];
    for (size_t k = 0; k < r.success.size(); ++k) {
      if (std::isfinite(r.success[k])) {
        e.final_success = r.success[k];
        if (!(r.success[k] <= e.best_success)) e.best_success = r.success[k], e.best_at = r.env_steps[k];
      }
      if (std::isfinite(r.ret[k])) {
        e.final_return = r.ret[k];
        if (!(r.ret[k] <= e.best_return)) e.best_return = r.ret[k];
      }
    }
    per_run.rows.push_back({r.label, r.seed, std::to_string(r.success.size()),
                            r.env_steps.empty() ? "" : num(r.env_steps.back(), "{:.0f}"), num(e.final_success),
                            num(e.best_success), num(e.best_at, "{:.0f}"), num(e.final_return, "{:.2f}"),
                            num(e.best_return, "{:.2f}")});
  }
  const char* how = interval == RlInterval::Bootstrap ? "bootstrap" : "Student t";
  TextTable per_label{fmt::format("Mean over each label's seeds, with the 95% interval ({}) in brackets", how), {}, {}};
  per_label.header = {"label", "seeds", "final success", "best success", "final return"};
  for (const auto& g : groups) {
    auto cell = [&](double Ends::*f, const char* spec, bool rate) {
      std::vector<double> v;
      for (size_t i : g.runs)
        if (std::isfinite(ends[i].*f)) v.push_back(ends[i].*f);
      if (v.empty()) return std::string();
      const auto iv = mean_interval(v, interval);
      const auto [lo, hi] = rate ? held_to_rate(iv) : iv;
      std::string s = num(mean_of(v), spec);
      if (std::isfinite(lo)) s += " [" + num(lo, spec) + ", " + num(hi, spec) + "]";
      return s;
    };
    per_label.rows.push_back({g.label, std::to_string(g.runs.size()), cell(&Ends::final_success, "{:.3f}", true),
                              cell(&Ends::best_success, "{:.3f}", true), cell(&Ends::final_return, "{:.2f}", false)});
  }
  std::vector<TextTable> tables{per_run};
  if (std::any_of(groups.begin(), groups.end(), [](const RlGroup& g) { return g.runs.size() > 1; }))
    tables.push_back(per_label);  // else there is nothing to average
  return {render_markdown(tables, {}), render_csv(tables)};
}

std::string rl_group_csv(const std::vector<RlGroup>& groups) {
  std::string s = "label,env_steps,seeds,return_mean,return_lo,return_hi,success_mean,success_lo,success_hi\n";
  auto g6 = [](double x) { return num(x, "{:.6g}"); };
  for (const auto& g : groups)
    for (size_t k = 0; k < g.env_steps.size(); ++k)
      s += fmt::format("{},{:.0f},{},{},{},{},{},{},{}\n", csv_field(g.label), g.env_steps[k], g.success.seeds[k],
                       g6(g.ret.mean[k]), g6(g.ret.lo[k]), g6(g.ret.hi[k]), g6(g.success.mean[k]), g6(g.success.lo[k]),
                       g6(g.success.hi[k]));
  return s;
}

namespace {
std::pair<Chart, Chart> empty_charts(const std::string& title) {
  Chart ret, suc;
  ret.title = title + ": return";
  suc.title = title + ": success rate";
  ret.x_title = suc.x_title = "environment steps";
  ret.y_title = "mean return";
  suc.y_title = "success rate";
  suc.y_span = std::make_pair(0.0, 1.0);
  return {ret, suc};
}
}  // namespace

std::vector<std::pair<std::string, Chart>> rl_charts(const std::vector<RlCurve>& runs, const std::string& title) {
  auto [ret, suc] = empty_charts(title);
  int style = 0;
  for (const auto& r : runs) {
    ret.series.push_back({r.name() + " (greedy eval)", r.env_steps, r.ret, style});
    suc.series.push_back({r.name() + " (greedy eval)", r.env_steps, r.success, style});
    ret.series.push_back({r.name() + " (training episodes)", r.env_steps, r.train_return, style + 1});
    suc.series.push_back({r.name() + " (training episodes)", r.env_steps, r.train_success, style + 1});
    style += 2;
  }
  return {{"curve_return", ret}, {"curve_success", suc}};
}

std::vector<std::pair<std::string, Chart>> rl_group_charts(const std::vector<RlGroup>& groups, const std::string& title) {
  auto [ret, suc] = empty_charts(title);
  int style = 0;
  for (const auto& g : groups) {
    const std::string name =
        g.runs.size() == 1 ? g.label + " (1 seed)" : fmt::format("{} (mean of {} seeds, 95% interval)", g.label, g.runs.size());
    ret.series.push_back({name, g.env_steps, g.ret.mean, style, g.ret.lo, g.ret.hi});
    suc.series.push_back({name, g.env_steps, g.success.mean, style, g.success.lo, g.success.hi});
    ++style;
  }
  return {{"curve_return", ret}, {"curve_success", suc}};
}

std::vector<std::string> write_rl_plots(const std::vector<std::pair<std::string, Chart>>& charts, const std::string& dir) {
  require_plotting();
  ensure_writable_dir(dir);
  std::vector<std::string> files;
  for (const auto& [name, chart] : charts) {
    const std::string base = join_path(dir, name);
    write_chart(chart, base);
    files.push_back(base + ".png");
  }
  return files;
}

}  // namespace memlab
