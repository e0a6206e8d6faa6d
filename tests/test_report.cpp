// memlab report: scores, aggregation over seeds and learning rates, tables, labels, chart data.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <tuple>

#include "core/errors.h"
#include "core/io.h"
#include "report/aggregate.h"
#include "report/paper_values.h"
#include "core/length_generalisation.h"
#include "report/plot.h"
#include "report/protocol.h"
#include "report/results.h"
#include "report/rl_curves.h"
#include "report/run_result.h"
#include "report/table.h"
#include "sweep/store.h"

namespace memlab {
namespace {

const Range kTrain{3, 40}, kHead{40, 256};

// Evaluation rows as (step, min, max, normalised fraction); accuracy as parity's (chance 1/2).
using Row = std::tuple<int64_t, int64_t, int64_t, double>;

RunResult make_run(const std::string& label, const std::string& task, double lr, int64_t seed,
                   const std::vector<Row>& rows) {
  RunResult r;
  r.source = label + "/" + task + "/" + std::to_string(lr) + "/" + std::to_string(seed);
  r.label = label;
  r.task = task;
  r.model = label;
  r.lr = lr;
  r.seed = seed;
  r.train_len = kTrain;
  r.eval_len = kHead;
  for (const auto& [step, a, b, norm] : rows) r.evals.push_back(EvalPoint{step, {a, b}, 64, 0.5 + 0.5 * norm, norm});
  return r;
}

// A run with one evaluation (final step 100) of the headline range at `norm`.
RunResult scored(const std::string& label, const std::string& task, double lr, int64_t seed, double norm) {
  return make_run(label, task, lr, seed, {{100, 40, 256, norm}});
}

// Written out here rather than calling the library, so the test checks it.
double test_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

TEST(LengthGeneralisation, LongestLengthAtThreshold) {
  // the aggregate range 40-256 holds the bins, so it is left out; 129-256 is below: longest = 128
  EXPECT_EQ(longest_length_at({{3, 40, 1.0}, {40, 256, 0.95}, {40, 64, 0.99}, {65, 128, 0.9}, {129, 256, 0.6}}, 0.9), 128);
  EXPECT_EQ(longest_length_at({{512, 512, 0.95}, {128, 128, 1.0}, {2048, 2048, 0.91}}, 0.9), 2048);
  // a later bin above the threshold does not count after one below it
  EXPECT_EQ(longest_length_at({{128, 128, 1.0}, {512, 512, 0.5}, {2048, 2048, 0.95}}, 0.9), 128);
  EXPECT_EQ(longest_length_at({{128, 128, 0.5}}, 0.9), 0);
  EXPECT_EQ(longest_length_at({}, 0.9), 0);
}

TEST(Protocol, SubquadraticBestOverSeedsPerLength) {
  // rows carry normalised fractions; accuracy = 0.5 + 0.5 * normalised
  std::vector<RunResult> runs{make_run("G", "parity", 1e-3, 1, {{10, 3, 40, 0.0}, {10, 128, 128, 1.0}, {10, 512, 512, 0.2}}),
                              make_run("G", "parity", 1e-3, 2, {{10, 128, 128, 0.9}, {10, 512, 512, 0.9}}),
                              make_run("G", "parity", 1e-3, 3, {{5, 128, 128, 1.0}, {5, 512, 512, 1.0},
                                                                {10, 128, 128, 0.0}, {10, 512, 512, 0.0}})};
  ProtocolOptions opt;  // accuracy, final step
  auto rep = subquadratic_report(runs, opt);
  ASSERT_EQ(rep.tables.size(), 2u);
  const auto& t = rep.tables[0];
  ASSERT_EQ(t.rows.size(), 2u);  // 128 and 512; the training range is left out
  EXPECT_EQ(t.rows[0], (std::vector<std::string>{"G", "128", "1.000"}));
  EXPECT_EQ(t.rows[1], (std::vector<std::string>{"G", "512", "0.950"}));  // seed 2; seed 3's 1.0 was not final
  EXPECT_EQ(rep.tables[1].rows[0], (std::vector<std::string>{"G", "512 (3)"}));
  opt.select = Select::Best;
  EXPECT_EQ(subquadratic_report(runs, opt).tables[0].rows[1][2], "1.000");
  opt.threshold = 0.96;
  opt.select = Select::Final;
  EXPECT_EQ(subquadratic_report(runs, opt).tables[1].rows[0][1], "128 (3)");
  opt.task = "s3";
  EXPECT_THROW(subquadratic_report(runs, opt), UserError);
}

TEST(Protocol, MadMeanOverSettingsOfTheBestRun) {
  auto run = [](const std::string& label, const std::string& vocab, double lr, double norm) {
    RunResult r = make_run(label, "mad_recall", lr, 1, {{100, 40, 256, norm}});
    r.task_keys = {{"mad.vocab", vocab}, {"train_len", "[40, 256]"}};
    return r;
  };
  // accuracy = 0.5 + 0.5 * norm: vocab 16 best 1.0 (100%), vocab 32 best 0.8 (80%) -> mean 90
  std::vector<RunResult> runs{run("T", "16", 1e-3, 1.0), run("T", "16", 3e-3, 0.2), run("T", "32", 1e-3, 0.6),
                              run("T", "32", 3e-3, 0.4), run("D", "16", 1e-3, 0.0)};
  auto rep = mad_report(runs, ProtocolOptions{});
  ASSERT_EQ(rep.tables.size(), 2u);
  EXPECT_EQ(rep.tables[0].header, (std::vector<std::string>{"Model", "Mad Recall", "Avg."}));
  EXPECT_EQ(rep.tables[0].rows[0], (std::vector<std::string>{"T", "90.0", "90.0"}));
  EXPECT_EQ(rep.tables[0].rows[1], (std::vector<std::string>{"D", "50.0", "50.0"}));
  // the per-setting table names settings by the keys that differ, with the runs behind each
  EXPECT_EQ(rep.tables[1].header, (std::vector<std::string>{"Model", "mad.vocab=16", "mad.vocab=32"}));
  EXPECT_EQ(rep.tables[1].rows[0], (std::vector<std::string>{"T", "100.0 (2)", "80.0 (2)"}));
  EXPECT_EQ(rep.tables[1].rows[1], (std::vector<std::string>{"D", "50.0 (1)", "-"}));
  ASSERT_EQ(rep.notes.size(), 1u);  // D has one of the two settings
  EXPECT_THROW(parse_protocol("table3"), UserError);
}

TEST(Report, MedianAndMad) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  // |x - 3| = 2 1 0 1 97 -> median 1; an outlier moves neither.
  EXPECT_DOUBLE_EQ(median_abs_deviation({1, 2, 3, 4, 100}), 1);
  // |x - 2.5| = 1.5 .5 .5 1.5 -> 1.
  EXPECT_DOUBLE_EQ(median_abs_deviation({1, 2, 3, 4}), 1);
  EXPECT_DOUBLE_EQ(median_abs_deviation({7}), 0);
}

TEST(Report, BestAndMedianPickTheirOwnLearningRate) {
  // lr 1e-3: one lucky seed (max 90, median 20); lr 5e-4: steady (max 60, median 55).
  std::vector<RunResult> runs;
  const std::vector<double> a{0.90, 0.10, 0.20}, b{0.50, 0.60, 0.55};
  for (int s = 0; s < 3; ++s) runs.push_back(scored("m", "parity", 1e-3, s + 1, a[s]));
  for (int s = 0; s < 3; ++s) runs.push_back(scored("m", "parity", 5e-4, s + 1, b[s]));
  const Report rep = aggregate(runs, {});
  ASSERT_EQ(rep.cells.size(), 1u);
  const Cell& c = rep.cells[0];
  ASSERT_EQ(c.lrs.size(), 2u);
  EXPECT_DOUBLE_EQ(c.by_max().lr, 1e-3);
  EXPECT_NEAR(c.by_max().max, 90, 1e-9);
  EXPECT_EQ(c.best_run().run->seed, 1);
  EXPECT_DOUBLE_EQ(c.by_median().lr, 5e-4);
  std::vector<double> pct;
  for (double x : b) pct.push_back(100 * x);
  const double m = test_median(pct);
  std::vector<double> dev;
  for (double x : pct) dev.push_back(std::fabs(x - m));
  EXPECT_NEAR(c.by_median().median, m, 1e-9);
  EXPECT_NEAR(c.by_median().mad, test_median(dev), 1e-9);
  EXPECT_NEAR(c.by_median().mad, 5, 1e-9);
  EXPECT_EQ(c.by_median().seeds.size(), 3u);
}

TEST(Report, TiesGoToTheLearningRateMetFirst) {
  std::vector<RunResult> runs{scored("m", "parity", 1e-2, 1, 0.5), scored("m", "parity", 1e-3, 1, 0.5)};
  const Report rep = aggregate(runs, {});
  EXPECT_DOUBLE_EQ(rep.cells[0].by_max().lr, 1e-2);
  EXPECT_DOUBLE_EQ(rep.cells[0].by_median().lr, 1e-2);
}

TEST(Report, FinalOrBestStepAndMetric) {
  std::vector<RunResult> runs{make_run("m", "parity", 1e-3, 1,
                                       {{10, 40, 256, 0.8}, {20, 40, 256, 0.6}, {30, 3, 40, 1.0}, {30, 40, 256, 0.7}})};
  ReportOptions opt;
  auto s = score_run(runs[0], opt);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->step, 30);  // the last step evaluated on the headline range
  EXPECT_NEAR(s->value, 70, 1e-9);
  opt.select = Select::Best;
  s = score_run(runs[0], opt);
  EXPECT_EQ(s->step, 10);
  EXPECT_NEAR(s->value, 80, 1e-9);
  opt.metric = Metric::Accuracy;
  s = score_run(runs[0], opt);
  EXPECT_NEAR(s->value, 90, 1e-9);  // accuracy 0.5 + 0.5 * 0.8
  // No headline row at all: not scored.
  EXPECT_FALSE(score_run(make_run("m", "parity", 1e-3, 1, {{10, 3, 40, 1.0}}), {}));
}

