#pragma once
// A fixed pool of worker threads for data-parallel loops. Workers are created once; a parallel
// loop allocates nothing. One loop runs at a time per pool (callers on other threads wait).
// Between loops workers spin for a while (kSpin in thread_pool.cpp) before they sleep, so the
// loops of one forward do not each pay a thread's wake-up.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moekit {

class ThreadPool {
 public:
  // threads >= 1, the calling thread included; anything else throws internal (the count comes
  // from the plan, which takes it from Platform::probe).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process's pool of `threads` threads, made on first use. Every layer planned for the same
  // thread count runs its loops on it: a model's layers run one after another, so the workers
  // that one layer's loops leave spinning are the ones the next layer's loops need, where a pool
  // per layer would leave them spinning on the cores the next layer's workers wait for. Loops
  // of layers called from several threads at once take turns.
  static ThreadPool& shared(int threads);

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) over [0, n) split into at most size() contiguous chunks; the calling
  // thread takes a chunk too. The first exception thrown by a chunk is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body);
  // As parallel_for, and tells each chunk its index in [0, size()), so a chunk can use
  // per-thread scratch memory declared up front.
  void parallel_chunks(int64_t n, const std::function<void(int64_t, int64_t, int)>& body);
  // Wakes sleeping workers so that they are spinning, ready, when a loop starts shortly after:
  // a caller that will run loops calls it before its serial work, and the workers' wake-up
  // overlaps that work instead of delaying the first loop.
  void wake();

 private:
  void worker_loop(int worker);
  void run_chunk(int chunk);

  std::vector<std::thread> workers_;
  std::mutex loop_mutex_;  // one loop at a time
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t, int)>* body_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;
  std::atomic<int> pending_ = 0;          // workers still in the current loop
  std::atomic<uint64_t> generation_ = 0;  // loops started
  std::atomic<bool> stop_ = false;
  uint64_t wakes_ = 0;  // wake() calls, under mutex_
  std::exception_ptr error_;
};

}  // namespace moekit
