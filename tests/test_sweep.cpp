// Sweep plans (expansion, order, stable ids) and the results store (claims, abandoned runs, finishing).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "sweep/launcher.h"
#include "sweep/plan.h"
#include "sweep/store.h"

#include "train/trainer.h"

namespace {
using namespace memlab;

Schema& schema() { return full_schema(); }

std::string tmpdir() {
  char t[] = "/tmp/memlab-sweep-XXXXXX";
  return mkdtemp(t);
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

Plan plan_of(const std::vector<std::string>& files, std::vector<std::string> grid = {},
             std::vector<std::string> sets = {}) {
  PlanRequest r;
  r.files = files;
  r.grid = std::move(grid);
  r.sets = std::move(sets);
  return make_plan(schema(), r);
}

TEST(SweepPlan, GridOrderLabelsAndPrecedence) {
  const auto d = tmpdir();
  write(d + "/exp.yaml", "task: {name: mod_arith}\ntrain: {steps: 7, lr: 0.5}\n");
  write(d + "/s.yaml",
        "sweep:\n  experiments:\n    - exp.yaml\n    - {label: two, set: {model.name: transformer, train.steps: 9}}\n"
        "  grid:\n    train.lr: [1.0e-3, 2.0e-3]\n    train.seed: [1, 2, 3]\n  set: {train.steps: 5, task.name: parity}\n");
  const Plan p = plan_of({d + "/s.yaml"});
  EXPECT_EQ(p.name, "s");
  ASSERT_EQ(p.runs.size(), 12u);
  // Experiment by experiment, the last axis fastest.
  const double lrs[] = {1e-3, 1e-3, 1e-3, 2e-3, 2e-3, 2e-3};
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_DOUBLE_EQ(p.runs[i].lr, lrs[i % 6]) << i;
    EXPECT_EQ(p.runs[i].seed, static_cast<int64_t>(i % 3) + 1) << i;
  }
  // The sweep's `set` wins over the experiment file; the experiment's own `set` wins over the sweep's.
  EXPECT_EQ(p.runs[0].task, "parity");
  EXPECT_NE(p.runs[0].config.find("steps: 5"), std::string::npos);
  EXPECT_EQ(p.runs[6].model, "transformer");
  EXPECT_EQ(p.runs[6].label, "two");
  EXPECT_NE(p.runs[6].config.find("steps: 9"), std::string::npos);
  std::set<std::string> ids;
  for (const auto& r : p.runs) ids.insert(r.id);
  EXPECT_EQ(ids.size(), 12u);
  // The command line's --set comes last, and --grid replaces an axis of the same key.
  const Plan q = plan_of({d + "/s.yaml"}, {"train.seed=7"}, {"train.steps=11"});
  ASSERT_EQ(q.runs.size(), 4u);
  for (const auto& r : q.runs) {
    EXPECT_EQ(r.seed, 7);
    EXPECT_NE(r.config.find("steps: 11"), std::string::npos);
  }
}

TEST(SweepPlan, IdsAreStableAndIgnoreWhatDoesNotChangeTheRun) {
  const auto d = tmpdir();
  write(d + "/a.yaml", "task: {name: parity}\ntrain: {lr: 1.0e-3}\n");
  const std::string a = plan_of({d + "/a.yaml"}).runs.at(0).id;
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(plan_of({d + "/a.yaml"}).runs.at(0).id, a);
  // Keys added to memlab later (eval.average) leave the ids of stored runs alone at their defaults: this run's id
  // is the one it had before (results/reference's packed Table 3 cell keeps its ids the same way).
  EXPECT_EQ(a, "9a4039e1b1ece3a4");
  EXPECT_NE(plan_of({d + "/a.yaml"}, {}, {"eval.average=mad"}).runs.at(0).id, a);
  // Device, logging, checkpoints, evaluation batch and label change nothing computed.
  EXPECT_EQ(plan_of({d + "/a.yaml"}, {}, {"train.log_every=7", "train.device=cpu", "label=x", "eval.batch_size=3"})
                .runs.at(0)
                .id,
            a);
  // Another mixer's keys at their defaults do not count; set to something else, they do.
  write(d + "/b.yaml", "task: {name: parity}\ntrain: {lr: 1.0e-3}\nmodel: {mamba2: {d_state: 16}}\n");
  EXPECT_EQ(plan_of({d + "/b.yaml"}).runs.at(0).id, a);
  EXPECT_NE(plan_of({d + "/a.yaml"}, {}, {"model.mamba2.d_state=32"}).runs.at(0).id, a);
  // What changes the run changes the id.
  EXPECT_NE(plan_of({d + "/a.yaml"}, {}, {"train.lr=2.0e-3"}).runs.at(0).id, a);
  EXPECT_NE(plan_of({d + "/a.yaml"}, {}, {"train.seed=2"}).runs.at(0).id, a);
  EXPECT_NE(plan_of({d + "/a.yaml"}, {}, {"model.deltanet.neg_eigval=false"}).runs.at(0).id, a);
}

TEST(SweepPlan, ExtendsGlobsAndDuplicates) {
  const auto d = tmpdir();
  write(d + "/p_1.yaml", "task: {name: parity}\n");
  write(d + "/p_2.yaml", "task: {name: mod_arith}\n");
  write(d + "/base.yaml", "sweep:\n  name: base\n  experiments: [p_*.yaml]\n  grid: {train.seed: [1, 2]}\n");
  write(d + "/quick.yaml", "sweep:\n  extends: base.yaml\n  grid: {train.seed: [5]}\n  set: {train.steps: 3}\n");
  const Plan p = plan_of({d + "/quick.yaml"});
  EXPECT_EQ(p.name, "quick");
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.runs[0].task, "parity");
  EXPECT_EQ(p.runs[1].task, "mod_arith");
  EXPECT_EQ(p.runs[0].seed, 5);
  // A grid point that repeats an earlier run is kept once.
  const Plan dup = plan_of({d + "/p_1.yaml"}, {"train.steps=5,5,6"});
  EXPECT_EQ(dup.runs.size(), 2u);
  EXPECT_EQ(dup.duplicates, 1);
  // Plain config files are one-run sweeps.
  EXPECT_EQ(plan_of({d + "/p_1.yaml", d + "/p_2.yaml"}).runs.size(), 2u);
}