TEST(Report, LengthRangesRowsAndColumns) {
  std::vector<Row> rows;
  for (auto [a, b] : std::vector<std::pair<int, int>>{{3, 40}, {129, 256}, {40, 256}, {65, 128}, {40, 64}})
    rows.emplace_back(100, a, b, a == 3 ? 1.0 : 1.0 - b / 512.0);
  std::vector<RunResult> runs{make_run("z", "mod_arith", 1e-3, 1, rows), make_run("a", "parity", 1e-3, 1, rows),
                              make_run("z", "parity", 1e-3, 1, rows)};
  const Report rep = aggregate(runs, {});
  EXPECT_EQ(rep.labels, (std::vector<std::string>{"z", "a"}));          // first appearance
  EXPECT_EQ(rep.tasks, (std::vector<std::string>{"mod_arith", "parity"}));
  ASSERT_EQ(rep.ranges.size(), 2u);
  std::vector<std::string> names;
  for (const auto& r : rep.ranges[0]) names.push_back(range_name(r));
  EXPECT_EQ(names, (std::vector<std::string>{"40-64", "40-256", "65-128", "129-256"}));
  EXPECT_EQ(task_title("mod_arith"), "Mod Arith");
  EXPECT_EQ(task_title("parity"), "Parity");

  // --task keeps one column; an unknown task names the ones there are.
  ReportOptions opt;
  opt.task = "parity";
  EXPECT_EQ(aggregate(runs, opt).tasks, (std::vector<std::string>{"parity"}));
  opt.task = "nope";
  try {
    aggregate(runs, opt);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("mod_arith, parity"), std::string::npos) << e.what();
  }
  EXPECT_THROW(aggregate({}, {}), UserError);
}

