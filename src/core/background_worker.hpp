#pragma once
// One persistent thread that runs one task at a time while the caller does other work: the
// second stream of the overlapped block form. Created once; starting a task allocates nothing.

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace moekit {

class BackgroundWorker {
 public:
  explicit BackgroundWorker(std::function<void()> task);
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void start();
  // Waits for the task started last; rethrows what it threw.
  void wait();

 private:
  void loop();

  std::function<void()> task_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool requested_ = false;
  bool running_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace moekit
