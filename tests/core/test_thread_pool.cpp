#include "core/thread_pool.hpp"
#include "moekit/error.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace moekit {
namespace {

struct Chunk {
  int64_t begin;
  int64_t end;
  int index;
};

// Every chunk a parallel_chunks call hands out, recorded under a lock.
std::vector<Chunk> record_chunks(ThreadPool& pool, int64_t n) {
  std::mutex mutex;
  std::vector<Chunk> chunks;
  pool.parallel_chunks(n, [&](int64_t begin, int64_t end, int index) {
    std::lock_guard lock(mutex);
    chunks.push_back({begin, end, index});
  });
  std::sort(chunks.begin(), chunks.end(),
            [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
  return chunks;
}

// How many times parallel_for visited each index of [0, n).
std::vector<int> visit_counts(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> counts(static_cast<size_t>(n));
  pool.parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) counts[static_cast<size_t>(i)].fetch_add(1);
  });
  std::vector<int> result;
  for (const auto& count : counts) result.push_back(count.load());
  return result;
}

class ThreadPoolLoop : public testing::TestWithParam<std::tuple<int, int64_t>> {
 protected:
  int threads() const { return std::get<0>(GetParam()); }
  int64_t n() const { return std::get<1>(GetParam()); }
};

TEST_P(ThreadPoolLoop, ParallelForVisitsEveryIndexExactlyOnce) {
  ThreadPool pool(threads());
  EXPECT_EQ(visit_counts(pool, n()), std::vector<int>(static_cast<size_t>(n()), 1));
}

TEST_P(ThreadPoolLoop, ParallelChunksAreDisjointInRangeAndCoverTheLoop) {
  ThreadPool pool(threads());
  const std::vector<Chunk> chunks = record_chunks(pool, n());
  if (n() == 0) {
    EXPECT_TRUE(chunks.empty());
    return;
  }
  ASSERT_FALSE(chunks.empty());
  EXPECT_LE(static_cast<int>(chunks.size()), pool.size());
  EXPECT_EQ(chunks.front().begin, 0);
  EXPECT_EQ(chunks.back().end, n());
  std::vector<int> indices;
  for (size_t c = 0; c < chunks.size(); ++c) {
    SCOPED_TRACE(testing::Message() << "chunk [" << chunks[c].begin << ", " << chunks[c].end
                                    << ") index " << chunks[c].index);
    EXPECT_LT(chunks[c].begin, chunks[c].end);
    EXPECT_GE(chunks[c].index, 0);
    EXPECT_LT(chunks[c].index, pool.size());
    if (c > 0) {
      EXPECT_EQ(chunks[c].begin, chunks[c - 1].end);  // no overlap, no gap
    }
    indices.push_back(chunks[c].index);
  }
  // Distinct indices, so each chunk may own per-thread scratch memory.
  std::sort(indices.begin(), indices.end());
  EXPECT_EQ(std::adjacent_find(indices.begin(), indices.end()), indices.end());
}

INSTANTIATE_TEST_SUITE_P(SizesAndLengths, ThreadPoolLoop,
                         testing::Combine(testing::Values(1, 2, 4),
                                          testing::Values<int64_t>(0, 1, 2, 3, 7, 1000)),
                         [](const testing::TestParamInfo<std::tuple<int, int64_t>>& param_info) {
                           return "threads" + std::to_string(std::get<0>(param_info.param)) + "_n" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

struct ThrowRow {
  const char* label;
  int threads;
  int64_t n;
  int64_t throw_at;  // the chunk holding this index throws
};
void PrintTo(const ThrowRow& row, std::ostream* os) {
  *os << row.label;
}

class ThreadPoolException : public testing::TestWithParam<ThrowRow> {};

TEST_P(ThreadPoolException, IsRethrownAndThePoolStaysUsable) {
  const ThrowRow& row = GetParam();
  ThreadPool pool(row.threads);
  EXPECT_THROW(
      {
        try {
          pool.parallel_for(row.n, [&](int64_t begin, int64_t end) {
            if (begin <= row.throw_at && row.throw_at < end)
              throw std::runtime_error("chunk failed");
          });
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "chunk failed");
          throw;
        }
      },
      std::runtime_error);
  // The pool still runs loops, repeatedly, and covers them fully.
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(visit_counts(pool, 100), std::vector<int>(100, 1)) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Chunks, ThreadPoolException,
    testing::Values(ThrowRow{"one_thread", 1, 10, 5}, ThrowRow{"single_index", 4, 1, 0},
                    ThrowRow{"callers_chunk", 4, 100, 0},   // chunk 0 runs on the caller
                    ThrowRow{"workers_chunk", 4, 100, 99},  // the last chunk: a worker
                    ThrowRow{"middle_worker_chunk", 2, 1000, 700}),
    [](const testing::TestParamInfo<ThrowRow>& param_info) {
      return std::string(param_info.param.label);
    });

TEST(ThreadPoolRethrow, EveryChunkThrowingStillRethrowsOneAndStaysUsable) {
  ThreadPool pool(4);
  EXPECT_THROW(
      pool.parallel_for(1000, [](int64_t, int64_t) { throw std::invalid_argument("every chunk"); }),
      std::invalid_argument);
  EXPECT_EQ(visit_counts(pool, 1000), std::vector<int>(1000, 1));
}

TEST(ThreadPoolSize, NonPositiveThreadsAreRefused) {
  // The thread count comes from the plan (Platform::probe is the one place that looks at the
  // machine), so a pool never guesses one.
  for (int threads : {0, -1, -8}) EXPECT_THROW(ThreadPool pool(threads), Error) << threads;
}

TEST(ThreadPoolSize, PositiveThreadsIsTheSize) {
  for (int threads : {1, 2, 3, 4}) EXPECT_EQ(ThreadPool(threads).size(), threads);
}

// wake() only readies the workers: loops after it, right away or after the workers went back to
// sleep, still visit every index once; and a pool can be destroyed while its workers spin.
TEST(ThreadPoolWake, LoopsAfterAWakeStillCoverEveryIndexOnce) {
  for (const int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    pool.wake();
    EXPECT_EQ(visit_counts(pool, 100), std::vector<int>(100, 1));
    pool.wake();
    pool.wake();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the workers' spin
    EXPECT_EQ(visit_counts(pool, 37), std::vector<int>(37, 1));
  }
  ThreadPool spinning(3);
  spinning.wake();
}

TEST(ThreadPoolConcurrency, LoopsFromSeveralCallerThreadsEachCoverTheirRange) {
  ThreadPool pool(4);
  constexpr int kCallers = 4;
  constexpr int kRounds = 50;
  std::vector<int> failures(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < kRounds; ++round) {
        const int64_t n = 17 + c * 31 + round;
        if (visit_counts(pool, n) != std::vector<int>(static_cast<size_t>(n), 1)) ++failures[c];
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(failures, std::vector<int>(kCallers, 0));
}

TEST(ThreadPoolShared, IsOnePoolPerThreadCount) {
  ThreadPool& three = ThreadPool::shared(3);
  EXPECT_EQ(&ThreadPool::shared(3), &three);
  EXPECT_EQ(three.size(), 3);
  ThreadPool& two = ThreadPool::shared(2);
  EXPECT_NE(&two, &three);
  EXPECT_EQ(two.size(), 2);
  EXPECT_EQ(visit_counts(three, 50), std::vector<int>(50, 1));
}

}  // namespace
}  // namespace moekit
