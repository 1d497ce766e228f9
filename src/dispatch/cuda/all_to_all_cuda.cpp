// The all-to-all dispatcher on the GPU (a2a nccl): the protocol of all_to_all.cpp on device
// buffers, over a communicator of device buffers (NCCL), one GPU per rank. Each rank holds its
// own tokens, sends each token's row once to every rank that holds one of its experts, with that
// rank's (slot, weight) pairs, and gets back that rank's weighted partial sum, which a kernel adds
// into the token's output in rank order. The runner reads the standard dispatch format. The rows
// travel as the hidden states came (the plan refuses the e4m3 wire on the GPU).
// docs/EXPERT_PARALLEL.md has the protocol and its bytes.
//
//   normal (prefill): round 1, one 16-byte header per destination (status, rows, dtype), read
//     on the host, which then knows every exact size NCCL's receives need; round 2 the rows,
//     straight into the runner's input (this rank's own first, packed there, then each other
//     rank's in rank order); round 3 their (slot, weight) pairs, checked into the runner's arrays
//     by a kernel; combine sends the partial sums back and a kernel adds them in rank order.
//   low-latency (decode): no host synchronisation, so dispatch, experts and combine can be
//     captured in one CUDA graph. Every source rank has a fixed slot of max_tokens rows at each
//     destination; two exchanges enqueued without waiting carry each slot whole (NCCL's receives
//     take exact sizes): a message (header, then the rows' pairs) and the rows, straight into the
//     runner's input at the source's slot. A kernel unpacks the messages with the counts in their
//     headers, masking the rows past each count (every slot -1: the runner skips them), so the
//     runner sees size x max_tokens rows whatever arrived. Problems in what came (a rank that
//     abandoned, another dtype, a bad slot) are found on the device and reported by
//     synchronize(), which also bounds the wait for the exchanges by their deadline.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/scratch.hpp"
#include "dispatch/cuda/a2a_kernels.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

using dispatch::cuda::kWireFailed;
using dispatch::cuda::kWireOk;
using dispatch::cuda::WireHeader;
using dispatch::cuda::WirePair;
using dispatch::cuda::WireProblem;

constexpr int64_t kMaxElementBytes = 4;  // the activations' dtypes: f32 at most
constexpr auto kHeaderBytes = static_cast<int64_t>(sizeof(WireHeader));
constexpr auto kReportBytes = static_cast<int64_t>(sizeof(WireProblem));
static_assert(kHeaderBytes == 16);

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  fail(Errc::internal, "the nccl all-to-all: {} failed: {}", what, cudaGetErrorString(status));
}

// Pinned host memory, where the headers and the unpack kernels' reports are copied back to.
class PinnedHost {
 public:
  explicit PinnedHost(int64_t bytes) {
    check_cuda(cudaMallocHost(&data_, static_cast<size_t>(bytes)), "cudaMallocHost");
  }
  ~PinnedHost() { cudaFreeHost(data_); }
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

class CudaAllToAllDispatcher final : public Dispatcher {
 public:
  explicit CudaAllToAllDispatcher(const DispatcherProblem& problem)
      : p_(problem),
        comm_(*problem.comm),
        size_(comm_.size()),
        me_(comm_.rank()),
        low_latency_(problem.mode == A2AMode::low_latency),
        slots_(static_cast<int>(std::count_if(problem.global_to_local.begin(),
                                              problem.global_to_local.end(),
                                              [](int32_t s) { return s >= 0; }))),
        message_bytes_(kHeaderBytes + problem.max_tokens * problem.columns *
                                          static_cast<int64_t>(sizeof(WirePair))),
        arrays_(size_),
        sent_(static_cast<size_t>(size_)),
        got_(static_cast<size_t>(size_)),
        got_offset_(static_cast<size_t>(size_)),
        table_(Tensor::empty(DType::i32, {static_cast<int64_t>(problem.global_to_local.size())},
                             problem.device)),
        reports_(Tensor::empty(DType::i8, {(size_ + 1) * kReportBytes}, problem.device)),
        headers_(2 * size_ * kHeaderBytes),
        reports_host_((size_ + 1) * kReportBytes) {
    if (comm_.buffers() != DeviceKind::cuda) {
      fail(Errc::internal, "the nccl all-to-all needs a communicator of device buffers, not {}",
           comm_.name());
    }
    if (p_.wire != A2AWire::activations || (low_latency_ && !comm_.enqueues())) {
      fail(Errc::internal,
           "the nccl all-to-all was planned for mode {} and wire {} over {}: not built",
           a2a_mode_name(p_.mode), a2a_wire_name(p_.wire), comm_.name());
    }
    if (p_.max_tokens * size_ > p_.max_received_tokens) {
      fail(Errc::internal, "all-to-all planned for {} received tokens, fewer than {} ranks x {}",
           p_.max_received_tokens, size_, p_.max_tokens);
    }
    copy(table_, TensorView::contiguous(p_.global_to_local.data(), DType::i32,
                                        {static_cast<int64_t>(p_.global_to_local.size())}));
    reports_.fill_bytes(0);
    row_bytes_ = dtype_storage_bytes(dtype_, p_.hidden);
  }

