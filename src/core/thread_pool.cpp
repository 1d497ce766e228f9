#include "core/thread_pool.hpp"

#include <algorithm>

#include "moekit/error.hpp"

namespace moekit {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) fail(Errc::internal, "a thread pool needs at least one thread, got {}", threads);
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int w = 0; w < threads - 1; ++w) workers_.emplace_back([this, w] { worker_loop(w + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_chunk(int chunk) {
  const int64_t begin = n_ * chunk / chunks_;
  const int64_t end = n_ * (chunk + 1) / chunks_;
  if (begin >= end) return;
  try {
    (*body_)(begin, end, chunk);
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    if (worker < chunks_) run_chunk(worker);
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  parallel_chunks(n, [&body](int64_t begin, int64_t end, int) { body(begin, end); });
}

void ThreadPool::parallel_chunks(int64_t n,
                                 const std::function<void(int64_t, int64_t, int)>& body) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    body(0, n, 0);
    return;
  }
  std::lock_guard loop(loop_mutex_);
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    n_ = n;
    chunks_ = static_cast<int>(std::min<int64_t>(n, size()));
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  run_chunk(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    error = error_;
    body_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace moekit