TEST(SweepPlan, BadInputNamesTheProblem) {
  const auto d = tmpdir();
  write(d + "/s.yaml", "sweep:\n  experiments: [{label: x}]\n  grid: {train.lrr: [1]}\n");
  try {
    plan_of({d + "/s.yaml"});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train.lrr"), std::string::npos) << e.what();
  }
  write(d + "/t.yaml", "sweep:\n  experments: []\n");
  EXPECT_THROW(plan_of({d + "/t.yaml"}), UserError);
  for (const char* text : {"", "sweep:\n  name: x\n", "sweep:\n  grid: {train.seed: [1]}\n"}) {
    write(d + "/w.yaml", text);  // an empty file, or no experiments: no default run
    EXPECT_THROW(plan_of({d + "/w.yaml"}), UserError) << text;
  }
  write(d + "/x.yaml", "sweep:\n  experiments: [{label: x}]\n  set: {train.steps: 3, train: {steps: 4}}\n");
  EXPECT_THROW(plan_of({d + "/x.yaml"}), UserError);  // one key given twice
  write(d + "/y.yaml", "sweep:\n  experiments: [{label: x}]\n  experiments: [{label: y}]\n");
  EXPECT_THROW(plan_of({d + "/y.yaml"}), UserError);
  write(d + "/u.yaml", "sweep:\n  experiments: [nothing_*.yaml]\n");
  EXPECT_THROW(plan_of({d + "/u.yaml"}), UserError);
  write(d + "/v.yaml", "sweep:\n  grid: {train.seed: []}\n");
  EXPECT_THROW(plan_of({d + "/v.yaml"}), UserError);
  EXPECT_THROW(plan_of({d + "/missing.yaml"}), UserError);
  EXPECT_THROW(plan_of({d + "/s.yaml"}, {"train.seed"}), UserError);
}