  bool collective() const override { return true; }

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    carve(counter);
    return counter.bytes();
  }

  DispatchOutput dispatch(const ExecContext& ctx, const TensorView& hidden,
                          const int32_t* global_ids, const float* weights, float*,
                          void* scratch) override {
    const Arrays a = carve_at(scratch);
    const int64_t T = hidden.dim(0);
    if (T > p_.max_tokens) {
      fail(Errc::internal, "dispatch of {} tokens exceeds the {} planned", T, p_.max_tokens);
    }
    tokens_ = T;
    dtype_ = hidden.dtype;
    row_bytes_ = dtype_storage_bytes(dtype_, p_.hidden);
    // Low-latency: this rank's own rows sit in its slot, and the headers lead the messages.
    const int64_t own_row = low_latency_ ? me_ * p_.max_tokens : 0;
    dispatch::cuda::plan_all_to_all(
        {.global_ids = global_ids,
         .weights = weights,
         .tokens = T,
         .columns = p_.columns,
         .size = size_,
         .me = me_,
         .physical = p_.physical,
         .per_rank = p_.per_rank,
         .global_to_local = table_.data<int32_t>(),
         .n_global = static_cast<int>(p_.global_to_local.size()),
         .max_tokens = p_.max_tokens,
         .dtype = static_cast<int32_t>(dtype_),
         .token_of = a.token_of,
         .index_of = a.index_of,
         .send_pairs = low_latency_ ? pairs_of(a.messages_out) : a.send_pairs,
         .pairs_stride = low_latency_ ? message_bytes_ / static_cast<int64_t>(sizeof(WirePair))
                                      : p_.max_tokens * p_.columns,
         .own_slots = a.in_slots + own_row * p_.columns,
         .own_weights = a.in_weights + own_row * p_.columns,
         .headers = headers_of(a),
         .header_stride = header_stride()},
        ctx.stream);
    return low_latency_ ? dispatch_low_latency(ctx, hidden, a) : dispatch_normal(ctx, hidden, a);
  }

