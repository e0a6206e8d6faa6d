#include "report/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <map>
#include <set>

#include "core/errors.h"
#include "core/length_generalisation.h"
#include "report/paper_values.h"

namespace memlab {

Protocol parse_protocol(const std::string& s) {
  if (s == "hqlt") return Protocol::Hqlt;
  if (s == "subquadratic") return Protocol::Subquadratic;
  if (s == "mad") return Protocol::Mad;
  throw UserError(fmt::format("unknown --protocol '{}' (allowed: hqlt, subquadratic, mad)", s));
}

namespace {

std::string pct(double v) { return std::fabs(v) < 0.05 ? "0.0" : fmt::format("{:.1f}", v); }

template <typename T>
void add_once(std::vector<T>& v, const T& x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

// The value (a fraction, or % for mad) of a run on `lengths`: at its last evaluation (final) or the best.
bool run_value(const RunResult& run, const Range& lengths, const ProtocolOptions& opt, double& value, int64_t& step) {
  int64_t last = -1;
  for (const auto& e : run.evals) last = std::max(last, e.step);
  bool found = false;
  for (const auto& e : run.evals) {
    if (e.lengths != lengths) continue;
    if (opt.select == Select::Final && e.step != last) continue;
    const double v = opt.metric == Metric::Normalized ? e.normalized : e.accuracy;
    if (!found || v > value) {
      value = v;
      step = e.step;
      found = true;
    }
  }
  return found;
}

const char* metric_word(const ProtocolOptions& opt) {
  return opt.metric == Metric::Normalized ? "normalised accuracy" : "accuracy";
}

const char* step_words(const ProtocolOptions& opt) {
  return opt.select == Select::Final ? "at the final evaluation" : "at the best evaluation over training";
}

std::string missing_runs_note(const std::vector<std::string>& left_out, const std::string& why) {
  return fmt::format("{} run{} left out: {} ({}{})", left_out.size(), left_out.size() == 1 ? "" : "s", why,
                     left_out.front(), left_out.size() > 1 ? ", ..." : "");
}

}  // namespace

ProtocolReport subquadratic_report(const std::vector<RunResult>& runs, const ProtocolOptions& opt) {
  ProtocolReport rep;
  std::vector<std::string> labels, tasks;
  std::map<std::string, std::set<Range>> ranges;  // per task, every evaluated range but the training one
  struct Best {
    double value = -1;
    int64_t seeds = 0;
  };
  std::map<std::tuple<std::string, std::string, Range>, Best> best;
  std::map<std::pair<std::string, std::string>, int64_t> runs_of;
  std::vector<std::string> left_out;
  for (const auto& run : runs) {
    if (!opt.task.empty() && run.task != opt.task) continue;
    bool any = false;
    std::set<Range> seen;
    for (const auto& e : run.evals) seen.insert(e.lengths);
    for (const auto& r : seen) {
      if (r == run.train_len) continue;
      double v = 0;
      int64_t step = 0;
      if (!run_value(run, r, opt, v, step)) continue;
      auto& b = best[{run.label, run.task, r}];
      b.value = std::max(b.value, v);
      ranges[run.task].insert(r);
      any = true;
    }
    if (!any) {
      left_out.push_back(run.source);
      continue;
    }
    add_once(labels, run.label);
    add_once(tasks, run.task);
    ++runs_of[{run.label, run.task}];
  }
  if (labels.empty()) {
    if (!opt.task.empty()) throw UserError(fmt::format("no evaluated run of task '{}' to report", opt.task));
    throw UserError("nothing to report: no run has an evaluation outside its training lengths");
  }
  std::set<Range> all;
  for (const auto& [t, rs] : ranges) all.insert(rs.begin(), rs.end());

  const std::string where = opt.positions.empty() ? "" : " " + opt.positions;
  TextTable table{fmt::format("Best run (max over seeds and learning rates): {}{} {} by evaluation length "
                              "(as \"On Subquadratic Architectures\", Table 13: best of 5 seeds)",
                              metric_word(opt), where, step_words(opt)),
                  {"Model", "Length"},
                  {}};
  std::vector<std::string> titles;
  for (const auto& t : tasks) table.header.push_back(task_title(t));
  for (const auto& label : labels) {
    for (const auto& r : all) {
      std::vector<std::string> row{label, r.min == r.max ? std::to_string(r.min) : range_name(r)};
      bool any = false;
      for (const auto& t : tasks) {
        auto it = best.find({label, t, r});
        any = any || it != best.end();
        row.push_back(it == best.end() ? "-" : fmt::format("{:.3f}", it->second.value));
      }
      if (any) table.rows.push_back(row);
    }
  }
  TextTable longest{fmt::format("Longest evaluation length up to which the best run's {}{} stays at or above {:g} "
                                "(0: already below at the shortest); runs per cell in brackets",
                                metric_word(opt), where, opt.threshold),
                    {"Model"},
                    {}};
  for (const auto& t : tasks) longest.header.push_back(task_title(t));
  for (const auto& label : labels) {
    std::vector<std::string> row{label};
    for (const auto& t : tasks) {
      std::vector<LengthAccuracy> bins;
      for (const auto& r : ranges[t]) {
        auto it = best.find({label, t, r});
        if (it != best.end()) bins.push_back({r.min, r.max, it->second.value});
      }
      row.push_back(bins.empty() ? "-"
                                 : fmt::format("{} ({})", longest_length_at(bins, opt.threshold),
                                               runs_of[{label, t}]));
    }
    longest.rows.push_back(row);
  }
  if (opt.paper) add_paper_columns(table, "best", tasks, /*length_column=*/true, *opt.paper);
  rep.tables = {table, longest};
  if (!left_out.empty()) rep.notes.push_back(missing_runs_note(left_out, "no evaluation outside the training lengths"));
  return rep;
}

ProtocolReport mad_report(const std::vector<RunResult>& runs, const ProtocolOptions& opt) {
  ProtocolReport rep;
  std::vector<std::string> labels, tasks;
  // Settings per task in order of first appearance; a setting is the run's task keys.
  std::map<std::string, std::vector<std::map<std::string, std::string>>> settings;
  std::map<std::tuple<std::string, std::string, size_t>, double> best;  // (label, task, setting) -> %
  std::map<std::tuple<std::string, std::string, size_t>, int64_t> count;
  std::vector<std::string> left_out;
  for (const auto& run : runs) {
    if (!opt.task.empty() && run.task != opt.task) continue;
    double v = 0;
    int64_t step = 0;
    if (!run_value(run, run.eval_len, opt, v, step)) {
      left_out.push_back(run.source);
      continue;
    }
    add_once(labels, run.label);
    add_once(tasks, run.task);
    auto& list = settings[run.task];
    auto it = std::find(list.begin(), list.end(), run.task_keys);
    const size_t s = it - list.begin();
    if (it == list.end()) list.push_back(run.task_keys);
    const auto key = std::make_tuple(run.label, run.task, s);
    auto b = best.find(key);
    if (b == best.end() || 100.0 * v > b->second) best[key] = 100.0 * v;
    ++count[key];
  }
  if (labels.empty()) {
    if (!opt.task.empty()) throw UserError(fmt::format("no evaluated run of task '{}' to report", opt.task));
    throw UserError("nothing to report: no run has an evaluation of its task.eval_len lengths");
  }

  TextTable summary{fmt::format("Mean over each task's settings of the best run per setting (max over learning "
                                "rate, weight decay and seeds): {} [%] {} on task.eval_len (MAD protocol; "
                                "MesaNet Table 1, where IC and noisy recall share a column)",
                                metric_word(opt), step_words(opt)),
                    {"Model"},
                    {}};
  for (const auto& t : tasks) summary.header.push_back(task_title(t));
  summary.header.push_back("Avg.");
  std::vector<TextTable> details;
  for (const auto& label : labels) {
    std::vector<std::string> row{label};
    double sum = 0;
    int64_t n = 0;
    for (const auto& t : tasks) {
      double s = 0;
      size_t have = 0;
      for (size_t i = 0; i < settings[t].size(); ++i) {
        auto b = best.find({label, t, i});
        if (b == best.end()) continue;
        s += b->second;
        ++have;
      }
      if (have == 0) {
        row.push_back("-");
        continue;
      }
      row.push_back(pct(s / static_cast<double>(have)));
      sum += s / static_cast<double>(have);
      ++n;
      if (have < settings[t].size())
        rep.notes.push_back(fmt::format("{} on {}: {} of the task's {} settings have runs; the mean is over those",
                                        label, task_title(t), have, settings[t].size()));
    }
    row.push_back(n ? pct(sum / static_cast<double>(n)) : "-");
    summary.rows.push_back(row);
  }
  // Per task: one column per setting, named by the task keys that differ among the task's settings
  // (eval_len left out where it always equals train_len), ordered by those keys' values.
  for (const auto& t : tasks) {
    const auto& list = settings[t];
    std::set<std::string> differing;
    for (const auto& s : list)
      for (const auto& [k, v] : s)
        for (const auto& o : list) {
          auto f = o.find(k);
          if (f == o.end() || f->second != v) differing.insert(k);
        }
    if (std::all_of(list.begin(), list.end(), [](const std::map<std::string, std::string>& s) {
          auto a = s.find("eval_len"), b = s.find("train_len");
          return a != s.end() && b != s.end() && a->second == b->second;
        }))
      differing.erase("eval_len");
    std::vector<size_t> order(list.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // numbers compare as numbers ("64" < "128"), the rest as text
    auto value_less = [](const std::string& a, const std::string& b) {
      char* ea = nullptr;
      char* eb = nullptr;
      const double x = std::strtod(a.c_str(), &ea), y = std::strtod(b.c_str(), &eb);
      if (ea != a.c_str() && eb != b.c_str() && *ea == 0 && *eb == 0) return x < y;
      const auto digits = [](const std::string& s) { return s.find_first_of("0123456789"); };
      if (digits(a) != std::string::npos && digits(b) != std::string::npos) {
        const double p = std::strtod(a.c_str() + digits(a), nullptr), q = std::strtod(b.c_str() + digits(b), nullptr);
        if (p != q) return p < q;
      }
      return a < b;
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      for (const auto& k : differing) {
        auto fa = list[a].find(k), fb = list[b].find(k);
        const std::string va = fa == list[a].end() ? "" : fa->second, vb = fb == list[b].end() ? "" : fb->second;
        if (va != vb) return value_less(va, vb);
      }
      return false;
    });
    TextTable d{fmt::format("{}: best run per setting, {} [%]; (runs) behind each", task_title(t), metric_word(opt)),
                {"Model"},
                {}};
    for (size_t i : order) {
      const auto& s = list[i];
      std::string name;
      for (const auto& k : differing) {
        auto f = s.find(k);
        name += fmt::format("{}{}={}", name.empty() ? "" : " ", k, f == s.end() ? "-" : f->second);
      }
      d.header.push_back(name.empty() ? "baseline" : name);
    }
    for (const auto& label : labels) {
      std::vector<std::string> row{label};
      bool any = false;
      for (size_t i : order) {
        auto b = best.find({label, t, i});
        any = any || b != best.end();
        row.push_back(b == best.end() ? "-" : fmt::format("{} ({})", pct(b->second), count[{label, t, i}]));
      }
      if (any) d.rows.push_back(row);
    }
    details.push_back(d);
  }
  if (opt.paper) add_paper_columns(summary, "summary", tasks, /*length_column=*/false, *opt.paper);
  rep.tables.push_back(summary);
  rep.tables.insert(rep.tables.end(), details.begin(), details.end());
  if (!left_out.empty()) rep.notes.push_back(missing_runs_note(left_out, "no evaluation of task.eval_len"));
  return rep;
}

}  // namespace memlab
