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
#include "report/paper_values.h"
#include "report/protocol.h"
#include "report/results.h"
#include "report/table.h"

namespace memlab {

namespace {
struct ReportArgs {
  std::vector<std::string> paths;
  std::string format = "md", out, select = "final", metric, task, protocol = "hqlt", positions, paper;
  double threshold = 0.9;
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
  kind=paper_best, paper_median  with --paper: the paper's value (and its spread in mad)
  value and mad are in %; metric is normalized or accuracy. Notes go to stderr.

Protocols (--protocol): hqlt is the above. subquadratic ("On Subquadratic Architectures", Table 13):
per label, task and evaluated length (all but the training range), the best run over seeds and learning
rates, as a fraction; then per label and task the longest length up to which that stays >= --threshold.
mad (MAD / MesaNet Table 1; RegBench): runs are grouped by label, task and setting (all task.* keys), the
best run of a group (over learning rate, weight decay, seeds) scores the setting, and a task's score is
the mean over its settings; per-task tables show every setting. Set `label` in the configs to pool other
hyperparameters (width, layers) into one row. Their CSV is each table as lines: "table,<header>" then
"<table index>,<row>".

--paper FILE puts a paper's published values beside memlab's: a "paper" column after each task of the best
and median tables (hqlt), the best table (subquadratic, per length; at the last position) or the summary
(mad). FILE is YAML: table -> label -> task -> value, e.g. configs/papers/hqlt_table3.yaml; its metric: must
be the report's --metric, and --positions all refuses it (the values are at the last position); values that
match no row or column are named on stderr.

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
  cmd->add_option("--out", args->out, "write report.<format> (and plots) into this folder instead of stdout")
      ->check(non_empty());
  cmd->add_option("--select", args->select, "final (default) or best: which evaluation step scores a run");
  cmd->add_option("--metric", args->metric,
                  "normalized or accuracy (default: normalized for hqlt, accuracy for subquadratic and mad)");
  cmd->add_option("--protocol", args->protocol, "hqlt (default), subquadratic or mad: which paper's aggregation");
  cmd->add_option("--threshold", args->threshold,
                  "subquadratic: accuracy the longest generalised length must keep (default 0.9)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--task", args->task, "report this task only");
  cmd->add_option("--paper", args->paper, "a YAML file of the paper's values, shown beside memlab's (see below)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--positions", args->positions,
                  "last: the headline (a running answer's last position), all: every scored position, both "
                  "(subquadratic: its tables for each); default both for subquadratic, else last")
      ->check(CLI::IsMember({"last", "all", "both"}));
  cmd->footer(kFooter);
  return [cmd, args]() -> int {
    if (!cmd->parsed()) return -1;
    const Format format = parse_format(args->format);
    const Protocol protocol = parse_protocol(args->protocol);
    if (args->metric.empty()) args->metric = protocol == Protocol::Hqlt ? "normalized" : "accuracy";
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
    PaperValues paper;
    if (!args->paper.empty()) {
      paper = read_paper_values(args->paper);
      opt.paper = &paper;
    }
    if (args->plot) require_plotting();  // before anything is written

    if (args->plot && protocol != Protocol::Hqlt)
      throw UserError("--plot draws the hqlt protocol's plots only; leave it out with --protocol " + args->protocol);

    if (args->positions.empty()) args->positions = protocol == Protocol::Subquadratic ? "both" : "last";
    if (args->positions == "both" && protocol != Protocol::Subquadratic)
      throw UserError("--positions both goes with --protocol subquadratic; pick last or all");

    if (opt.paper && !paper.metric.empty() && paper.metric != args->metric)
      throw UserError(fmt::format("{} holds {} values; report them with --metric {}", args->paper, paper.metric,
                                  paper.metric));
    if (opt.paper && args->positions == "all")
      throw UserError("--paper shows the paper's values at the answer's last position; leave out --positions all");

    LoadedRuns loaded = load_results(args->paths);
    if (args->positions == "all") loaded = every_position(loaded);
    std::string text;
    std::vector<std::string> notes;
    Report rep;
    if (protocol == Protocol::Hqlt) {
      rep = aggregate(loaded.runs, opt, loaded.notes);
      text = format_report(rep, format);
      notes = rep.notes;
    } else {
      ProtocolOptions po;
      po.select = opt.select;
      po.metric = opt.metric;
      po.task = opt.task;
      po.threshold = args->threshold;
      po.paper = opt.paper;
      ProtocolReport pr;
      if (protocol == Protocol::Mad) {
        pr = mad_report(loaded.runs, po);
      } else {
        po.positions = args->positions == "all" ? "at every scored position" : "at the answer's last position";
        pr = subquadratic_report(loaded.runs, po);
        if (args->positions == "both") {  // the same tables over every position of the running answer
          const LoadedRuns every = every_position(loaded);
          po.positions = "at every scored position";
          po.paper = nullptr;  // the paper's values are at the last position
          if (!every.runs.empty()) {
            ProtocolReport all = subquadratic_report(every.runs, po);
            pr.tables.insert(pr.tables.end(), all.tables.begin(), all.tables.end());
          }
          pr.notes.insert(pr.notes.end(), every.notes.begin() + static_cast<long>(loaded.notes.size()), every.notes.end());
        }
      }
      notes = loaded.notes;
      notes.insert(notes.end(), pr.notes.begin(), pr.notes.end());
      text = format == Format::Markdown ? render_markdown(pr.tables, notes)
             : format == Format::Tex    ? render_tex(pr.tables, notes)
                                        : render_csv(pr.tables);
    }
    if (!args->out.empty()) ensure_writable_dir(args->out);
    if (args->out.empty()) {
      std::fputs(text.c_str(), stdout);
    } else {
      const std::string path = join_path(args->out, fmt::format("report.{}", format_extension(format)));
      write_file_atomic(path, text);
      std::fprintf(stderr, "wrote %s\n", path.c_str());
    }
    if (format == Format::Csv)
      for (const auto& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    if (const std::string unshown = opt.paper ? unshown_paper_values(paper) : ""; !unshown.empty())
      std::fprintf(stderr, "note: %s\n", unshown.c_str());
    if (args->plot) {
      const std::string dir = args->out.empty() ? args->paths.front() : args->out;
      for (const auto& f : write_report_plots(rep, dir)) std::fprintf(stderr, "wrote %s\n", f.c_str());
    }
    return 0;
  };
}

}  // namespace memlab