  void combine(const ExecContext& ctx, const DispatchOutput&, float* combined,
               void* scratch) override {
    const Arrays a = carve_at(scratch);
    const int64_t row = p_.hidden * static_cast<int64_t>(sizeof(float));
    if (low_latency_) {
      exchange_slots(ctx, reinterpret_cast<std::byte*>(a.sums),
                     reinterpret_cast<std::byte*>(a.back), row, kCombineStep);
    } else {
      for (int r = 0; r < size_; ++r) {
        const bool other = r != me_;
        arrays_.send_offsets[r] = got_offset_[r] * row;
        arrays_.send_bytes[r] = other ? got_[r] * row : 0;
        arrays_.recv_offsets[r] = r * p_.max_tokens * row;
        arrays_.recv_capacity[r] = other ? sent_[r] * row : 0;
      }
      comm_.all_to_all(ctx, arrays_.view(a.sums, a.back), step(kCombineStep));
      if (const WireProblem bad = take_reports(ctx, size_, 1).front(); bad.kind != 0) {
        fail(Errc::comm, "rank {}: a rank sent expert slot {}, not one of this rank's {}", me_,
             bad.detail, slots_);
      }
    }
    const int64_t own_row = low_latency_ ? me_ * p_.max_tokens : 0;
    dispatch::cuda::sum_in_rank_order({.own = a.sums + own_row * p_.hidden,
                                       .back = a.back,
                                       .index_of = a.index_of,
                                       .tokens = tokens_,
                                       .hidden = p_.hidden,
                                       .max_tokens = p_.max_tokens,
                                       .size = size_,
                                       .me = me_,
                                       .combined = combined},
                                      ctx.stream);
  }

  // Failed headers go where the others wait for this rank's: round 1 in normal mode; in
  // low-latency mode every exchange of a forward, whole (the rows' slots sized by the dtype of
  // this rank's last batch, bf16 before any), then waited for.
  void abandon(const ExecContext& ctx, void* scratch) override {
    const Arrays a = carve_at(scratch);
    auto* failed = headers_.as<WireHeader>();
    std::fill_n(failed, size_, WireHeader{kWireFailed, 0, 0, 0});
    check_cuda(cudaMemcpy2DAsync(headers_of(a), static_cast<size_t>(header_stride()), failed,
                                 sizeof(WireHeader), sizeof(WireHeader), static_cast<size_t>(size_),
                                 cudaMemcpyHostToDevice, ctx.stream),
               "copying the failed headers");
    if (!low_latency_) {
      exchange_headers(ctx, a);
      return;
    }
    enqueue_low_latency(ctx, a);
    exchange_slots(ctx, reinterpret_cast<std::byte*>(a.sums), reinterpret_cast<std::byte*>(a.back),
                   p_.hidden * static_cast<int64_t>(sizeof(float)), kCombineStep);
    comm_.wait(ctx, step(kLowLatencyStep));
  }

  void synchronize(const ExecContext& ctx, void*) override {
    if (!low_latency_) return;
    comm_.wait(ctx, step(kLowLatencyStep));
    const std::vector<WireProblem> problems = take_reports(ctx, 0, size_);
    std::string found;
    for (int r = 0; r < size_; ++r) {
      if (problems[r].kind != 0) found += (found.empty() ? "" : "; ") + describe(r, problems[r]);
    }
    if (!found.empty()) {
      fail(Errc::comm,
           "rank {}: step '{}': {}; the rows of those ranks were left out of this batch", me_,
           kLowLatencyStep, found);
    }
  }

 private:
  struct Arrays {
    WireHeader* headers;      // normal: [2][size], to each rank, then from each rank
    std::byte* messages_out;  // low-latency: [size][message_bytes_], to each rank
    std::byte* messages_in;   // low-latency: the same, from each rank
    int32_t* token_of;        // [size][max_tokens]: the token of each row sent to a rank
    int32_t* index_of;        // [size][max_tokens]: each token's row at a rank, or -1
    WirePair* send_pairs;     // normal: [size][max_tokens][columns]
    WirePair* recv_pairs;     // normal: [size * max_tokens][columns], by row of the input
    std::byte* send_rows;     // [size][max_tokens][H]: rows to each other rank
    std::byte* input;         // [size * max_tokens][H]: the rows the runner reads
    int32_t* in_slots;        // [size * max_tokens][columns]
    float* in_weights;
    float* sums;  // [size * max_tokens][H]: the runner's weighted sums
    float* back;  // [size][max_tokens][H]: this rank's partial sums, from each rank
  };