std::vector<RunRecord> three_runs() {
  std::vector<RunRecord> rs(3);
  for (int i = 0; i < 3; ++i) {
    rs[i].id = "run" + std::to_string(i);
    rs[i].label = "L";
    rs[i].task = "parity";
    rs[i].model = "deltanet";
    rs[i].lr = 1e-3;
    rs[i].seed = i;
    rs[i].config = "x: 1\n";
  }
  return rs;
}

// The store as an older memlab left it: without one of the runs table's later columns.
void drop_run_column(const std::string& results_dir, const std::string& column) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((results_dir + "/results.sqlite").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, ("ALTER TABLE runs DROP COLUMN " + column).c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
}

TEST(SweepStore, ClaimsAreExclusiveAndFinishingReplacesRows) {
  const auto d = tmpdir();
  Store a(d), b(d);  // two connections, as two launchers would have
  a.add_sweep("s", three_runs());
  auto r0 = a.claim("s", "", "w1", 600, false);
  auto r1 = b.claim("s", "", "w2", 600, false);
  ASSERT_TRUE(r0 && r1);
  EXPECT_EQ(r0->id, "run0");
  EXPECT_EQ(r1->id, "run1");
  EXPECT_EQ(a.counts("s").running, 2);
  EvalRecord e{"run0", 10, 3, 40, 8, 0.75, 0.5};
  TrainRecord t{"run0", 10, 0.5, 0.7, 1e-3, 1.0, 2.0, 3.0};
  a.finish("run0", {t}, {e, EvalRecord{"run0", 10, 40, 256, 8, 0.5, 0.0}}, 3.0);
  a.finish("run0", {t}, {e}, 3.0);  // finishing again replaces, never adds
  EXPECT_EQ(b.evals("run0").size(), 1u);
  EXPECT_EQ(b.train_rows("run0").size(), 1u);
  EXPECT_DOUBLE_EQ(b.evals("run0")[0].normalized, 0.5);
  b.fail("run1", "boom");
  EXPECT_EQ(a.run("run1")->error, "boom");
  // Registering again keeps status and rows; a config changed in keys the id ignores reaches the runs not yet
  // done, and a done run keeps the config it ran with.
  auto changed = three_runs();
  for (auto& r : changed) r.config = "x: 2\n";
  b.add_sweep("s", changed);
  EXPECT_EQ(a.run("run0")->config, "x: 1\n");
  EXPECT_EQ(a.run("run1")->config, "x: 2\n");
  EXPECT_EQ(a.run("run2")->config, "x: 2\n");
  EXPECT_EQ(a.run("run0")->status, "done");
  EXPECT_EQ(a.counts("s").done, 1);
  EXPECT_EQ(a.counts("s").failed, 1);
  // Failed runs are claimable only when asked.
  auto r2 = a.claim("s", "", "w1", 600, false);
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->id, "run2");
  EXPECT_FALSE(a.claim("s", "", "w1", 600, false));
  auto again = a.claim("s", "run1", "w1", 600, true);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->attempts, 2);
  a.release("run1");
  EXPECT_EQ(a.run("run1")->status, "pending");
}

// A claim undone (the run would not end before a deadline) leaves each run as it was, a failed one failed.
TEST(SweepStore, UnclaimRestoresTheRunsAsTheyWere) {
  const auto d = tmpdir();
  Store s(d);
  s.add_sweep("s", three_runs());
  ASSERT_TRUE(s.claim("s", "run0", "w0", 600, false));
  s.fail("run0", "boom");
  const auto failed = *s.run("run0"), pending = *s.run("run1");
  std::vector<RunRecord> before;
  const auto got = s.claim_group("s", "", "w1", 600, /*retry_failed=*/true, {},
                                 [](const std::vector<RunRecord>&, const RunRecord&) { return true; }, &before);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(before.size(), 3u);
  EXPECT_EQ(before[0].status, "failed");
  EXPECT_EQ(s.run("run0")->attempts, 2);
  for (const auto& r : before) s.unclaim(r);
  for (const auto& [now, was] : {std::pair{*s.run("run0"), failed}, std::pair{*s.run("run1"), pending}}) {
    EXPECT_EQ(now.status, was.status);
    EXPECT_EQ(now.error, was.error);
    EXPECT_EQ(now.attempts, was.attempts);
    EXPECT_EQ(now.worker, was.worker);
    EXPECT_DOUBLE_EQ(now.started, was.started);
  }
  EXPECT_EQ(s.counts("s").failed, 1);
  EXPECT_EQ(s.counts("s").pending, 2);
}