// The small case of the format tests: A has two lrs whose best and median picks differ, B one run
// that lacks the 40-100 range.
std::vector<RunResult> small_case() {
  return {make_run("A", "parity", 1e-3, 1, {{100, 3, 40, 1.0}, {100, 40, 100, 0.8}, {100, 40, 256, 0.5}}),
          make_run("A", "parity", 1e-3, 2, {{100, 3, 40, 0.9}, {100, 40, 100, 0.6}, {100, 40, 256, 0.3}}),
          make_run("A", "parity", 1e-2, 1, {{100, 40, 256, 0.45}}),
          make_run("A", "parity", 1e-2, 2, {{100, 40, 256, 0.44}}),
          make_run("B", "parity", 1e-3, 1, {{100, 3, 40, 0.7}, {100, 40, 256, 0.1}})};
}

TEST(Report, Markdown) {
  const auto runs = small_case();
  const std::string md = format_markdown(aggregate(runs, {}));
  const std::string expected =
      "Best over seeds: normalised accuracy [%] (0 = chance) at the final evaluation on lengths 40-256, at the "
      "learning rate whose best seed is highest (HQLT paper, Table 3)\n"
      "\n"
      "| Model | Parity |\n"
      "|---|---:|\n"
      "| A | 50.0 |\n"
      "| B | 10.0 |\n"
      "\n"
      "Median \xC2\xB1 MAD over seeds: normalised accuracy [%] (0 = chance) at the final evaluation on lengths 40-256, "
      "at the learning rate whose median is highest (HQLT paper, Table 6)\n"
      "\n"
      "| Model | Parity |\n"
      "|---|---:|\n"
      "| A | 44.5 \xC2\xB1 0.5 |\n"
      "| B | 10.0 \xC2\xB1 0.0 |\n"
      "\n"
      "Learning rate chosen (seeds at it): for the best, and for the median where it differs\n"
      "\n"
      "| Model | Parity |\n"
      "|---|---:|\n"
      "| A | best 0.001 (2), median 0.01 (2) |\n"
      "| B | 0.001 (1) |\n"
      "\n"
      "Length generalisation on Parity: normalised accuracy [%] (0 = chance) at the final evaluation by length range, "
      "of the best seed at the best learning rate; trained on lengths 3-40\n"
      "\n"
      "| Model | 40-100 | 40-256 | lr / seed / step |\n"
      "|---|---:|---:|---:|\n"
      "| A | 80.0 | 50.0 | 0.001 / 1 / 100 |\n"
      "| B | - | 10.0 | 0.001 / 1 / 100 |\n"
      "\n";
  EXPECT_EQ(md, expected);
  // Notes come last (given ones first, then runs left out); a '|' in a label is escaped.
  auto more = runs;
  more.push_back(make_run("C|D", "parity", 1e-3, 1, {{100, 40, 256, 0.2}}));
  more.push_back(make_run("E", "parity", 1e-3, 1, {{100, 3, 40, 0.7}}));
  const std::string md2 = format_markdown(aggregate(more, {}, {"2 runs pending"}));
  EXPECT_NE(md2.find("\n| C\\|D | 20.0 |\n"), std::string::npos) << md2;
  EXPECT_EQ(md2.find("| E |"), std::string::npos) << md2;
  EXPECT_NE(md2.find("\nNotes:\n\n- 2 runs pending\n- 1 run left out: no evaluation of task.eval_len"), std::string::npos)
      << md2;
}

TEST(Report, CsvIsLongFormat) {
  const auto runs = small_case();
  const std::string csv = format_csv(aggregate(runs, {}));
  EXPECT_EQ(csv.substr(0, csv.find('\n')), kReportCsvHeader);
  auto has = [&](const std::string& line) { return csv.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("run,A,parity,0.001,2,100,40,256,1,normalized,30,")) << csv;
  EXPECT_TRUE(has("run,A,parity,0.01,1,100,40,256,1,normalized,45,")) << csv;
  EXPECT_TRUE(has("best,A,parity,0.001,1,100,40,256,2,normalized,50,")) << csv;
  EXPECT_TRUE(has("median,A,parity,0.01,,,40,256,2,normalized,44.5,0.5")) << csv;
  EXPECT_TRUE(has("length,A,parity,0.001,1,100,40,100,1,normalized,80,")) << csv;
  EXPECT_TRUE(has("length,B,parity,0.001,1,100,40,256,1,normalized,10,")) << csv;
  EXPECT_FALSE(has("length,B,parity,0.001,1,100,40,100,1,normalized,0,")) << csv;
  // 5 runs, 2 best, 2 median, 3 length lines and the header.
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 13);
  // A label with a comma is quoted.
  std::vector<RunResult> q{scored("hqlt (variant=x, window=8)", "parity", 1e-3, 1, 0.5)};
  EXPECT_NE(format_csv(aggregate(q, {})).find("\nrun,\"hqlt (variant=x, window=8)\",parity,"), std::string::npos);
}

std::string paper_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "memlab_paper_" + name + "_" + std::to_string(::getpid()) + ".yaml";
  write_file_atomic(path, text);
  return path;
}