  Arrays carve(ScratchCarver& c) const {
    const int64_t rows = size_ * p_.max_tokens, H = p_.hidden;
    const int64_t messages = low_latency_ ? size_ * message_bytes_ : 0;
    const int64_t normal_pairs = low_latency_ ? 0 : rows * p_.columns;
    return {c.take<WireHeader>(low_latency_ ? 0 : 2 * size_),
            c.take<std::byte>(messages),
            c.take<std::byte>(messages),
            c.take<int32_t>(rows),
            c.take<int32_t>(rows),
            c.take<WirePair>(normal_pairs),
            c.take<WirePair>(normal_pairs),
            c.take<std::byte>(rows * H * kMaxElementBytes),
            c.take<std::byte>(rows * H * kMaxElementBytes),
            c.take<int32_t>(rows * p_.columns),
            c.take<float>(rows * p_.columns),
            c.take<float>(rows * H),
            c.take<float>(rows * H)};
  }
  Arrays carve_at(void* scratch) const {
    ScratchCarver carver(scratch);
    return carve(carver);
  }

  static WirePair* pairs_of(std::byte* messages) {
    return reinterpret_cast<WirePair*>(messages + kHeaderBytes);
  }
  WireHeader* headers_of(const Arrays& a) const {
    return low_latency_ ? reinterpret_cast<WireHeader*>(a.messages_out) : a.headers;
  }
  int64_t header_stride() const { return low_latency_ ? message_bytes_ : kHeaderBytes; }

  CommStep step(std::string_view name) const { return {name, p_.timeout_ms}; }

  DispatchOutput dispatch_normal(const ExecContext& ctx, const TensorView& hidden,
                                 const Arrays& a) {
    exchange_headers(ctx, a);
    read_headers();
    const int64_t received = std::accumulate(got_.begin(), got_.end(), int64_t{0});
    dispatch::cuda::pack_rows({.hidden = static_cast<const std::byte*>(hidden.data),
                               .row_bytes = row_bytes_,
                               .token_of = a.token_of,
                               .max_tokens = p_.max_tokens,
                               .size = size_,
                               .me = me_,
                               .headers = a.headers,
                               .header_stride = kHeaderBytes,
                               .most_rows = *std::max_element(sent_.begin(), sent_.end()),
                               .send_rows = a.send_rows,
                               .own_rows = a.input},
                              ctx.stream);
    exchange_rows(ctx, a.send_rows, a.input, row_bytes_, "dispatch: rows");
    const auto pair_bytes = static_cast<int64_t>(p_.columns * sizeof(WirePair));
    exchange_rows(ctx, reinterpret_cast<std::byte*>(a.send_pairs),
                  reinterpret_cast<std::byte*>(a.recv_pairs), pair_bytes,
                  "dispatch: expert slots and weights");
    const int64_t own = got_[me_];
    dispatch::cuda::unpack_pairs({.pairs = a.recv_pairs + own * p_.columns,
                                  .rows = received - own,
                                  .columns = p_.columns,
                                  .slots = slots_,
                                  .first_row = own,
                                  .slots_out = a.in_slots,
                                  .weights_out = a.in_weights,
                                  .problem = reports() + size_},
                                 ctx.stream);
    return {TensorView::contiguous(a.input, dtype_, {received, p_.hidden}, p_.device),
            a.in_slots,
            a.in_weights,
            received,
            p_.columns,
            a.sums};
  }