// How many of a pack start before a deadline: the most whose estimate fits with a fifth to spare, and one alone where
// that is fewer than pay packed.
TEST(SweepDeadline, PackCutBelowItsMinimumStartsOneRun) {
  const auto fifty = [](size_t n) { return 50.0 * static_cast<double>(n); };
  auto cut = [&](size_t claimed, double left, size_t min_pack) {
    const DeadlineCut c = runs_before_deadline(fifty, claimed, left, min_pack);
    return std::pair<size_t, size_t>{c.fit, c.start};
  };
  EXPECT_EQ(cut(6, 1000, 4), (std::pair<size_t, size_t>{6, 6}));
  EXPECT_EQ(cut(6, 250, 4), (std::pair<size_t, size_t>{4, 4}));  // 4 x 50 x 1.2 = 240
  EXPECT_EQ(cut(6, 239, 4), (std::pair<size_t, size_t>{3, 1}));  // 3 fit, fewer than 4
  EXPECT_EQ(cut(6, 239, 1), (std::pair<size_t, size_t>{3, 3}));
  EXPECT_EQ(cut(2, 1000, 4), (std::pair<size_t, size_t>{2, 2}));  // a pack the deadline does not cut stays whole
  EXPECT_EQ(cut(6, 59, 4), (std::pair<size_t, size_t>{0, 0}));
  EXPECT_EQ(cut(6, 60, 4), (std::pair<size_t, size_t>{1, 1}));
}

// The deadline's estimate: a finished pack's time is shared among its members (the runs claimed with it), and a
// group costs the sum of its members, a tenth more when smaller than the packs timed.
TEST(SweepStore, DeadlineEstimateIsPerPackMember) {
  const auto d = tmpdir();
  Store s(d);
  std::vector<RunRecord> rs(14);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].id = "run" + std::to_string(i);
    rs[i].label = i < 12 ? "A" : "B";
    rs[i].task = "parity";
    rs[i].model = "deltanet";
    rs[i].seed = static_cast<int64_t>(i);
    rs[i].config = "train:\n  steps: 1000\n";
  }
  s.add_sweep("s", rs);
  LaunchOptions o;
  o.results = d;
  o.sweep = "s";
  auto pending = [&](std::vector<int> idx) {
    std::vector<RunRecord> g;
    for (int i : idx) g.push_back(*s.run("run" + std::to_string(i)));
    return g;
  };
  EXPECT_EQ(expected_seconds(s, o, pending({0})), 0.0);  // nothing finished: nothing to go by
  const auto pack = s.claim_group("s", "", "w", 600, false, {},
                                  [](const std::vector<RunRecord>& got, const RunRecord&) { return got.size() < 6; });
  ASSERT_EQ(pack.size(), 6u);
  for (const auto& r : pack) s.finish(r.id, {}, {}, 600.0);  // 600 s for the pack: 0.1 s a step per member
  EXPECT_NEAR(expected_seconds(s, o, pending({6, 7, 8, 9, 10, 11})), 600.0, 1e-6);
  EXPECT_NEAR(expected_seconds(s, o, pending({6, 7, 8})), 330.0, 1e-6);
  EXPECT_NEAR(expected_seconds(s, o, pending({6})), 110.0, 1e-6);
  EXPECT_NEAR(expected_seconds(s, o, pending({12, 13})), 220.0, 1e-6);  // B: the slowest finished rate
}

