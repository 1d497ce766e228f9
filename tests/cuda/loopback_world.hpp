#pragma once
// Ranks as threads of one process on one GPU, for the GPU tests of what runs across ranks (the
// nccl dispatcher, the reduce form): a communicator of device buffers that moves bytes between
// the ranks' buffers with NCCL's rule (a receive takes the exact size sent, or the step fails),
// and runs the exchanges it is asked to enqueue at once.

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/nccl/segment_sum.hpp"
#include "moekit/error.hpp"

namespace moekit::cuda_testing {

// N ranks as threads of this process on one GPU. An exchange is two rendezvous: every rank posts
// what it sends, each copies what its peers send it into its own buffers on its stream, and all
// wait until every copy is done before any sender may reuse its buffer.
class LoopbackWorld {
 public:
  explicit LoopbackWorld(int size) : size_(size), posted_(static_cast<size_t>(size)) {}

  int size() const { return size_; }

  void exchange(int rank, const ExecContext& ctx, const Exchange& x, const CommStep& step) {
    require(cudaStreamSynchronize(ctx.stream), rank, step);  // the send buffers are written
    std::unique_lock<std::mutex> lock(mutex_);
    posted_[static_cast<size_t>(rank)] = x;
    arrive(lock, rank, step);
    const std::vector<Exchange> posted = posted_;
    lock.unlock();
    for (int p = 0; p < size_; ++p) {
      const Exchange& from = posted[static_cast<size_t>(p)];
      const int64_t bytes = from.send_bytes[rank];
      if (bytes != x.recv_capacity[p]) {
        fail(Errc::comm, "rank {}: step '{}': rank {} sends {} bytes into a receive of {}", rank,
             step.name, p, bytes, x.recv_capacity[p]);
      }
      if (bytes > 0) {
        require(cudaMemcpyAsync(x.recv + x.recv_offsets[p], from.send + from.send_offsets[rank],
                                static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, ctx.stream),
                rank, step);
      }
      x.received[p] = bytes;
    }
    require(cudaStreamSynchronize(ctx.stream), rank, step);
    lock.lock();
    arrive(lock, rank, step);
  }

  bool barrier(int rank, const CommStep& step) {
    std::unique_lock<std::mutex> lock(mutex_);
    try {
      arrive(lock, rank, step);
    } catch (const Error&) {
      return false;
    }
    return true;
  }

 private:
  void arrive(std::unique_lock<std::mutex>& lock, int rank, const CommStep& step) {
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
      return;
    }
    if (!all_arrived_.wait_for(lock, std::chrono::milliseconds(step.timeout_ms),
                               [&] { return generation_ != generation; })) {
      fail(Errc::comm, "rank {}: step '{}' timed out after {} ms", rank, step.name,
           step.timeout_ms);
    }
  }

  static void require(cudaError_t status, int rank, const CommStep& step) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    fail(Errc::comm, "rank {}: step '{}': {}", rank, step.name, cudaGetErrorString(status));
  }

  int size_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<Exchange> posted_;
};

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(LoopbackWorld& world, int rank)
      : world_(world), rank_(rank), arrays_(world.size()), sent_to_(world.size()) {}

  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  std::string_view name() const override { return "loopback"; }
  DeviceKind buffers() const override { return DeviceKind::cuda; }

  void all_to_all(const ExecContext& ctx, const Exchange& x, const CommStep& step) override {
    world_.exchange(rank_, ctx, x, step);
    for (int p = 0; p < size(); ++p) {
      if (p != rank_) sent_to_[static_cast<size_t>(p)] += x.send_bytes[p];
    }
  }
  // Enqueued exchanges run at once here (the ranks are threads of one process): the protocol of
  // the low-latency mode is what these tests check, not its capture.
  bool enqueues() const override { return true; }
  void enqueue_all_to_all(const ExecContext& ctx, const Exchange& x,
                          const CommStep& step) override {
    all_to_all(ctx, x, step);
  }
  void enqueue_all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                              const CommStep& step) override {
    fixed_order_all_reduce(*this, arrays_, ctx, data, count, scratch, step, device_sum,
                           /*enqueued=*/true);
  }
  void wait(const ExecContext& ctx, const CommStep&) override { synchronize_stream(ctx.stream); }
  void all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                      const CommStep& step) override {
    fixed_order_all_reduce(
        *this, arrays_, ctx, data, count, scratch, step,
        [](const ExecContext& c, float* out, const float* parts, int64_t stride, int n_parts,
           int64_t n) { comm::cuda::segment_sum(out, parts, stride, n_parts, n, c.stream); });
  }
  int64_t all_reduce_scratch(int64_t count) const override {
    return fixed_order_reduce_scratch(size(), count);
  }
  bool barrier(const CommStep& step) override { return world_.barrier(rank_, step); }
  [[noreturn]] void abort(int) override { std::abort(); }
  const std::vector<int64_t>& bytes_sent_to() const override { return sent_to_; }
  double bare_all_to_all_seconds(const std::vector<int64_t>&, int) override {
    fail(Errc::internal, "the loopback world times no transport");
  }

 private:
  static void device_sum(const ExecContext& c, float* out, const float* parts, int64_t stride,
                         int n_parts, int64_t n) {
    comm::cuda::segment_sum(out, parts, stride, n_parts, n, c.stream);
  }

  LoopbackWorld& world_;
  int rank_;
  ExchangeArrays arrays_;
  std::vector<int64_t> sent_to_;
};

// Runs body(rank) on `size` threads at once; the first exception of each rank is kept.
template <typename Body>
std::vector<std::exception_ptr> on_every_rank(int size, Body body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

inline std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace moekit::cuda_testing