  DispatchOutput dispatch_low_latency(const ExecContext& ctx, const TensorView& hidden,
                                      const Arrays& a) {
    dispatch::cuda::pack_rows({.hidden = static_cast<const std::byte*>(hidden.data),
                               .row_bytes = row_bytes_,
                               .token_of = a.token_of,
                               .max_tokens = p_.max_tokens,
                               .size = size_,
                               .me = me_,
                               .headers = headers_of(a),
                               .header_stride = message_bytes_,
                               .most_rows = p_.max_tokens,
                               .send_rows = a.send_rows,
                               .own_rows = a.input + me_ * p_.max_tokens * row_bytes_},
                              ctx.stream);
    enqueue_low_latency(ctx, a);
    dispatch::cuda::unpack_messages({.messages = a.messages_in,
                                     .own_message = a.messages_out + me_ * message_bytes_,
                                     .message_bytes = message_bytes_,
                                     .max_tokens = p_.max_tokens,
                                     .columns = p_.columns,
                                     .slots = slots_,
                                     .size = size_,
                                     .me = me_,
                                     .dtype = static_cast<int32_t>(dtype_),
                                     .slots_out = a.in_slots,
                                     .weights_out = a.in_weights,
                                     .problems = reports()},
                                    ctx.stream);
    const int64_t rows = size_ * p_.max_tokens;
    return {TensorView::contiguous(a.input, dtype_, {rows, p_.hidden}, p_.device),
            a.in_slots,
            a.in_weights,
            rows,
            p_.columns,
            a.sums};
  }

  // The low-latency dispatch's two exchanges, enqueued: the messages, then the rows straight into
  // the source's slot of the runner's input.
  void enqueue_low_latency(const ExecContext& ctx, const Arrays& a) {
    for (int r = 0; r < size_; ++r) {
      const int64_t bytes = r != me_ ? message_bytes_ : 0;
      arrays_.send_offsets[r] = r * message_bytes_;
      arrays_.send_bytes[r] = bytes;
      arrays_.recv_offsets[r] = r * message_bytes_;
      arrays_.recv_capacity[r] = bytes;
    }
    comm_.enqueue_all_to_all(ctx, arrays_.view(a.messages_out, a.messages_in),
                             step("dispatch: headers and expert slots (low-latency)"));
    exchange_slots(ctx, a.send_rows, a.input, row_bytes_, "dispatch: rows (low-latency)");
  }

  // A whole slot of max_tokens rows of `unit` bytes to and from every other rank, enqueued: from
  // send[r] to recv[me] there, the same layout on both sides.
  void exchange_slots(const ExecContext& ctx, const std::byte* send, std::byte* recv, int64_t unit,
                      std::string_view name) {
    for (int r = 0; r < size_; ++r) {
      const int64_t bytes = r != me_ ? p_.max_tokens * unit : 0;
      arrays_.send_offsets[r] = r * p_.max_tokens * unit;
      arrays_.send_bytes[r] = bytes;
      arrays_.recv_offsets[r] = r * p_.max_tokens * unit;
      arrays_.recv_capacity[r] = bytes;
    }
    comm_.enqueue_all_to_all(ctx, arrays_.view(send, recv), step(name));
  }

  WireProblem* reports() const { return static_cast<WireProblem*>(reports_.view().data); }

  // Reports [first, first + n) on the host, cleared on the device for the batches after.
  std::vector<WireProblem> take_reports(const ExecContext& ctx, int first, int n) {
    auto* host = reports_host_.as<WireProblem>();
    const auto bytes = static_cast<size_t>(n * kReportBytes);
    check_cuda(cudaMemcpyAsync(host, reports() + first, bytes, cudaMemcpyDeviceToHost, ctx.stream),
               "copying the unpack kernels' reports");
    check_cuda(cudaMemsetAsync(reports() + first, 0, bytes, ctx.stream),
               "clearing the unpack kernels' reports");
    check_cuda(cudaStreamSynchronize(ctx.stream), "waiting for the reports");
    return {host, host + n};
  }

