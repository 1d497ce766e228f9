// The MPI communicator: host buffers, every exchange as non-blocking point-to-point messages
// polled against the step's deadline (MPI_Testall), so that a rank that died or stopped is
// named in an error instead of blocking the others forever. The only file that includes mpi.h.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

constexpr int kExchangeTag = 7301;
// How long a wait polls busily, then yielding the core, before it sleeps between polls.
constexpr std::chrono::microseconds kSpin{500};
constexpr std::chrono::milliseconds kYield{20};

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0) {
      // Serialized: forward() may be called from any one thread at a time; the thread pool's
      // workers never call MPI.
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fail(Errc::comm, "MPI_Init_thread failed");
      }
      owns_mpi_ = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    reduce_arrays_ = ExchangeArrays(size_);
    sent_to_.assign(static_cast<size_t>(size_), 0);
    requests_.resize(static_cast<size_t>(2 * size_));
    statuses_.resize(requests_.size());
    peer_of_.resize(requests_.size());
  }

  ~MpiCommunicator() override {
    if (broken_) return;  // requests may still be pending: the process is ending with an error
    MPI_Comm_free(&comm_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && finalized == 0) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "mpi"; }
  DeviceKind buffers() const override { return DeviceKind::cpu; }

  void all_to_all(const ExecContext&, const Exchange& x, const CommStep& step) override {
    check_usable(step);
    int n = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const int capacity = as_count(x.recv_capacity[p], p, step);
      post(MPI_Irecv(x.recv + x.recv_offsets[p], capacity, MPI_BYTE, p, kExchangeTag, comm_,
                     &requests_[n]),
           p, step);
      peer_of_[n++] = p;
    }
    const int receives = n;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const int bytes = as_count(x.send_bytes[p], p, step);
      post(MPI_Isend(x.send + x.send_offsets[p], bytes, MPI_BYTE, p, kExchangeTag, comm_,
                     &requests_[n]),
           p, step);
      peer_of_[n++] = p;
      sent_to_[p] += bytes;
    }
    const int64_t own = x.send_bytes[rank_];
    if (own > x.recv_capacity[rank_]) {
      broken_ = true;
      fail(Errc::internal, "rank {}: step '{}' sends itself {} bytes into room for {}", rank_,
           step.name, own, x.recv_capacity[rank_]);
    }
    if (own > 0) {
      std::memmove(x.recv + x.recv_offsets[rank_], x.send + x.send_offsets[rank_],
                   static_cast<size_t>(own));
    }
    x.received[rank_] = own;
    wait_all(n, step);
    for (int i = 0; i < receives; ++i) {
      int count = 0;
      MPI_Get_count(&statuses_[i], MPI_BYTE, &count);
      x.received[peer_of_[i]] = count;
    }
  }

  void all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                      const CommStep& step) override {
    fixed_order_all_reduce(*this, reduce_arrays_, ctx, data, count, scratch, step,
                           host_segment_sum);
  }

  int64_t all_reduce_scratch(int64_t count) const override {
    return fixed_order_reduce_scratch(size_, count);
  }

  bool barrier(const CommStep& step) override {
    if (broken_) return false;
    if (MPI_Ibarrier(comm_, &requests_[0]) != MPI_SUCCESS) return false;
    peer_of_[0] = -1;
    try {
      wait_all(1, step);
    } catch (const Error&) {
      return false;
    }
    return true;
  }

  const std::vector<int64_t>& bytes_sent_to() const override { return sent_to_; }

  double bare_all_to_all_seconds(const std::vector<int64_t>& bytes_to, int repeats) override {
    std::vector<int> send_counts(size_), recv_counts(size_), send_displs(size_), recv_displs(size_);
    for (int p = 0; p < size_; ++p) {
      send_counts[p] = p == rank_ ? 0 : as_count(bytes_to[p], p, {"bare all-to-all", 0});
    }
    MPI_Alltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, comm_);
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size_; ++p) {
      send_displs[p] = static_cast<int>(sent);
      recv_displs[p] = static_cast<int>(received);
      sent += send_counts[p];
      received += recv_counts[p];
    }
    std::vector<char> send(static_cast<size_t>(std::max<int64_t>(sent, 1)), 1);
    std::vector<char> recv(static_cast<size_t>(std::max<int64_t>(received, 1)));
    std::vector<double> seconds;
    for (int r = -1; r < repeats; ++r) {  // one untimed call first
      MPI_Barrier(comm_);
      const auto start = std::chrono::steady_clock::now();
      MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_BYTE, recv.data(),
                    recv_counts.data(), recv_displs.data(), MPI_BYTE, comm_);
      const auto end = std::chrono::steady_clock::now();
      if (r >= 0) seconds.push_back(std::chrono::duration<double>(end - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds.empty() ? 0.0 : seconds[seconds.size() / 2];
  }

  [[noreturn]] void abort(int code) override {
    broken_ = true;
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

 private:
  void check_usable(const CommStep& step) const {
    if (broken_) {
      fail(Errc::comm, "rank {}: step '{}' cannot run: an earlier exchange failed", rank_,
           step.name);
    }
  }

  int as_count(int64_t bytes, int peer, const CommStep& step) {
    if (bytes < 0 || bytes > INT_MAX) {
      broken_ = true;
      fail(Errc::invalid_argument,
           "rank {}: step '{}' exchanges {} bytes with rank {}, beyond "
           "what one MPI message carries",
           rank_, step.name, bytes, peer);
    }
    return static_cast<int>(bytes);
  }

  void post(int code, int peer, const CommStep& step) {
    if (code != MPI_SUCCESS) {
      broken_ = true;
      fail(Errc::comm, "rank {}: step '{}' could not post a message to rank {}: {}", rank_,
           step.name, peer, mpi_error_text(code));
    }
  }

  // Polls the n posted requests until all are done or the step's deadline passes: busily for
  // kSpin (yielding at once cost 5x on 2 ranks, the core going to another process), then
  // yielding, and after kYield sleeping, so that ranks oversubscribed on few cores let the rank
  // they wait for run.
  void wait_all(int n, const CommStep& step) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::milliseconds(step.timeout_ms);
    const auto spin_until = start + kSpin, yield_until = start + kYield;
    for (;;) {
      int done = 0;
      const int code = MPI_Testall(n, requests_.data(), &done, statuses_.data());
      if (code != MPI_SUCCESS) fail_in_status(n, code, step);
      if (done != 0) return;
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) fail_timed_out(n, step);
      if (now < spin_until) continue;
      if (now < yield_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  [[noreturn]] void fail_in_status(int n, int code, const CommStep& step) {
    broken_ = true;
    for (int i = 0; i < n; ++i) {
      const int e = statuses_[i].MPI_ERROR;
      if (code == MPI_ERR_IN_STATUS && e != MPI_SUCCESS && e != MPI_ERR_PENDING) {
        fail(Errc::comm, "rank {}: step '{}' failed with rank {}: {}", rank_, step.name,
             peer_of_[i], mpi_error_text(e));
      }
    }
    fail(Errc::comm, "rank {}: step '{}' failed: {}", rank_, step.name, mpi_error_text(code));
  }

  [[noreturn]] void fail_timed_out(int n, const CommStep& step) {
    broken_ = true;
    std::string missing;
    for (int i = 0; i < n; ++i) {
      int done = 0;
      MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE);
      if (done != 0) continue;
      const std::string who =
          peer_of_[i] < 0 ? std::string("some rank") : fmt::format("rank {}", peer_of_[i]);
      if (missing.find(who) == std::string::npos) missing += (missing.empty() ? "" : ", ") + who;
    }
    fail(Errc::comm,
         "rank {}: step '{}' timed out after {} ms waiting for {} (a rank that died, stopped "
         "answering, or took another path)",
         rank_, step.name, step.timeout_ms, missing.empty() ? std::string("a peer") : missing);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool owns_mpi_ = false;
  bool broken_ = false;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> peer_of_;  // the rank of each request; -1 for a collective
  std::vector<int64_t> sent_to_;
  ExchangeArrays reduce_arrays_{0};
};

std::mutex& world_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unique_ptr<MpiCommunicator>& world_slot() {
  static std::unique_ptr<MpiCommunicator> world;
  return world;
}

}  // namespace

Communicator& mpi_world() {
  const std::lock_guard<std::mutex> lock(world_mutex());
  std::unique_ptr<MpiCommunicator>& world = world_slot();
  if (!world) world = std::make_unique<MpiCommunicator>();
  return *world;
}

Communicator* mpi_world_if_made() {
  const std::lock_guard<std::mutex> lock(world_mutex());
  return world_slot().get();
}

}  // namespace moekit
