#include "sweep/store.h"

#include <fmt/format.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <functional>

#include "core/errors.h"
#include "core/io.h"
#include "core/log.h"

namespace memlab {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One prepared statement; binds by position (1-based) and steps.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK)
      throw UserError(fmt::format("results store: {} (in: {})", sqlite3_errmsg(db), sql));
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, double v) {  // NaN is stored as NULL
    if (std::isnan(v))
      sqlite3_bind_null(s_, i);
    else
      sqlite3_bind_double(s_, i, v);
    return *this;
  }
  Stmt& bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& bind(int i, int v) { return bind(i, static_cast<int64_t>(v)); }
  // True while a row is available.
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw UserError(fmt::format("results store: {}", sqlite3_errmsg(db_)));
  }
  void run() {
    while (step()) {
    }
    sqlite3_reset(s_);
  }
  void reset() { sqlite3_reset(s_); }
  std::string text(int c) const {
    const auto* p = sqlite3_column_text(s_, c);
    return p ? std::string(reinterpret_cast<const char*>(p)) : std::string();
  }
  double real(int c) const { return sqlite3_column_double(s_, c); }
  double real_or_nan(int c) const {  // NULL (SQLite's NaN) reads as NaN
    return sqlite3_column_type(s_, c) == SQLITE_NULL ? std::nan("") : sqlite3_column_double(s_, c);
  }
  int64_t integer(int c) const { return sqlite3_column_int64(s_, c); }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
};

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw UserError(fmt::format("results store: {}", msg));
  }
}