  std::string describe(int r, const WireProblem& problem) const {
    switch (problem.kind) {
      case dispatch::cuda::kWireRefused:
        return fmt::format("rank {} refused its input (see its message)", r);
      case dispatch::cuda::kWireDtype:
        return fmt::format(
            "rank {} sent {} rows, this rank {}: every rank must pass the same dtype", r,
            dtype_name(static_cast<DType>(problem.detail)), dtype_name(dtype_));
      case dispatch::cuda::kWireBadId:
        return fmt::format("routed expert id {} is out of range [0, {})", problem.detail,
                           p_.global_to_local.size());
      case dispatch::cuda::kWireSlot:
        return fmt::format("rank {} sent expert slot {}, not one of this rank's {}", r,
                           problem.detail, slots_);
      default:
        return fmt::format("rank {} sent a malformed header", r);
    }
  }

  // Round 1, and its copy to the host (the exchange has waited for the stream already).
  void exchange_headers(const ExecContext& ctx, const Arrays& a) {
    for (int r = 0; r < size_; ++r) {
      arrays_.send_offsets[r] = r * kHeaderBytes;
      arrays_.send_bytes[r] = kHeaderBytes;
      arrays_.recv_offsets[r] = r * kHeaderBytes;
      arrays_.recv_capacity[r] = kHeaderBytes;
    }
    comm_.all_to_all(ctx, arrays_.view(a.headers, a.headers + size_), step(kCountStep));
    check_cuda(cudaMemcpyAsync(headers_.as<WireHeader>(), a.headers,
                               static_cast<size_t>(2 * size_ * kHeaderBytes),
                               cudaMemcpyDeviceToHost, ctx.stream),
               "copying the headers to the host");
    check_cuda(cudaStreamSynchronize(ctx.stream), "waiting for the headers");
  }

  // What this rank sends (its own headers: an id out of range fails them all) and what each
  // source rank said it sends: a failure, or a row count this rank has room for, in this rank's
  // dtype; then where those rows go in the runner's input.
  void read_headers() {
    const WireHeader* out = headers_.as<WireHeader>();
    const WireHeader* in = out + size_;
    if (out[me_].status != kWireOk) {
      fail(Errc::invalid_argument, "rank {}: routed expert id {} is out of range [0, {})", me_,
           out[me_].bad_id, p_.global_to_local.size());
    }
    std::string failed;
    for (int r = 0; r < size_; ++r) {
      sent_[r] = out[r].rows;
      const WireHeader& h = in[r];
      if (h.status == kWireFailed) {
        failed += (failed.empty() ? "" : ", ") + std::to_string(r);
        continue;
      }
      if (h.status != kWireOk || h.rows < 0 || h.rows > p_.max_tokens) {
        fail(Errc::comm, "rank {}: rank {} sent a malformed header in step '{}'", me_, r,
             kCountStep);
      }
      if (h.dtype != static_cast<int32_t>(dtype_)) {
        fail_dtype_mismatch(me_, dtype_, static_cast<DType>(h.dtype), r);
      }
      got_[r] = h.rows;
    }
    if (!failed.empty()) fail_refused_input(me_, failed, kCountStep);
    rows_by_source(got_, me_, got_offset_);
  }

  // Rounds 2 and 3: `unit` bytes per row, from [size][max_tokens] rows per destination into the
  // runner's row order; none to or from this rank itself.
  void exchange_rows(const ExecContext& ctx, const std::byte* send, std::byte* recv, int64_t unit,
                     std::string_view name) {
    for (int r = 0; r < size_; ++r) {
      const bool other = r != me_;
      arrays_.send_offsets[r] = r * p_.max_tokens * unit;
      arrays_.send_bytes[r] = other ? sent_[r] * unit : 0;
      arrays_.recv_offsets[r] = got_offset_[r] * unit;
      arrays_.recv_capacity[r] = other ? got_[r] * unit : 0;
    }
    comm_.all_to_all(ctx, arrays_.view(send, recv), step(name));
  }

  static constexpr std::string_view kCountStep = "dispatch: row counts";
  static constexpr std::string_view kCombineStep = "combine: partial sums";
  static constexpr std::string_view kLowLatencyStep = "low-latency dispatch and combine";

