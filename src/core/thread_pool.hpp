#pragma once
// A fixed pool of worker threads for data-parallel loops. Workers are created once; a parallel
// loop allocates nothing. One loop runs at a time per pool (callers on other threads wait).

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

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) over [0, n) split into at most size() contiguous chunks; the calling
  // thread takes a chunk too. The first exception thrown by a chunk is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body);
  // As parallel_for, and tells each chunk its index in [0, size()), so a chunk can use
  // per-thread scratch memory declared up front.
  void parallel_chunks(int64_t n, const std::function<void(int64_t, int64_t, int)>& body);

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
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace moekit
