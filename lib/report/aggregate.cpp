#include "report/aggregate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "core/errors.h"

namespace memlab {

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double median_abs_deviation(const std::vector<double>& v) {
  const double m = median(v);
  std::vector<double> d;
  for (double x : v) d.push_back(std::fabs(x - m));
  return median(d);
}

double metric_value(const EvalPoint& e, Metric metric) {
  return 100.0 * (metric == Metric::Normalized ? e.normalized : e.accuracy);
}

std::optional<Score> score_run(const RunResult& run, const ReportOptions& opt) {
  std::optional<Score> s;
  for (const auto& e : run.evals) {
    if (e.lengths != run.eval_len) continue;
    const double v = metric_value(e, opt.metric);
    // Final: the latest step. Best: the highest value, the earliest step of ties.
    const bool take = !s || (opt.select == Select::Final ? e.step > s->step
                                                         : (v > s->value || (v == s->value && e.step < s->step)));
    if (take) s = Score{&run, e.step, v};
  }
  return s;
}

const EvalPoint* find_eval(const RunResult& run, int64_t step, const Range& lengths) {
  for (const auto& e : run.evals)
    if (e.step == step && e.lengths == lengths) return &e;
  return nullptr;
}

const Score* LrGroup::best() const {
  const Score* b = nullptr;
  for (const auto& s : seeds)
    if (!b || s.value > b->value) b = &s;
  return b;
}

const Cell* Report::cell(const std::string& label, const std::string& task) const {
  for (const auto& c : cells)
    if (c.label == label && c.task == task) return &c;
  return nullptr;
}

size_t Report::task_index(const std::string& task) const {
  return std::find(tasks.begin(), tasks.end(), task) - tasks.begin();
}

Report aggregate(const std::vector<RunResult>& runs, const ReportOptions& opt, std::vector<std::string> notes) {
  Report rep;
  rep.options = opt;
  std::map<std::pair<std::string, std::string>, size_t> cell_of;
  std::vector<std::string> unscored;
  std::map<std::tuple<std::string, std::string, double, int64_t>, int> repeats;
  std::set<std::string> all_tasks;
  for (const auto& run : runs) {
    all_tasks.insert(run.task);
    if (!opt.task.empty() && run.task != opt.task) continue;
    const auto score = score_run(run, opt);
    if (!score) {
      unscored.push_back(run.source);
      continue;
    }
    if (std::find(rep.labels.begin(), rep.labels.end(), run.label) == rep.labels.end()) rep.labels.push_back(run.label);
    if (std::find(rep.tasks.begin(), rep.tasks.end(), run.task) == rep.tasks.end()) {
      rep.tasks.push_back(run.task);
      rep.train_len.push_back(run.train_len);
      rep.eval_len.push_back(run.eval_len);
    }
    auto [it, fresh] = cell_of.emplace(std::make_pair(run.label, run.task), rep.cells.size());
    if (fresh) rep.cells.push_back(Cell{run.label, run.task, {}, 0, 0});
    Cell& c = rep.cells[it->second];
    auto g = std::find_if(c.lrs.begin(), c.lrs.end(), [&](const LrGroup& x) { return x.lr == run.lr; });
    if (g == c.lrs.end()) g = c.lrs.insert(c.lrs.end(), LrGroup{run.lr, {}, 0, 0, 0});
    g->seeds.push_back(*score);
    ++repeats[{run.label, run.task, run.lr, run.seed}];
  }
  if (!opt.task.empty() && rep.tasks.empty()) {
    std::string names;
    for (const auto& t : all_tasks) names += (names.empty() ? "" : ", ") + t;
    throw UserError(fmt::format("no evaluated run of task '{}' to report (tasks: {})", opt.task,
                                names.empty() ? "none" : names));
  }
  if (rep.cells.empty()) throw UserError("nothing to report: no run has an evaluation of its task.eval_len lengths");

  for (auto& c : rep.cells) {
    for (auto& g : c.lrs) {
      std::vector<double> v;
      for (const auto& s : g.seeds) v.push_back(s.value);
      g.max = *std::max_element(v.begin(), v.end());
      g.median = median(v);
      g.mad = median_abs_deviation(v);
    }
    for (size_t i = 1; i < c.lrs.size(); ++i) {
      if (c.lrs[i].max > c.lrs[c.best_lr].max) c.best_lr = i;
      if (c.lrs[i].median > c.lrs[c.median_lr].median) c.median_lr = i;
    }
  }

  // Length ranges per task: every evaluated range of the task's runs but their training range.
  for (size_t t = 0; t < rep.tasks.size(); ++t) {
    std::set<Range> ranges, train;
    std::set<Range> heads;
    for (const auto& c : rep.cells) {
      if (c.task != rep.tasks[t]) continue;
      for (const auto& g : c.lrs)
        for (const auto& s : g.seeds) {
          train.insert(s.run->train_len);
          heads.insert(s.run->eval_len);
          for (const auto& e : s.run->evals) ranges.insert(e.lengths);
        }
    }
    for (const auto& r : train) ranges.erase(r);
    rep.ranges.emplace_back(ranges.begin(), ranges.end());
    if (heads.size() > 1)
      notes.push_back(fmt::format("runs of {} differ in task.eval_len; each run is scored on its own", rep.tasks[t]));
  }

  if (!unscored.empty())
    notes.push_back(fmt::format("{} run{} left out: no evaluation of task.eval_len ({}{})", unscored.size(),
                                unscored.size() == 1 ? "" : "s", unscored.front(), unscored.size() > 1 ? ", ..." : ""));
  for (const auto& [k, n] : repeats)
    if (n > 1)
      notes.push_back(fmt::format("{} / {} / lr {:g} / seed {} appears {} times; each counts as a seed",
                                  std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), n));
  for (const auto& c : rep.cells)
    for (const auto& g : c.lrs)
      for (const auto& s : g.seeds)
        if (s.run->steps > 0 && opt.select == Select::Final) {
          int64_t last = 0;
          for (const auto& e : s.run->evals) last = std::max(last, e.step);
          if (last < s.run->steps)
            notes.push_back(fmt::format("run '{}' was evaluated up to step {} of its {} (stopped or still running)",
                                        s.run->source, last, s.run->steps));
        }
  rep.notes = std::move(notes);
  return rep;
}

std::string task_title(const std::string& task) {
  static const std::map<std::string, std::string> named = {
      {"anbn", "AnBn"}, {"anbncn", "AnBnCn"}, {"sum_mod5", "Mod-5 Sum"}, {"regbench", "RegBench"}};
  if (auto it = named.find(task); it != named.end()) return it->second;
  std::string s;
  bool up = true;
  for (char ch : task) {
    if (ch == '_' || ch == '-') {
      s += ' ';
      up = true;
    } else {
      s += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
      up = false;
    }
  }
  return s;
}

const char* metric_name(Metric m) { return m == Metric::Normalized ? "normalized" : "accuracy"; }
const char* select_name(Select s) { return s == Select::Final ? "final" : "best"; }

}  // namespace memlab