// --paper: the file's values in a "paper" column after each task column of the best and median tables, in the
// rows of their labels, empty where the file has none; the CSV carries them as paper_best / paper_median lines;
// values of labels, tasks or tables the report lacks are named.
TEST(PaperValues, BesideTheBestAndMedianTables) {
  const std::string path = paper_file("hqlt", "title: some paper\n"
                                              "best:\n  \"A\": {parity: 97.5}\n  \"Z\": {parity: 1.0}\n"
                                              "median:\n  \"B\": {parity: \"9.0 \xC2\xB1 1.5\", mod_arith: 3.0}\n"
                                              "summary:\n  \"A\": {parity: 5}\n");
  const PaperValues paper = read_paper_values(path);
  EXPECT_EQ(paper.title, "some paper");
  ASSERT_EQ(paper.values.size(), 5u);
  const PaperValue* m = paper.find("median", "B", "parity");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->text, "9.0 \xC2\xB1 1.5");
  EXPECT_DOUBLE_EQ(m->value, 9.0);
  EXPECT_DOUBLE_EQ(*m->spread, 1.5);
  paper.shown.clear();
  ReportOptions opt;
  opt.paper = &paper;
  const std::string md = format_markdown(aggregate(small_case(), opt));
  EXPECT_NE(md.find("| Model | Parity | paper |\n|---|---:|---:|\n| A | 50.0 | 97.5 |\n| B | 10.0 |  |\n"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| A | 44.5 \xC2\xB1 0.5 |  |\n| B | 10.0 \xC2\xB1 0.0 | 9.0 \xC2\xB1 1.5 |\n"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| Model | Parity |\n|---|---:|\n| A | best 0.001"), std::string::npos) << md;  // lr table: none
  // Z, B's mod_arith, the summary table
  EXPECT_EQ(unshown_paper_values(paper),
            "3 of the 5 values of some paper are not shown, as the report has no such table, row or column: "
            "best / Z / parity (1.0); median / B / mod_arith (3.0); summary / A / parity (5)");
  const std::string csv = format_csv(aggregate(small_case(), opt));
  EXPECT_NE(csv.find("\npaper_best,A,parity,,,,,,,normalized,97.5,\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\npaper_median,B,parity,,,,,,,normalized,9,1.5\n"), std::string::npos) << csv;
}

// The subquadratic best table takes a value per evaluation length, in the row of that label and length.
TEST(PaperValues, PerLengthInTheSubquadraticTable) {
  const PaperValues paper = read_paper_values(paper_file("sq", "best:\n  G: {parity: {512: 0.472}}\n"));
  std::vector<RunResult> runs{make_run("G", "parity", 1e-3, 1, {{10, 128, 128, 1.0}, {10, 512, 512, 0.2}})};
  ProtocolOptions opt;
  opt.paper = &paper;
  const auto t = subquadratic_report(runs, opt).tables[0];
  EXPECT_EQ(t.header, (std::vector<std::string>{"Model", "Length", "Parity", "paper"}));
  EXPECT_EQ(t.rows[0], (std::vector<std::string>{"G", "128", "1.000", ""}));
  EXPECT_EQ(t.rows[1], (std::vector<std::string>{"G", "512", "0.600", "0.472"}));
  EXPECT_EQ(unshown_paper_values(paper), "");
}

// The mad protocol's summary takes the values of table "summary"; its Avg. column takes none.
TEST(PaperValues, BesideTheMadSummary) {
  const PaperValues paper = read_paper_values(paper_file("mad", "metric: accuracy\nsummary:\n  M: {mad_recall: 99.5}\n"));
  EXPECT_EQ(paper.metric, "accuracy");
  RunResult r = make_run("M", "mad_recall", 1e-3, 1, {{10, 40, 256, 0.5}});
  ProtocolOptions opt;
  opt.paper = &paper;
  const auto t = mad_report({r}, opt).tables[0];
  EXPECT_EQ(t.header, (std::vector<std::string>{"Model", "Mad Recall", "paper", "Avg."}));
  EXPECT_EQ(t.rows[0][2], "99.5");
  EXPECT_EQ(unshown_paper_values(paper), "");
}

TEST(PaperValues, RefusesWhatIsNotTableLabelTaskValue) {
  for (const std::string bad : {"best: 3\n", "best:\n  A: 2\n", "best:\n  A: {parity: high}\n", "title: [a]\n",
                                "metric: percent\nbest:\n  A: {parity: 1}\n", "best:\n  [A]: {parity: 1}\n",
                                "best:\n  A: {parity: \"1 +- x\"}\n", "best:\n  A: {parity: {long: 0.5}}\n",
                                "best:\n  A: {parity: 1}\n  A: {parity: 2}\n", "title: x\n", "[1, 2]\n"})
    EXPECT_THROW(read_paper_values(paper_file("bad", bad)), UserError) << bad;
  EXPECT_THROW(read_paper_values("/nonexistent/paper.yaml"), UserError);
  EXPECT_DOUBLE_EQ(*read_paper_values(paper_file("pm", "best:\n  A: {parity: \"2.5 +- 0.5\"}\n"))
                        .values.begin()
                        ->second.spread,
                   0.5);
}

TEST(Report, TexBooktabs) {
  const std::string tex = format_tex(aggregate(small_case(), {}));
  EXPECT_NE(tex.find("\\begin{tabular}{lr}\n\\toprule\nModel & Parity \\\\\n\\midrule\nA & 50.0 \\\\\nB & 10.0 \\\\\n"
                     "\\bottomrule\n\\end{tabular}\n"),
            std::string::npos)
      << tex;
  EXPECT_NE(tex.find("A & 44.5 $\\pm$ 0.5 \\\\\n"), std::string::npos) << tex;
  EXPECT_NE(tex.find("Model & 40-100 & 40-256 & lr / seed / step \\\\\n"), std::string::npos) << tex;
  EXPECT_NE(tex.find("B & -- & 10.0 & 0.001 / 1 / 100 \\\\\n"), std::string::npos) << tex;
  std::vector<RunResult> q{scored("a_b & 50%", "parity", 1e-3, 1, 0.5)};
  EXPECT_NE(format_tex(aggregate(q, {})).find("a\\_b \\& 50\\% & 50.0"), std::string::npos);
  EXPECT_THROW(parse_format("html"), UserError);
}

