#include "core/background_worker.hpp"

#include <utility>

namespace moekit {

BackgroundWorker::BackgroundWorker(std::function<void()> task)
    : task_(std::move(task)), thread_([this] { loop(); }) {}

BackgroundWorker::~BackgroundWorker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BackgroundWorker::start() {
  {
    std::lock_guard lock(mutex_);
    requested_ = true;
    running_ = true;
    error_ = nullptr;
  }
  changed_.notify_all();
}

void BackgroundWorker::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void BackgroundWorker::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [this] { return stop_ || requested_; });
      if (stop_) return;
      requested_ = false;
    }
    std::exception_ptr error;
    try {
      task_();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      error_ = error;
      running_ = false;
    }
    changed_.notify_all();
  }
}

}  // namespace moekit
