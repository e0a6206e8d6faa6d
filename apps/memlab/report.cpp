// memlab report: tables (best, median ± MAD over seeds at the best lr; length generalisation) and plots
// of finished runs, from results folders of `memlab sweep` or run directories of `memlab train`.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "commands.h"
#include "core/errors.h"
#include "core/io.h"
#include "report/aggregate.h"
#include "report/plot.h"
#include "report/results.h"
#include "report/table.h"

namespace memlab {

namespace {
struct ReportArgs {
  std::vector<std::string> paths;
  std::string format = "md", out, select = "final", metric = "normalized", task;
  bool plot = false;
};

const char* kFooter = R"(Inputs (each RESULTS): a results folder of memlab sweep (results.sqlite; runs whose status is
not "done" are left out and counted in a note), a run directory of memlab train (config.yaml, eval.csv,
train.csv), or a folder holding run directories one level down.

Rows are labels (config key 'label'; when empty, model.name plus the model keys that tell apart runs of
the same task and model.name), in order of first appearance; columns are tasks.
A run's score: its accuracy in % (--metric normalized: (acc - chance)/(1 - chance)) on the task's
headline lengths task.eval_len, at the final evaluation (--select final) or the best one (--select best).
Per label, task and learning rate the seeds' scores are aggregated; "best" is the max over seeds at the
lr whose max is highest (the HQLT paper's Table 3), "median +- MAD" the median and median absolute
deviation at the lr whose median is highest (Table 6); ties go to the lr met first. The length table of
a task shows, per label, every evaluated length range but the training one, for the best seed at the
best lr at the step of its score.

CSV (--format csv), one value per line:
  kind,label,task,lr,seed,step,length_min,length_max,seeds,metric,value,mad
  kind=run     one per run: its score (value) at step on length_min-length_max (task.eval_len)
  kind=best    per label and task: max over seeds at the chosen lr; seed/step of that run; seeds = n
  kind=median  per label and task: median (value) and MAD at the lr with the best median; seeds = n
  kind=length  per label, task and length range: the best run's value on that range
  value and mad are in %; metric is normalized or accuracy. Notes go to stderr.

Output: stdout, or DIR/report.md|csv|tex with --out DIR. --plot writes <task>_length, <task>_learning
and <task>_loss as .png and .svg into --out DIR (default: the first RESULTS).)";
}  // namespace

std::function<int()> add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand("report", "tables and plots over seeds and learning rates of finished runs");
  cmd->add_option("RESULTS", args->paths, "results folders, run directories, or folders of run directories")
      ->required();
  cmd->add_option("--format", args->format, "md (default), csv or tex");
  cmd->add_flag("--plot", args->plot, "also draw PNG and SVG plots");
  cmd->add_option("--out", args->out, "write report.<format> (and plots) into this folder instead of stdout");
  cmd->add_option("--select", args->select, "final (default) or best: which evaluation step scores a run");
  cmd->add_option("--metric", args->metric, "normalized (default) or accuracy");
  cmd->add_option("--task", args->task, "report this task only");
  cmd->footer(kFooter);
  return [cmd, args]() -> int {
    if (!cmd->parsed()) return -1;
    const Format format = parse_format(args->format);
    ReportOptions opt;
    if (args->select == "final")
      opt.select = Select::Final;
    else if (args->select == "best")
      opt.select = Select::Best;
    else
      throw UserError(fmt::format("unknown --select '{}' (allowed: final, best)", args->select));
    if (args->metric == "normalized")
      opt.metric = Metric::Normalized;
    else if (args->metric == "accuracy")
      opt.metric = Metric::Accuracy;
    else
      throw UserError(fmt::format("unknown --metric '{}' (allowed: normalized, accuracy)", args->metric));
    opt.task = args->task;
    if (args->plot) require_plotting();  // before anything is written

    LoadedRuns loaded = load_results(args->paths);
    const Report rep = aggregate(loaded.runs, opt, loaded.notes);
    const std::string text = format_report(rep, format);
    if (!args->out.empty()) ensure_writable_dir(args->out);
    if (args->out.empty()) {
      std::fputs(text.c_str(), stdout);
    } else {
      const std::string path = join_path(args->out, fmt::format("report.{}", format_extension(format)));
      write_file_atomic(path, text);
      std::fprintf(stderr, "wrote %s\n", path.c_str());
    }
    if (format == Format::Csv)
      for (const auto& n : rep.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    if (args->plot) {
      const std::string dir = args->out.empty() ? args->paths.front() : args->out;
      for (const auto& f : write_report_plots(rep, dir)) std::fprintf(stderr, "wrote %s\n", f.c_str());
    }
    return 0;
  };
}

}  // namespace memlab