const char* kHqltConfig = R"(label: "%s"
task:
  name: %s
  train_len: [3, 40]
  eval_len: [40, 256]
model:
  name: %s
  hidden: 128
  hqlt:
    variant: %s
    window: 8
  deltanet:
    neg_eigval: true
train:
  lr: 0.001
  seed: 2
  steps: 1000
)";

RunResult from_config(const std::string& label, const std::string& task, const std::string& model,
                      const std::string& variant) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, kHqltConfig, label.c_str(), task.c_str(), model.c_str(), variant.c_str());
  RunResult r;
  read_run_config(r, buf, "test");
  return r;
}

TEST(Report, RunConfigAndLabels) {
  RunResult one = from_config("", "parity", "hqlt", "synchronous");
  EXPECT_EQ(one.task, "parity");
  EXPECT_DOUBLE_EQ(one.lr, 0.001);
  EXPECT_EQ(one.seed, 2);
  EXPECT_EQ(one.steps, 1000);
  EXPECT_EQ(one.eval_len, kHead);
  EXPECT_EQ(one.train_len, kTrain);
  EXPECT_EQ(one.model_keys.at("variant"), "synchronous");  // the mixer's own section without prefix
  EXPECT_EQ(one.model_keys.at("deltanet.neg_eigval"), "true");
  EXPECT_EQ(one.model_keys.at("hidden"), "128");

  std::vector<RunResult> runs{one,
                              from_config("", "parity", "hqlt", "delayed_chunk"),
                              from_config("", "parity", "hqlt", "synchronous"),
                              from_config("", "parity", "deltanet", "synchronous"),
                              from_config("", "parity", "deltanet", "delayed_chunk"),
                              from_config("mine", "parity", "hqlt", "delayed_stream"),
                              from_config("", "mod_arith", "hqlt", "delayed_chunk")};
  assign_labels(runs);
  EXPECT_EQ(runs[0].label, "hqlt (variant=synchronous)");
  EXPECT_EQ(runs[1].label, "hqlt (variant=delayed_chunk)");
  EXPECT_EQ(runs[2].label, "hqlt (variant=synchronous)");
  // For deltanet the hqlt section is someone else's: named in full.
  EXPECT_EQ(runs[3].label, "deltanet (hqlt.variant=synchronous)");
  EXPECT_EQ(runs[5].label, "mine");
  EXPECT_EQ(runs[6].label, "hqlt");  // alone in its task

  RunResult bad;
  EXPECT_THROW(read_run_config(bad, "task: {name: parity}\n", "x"), UserError);
  EXPECT_THROW(read_run_config(bad, "task: [\n", "x"), UserError);
}

TEST(Report, LengthChartData) {
  std::vector<Row> rows;
  for (auto [a, b] : std::vector<std::pair<int, int>>{{3, 40}, {129, 256}, {40, 256}, {65, 128}, {40, 64}})
    rows.emplace_back(100, a, b, a == 3 ? 1.0 : 1.0 - b / 512.0);
  auto partial = rows;
  partial.erase(partial.begin() + 1);  // no 129-256
  std::vector<RunResult> runs{make_run("a", "parity", 1e-3, 1, rows), make_run("b", "parity", 1e-3, 1, partial)};
  const Report rep = aggregate(runs, {});
  const Chart ch = length_chart(rep, 0);
  // The headline 40-256 is covered by finer ranges: left out of the x axis; the training range is shaded.
  EXPECT_EQ(ch.categories, (std::vector<std::string>{"3-40", "40-64", "65-128", "129-256"}));
  ASSERT_TRUE(ch.shade_x);
  EXPECT_DOUBLE_EQ(ch.shade_x->first, -0.5);
  EXPECT_DOUBLE_EQ(ch.shade_x->second, 0.5);
  ASSERT_EQ(ch.series.size(), 2u);
  EXPECT_EQ(ch.series[0].name, "a (40-256: 50.0)");
  EXPECT_NEAR(ch.series[0].y[0], 100, 1e-9);
  EXPECT_NEAR(ch.series[0].y[2], 75, 1e-9);
  EXPECT_TRUE(std::isnan(ch.series[1].y[3]));  // a gap, not a zero
  const Chart lc = learning_chart(rep, 0);
  ASSERT_EQ(lc.series.size(), 2u);
  EXPECT_EQ(lc.series[0].x, (std::vector<double>{100}));
}

std::string config_text(const std::string& label, const std::string& model, const std::string& variant, int seed) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, kHqltConfig, label.c_str(), "parity", model.c_str(), variant.c_str());
  std::string s = buf;
  s.replace(s.find("seed: 2"), 7, "seed: " + std::to_string(seed));
  return s;
}

// Not remove_tree: in this binary std::filesystem::remove_all resolves into libtorch.so and crashes.
void remove_dir(const std::string& dir) { EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0); }

std::string temp_dir() {
  char tmpl[] = "/tmp/memlab-report-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "";
}

