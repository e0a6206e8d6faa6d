#include "core/workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace memlab;

// Every item runs once, in chunks of the grain, whatever thread takes it; a second call reuses the pool.
TEST(Workers, EveryItemRunsOnceInChunksOfTheGrain) {
  for (int64_t n : {1, 7, 1000, 1001}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> bad_chunks{0};
    parallel_chunks(n, 7, [&](int64_t lo, int64_t hi) {
      if (lo % 7 != 0 || hi - lo > 7 || (hi - lo < 7 && hi != n)) ++bad_chunks;
      for (int64_t i = lo; i < hi; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << ", item " << i;
    EXPECT_EQ(bad_chunks.load(), 0);
  }
  parallel_chunks(0, 7, [](int64_t, int64_t) { FAIL() << "no items, no call"; });
}

// The chunks run on several threads where the machine has them.
TEST(Workers, ChunksShareThreads) {
  if (worker_threads() < 2) GTEST_SKIP() << "one thread";
  std::atomic<int> inside{0}, most{0};
  parallel_chunks(64, 1, [&](int64_t, int64_t) {
    const int now = ++inside;
    for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    --inside;
  });
  EXPECT_GE(most.load(), 2);
}

// A throwing chunk's exception reaches the caller, and the chunks after it do not start (serially: exactly those
// before it ran); a call from inside a chunk runs serially.
TEST(Workers, ExceptionsReachTheCallerAndNestedCallsRun) {
  std::atomic<int> ran{0};
  auto throw_at_30 = [&](int64_t lo, int64_t) {
    ++ran;
    if (lo == 30) throw std::runtime_error("chunk 3");
  };
  EXPECT_THROW(parallel_chunks(100, 10, throw_at_30), std::runtime_error);
  ran = 0;
  EXPECT_THROW(parallel_chunks(1, 1, [&](int64_t, int64_t) { parallel_chunks(100, 10, throw_at_30); }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 4);
  std::vector<std::atomic<int>> hits(100);
  parallel_chunks(10, 1, [&](int64_t lo, int64_t) {
    parallel_chunks(10, 3, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) ++hits[static_cast<size_t>(lo * 10 + i)];
    });
  });
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}
