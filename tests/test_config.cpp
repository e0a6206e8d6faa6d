// Config: YAML merging, overrides, and one clear error per kind of bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "core/config.h"
#include "core/errors.h"

using namespace memlab;

namespace {

Schema make_schema() {
  Schema s;
  s.add_string("task.name", "parity", "task", {"parity", "mod_arith"});
  s.add_int("model.hidden", 128, "width", 1, 4096);
  s.add_float("train.lr", 1e-3, "lr", 0.0, 1.0);
  s.add_bool("model.mlp", true, "mlp");
  s.add_int_list("task.train_len", {3, 40}, "lengths", 1);
  s.add_range_list("eval.ranges", {}, "ranges", 1);
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string p = ::testing::TempDir() + name;
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST(Config, DefaultsFileAndOverridesInOrder) {
  auto s = make_schema();
  Config c(s);
  EXPECT_EQ(c.get_int("model.hidden"), 128);
  c.merge_text("model:\n  hidden: 64\ntrain:\n  lr: 0.005\n", "x.yaml");
  EXPECT_EQ(c.get_int("model.hidden"), 64);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 0.005);
  c.set("model.hidden=32");
  c.set("task.train_len=[5, 9]");
  c.set("eval.ranges=[[3,40],[40,256]]");
  EXPECT_EQ(c.get_int("model.hidden"), 32);
  EXPECT_EQ(c.get_int_list("task.train_len"), (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(c.get_ranges("eval.ranges").size(), 2u);
  EXPECT_EQ(c.get_ranges("eval.ranges")[1].second, 256);
}

TEST(Config, CopiesAreIndependent) {
  // A copy changed, then the original: neither sees the other's value (YAML nodes are shared references).
  Schema s = make_schema();
  Config a(s);
  Config b = a;
  b.set_value("train.lr", "0.5", "test");
  EXPECT_DOUBLE_EQ(a.get_float("train.lr"), 1e-3);
  EXPECT_DOUBLE_EQ(b.get_float("train.lr"), 0.5);
  Config c = b;
  c.set_value("train.lr", "0.25", "test");
  b.set_value("train.lr", "0.125", "test");
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 0.25);
  EXPECT_DOUBLE_EQ(b.get_float("train.lr"), 0.125);
  EXPECT_DOUBLE_EQ(a.get_float("train.lr"), 1e-3);
}

TEST(Config, DumpRoundTrips) {
  auto s = make_schema();
  Config c(s);
  c.set("model.hidden=77");
  c.set("eval.ranges=[[3,4]]");
  Config d(s);
  d.merge_text(c.dump(), "dump");
  EXPECT_EQ(d.get_int("model.hidden"), 77);
  EXPECT_EQ(d.get_ranges("eval.ranges")[0].second, 4);
  EXPECT_EQ(d.dump(), c.dump());
}

TEST(Config, UnknownKeyNamesFileLineAndAllowedKeys) {
  auto s = make_schema();
  Config c(s);
  auto e = error_of([&] { c.merge_text("model:\n  hidden: 64\n  hiddn: 3\n", "exp.yaml"); });
  EXPECT_NE(e.find("exp.yaml:3:3"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'model.hiddn'"), std::string::npos) << e;
  EXPECT_NE(e.find("hidden"), std::string::npos) << e;
  e = error_of([&] { c.set("model.hiddn=3"); });
  EXPECT_NE(e.find("unknown key 'model.hiddn'"), std::string::npos) << e;
  e = error_of([&] { c.set("nosuch=3"); });
  EXPECT_NE(e.find("unknown key 'nosuch'"), std::string::npos) << e;
}

TEST(Config, WrongTypeAndRange) {
  auto s = make_schema();
  Config c(s);
  auto e = error_of([&] { c.merge_text("model:\n  hidden: abc\n", "a.yaml"); });
  EXPECT_NE(e.find("a.yaml:2:11"), std::string::npos) << e;
  EXPECT_NE(e.find("must be an integer"), std::string::npos) << e;
  e = error_of([&] { c.set("model.hidden=2.5"); });
  EXPECT_NE(e.find("must be an integer"), std::string::npos) << e;
  e = error_of([&] { c.set("model.hidden=0"); });
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  EXPECT_NE(e.find("between 1 and 4096"), std::string::npos) << e;
  e = error_of([&] { c.set("train.lr=-1"); });
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = error_of([&] { c.set("model.mlp=maybe"); });
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
  e = error_of([&] { c.set("task.name=nosuch"); });
  EXPECT_NE(e.find("allowed: parity, mod_arith"), std::string::npos) << e;
  e = error_of([&] { c.set("eval.ranges=[[40,3]]"); });
  EXPECT_NE(e.find("max < min"), std::string::npos) << e;
  e = error_of([&] { c.set("model.hidden"); });
  EXPECT_NE(e.find("expected key=value"), std::string::npos) << e;
  e = error_of([&] { c.merge_text("model: 3\n", "b.yaml"); });
  EXPECT_NE(e.find("is a section"), std::string::npos) << e;
}

TEST(Config, MalformedYamlAndMissingFile) {
  auto s = make_schema();
  Config c(s);
  auto p = write_tmp("bad.yaml", "model:\n  hidden: [1, 2\n");
  auto e = error_of([&] { c.merge_file(p); });
  EXPECT_NE(e.find("malformed YAML"), std::string::npos) << e;
  EXPECT_NE(e.find("bad.yaml:"), std::string::npos) << e;
  e = error_of([&] { c.merge_file("/nonexistent/x.yaml"); });
  EXPECT_NE(e.find("cannot read config file '/nonexistent/x.yaml'"), std::string::npos) << e;
}

TEST(Config, FailNamesWhereTheValueCameFrom) {
  auto s = make_schema();
  Config c(s);
  c.merge_text("model:\n  hidden: 6\n", "m.yaml");
  auto e = error_of([&] { c.fail("model.hidden", "must be even"); });
  EXPECT_NE(e.find("m.yaml:2:11: model.hidden: must be even"), std::string::npos) << e;
}

TEST(Config, SavedRunWithoutALaterKeyTakesItsBeforeValue) {
  Schema s = make_schema();
  s.add_bool("train.fast", true, "a key added after runs were saved").before_key("train.fast", "false");
  // a saved run from before the key: it resumes as it ran; one that has the key keeps its value
  const auto old_run = write_tmp("old_run.yaml", "model:\n  hidden: 64\n");
  const auto new_run = write_tmp("new_run.yaml", "model:\n  hidden: 64\ntrain:\n  fast: true\n");
  Config a(s), b(s), c(s);
  a.merge_saved_run(old_run);
  b.merge_saved_run(new_run);
  c.merge_file(old_run);  // a config file, not a saved run: the default
  EXPECT_FALSE(a.get_bool("train.fast"));
  EXPECT_NE(a.origin("train.fast").find("a run from before train.fast"), std::string::npos) << a.origin("train.fast");
  EXPECT_TRUE(b.get_bool("train.fast"));
  EXPECT_TRUE(c.get_bool("train.fast"));
  EXPECT_EQ(a.get_int("model.hidden"), 64);
  a.set("train.fast=true");  // --set still wins
  EXPECT_TRUE(a.get_bool("train.fast"));
}