TEST(ReportLoader, ResultsFolder) {
  const std::string dir = temp_dir();
  {
    Store st(dir);
    auto rec = [](const std::string& id, const std::string& label, const std::string& variant, int seed) {
      RunRecord r;
      r.id = id;
      r.label = label;
      r.task = "parity";
      r.model = "hqlt";
      r.lr = 1e-3;
      r.seed = seed;
      r.config = config_text(label, "hqlt", variant, seed);
      return r;
    };
    st.add_sweep("s", {rec("a", "", "synchronous", 1), rec("b", "", "delayed_chunk", 1), rec("c", "", "synchronous", 2),
                       rec("d", "", "synchronous", 3), rec("e", "mine", "synchronous", 4),
                       rec("f", "", "synchronous", 5)});
    EvalRecord e{"", 10, 40, 256, 64, 0.9, 0.8};
    TrainRecord t{"", 5, 0.25, 0.7, 1e-3, 1, 1, 1};
    st.finish("b", {t}, {e}, 1.0);  // finished before a: the order is still the sweep's
    e.normalized = 0.6;
    st.finish("a", {t}, {e}, 1.0);
    st.finish("e", {t}, {e}, 1.0);
    st.fail("d", "boom");
    ASSERT_TRUE(st.claim("s", "f", "elsewhere:1", 1e9, false));
  }
  const LoadedRuns got = load_results({dir});
  ASSERT_EQ(got.runs.size(), 3u);
  EXPECT_EQ(got.runs[0].label, "hqlt (variant=synchronous)");
  EXPECT_EQ(got.runs[1].label, "hqlt (variant=delayed_chunk)");
  EXPECT_EQ(got.runs[2].label, "mine");
  EXPECT_EQ(got.runs[0].seed, 1);
  ASSERT_EQ(got.runs[0].evals.size(), 1u);
  EXPECT_DOUBLE_EQ(got.runs[0].evals[0].normalized, 0.6);
  EXPECT_EQ(got.runs[0].evals[0].lengths, kHead);
  ASSERT_EQ(got.runs[1].train.size(), 1u);
  EXPECT_DOUBLE_EQ(got.runs[1].train[0].loss, 0.25);
  ASSERT_EQ(got.notes.size(), 2u);
  EXPECT_NE(got.notes[0].find("3 of 6 runs not reported: 1 pending, 1 running, 1 failed"), std::string::npos)
      << got.notes[0];
  // No device time recorded (finished by hand): estimated from the runs' 1 s of training each.
  EXPECT_NE(got.notes[1].find("device time 3.0s for its 3 finished runs (1.0s a run), estimated"), std::string::npos)
      << got.notes[1];
  // Named twice, counted once.
  const LoadedRuns twice = load_results({dir, dir});
  EXPECT_EQ(twice.runs.size(), 3u);
  EXPECT_NE(twice.notes.back().find("3 runs named more than once"), std::string::npos) << twice.notes.back();
  // What is none of the three inputs.
  EXPECT_THROW(load_results({join_path(dir, "nope")}), UserError);
  remove_dir(dir);
}

TEST(ReportLoader, RunDirectories) {
  const std::string dir = temp_dir();
  const std::string a = join_path(dir, "a"), b = join_path(dir, "b");
  ensure_writable_dir(a);
  ensure_writable_dir(b);
  write_file_atomic(join_path(a, "config.yaml"), config_text("", "deltanet", "synchronous", 7));
  write_file_atomic(join_path(a, "eval.csv"),
                    "task,model,seed,step,length_min,length_max,n,accuracy,normalized_accuracy\n"
                    "parity,deltanet,7,10,3,40,32,1.000000,1.000000\n"
                    "parity,deltanet,7,10,40,256,32,0.750000,0.500000\n");
  write_file_atomic(join_path(a, "train.csv"),
                    "step,loss,accuracy,lr,grad_norm,ms_per_step,elapsed_s\n5,0.69,0.5,0.001,1,2,0.1\n");
  write_file_atomic(join_path(b, "config.yaml"), config_text("", "deltanet", "synchronous", 8));  // no eval.csv yet
  const LoadedRuns got = load_results({dir});
  ASSERT_EQ(got.runs.size(), 1u);
  const RunResult& r = got.runs[0];
  EXPECT_EQ(r.label, "deltanet");
  EXPECT_EQ(r.seed, 7);
  ASSERT_EQ(r.evals.size(), 2u);
  EXPECT_EQ(r.evals[1].lengths, kHead);
  EXPECT_DOUBLE_EQ(r.evals[1].accuracy, 0.75);
  ASSERT_EQ(r.train.size(), 1u);
  EXPECT_DOUBLE_EQ(r.train[0].loss, 0.69);
  ASSERT_EQ(got.notes.size(), 1u);
  EXPECT_NE(got.notes[0].find("no eval.csv yet"), std::string::npos);
  // The same run as a run directory of its own.
  EXPECT_EQ(load_results({a}).runs.size(), 1u);
  EXPECT_THROW(load_results({join_path(a, "eval.csv")}), UserError);
  remove_dir(dir);
}

// Two seeds of one label, one evaluated with MAD's average: different numbers, so two rows, the MAD one marked.
TEST(ReportLoader, MadAverageKeptApart) {
  const std::string dir = temp_dir();
  const char* evals = "task,model,seed,step,length_min,length_max,n,accuracy,normalized_accuracy\n"
                      "parity,deltanet,7,10,40,256,32,0.750000,0.500000\n";
  for (const auto& [name, average, seed] :
       {std::tuple{"tokens", "", 7}, std::tuple{"mad", "eval:\n  average: mad\n", 8}}) {
    const std::string run = join_path(dir, name);
    ensure_writable_dir(run);
    write_file_atomic(join_path(run, "config.yaml"), config_text("mine", "deltanet", "synchronous", seed) + average);
    write_file_atomic(join_path(run, "eval.csv"), evals);
  }
  const LoadedRuns got = load_results({dir});
  ASSERT_EQ(got.runs.size(), 2u);
  EXPECT_TRUE(got.runs[0].mad_average);  // "mad" sorts before "tokens"
  EXPECT_EQ(got.runs[0].label, "mine (class-averaged)");
  EXPECT_FALSE(got.runs[1].mad_average);  // no eval.average: a run from before the key, over tokens
  EXPECT_EQ(got.runs[1].label, "mine");
  ASSERT_EQ(got.notes.size(), 1u);
  EXPECT_NE(got.notes[0].find("1 run with eval.average = mad"), std::string::npos) << got.notes[0];
  const Report rep = aggregate(got.runs, {}, got.notes);
  EXPECT_EQ(rep.labels, (std::vector<std::string>{"mine (class-averaged)", "mine"}));
  ASSERT_NE(rep.cell("mine", "parity"), nullptr);
  EXPECT_EQ(rep.cell("mine", "parity")->by_max().seeds.size(), 1u);  // not pooled with the MAD seed
  EXPECT_NE(format_markdown(rep).find("| mine (class-averaged) | 50.0 |"), std::string::npos) << format_markdown(rep);

  // Neither tokens nor mad: refused, naming the run and the key.
  write_file_atomic(join_path(join_path(dir, "mad"), "config.yaml"),
                    config_text("mine", "deltanet", "synchronous", 8) + "eval:\n  average: macro\n");
  try {
    load_results({dir});
    ADD_FAILURE() << "eval.average = macro was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed eval.average: 'macro'"), std::string::npos) << e.what();
  }
  remove_dir(dir);
}