// An experiment not yet timed: its label's rate on another task times the tasks' ratio over the labels timed on both,
// else another label of its model on its task, else the slowest finished run.
TEST(SweepStore, DeadlineEstimateOfAnUntimedExperiment) {
  const auto d = tmpdir();
  Store s(d);
  struct Row {
    const char *label, *task, *model;
  };
  const std::vector<Row> rows = {{"A", "parity", "deltanet"}, {"A", "mod", "deltanet"}, {"B", "parity", "mamba2"},
                                 {"B", "mod", "mamba2"},      {"C", "parity", "hqlt"},    {"D", "parity", "hqlt"},
                                 {"E", "mod", "hqlt"}};
  std::vector<RunRecord> rs;
  for (size_t i = 0; i < rows.size(); ++i) {
    RunRecord r;
    r.id = "run" + std::to_string(i);
    r.label = rows[i].label;
    r.task = rows[i].task;
    r.model = rows[i].model;
    r.config = "train:\n  steps: 1000\n";
    rs.push_back(r);
  }
  s.add_sweep("s", rs);
  LaunchOptions o;
  o.results = d;
  o.sweep = "s";
  auto finish = [&](int i, double seconds) {
    const std::string id = "run" + std::to_string(i);
    ASSERT_TRUE(s.claim("s", id, "w" + std::to_string(i), 600, false));
    s.finish(id, {}, {}, seconds);
  };
  auto need = [&](int i) { return expected_seconds(s, o, {*s.run("run" + std::to_string(i))}); };
  finish(0, 100);  // A parity
  finish(1, 150);  // A mod: 1.5 times its parity
  finish(2, 60);   // B parity
  EXPECT_NEAR(need(3), 90.0, 1e-6);   // B mod: 60 x 1.5
  EXPECT_NEAR(need(4), 150.0, 1e-6);  // C parity: nothing of C nor of hqlt on parity: the slowest
  finish(5, 80);                       // D parity, also hqlt
  EXPECT_NEAR(need(4), 80.0, 1e-6);   // C parity: D's
  EXPECT_NEAR(need(6), 150.0, 1e-6);  // E mod: no hqlt on mod yet, and E has no other task: the slowest
}

TEST(SweepStore, RunsOfDeadOrSilentWorkersAreClaimedAgain) {
  const auto d = tmpdir();
  Store s(d);
  s.add_sweep("s", three_runs());
  // A worker on this host whose process has ended.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  const std::string host = Store::this_worker().substr(0, Store::this_worker().rfind(':'));
  ASSERT_TRUE(s.claim("s", "run0", host + ":" + std::to_string(child), 600, false));
  // A live worker (this process) keeps its run; one elsewhere keeps it while it beats.
  ASSERT_TRUE(s.claim("s", "run1", Store::this_worker(), 600, false));
  ASSERT_TRUE(s.claim("s", "run2", "elsewhere:1", 600, false));
  auto r = s.claim("s", "", "w", 600, false);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, "run0");
  EXPECT_EQ(r->attempts, 2);
  EXPECT_FALSE(s.claim("s", "", "w", 600, false));
  // Silence beyond stale_s frees a run whichever host holds it.
  auto late = s.claim("s", "", "w", -1, false);
  ASSERT_TRUE(late);
  EXPECT_TRUE(late->id == "run1" || late->id == "run0");
}

// A run the sweep stopped itself (Ctrl-C, --deadline) counts a stop beside its attempt, so that --retries counts only
// the attempts that ended otherwise; a store of an older memlab gains the column, at zero.
TEST(SweepStore, StopsAreCountedBesideAttempts) {
  const auto d = tmpdir();
  {
    Store s(d);
    s.add_sweep("s", three_runs());
    ASSERT_TRUE(s.claim("s", "run0", "w0", 600, false));
    s.release("run0", /*stopped=*/true);
    auto r = *s.run("run0");
    EXPECT_EQ(r.status, "pending");
    EXPECT_EQ(r.attempts, 1);
    EXPECT_EQ(r.stops, 1);
    ASSERT_TRUE(s.claim("s", "run0", "w0", 600, false));
    s.release("run0");  // killed from outside: an attempt, no stop
    r = *s.run("run0");
    EXPECT_EQ(r.attempts, 2);
    EXPECT_EQ(r.stops, 1);
  }
  drop_run_column(d, "stops");
  Store old(d);
  EXPECT_EQ(old.run("run0")->attempts, 2);
  EXPECT_EQ(old.run("run0")->stops, 0);
}