// BEGIN IMMEDIATE takes the write lock up front, so two claimers never both read a run as free.
void transaction(sqlite3* db, const std::function<void()>& body) {
  exec(db, "BEGIN IMMEDIATE");
  try {
    body();
    exec(db, "COMMIT");
  } catch (...) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs(
  id TEXT PRIMARY KEY, label TEXT NOT NULL, task TEXT NOT NULL, model TEXT NOT NULL, lr REAL NOT NULL,
  seed INTEGER NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  worker TEXT NOT NULL DEFAULT '', error TEXT NOT NULL DEFAULT '', attempts INTEGER NOT NULL DEFAULT 0,
  started REAL NOT NULL DEFAULT 0, finished REAL NOT NULL DEFAULT 0, heartbeat REAL NOT NULL DEFAULT 0,
  seconds REAL NOT NULL DEFAULT 0, stops INTEGER NOT NULL DEFAULT 0, device_seconds REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS sweep_runs(
  sweep TEXT NOT NULL, idx INTEGER NOT NULL, run_id TEXT NOT NULL REFERENCES runs(id), PRIMARY KEY(sweep, idx));
CREATE TABLE IF NOT EXISTS evals(
  run_id TEXT NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, length_min INTEGER NOT NULL,
  length_max INTEGER NOT NULL, n INTEGER NOT NULL, accuracy REAL NOT NULL, normalized REAL NOT NULL,
  accuracy_all REAL, normalized_all REAL, PRIMARY KEY(run_id, step, length_min, length_max));
CREATE TABLE IF NOT EXISTS train(
  run_id TEXT NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, loss REAL NOT NULL, accuracy REAL NOT NULL,
  lr REAL NOT NULL, grad_norm REAL NOT NULL, ms_per_step REAL NOT NULL, elapsed_s REAL NOT NULL,
  PRIMARY KEY(run_id, step));
)sql";

const char* kRunColumns =
    "runs.id, label, task, model, lr, seed, config, status, worker, error, attempts, started, finished, heartbeat, "
    "seconds, stops, device_seconds";

RunRecord read_run(const Stmt& s) {
  RunRecord r;
  r.id = s.text(0);
  r.label = s.text(1);
  r.task = s.text(2);
  r.model = s.text(3);
  r.lr = s.real(4);
  r.seed = s.integer(5);
  r.config = s.text(6);
  r.status = s.text(7);
  r.worker = s.text(8);
  r.error = s.text(9);
  r.attempts = static_cast<int>(s.integer(10));
  r.started = s.real(11);
  r.finished = s.real(12);
  r.heartbeat = s.real(13);
  r.seconds = s.real(14);
  r.stops = static_cast<int>(s.integer(15));
  r.device_seconds = s.real(16);
  return r;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

// A running run is abandoned when its process is known to be gone (same host) or has stopped beating.
bool Store::abandoned(const RunRecord& r, double stale_s) {
  if (r.heartbeat < now_s() - stale_s) return true;
  const auto colon = r.worker.rfind(':');
  if (colon == std::string::npos || r.worker.substr(0, colon) != host_name()) return false;
  const long pid = std::strtol(r.worker.c_str() + colon + 1, nullptr, 10);
  return pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

std::string Store::file_in(const std::string& results_dir) { return join_path(results_dir, "results.sqlite"); }

std::string Store::this_worker() { return fmt::format("{}:{}", host_name(), static_cast<long>(getpid())); }

namespace {
// PRAGMA application_id of a memlab results store ("MLAB"); stores of memlab before 2026-11-23 have 0.
constexpr int64_t kApplicationId = 0x4d4c4142;

std::vector<std::string> column_names(sqlite3* db, const char* table) {
  Stmt s(db, fmt::format("PRAGMA table_info({})", table).c_str());
  std::vector<std::string> out;
  while (s.step()) out.push_back(s.text(1));
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Creates the tables in a new file, upgrades a store of an older memlab, and refuses any other SQLite file.
void prepare_schema(sqlite3* db, const std::string& path) {
  transaction(db, [&] {
    Stmt id(db, "PRAGMA application_id");
    id.step();
    const int64_t app = id.integer(0);
    id.reset();
    Stmt tables(db, "SELECT count(*) FROM sqlite_master");
    tables.step();
    const bool empty = tables.integer(0) == 0;
    tables.reset();
    if (app != kApplicationId && !empty) {
      const auto runs = column_names(db, "runs"), links = column_names(db, "sweep_runs");
      if (app != 0 || !has(runs, "id") || !has(runs, "config") || !has(runs, "status") || !has(links, "run_id"))
        throw UserError(fmt::format("'{}' is an SQLite file but not a memlab results store", path));
    }
    exec(db, kSchema);
    if (!has(column_names(db, "evals"), "accuracy_all")) {
      exec(db, "ALTER TABLE evals ADD COLUMN accuracy_all REAL");
      exec(db, "ALTER TABLE evals ADD COLUMN normalized_all REAL");
    }
    const auto runs = column_names(db, "runs");
    if (!has(runs, "stops")) exec(db, "ALTER TABLE runs ADD COLUMN stops INTEGER NOT NULL DEFAULT 0");
    if (!has(runs, "device_seconds")) exec(db, "ALTER TABLE runs ADD COLUMN device_seconds REAL NOT NULL DEFAULT 0");
    if (app != kApplicationId) exec(db, fmt::format("PRAGMA application_id = {}", kApplicationId).c_str());
  });
}
}  // namespace

Store::Store(const std::string& results_dir, bool create) : path_(file_in(results_dir)) {
  if (!create && !path_exists(path_))
    throw UserError(fmt::format("'{}' holds no results store (results.sqlite)", results_dir));
  if (create) ensure_writable_dir(results_dir);
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw UserError(fmt::format("cannot open the results store '{}': {}", path_, msg));
  }
  sqlite3_busy_timeout(db_, 120000);
  try {
    exec(db_, "PRAGMA journal_mode=WAL");
    exec(db_, "PRAGMA synchronous=NORMAL");
    exec(db_, "PRAGMA foreign_keys=ON");
    prepare_schema(db_, path_);
  } catch (const std::exception& e) {
    sqlite3_close(db_);
    db_ = nullptr;
    const std::string what = e.what();
    if (what.find("not a memlab results store") != std::string::npos) throw;
    throw UserError(fmt::format("cannot use the results store '{}': {}", path_,
                                what.rfind("results store: ", 0) == 0 ? what.substr(15) : what));
  }
}

Store::~Store() { sqlite3_close(db_); }

void Store::add_sweep(const std::string& sweep, const std::vector<RunRecord>& runs) {
  transaction(db_, [&] {
    Stmt ins(db_,
             "INSERT INTO runs(id, label, task, model, lr, seed, config) VALUES(?,?,?,?,?,?,?) "
             "ON CONFLICT(id) DO UPDATE SET label = excluded.label, config = CASE WHEN status IN ('pending', "
             "'failed') THEN excluded.config ELSE config END");
    Stmt del(db_, "DELETE FROM sweep_runs WHERE sweep = ?");
    Stmt link(db_, "INSERT INTO sweep_runs(sweep, idx, run_id) VALUES(?,?,?)");
    del.bind(1, sweep).run();
    int64_t idx = 0;
    for (const auto& r : runs) {
      ins.bind(1, r.id).bind(2, r.label).bind(3, r.task).bind(4, r.model).bind(5, r.lr).bind(6, r.seed).bind(7, r.config);
      ins.run();
      link.bind(1, sweep).bind(2, idx++).bind(3, r.id).run();
    }
  });
}

std::vector<std::string> Store::sweeps() const {
  Stmt s(db_, "SELECT DISTINCT sweep FROM sweep_runs ORDER BY sweep");
  std::vector<std::string> out;
  while (s.step()) out.push_back(s.text(0));
  return out;
}

std::vector<RunRecord> Store::runs(const std::string& sweep) const {
  std::vector<RunRecord> out;
  if (sweep.empty()) {
    Stmt s(db_, fmt::format("SELECT {} FROM runs ORDER BY rowid", kRunColumns).c_str());
    while (s.step()) out.push_back(read_run(s));
  } else {
    Stmt s(db_, fmt::format("SELECT {} FROM sweep_runs JOIN runs ON runs.id = sweep_runs.run_id WHERE sweep = ? "
                            "ORDER BY idx",
                            kRunColumns)
                    .c_str());
    s.bind(1, sweep);
    while (s.step()) out.push_back(read_run(s));
  }
  return out;
}

std::optional<RunRecord> Store::run(const std::string& id) const {
  Stmt s(db_, fmt::format("SELECT {} FROM runs WHERE id = ?", kRunColumns).c_str());
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_run(s);
}

SweepCounts Store::counts(const std::string& sweep) const {
  SweepCounts c;
  for (const auto& r : runs(sweep)) {
    ++c.total;
    if (r.status == "pending") ++c.pending;
    if (r.status == "running") ++c.running;
    if (r.status == "done") ++c.done;
    if (r.status == "failed") ++c.failed;
  }
  return c;
}

std::optional<RunRecord> Store::claim(const std::string& sweep, const std::string& id, const std::string& worker,
                                      double stale_s, bool retry_failed, const std::set<std::string>& tried) {
  auto got = claim_group(sweep, id, worker, stale_s, retry_failed, tried, nullptr);
  if (got.empty()) return std::nullopt;
  return got[0];
}

std::vector<RunRecord> Store::claim_group(const std::string& sweep, const std::string& id, const std::string& worker,
                                          double stale_s, bool retry_failed, const std::set<std::string>& tried,
                                          const Joins& joins, std::vector<RunRecord>* before,
                                          const std::set<std::string>& skip) {
  std::vector<RunRecord> got;
  if (before) before->clear();
  transaction(db_, [&] {
    std::vector<RunRecord> candidates;
    if (!id.empty()) {
      if (auto r = run(id)) candidates.push_back(*r);
    } else {
      candidates = runs(sweep);
    }
    const double t = now_s();
    for (auto& r : candidates) {
      const bool free = r.status == "pending" || (r.status == "running" && abandoned(r, stale_s)) ||
                        (r.status == "failed" && retry_failed && !tried.count(r.id));
      if (!free || skip.count(r.id)) continue;
      if (!got.empty() && !(joins && joins(got, r))) continue;
      Stmt up(db_,
              "UPDATE runs SET status = 'running', worker = ?, attempts = attempts + 1, started = ?, heartbeat = ?, "
              "error = '' WHERE id = ?");
      up.bind(1, worker).bind(2, t).bind(3, t).bind(4, r.id).run();
      if (before) before->push_back(r);
      r.status = "running";
      r.worker = worker;
      r.attempts += 1;
      r.started = r.heartbeat = t;
      got.push_back(r);
      if (!joins) return;
    }
  });
  return got;
}

void Store::heartbeat(const std::string& id, const std::string& worker) {
  Stmt s(db_, "UPDATE runs SET heartbeat = ? WHERE id = ? AND worker = ? AND status = 'running'");
  s.bind(1, now_s()).bind(2, id).bind(3, worker).run();
}

void Store::finish(const std::string& id, const std::vector<TrainRecord>& train, const std::vector<EvalRecord>& evals,
                   double seconds) {
  transaction(db_, [&] {
    Stmt(db_, "DELETE FROM evals WHERE run_id = ?").bind(1, id).run();
    Stmt(db_, "DELETE FROM train WHERE run_id = ?").bind(1, id).run();
    Stmt ev(db_,
            "INSERT INTO evals(run_id, step, length_min, length_max, n, accuracy, normalized, accuracy_all, "
            "normalized_all) VALUES(?,?,?,?,?,?,?,?,?)");
    for (const auto& e : evals) {
      ev.bind(1, id).bind(2, e.step).bind(3, e.length_min).bind(4, e.length_max).bind(5, e.n).bind(6, e.accuracy);
      ev.bind(7, e.normalized).bind(8, e.accuracy_all).bind(9, e.normalized_all).run();  // NaN binds as NULL
    }
    Stmt tr(db_,
            "INSERT INTO train(run_id, step, loss, accuracy, lr, grad_norm, ms_per_step, elapsed_s) "
            "VALUES(?,?,?,?,?,?,?,?)");
    for (const auto& t : train) {
      tr.bind(1, id).bind(2, t.step).bind(3, t.loss).bind(4, t.accuracy).bind(5, t.lr).bind(6, t.grad_norm);
      tr.bind(7, t.ms_per_step).bind(8, t.elapsed_s).run();
    }
    Stmt(db_, "UPDATE runs SET status = 'done', error = '', finished = ?, seconds = ? WHERE id = ?")
        .bind(1, now_s())
        .bind(2, seconds)
        .bind(3, id)
        .run();
  });
}

void Store::fail(const std::string& id, const std::string& error) {
  Stmt(db_, "UPDATE runs SET status = 'failed', error = ?, finished = ? WHERE id = ?")
      .bind(1, error)
      .bind(2, now_s())
      .bind(3, id)
      .run();
}

void Store::add_device_time(const std::vector<std::string>& ids, double seconds) {
  transaction(db_, [&] {
    Stmt add(db_, "UPDATE runs SET device_seconds = device_seconds + ? WHERE id = ?");
    for (const auto& id : ids) add.bind(1, seconds).bind(2, id).run();
  });
}

std::map<std::string, FinishedCost> finished_costs(const std::vector<RunRecord>& runs) {
  std::map<std::pair<std::string, double>, int64_t> pack_size;
  for (const auto& r : runs)
    if ((r.status == "done" || r.status == "failed") && r.started > 0) ++pack_size[{r.worker, r.started}];
  std::map<std::string, FinishedCost> out;
  for (const auto& r : runs) {
    if (r.status != "done") continue;
    const double wall = r.started > 0 && r.finished > r.started ? r.finished - r.started : 0;
    // A run with no claim time (finished by hand) is a pack of its own.
    const int64_t m = r.started > 0 ? std::max<int64_t>(1, pack_size[{r.worker, r.started}]) : 1;
    out[r.id] = FinishedCost{std::max(r.seconds, wall) / static_cast<double>(m), m};
  }
  return out;
}

std::string device_time_summary(const std::vector<RunRecord>& runs) {
  const auto costs = finished_costs(runs);
  double recorded = 0, estimated = 0, unfinished = 0;
  int64_t n_recorded = 0, n_estimated = 0, n_unfinished = 0;
  for (const auto& r : runs) {
    if (r.status != "done") {
      unfinished += r.device_seconds;
      n_unfinished += r.device_seconds > 0;
    } else if (r.device_seconds > 0) {
      recorded += r.device_seconds;
      ++n_recorded;
    } else {
      estimated += costs.at(r.id).seconds;
      ++n_estimated;
    }
  }
  const int64_t done = n_recorded + n_estimated;
  if (done == 0 && n_unfinished == 0) return "";
  const auto unfinished_part = [&] {
    return fmt::format("{} in the attempts of {} run{} not finished", format_duration(unfinished), n_unfinished,
                       n_unfinished == 1 ? "" : "s");
  };
  if (done == 0) return "device time: no run finished yet; " + unfinished_part();
  std::string s = fmt::format("device time {} for its {} finished run{} ({} a run)", format_duration(recorded + estimated),
                              done, done == 1 ? "" : "s",
                              format_duration((recorded + estimated) / static_cast<double>(done)));
  const char* how_recorded = "each attempt's wall time, shared among the runs packed into its process";
  const char* how_estimated = "from their own time, as an older memlab recorded it: training time, or the finishing "
                              "attempt's where longer, shared in its pack; without work that stops cut off";
  if (n_estimated == 0)
    s += fmt::format(", recorded: {}", how_recorded);
  else if (n_recorded == 0)
    s += fmt::format(", estimated {}", how_estimated);
  else
    s += fmt::format(": {} recorded for {} ({}), {} estimated for {} ({})", format_duration(recorded), n_recorded,
                     how_recorded, format_duration(estimated), n_estimated, how_estimated);
  if (n_unfinished > 0) s += "; and " + unfinished_part();
  return s;
}

void Store::release(const std::string& id, bool stopped) {
  Stmt(db_, "UPDATE runs SET status = 'pending', worker = '', stops = stops + ? WHERE id = ? AND status = 'running'")
      .bind(1, static_cast<int64_t>(stopped ? 1 : 0))
      .bind(2, id)
      .run();
}

void Store::unclaim(const RunRecord& r) {
  Stmt(db_,
       "UPDATE runs SET status = ?, worker = ?, error = ?, attempts = ?, started = ?, heartbeat = ? "
       "WHERE id = ? AND status = 'running'")
      .bind(1, r.status)
      .bind(2, r.worker)
      .bind(3, r.error)
      .bind(4, static_cast<int64_t>(r.attempts))
      .bind(5, r.started)
      .bind(6, r.heartbeat)
      .bind(7, r.id)
      .run();
}

std::vector<EvalRecord> Store::evals(const std::string& run_id) const {
  Stmt s(db_,
         "SELECT step, length_min, length_max, n, accuracy, normalized, accuracy_all, normalized_all FROM evals "
         "WHERE run_id = ? ORDER BY step, length_min, length_max");
  s.bind(1, run_id);
  std::vector<EvalRecord> out;
  while (s.step())
    out.push_back({run_id, s.integer(0), s.integer(1), s.integer(2), s.integer(3), s.real(4), s.real(5),
                   s.real_or_nan(6), s.real_or_nan(7)});
  return out;
}

std::vector<TrainRecord> Store::train_rows(const std::string& run_id) const {
  Stmt s(db_,
         "SELECT step, loss, accuracy, lr, grad_norm, ms_per_step, elapsed_s FROM train WHERE run_id = ? ORDER BY step");
  s.bind(1, run_id);
  std::vector<TrainRecord> out;
  while (s.step())
    out.push_back({run_id, s.integer(0), s.real(1), s.real(2), s.real(3), s.real(4), s.real(5), s.real(6)});
  return out;
}

}  // namespace memlab