// RL curves: a run of `label` and `seed` with evaluations (env steps, success); return = 100 x success.
RlCurve rl_run(const std::string& label, const std::string& seed, const std::vector<std::pair<double, double>>& rows) {
  RlCurve c;
  c.dir = label + "_s" + seed;
  c.label = label;
  c.seed = seed;
  for (const auto& [x, y] : rows) {
    c.episodes.push_back(static_cast<double>(c.episodes.size()) * 10);
    c.env_steps.push_back(x);
    c.success.push_back(y);
    c.ret.push_back(100 * y);
    c.train_return.push_back(std::nan(""));
    c.train_success.push_back(std::nan(""));
  }
  return c;
}

TEST(RlCurves, StudentIntervalByHand) {
  // {0.2, 0.4, 0.9}: mean 0.5, s = sqrt(0.13), t(0.975, 2) = 4.3027 (tables)
  const auto [lo, hi] = mean_interval({0.2, 0.4, 0.9}, RlInterval::T);
  const double half = 4.3027 * std::sqrt(0.13) / std::sqrt(3.0);
  EXPECT_NEAR(lo, 0.5 - half, 1e-9);
  EXPECT_NEAR(hi, 0.5 + half, 1e-9);
  // 40 values (past the table): t(0.975, 39) = 2.0227
  std::vector<double> v;
  for (int i = 0; i < 40; ++i) v.push_back(i % 2);
  const auto [lo40, hi40] = mean_interval(v, RlInterval::T);
  const double s = std::sqrt(10.0 / 39.0);  // sum of squares 40 x 0.25 over n - 1
  EXPECT_NEAR(hi40 - 0.5, 2.0227 * s / std::sqrt(40.0), 2e-4);
  EXPECT_NEAR(0.5 - lo40, 2.0227 * s / std::sqrt(40.0), 2e-4);
  EXPECT_TRUE(std::isnan(mean_interval({0.7}, RlInterval::T).first));
  EXPECT_TRUE(std::isnan(mean_interval({}, RlInterval::Bootstrap).second));
}

TEST(RlCurves, BootstrapIntervalByHand) {
  // {0, 1}: the 4 resamples' means are 0, 0.5, 0.5, 1; numpy's percentiles at 2.5 and 97.5: positions 0.075 and
  // 2.925 of 3.
  const auto [lo, hi] = mean_interval({0.0, 1.0}, RlInterval::Bootstrap);
  EXPECT_NEAR(lo, 0.075 * 0.5, 1e-12);
  EXPECT_NEAR(hi, 0.5 + 0.925 * 0.5, 1e-12);
  // {0, 0, 3}: of the 27 resamples, 8, 12, 6 and 1 hold 0, 1, 2 and 3 threes, so their means sorted are 8 zeros,
  // 12 ones, 6 twos and a three. Position 0.65 of 26 is 0; position 25.35 lies between the last 2 and the 3.
  const auto [lo3, hi3] = mean_interval({0.0, 0.0, 3.0}, RlInterval::Bootstrap);
  EXPECT_NEAR(lo3, 0.0, 1e-12);
  EXPECT_NEAR(hi3, 2.35, 1e-12);
  // 8 values go by 20,000 fixed-seed resamples: within the range, reproducible, about mean ± 2 s / sqrt(n).
  const std::vector<double> v8{0, 1, 0, 1, 0, 1, 0, 1};
  const auto a = mean_interval(v8, RlInterval::Bootstrap), b = mean_interval(v8, RlInterval::Bootstrap);
  EXPECT_EQ(a, b);
  EXPECT_NEAR(a.first, 0.5 - 1.96 * 0.5 / std::sqrt(8.0), 0.05);
  EXPECT_NEAR(a.second, 0.5 + 1.96 * 0.5 / std::sqrt(8.0), 0.05);
}