  DispatcherProblem p_;
  Communicator& comm_;
  int size_;
  int me_;
  bool low_latency_;
  int slots_;              // this rank's local slots
  int64_t message_bytes_;  // low-latency: a header and max_tokens rows of pairs
  ExchangeArrays arrays_;
  std::vector<int64_t> sent_;        // normal: rows sent to each rank this call
  std::vector<int64_t> got_;         // normal: rows received from each rank
  std::vector<int64_t> got_offset_;  // normal: where those rows start in the runner's input
  Tensor table_;                     // global_to_local on the device
  // What the unpack kernels found, [size + 1] WireProblem: low-latency's by source rank, then
  // normal mode's bad slot; kept across batches until the host reads and clears them.
  Tensor reports_;
  PinnedHost headers_;       // [2][size] WireHeader: sent, received
  PinnedHost reports_host_;  // the reports' copy
  int64_t tokens_ = 0;
  DType dtype_ = DType::bf16;
  int64_t row_bytes_ = 0;
};

}  // namespace

Capability nccl_all_to_all_supports(const Deployment& deployment) {
  return all_to_all_supports_over(deployment, CommKind::nccl, "GPU(s)");
}

std::unique_ptr<Dispatcher> make_nccl_all_to_all_dispatcher(const DispatcherProblem& problem) {
  if (problem.comm == nullptr) {
    fail(Errc::internal, "the nccl all-to-all dispatcher has no communicator");
  }
  return std::make_unique<CudaAllToAllDispatcher>(problem);
}

void nccl_all_to_all_decide(Plan& plan) {
  const Options& o = plan.options;
  if (o.a2a_wire == A2AWire::e4m3) {
    fail(Errc::config_refused,
         "refused: a2a nccl with a2a wire e4m3: quantising the rows to e4m3 on the GPU before "
         "sending is not built; legal here: --a2a-wire auto or activations");
  }
  const A2AModeChoice choice = choose_a2a_mode(o);
  plan.a2a_mode = choice.mode;
  plan.a2a_wire = A2AWire::activations;
  const int64_t H = plan.spec.hidden;
  const int columns = plan.spec.routing.top_k + plan.shared_slots;
  const auto pairs = static_cast<int64_t>(columns * sizeof(WirePair));
  const bool low_latency = choice.mode == A2AMode::low_latency;
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "mode",
       std::string(a2a_mode_name(choice.mode)),
       low_latency
           ? choice.reason +
                 fmt::format("; on the GPU: each source rank's fixed slot of {} rows sent whole "
                             "(NCCL's receives take exact sizes), no host synchronisation, so "
                             "the layer can be captured in a CUDA graph; the runner sees {} x {} "
                             "rows, those past each count masked",
                             o.max_tokens, o.ep.size, o.max_tokens)
           : choice.reason + "; on the GPU: 16-byte headers read on the host, then rows and "
                             "pairs of exact sizes",
       {{low_latency ? "normal" : "low-latency",
         low_latency ? "a host synchronisation in every forward, and no CUDA graph"
                     : "fixed slots of max_tokens rows per source rank, sent whole"}},
       std::nullopt});
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "wire format",
       "rows in the hidden states' dtype; partial sums in f32",
       fmt::format("{}: per token and destination GPU: {} bytes out as bf16 ({} as f32) with the "
                   "token's {} (slot, weight) pairs; {} back (f32 partial sums); a token goes to "
                   "at most min(ranks, {}) GPUs, once each{}",
                   o.a2a_wire == A2AWire::activations ? "asked" : "auto", H * 2 + pairs,
                   H * 4 + pairs, columns, H * 4, columns,
                   low_latency ? fmt::format("; low-latency sends {} such rows to every other GPU, "
                                             "used or not",
                                             o.max_tokens)
                               : std::string()),
       {{"e4m3 rows with the activation scales", "not built on the GPU"}},
       std::nullopt});
}

}  // namespace moekit