// Device time: recorded per attempt (added up over a run's attempts); for a finished run of an older store, its own time
// shared among the runs claimed with it (finished_costs). A store of an older memlab gains the column, at zero.
TEST(SweepStore, DeviceTimeRecordedPerAttemptOrEstimatedPerPack) {
  const auto d = tmpdir();
  {
    Store s(d);
    s.add_sweep("s", three_runs());
    const auto pack = s.claim_group("s", "", "w", 600, false, {},
                                    [](const std::vector<RunRecord>& got, const RunRecord&) { return got.size() < 2; });
    ASSERT_EQ(pack.size(), 2u);
    s.add_device_time({"run0", "run1"}, 30.0);  // a stopped attempt of the pack of two: 60 s of wall time
    s.release("run0", true);
    s.release("run1", true);
    const auto again = s.claim_group("s", "", "w", 600, false, {},
                                     [](const std::vector<RunRecord>& got, const RunRecord&) { return got.size() < 2; });
    ASSERT_EQ(again.size(), 2u);
    s.add_device_time({"run0", "run1"}, 50.0);
    s.finish("run0", {}, {}, 90.0);  // its training time over both attempts
    s.finish("run1", {}, {}, 90.0);
    EXPECT_DOUBLE_EQ(s.run("run0")->device_seconds, 80.0);
    EXPECT_DOUBLE_EQ(s.run("run1")->device_seconds, 80.0);
    EXPECT_DOUBLE_EQ(s.run("run2")->device_seconds, 0.0);
    const auto costs = finished_costs(s.runs("s"));
    ASSERT_EQ(costs.size(), 2u);  // done runs only
    EXPECT_EQ(costs.at("run0").pack, 2);
    EXPECT_DOUBLE_EQ(costs.at("run0").seconds, 45.0);  // 90 s of training, or the last attempt's wall if longer, over 2
  }
  drop_run_column(d, "device_seconds");
  Store old(d);
  EXPECT_EQ(old.run("run0")->device_seconds, 0.0);
  EXPECT_EQ(old.run("run0")->status, "done");
}

TEST(SweepStore, MissingStoreIsAClearError) {
  try {
    Store s("/tmp/memlab-no-such-results-dir", false);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("results.sqlite"), std::string::npos);
  }
}

// The launcher clears a run directory that died before its first checkpoint.
TEST(Io, RemoveTreeDeletesNestedFoldersAndIgnoresMissingOnes) {
  const auto d = tmpdir();
  ensure_writable_dir(d + "/a/b/c");
  write(d + "/a/b/c/f.txt", "x");
  write(d + "/a/g.txt", "y");
  remove_tree(d + "/a");
  EXPECT_FALSE(path_exists(d + "/a"));
  EXPECT_TRUE(path_exists(d));
  remove_tree(d + "/a");  // already gone: nothing happens
}


// A pack's checkpoints are written as temporaries first and renamed after: until the commit every file holds its old
// content, and a commit that fails removes its temporary and names the file.
TEST(Io, TemporariesChangeNothingUntilCommitted) {
  const auto d = tmpdir();
  const std::string a = d + "/a.pt", b = d + "/b.pt";
  write(a, "old a");
  write(b, "old b");
  const std::string ta = write_temporary(a, "new a"), tb = write_temporary(b, "new b");
  EXPECT_EQ(read_file(a), "old a");
  EXPECT_EQ(read_file(b), "old b");
  EXPECT_TRUE(path_exists(ta));
  commit_temporary(ta, a);
  commit_temporary(tb, b);
  EXPECT_EQ(read_file(a), "new a");
  EXPECT_EQ(read_file(b), "new b");
  EXPECT_FALSE(path_exists(ta) || path_exists(tb));
  const std::string tc = write_temporary(d + "/c.pt", "c");
  try {
    commit_temporary(tc, d + "/no-such-folder/c.pt");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-folder/c.pt"), std::string::npos);
  }
  EXPECT_FALSE(path_exists(tc));
  EXPECT_THROW(write_temporary(d + "/no-such-folder/d.pt", "d"), UserError);
  remove_tree(d);
}

}  // namespace