TEST(RlCurves, SeedsOnOneGridOfTheirCommonSpan) {
  // Two seeds of A evaluated at different env steps, one of B; the grid of A spans 100..300, where both have data.
  const std::vector<RlCurve> runs{rl_run("A", "1", {{0, 0.0}, {200, 0.4}, {400, 0.8}}),
                                  rl_run("B", "1", {{0, 0.5}, {30, 0.5}, {100, 0.5}}),
                                  rl_run("A", "2", {{100, 0.2}, {300, 0.6}})};
  RlGroupOptions opt;
  opt.interval = RlInterval::T;
  const auto groups = group_rl_curves(runs, opt);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].label, "A");
  EXPECT_EQ(groups[0].runs, (std::vector<size_t>{0, 2}));
  // 3 points: the most evaluations of a seed of A.
  EXPECT_EQ(groups[0].env_steps, (std::vector<double>{100, 200, 300}));
  // seed 1 interpolated: 0.2, 0.4, 0.6; seed 2: 0.2, 0.4, 0.6 (0.4 halfway)
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(groups[0].success.mean[k], 0.2 * static_cast<double>(k + 1), 1e-12);
    EXPECT_NEAR(groups[0].success.lo[k], groups[0].success.mean[k], 1e-12);  // equal seeds: no width
    EXPECT_NEAR(groups[0].ret.mean[k], 20.0 * static_cast<double>(k + 1), 1e-9);
    EXPECT_EQ(groups[0].success.seeds[k], 2);
  }
  EXPECT_EQ(groups[1].env_steps, (std::vector<double>{0, 30, 100}));  // one run: its own evaluations
  EXPECT_EQ(groups[1].success.seeds[0], 1);
  EXPECT_TRUE(std::isnan(groups[1].success.lo[0]));  // one seed: no interval

  // --points and --smooth: seed 1 smoothed over 2 evaluations is 0, 0.2, 0.6 at 0, 200, 400.
  opt.points = 5;
  opt.smooth = 2;
  const auto g2 = group_rl_curves({runs[0], runs[2]}, opt);
  ASSERT_EQ(g2.size(), 1u);
  EXPECT_EQ(g2[0].env_steps, (std::vector<double>{100, 150, 200, 250, 300}));
  // at 300: seed 1 halfway between 0.2 and 0.6 = 0.4; seed 2 smoothed = (0.2 + 0.6) / 2 = 0.4
  EXPECT_NEAR(g2[0].success.mean[4], 0.4, 1e-12);

  // The same label and seed twice is refused; so are seeds with no common span, and a row without env steps.
  EXPECT_THROW(group_rl_curves({runs[0], runs[0]}, opt), UserError);
  EXPECT_THROW(group_rl_curves({rl_run("A", "1", {{0, 0}, {10, 0}}), rl_run("A", "2", {{20, 0}, {30, 0}})}, opt),
               UserError);
  EXPECT_THROW(group_rl_curves({rl_run("A", "1", {{std::nan(""), 0.5}})}, opt), UserError);

  // A seed evaluated once makes the common span one point: a grid of one point.
  opt = {};
  const auto one = group_rl_curves({rl_run("A", "1", {{0, 0.2}, {50, 0.4}, {100, 0.6}}), rl_run("A", "2", {{50, 0.8}})},
                                   opt);
  EXPECT_EQ(one[0].env_steps, (std::vector<double>{50}));
  EXPECT_NEAR(one[0].success.mean[0], 0.6, 1e-12);

  // Two evaluations at one env step: the last one with a value counts, there and on either side of it.
  opt.points = 5;
  RlCurve twice = rl_run("A", "1", {{0, 0.0}, {50, 0.2}, {50, 0.4}, {50, 0.0}, {100, 0.4}});
  twice.success[3] = std::nan("");
  const auto dup = group_rl_curves({twice}, opt);
  EXPECT_EQ(dup[0].env_steps, (std::vector<double>{0, 25, 50, 75, 100}));
  EXPECT_NEAR(dup[0].success.mean[1], 0.2, 1e-12);  // halfway from 0 to 0.4
  EXPECT_NEAR(dup[0].success.mean[2], 0.4, 1e-12);
  EXPECT_NEAR(dup[0].success.mean[3], 0.4, 1e-12);
  opt.points = 0;

  // Student's t over two seeds far apart goes past [0, 1]: the success rate's interval is held there, the return's
  // is not.
  opt.interval = RlInterval::T;
  const auto wide = group_rl_curves({rl_run("A", "1", {{0, 0.0}, {10, 0.1}}), rl_run("A", "2", {{0, 1.0}, {10, 0.9}})},
                                    opt);
  EXPECT_EQ(wide[0].success.lo[0], 0.0);
  EXPECT_EQ(wide[0].success.hi[0], 1.0);
  EXPECT_LT(wide[0].ret.lo[0], -100.0);  // 50 - 12.7062 * 50
}

TEST(RlCurves, SeedTablesFinalAndBest) {
  const std::vector<RlCurve> runs{rl_run("A", "1", {{0, 0.1}, {100, 0.9}, {200, 0.5}}),
                                  rl_run("A", "2", {{0, 0.3}, {100, 0.7}, {200, 0.7}})};
  const auto groups = group_rl_curves(runs, {});
  const auto [md, csv] = rl_seed_tables(runs, groups, RlInterval::T);
  // seed 1: final 0.5, best 0.9 at 100; seed 2: final 0.7, best 0.7 first reached at 100
  EXPECT_NE(md.find("| A | 1 | 3 | 200 | 0.500 | 0.900 | 100 | 50.00 | 90.00 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| A | 2 | 3 | 200 | 0.700 | 0.700 | 100 | 70.00 | 70.00 |"), std::string::npos) << md;
  // mean final 0.6, s = sqrt(0.02), t(0.975, 1) = 12.7062: half width 12.7062 * 0.1 = 1.271, which the success
  // rates' intervals are held to [0, 1] from; the return's is not
  EXPECT_NE(md.find("| A | 2 | 0.600 [0.000, 1.000] | 0.800 [0.000, 1.000] | 60.00 [-67.06, 187.06] |"),
            std::string::npos)
      << md;
  EXPECT_NE(csv.find("0,A,1,3,200,0.500,0.900,100,50.00,90.00\n"), std::string::npos) << csv;
  const std::string curves = rl_group_csv(groups);
  EXPECT_EQ(curves.substr(0, curves.find('\n')),
            "label,env_steps,seeds,return_mean,return_lo,return_hi,success_mean,success_lo,success_hi");
  EXPECT_NE(curves.find("\nA,100,2,80,"), std::string::npos) << curves;
  // One seed per label: nothing to average, so no second table.
  const auto [md1, csv1] = rl_seed_tables({runs[0]}, group_rl_curves({runs[0]}, {}), RlInterval::T);
  EXPECT_EQ(md1.find("Mean over each label"), std::string::npos) << md1;
  EXPECT_NE(md.find("Mean over each label"), std::string::npos) << md;
}

}  // namespace
}  // namespace memlab
