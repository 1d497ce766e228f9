#pragma once
// The ranks a layer spans, and the few exchanges its dispatchers need: an all-to-all with
// per-peer byte counts, a sum over the ranks, a barrier and an abort. Below layer 3: a
// dispatcher holds a Communicator and never names the library under it, so MPI (host buffers,
// blocking calls on the calling thread) and NCCL (device buffers, the calls enqueued on the
// ExecContext's stream and waited for) are rows of one table. Every blocking step has a
// deadline; a peer that does not answer in time is an Error(Errc::comm) naming that rank and the
// step, never a hang.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "contracts/exec.hpp"
#include "moekit/plan.hpp"

namespace moekit {

// One blocking step: its name (for errors) and how long it may wait for the other ranks.
struct CommStep {
  std::string_view name;
  int64_t timeout_ms = 30000;
};

// One all-to-all. This rank sends send_bytes[p] bytes at send + send_offsets[p] to every rank p
// (itself included, 0 bytes allowed) and accepts at most recv_capacity[p] bytes from p at
// recv + recv_offsets[p]; received[p] says how many came. A receiver that knows the exact size
// passes it as the capacity; one that does not (the low-latency dispatch) passes its fixed slot.
// NCCL's receives take exact sizes: over NCCL the capacity must be what p sends (a mismatch
// leaves one side waiting, which the step's deadline turns into an error).
struct Exchange {
  const std::byte* send = nullptr;
  const int64_t* send_offsets = nullptr;
  const int64_t* send_bytes = nullptr;
  std::byte* recv = nullptr;
  const int64_t* recv_offsets = nullptr;
  const int64_t* recv_capacity = nullptr;
  int64_t* received = nullptr;
};

// The per-peer arrays of an Exchange, made once when a dispatcher is built (an exchange
// allocates nothing).
struct ExchangeArrays {
  std::vector<int64_t> send_offsets, send_bytes, recv_offsets, recv_capacity, received;

  explicit ExchangeArrays(int size)
      : send_offsets(size),
        send_bytes(size),
        recv_offsets(size),
        recv_capacity(size),
        received(size) {}
  Exchange view(const void* send, void* recv) {
    return {static_cast<const std::byte*>(send),
            send_offsets.data(),
            send_bytes.data(),
            static_cast<std::byte*>(recv),
            recv_offsets.data(),
            recv_capacity.data(),
            received.data()};
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view name() const = 0;
  // Where the buffers of all_to_all and all_reduce_sum live: host memory for MPI, the device
  // for NCCL.
  virtual DeviceKind buffers() const = 0;

  virtual void all_to_all(const ExecContext& ctx, const Exchange& exchange,
                          const CommStep& step) = 0;
  // The same exchange enqueued on ctx.stream and not waited for, so that it can be captured in a
  // CUDA graph: built by communicators whose exchanges run on the stream (NCCL; enqueues()).
  // Sizes are exact both ways and `received` is not written. A peer that never answers leaves
  // the stream unfinished, which wait() bounds.
  virtual bool enqueues() const { return false; }
  virtual void enqueue_all_to_all(const ExecContext& ctx, const Exchange& exchange,
                                  const CommStep& step);
  // Waits until ctx.stream has run what was enqueued on it, against the step's deadline; a
  // timeout or a transport error aborts the communicator and throws Error(comm) naming this rank
  // and the step.
  virtual void wait(const ExecContext& ctx, const CommStep& step);
  // data[0, count) becomes the sum over the ranks, bit for bit the same on every rank: each
  // element is added in rank order 0, 1, ..., size-1, whatever order the parts arrive in.
  // `scratch` holds all_reduce_scratch(count) floats.
  virtual void all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                              const CommStep& step) = 0;
  virtual int64_t all_reduce_scratch(int64_t count) const = 0;
  // all_reduce_sum enqueued, not waited for (capturable), where enqueues(); wait() bounds it.
  virtual void enqueue_all_reduce_sum(const ExecContext& ctx, float* data, int64_t count,
                                      float* scratch, const CommStep& step);
  // Returns false if some rank did not arrive before the deadline (nothing is thrown: a caller
  // that is already failing uses it to learn whether the others are failing with it).
  virtual bool barrier(const CommStep& step) = 0;
  // Ends every rank's process with `code`.
  [[noreturn]] virtual void abort(int code) = 0;

  // For benchmarks. The bytes this rank has sent to each rank (itself excluded) since it was
  // made; and the median seconds of the transport's own all-to-all (MPI_Alltoallv for MPI)
  // sending bytes_to[p] bytes to each rank p, over `repeats` calls after a barrier each: the
  // floor a dispatcher's exchanges are compared against. Collective: every rank calls it.
  virtual const std::vector<int64_t>& bytes_sent_to() const = 0;
  virtual double bare_all_to_all_seconds(const std::vector<int64_t>& bytes_to, int repeats) = 0;
};

// The process's communicator of `kind` over all the ranks the launcher started, made (and the
// library under it initialised) on first use. An Error(internal) for a kind not built.
Communicator& world_communicator(CommKind kind);
// Whether this build has a communicator of `kind`, and why not.
bool communicator_built(CommKind kind);
std::string communicator_absent_reason(CommKind kind);
// The world communicator, if this process has made one spanning more than one rank.
Communicator* active_world_communicator();

// out[i] = parts[0][i] + parts[1][i] + ... + parts[n_parts - 1][i], added in that order, for i
// in [0, n), part p at parts + p * stride; out may be parts[0]. In the communicator's buffers:
// host_segment_sum on the CPU, a kernel on ctx.stream for device buffers.
using SegmentSum = void (*)(const ExecContext& ctx, float* out, const float* parts, int64_t stride,
                            int n_parts, int64_t n);
void host_segment_sum(const ExecContext& ctx, float* out, const float* parts, int64_t stride,
                      int n_parts, int64_t n);

// The fixed-order sum of all_reduce_sum over all_to_all alone, for communicators without a
// reduction of their own that keeps that order: a reduce-scatter (each rank sums its segment in
// rank order with `sum`) then an all-gather. scratch: fixed_order_reduce_scratch(size, count)
// floats.
// `enqueued`: both exchanges through enqueue_all_to_all (nothing waited for).
void fixed_order_all_reduce(Communicator& comm, ExchangeArrays& arrays, const ExecContext& ctx,
                            float* data, int64_t count, float* scratch, const CommStep& step,
                            SegmentSum sum, bool enqueued = false);
int64_t fixed_order_reduce_scratch(int size, int64_t count);

}  // namespace moekit
