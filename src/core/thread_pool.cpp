#include "core/thread_pool.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include "moekit/error.hpp"

namespace moekit {
namespace {

// How long a thread that is done with a loop spins, watching for the next loop (a worker) or
// for the workers to finish (the caller), before it sleeps on a condition variable. A forward
// runs a few loops back to back, and a sleeping thread takes tens of microseconds to wake (a
// hundred and more in a virtual machine): as long as a whole decode step's share of work.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// True as soon as ready() is; false if it is not within kSpin.
template <typename Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

}  // namespace

ThreadPool& ThreadPool::shared(int threads) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  std::lock_guard lock(mutex);
  std::unique_ptr<ThreadPool>& pool = pools[threads];
  if (!pool) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) fail(Errc::internal, "a thread pool needs at least one thread, got {}", threads);
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int w = 0; w < threads - 1; ++w) workers_.emplace_back([this, w] { worker_loop(w + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  start_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::wake() {
  if (workers_.empty()) return;
  {
    std::lock_guard lock(mutex_);
    ++wakes_;
  }
  start_.notify_all();
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
  uint64_t seen_wakes = 0;
  const auto next_loop = [&] {
    return stop_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!spin_until(next_loop)) {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return next_loop() || wakes_ != seen_wakes; });
      seen_wakes = wakes_;
      // Woken ahead of a loop (wake()): spin for it.
      if (!next_loop()) continue;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    if (worker < chunks_) run_chunk(worker);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the mutex, so a caller that found work pending is asleep before the notify.
      std::lock_guard lock(mutex_);
      done_.notify_one();
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
  // Workers read these only after they see the new generation.
  body_ = &body;
  n_ = n;
  chunks_ = static_cast<int>(std::min<int64_t>(n, size()));
  error_ = nullptr;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Under the mutex, so a worker that found no loop is asleep before the notify.
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_.notify_all();
  run_chunk(0);
  const auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, finished);
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = error_;
    body_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace moekit
