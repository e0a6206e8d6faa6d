#include "core/workers.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace memlab {

namespace {

thread_local bool in_chunk = false;  // nested calls run serially

struct InChunk {
  bool was = in_chunk;
  InChunk() { in_chunk = true; }
  ~InChunk() { in_chunk = was; }
};

using Fn = std::function<void(int64_t, int64_t)>;

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) {
      try {
        threads_.emplace_back([this] { serve(); });
      } catch (const std::system_error&) {
        break;  // the system gives no more threads: work with those it gave
      }
    }
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(int64_t n, int64_t grain, const Fn& fn) {
    std::lock_guard<std::mutex> one_job(run_mu_);
    Job job{&fn, n, grain, (n + grain - 1) / grain};
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    work(job);
    {
      // the job lives on this stack: no worker may still hold it when this returns
      std::unique_lock<std::mutex> lk(mu_);
      done_.wait(lk, [&] { return job.finished == job.chunks && job.users == 0; });
      job_ = nullptr;
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    const Fn* fn;
    int64_t n, grain, chunks;
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};  // a chunk threw: the chunks not yet started are skipped
    int64_t finished = 0;  // under mu_
    int users = 0;         // workers inside work(), under mu_
    std::exception_ptr error;
    std::mutex error_mu;
  };

  void work(Job& j) {
    int64_t done = 0;
    for (int64_t c = j.next.fetch_add(1); c < j.chunks; c = j.next.fetch_add(1), ++done) {
      if (j.failed.load()) continue;
      InChunk inside;
      try {
        (*j.fn)(c * j.grain, std::min(j.n, (c + 1) * j.grain));
      } catch (...) {
        std::lock_guard<std::mutex> lk(j.error_mu);
        if (!j.error) j.error = std::current_exception();
        j.failed = true;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    j.finished += done;
    if (j.finished == j.chunks) done_.notify_all();
  }

  void serve() {
    uint64_t seen = 0;
    while (true) {
      Job* j = nullptr;
      {
        std::unique_lock<std::mutex> lk(mu_);
        wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        j = job_;
        if (!j) continue;
        ++j->users;
      }
      work(*j);
      std::lock_guard<std::mutex> lk(mu_);
      if (--j->users == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mu_, mu_;
  std::condition_variable wake_, done_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

int worker_threads() {
  static const int n = [] {
    if (const char* e = std::getenv("OMP_NUM_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      if (end != e && v > 0) return static_cast<int>(std::min(v, 1024L));
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n <= grain || worker_threads() == 1 || in_chunk) {
    InChunk inside;
    for (int64_t lo = 0; lo < n; lo += grain) fn(lo, std::min(n, lo + grain));
    return;
  }
  static Pool pool(worker_threads());
  pool.run(n, grain, fn);
}

}  // namespace memlab
