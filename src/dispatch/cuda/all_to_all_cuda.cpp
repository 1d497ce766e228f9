// The all-to-all dispatcher on the GPU (a2a nccl): the protocol of all_to_all.cpp on device
// buffers, over a communicator of device buffers (NCCL), one GPU per rank. Each rank holds its
// own tokens, sends each token's row once to every rank that holds one of its experts, with that
// rank's (slot, weight) pairs, and gets back that rank's weighted partial sum, which a kernel adds
// into the token's output in rank order. The layout the runner reads is the standard dispatch
// format: this rank's own rows first (packed there, never exchanged), then each other rank's in
// rank order. docs/EXPERT_PARALLEL.md has the protocol and its bytes.
//
// Normal mode only, rows as the hidden states came (the plan refuses low-latency mode and the
// e4m3 wire on the GPU: nccl_all_to_all_decide):
//   round 1: one 16-byte header per destination (status, rows, dtype), read on the host, which
//            then knows every exact size NCCL's receives need;
//   round 2: the rows, straight into the runner's input;
//   round 3: the rows' (slot, weight) pairs, checked into the runner's arrays by a kernel;
//   combine: the partial sums back by the reverse exchange, then the rank-order sum kernel.

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

constexpr int64_t kMaxElementBytes = 4;  // the activations' dtypes: f32 at most
constexpr auto kHeaderBytes = static_cast<int64_t>(sizeof(WireHeader));
static_assert(kHeaderBytes == 16);

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  fail(Errc::internal, "the nccl all-to-all: {} failed: {}", what, cudaGetErrorString(status));
}

// Host memory the device reads and writes: the headers' copy (pinned, for the copy back) and the
// unpack kernel's flag (mapped, read once the stream has run).
class PinnedHost {
 public:
  explicit PinnedHost(int64_t bytes) {
    check_cuda(cudaHostAlloc(&data_, static_cast<size_t>(bytes), cudaHostAllocMapped),
               "cudaHostAlloc");
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
        slots_(static_cast<int>(std::count_if(problem.global_to_local.begin(),
                                              problem.global_to_local.end(),
                                              [](int32_t s) { return s >= 0; }))),
        arrays_(size_),
        sent_(static_cast<size_t>(size_)),
        got_(static_cast<size_t>(size_)),
        got_offset_(static_cast<size_t>(size_)),
        table_(Tensor::empty(DType::i32, {static_cast<int64_t>(problem.global_to_local.size())},
                             problem.device)),
        headers_(2 * size_ * kHeaderBytes),
        bad_slot_(sizeof(int32_t)) {
    if (comm_.buffers() != DeviceKind::cuda) {
      fail(Errc::internal, "the nccl all-to-all needs a communicator of device buffers, not {}",
           comm_.name());
    }
    if (p_.mode != A2AMode::normal || p_.wire != A2AWire::activations) {
      fail(Errc::internal, "the nccl all-to-all was planned for mode {} and wire {}: not built",
           a2a_mode_name(p_.mode), a2a_wire_name(p_.wire));
    }
    if (p_.max_tokens * size_ > p_.max_received_tokens) {
      fail(Errc::internal, "all-to-all planned for {} received tokens, fewer than {} ranks x {}",
           p_.max_received_tokens, size_, p_.max_tokens);
    }
    copy(table_, TensorView::contiguous(p_.global_to_local.data(), DType::i32,
                                        {static_cast<int64_t>(p_.global_to_local.size())}));
    check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&bad_slot_device_),
                                        bad_slot_.as<int32_t>(), 0),
               "cudaHostGetDevicePointer");
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
    const int64_t T = hidden.dim(0), H = p_.hidden;
    if (T > p_.max_tokens) {
      fail(Errc::internal, "dispatch of {} tokens exceeds the {} planned", T, p_.max_tokens);
    }
    tokens_ = T;
    dtype_ = hidden.dtype;
    row_bytes_ = dtype_storage_bytes(dtype_, H);
    dispatch::cuda::plan_all_to_all({.global_ids = global_ids,
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
                                     .send_pairs = a.send_pairs,
                                     .own_slots = a.in_slots,
                                     .own_weights = a.in_weights,
                                     .headers = a.headers},
                                    ctx.stream);
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
                               .most_rows = *std::max_element(sent_.begin(), sent_.end()),
                               .send_rows = a.send_rows,
                               .own_rows = a.input},
                              ctx.stream);
    exchange_rows(ctx, a.send_rows, a.input, row_bytes_, "dispatch: rows");
    const auto pair_bytes = static_cast<int64_t>(p_.columns * sizeof(WirePair));
    exchange_rows(ctx, reinterpret_cast<std::byte*>(a.send_pairs),
                  reinterpret_cast<std::byte*>(a.recv_pairs), pair_bytes,
                  "dispatch: expert slots and weights");
    *bad_slot_.as<int32_t>() = 0;
    const int64_t own = got_[me_];
    dispatch::cuda::unpack_pairs({.pairs = a.recv_pairs + own * p_.columns,
                                  .rows = received - own,
                                  .columns = p_.columns,
                                  .slots = slots_,
                                  .first_row = own,
                                  .slots_out = a.in_slots,
                                  .weights_out = a.in_weights,
                                  .bad_slot = bad_slot_device_},
                                 ctx.stream);
    return {TensorView::contiguous(a.input, dtype_, {received, H}, p_.device),
            a.in_slots,
            a.in_weights,
            received,
            p_.columns,
            a.sums};
  }

  void combine(const ExecContext& ctx, const DispatchOutput&, float* combined,
               void* scratch) override {
    const Arrays a = carve_at(scratch);
    const int64_t row = p_.hidden * static_cast<int64_t>(sizeof(float));
    for (int r = 0; r < size_; ++r) {
      const bool other = r != me_;
      arrays_.send_offsets[r] = got_offset_[r] * row;
      arrays_.send_bytes[r] = other ? got_[r] * row : 0;
      arrays_.recv_offsets[r] = r * p_.max_tokens * row;
      arrays_.recv_capacity[r] = other ? sent_[r] * row : 0;
    }
    comm_.all_to_all(ctx, arrays_.view(a.sums, a.back), step("combine: partial sums"));
    // The exchange has waited for the stream, the unpack kernel's flag with it.
    if (*bad_slot_.as<int32_t>() != 0) {
      fail(Errc::comm, "rank {}: a rank sent an expert slot that is not one of this rank's {}", me_,
           slots_);
    }
    dispatch::cuda::sum_in_rank_order({.own = a.sums,
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

  void abandon(const ExecContext& ctx, void* scratch) override {
    const Arrays a = carve_at(scratch);
    auto* out = headers_.as<WireHeader>();
    std::fill_n(out, size_, WireHeader{kWireFailed, 0, 0, 0});
    check_cuda(cudaMemcpyAsync(a.headers, out, static_cast<size_t>(size_ * kHeaderBytes),
                               cudaMemcpyHostToDevice, ctx.stream),
               "copying the failed headers");
    exchange_headers(ctx, a);
  }

 private:
  struct Arrays {
    WireHeader* headers;   // [2][size]: to each rank, then from each rank
    int32_t* token_of;     // [size][max_tokens]: the token of each row sent to a rank
    int32_t* index_of;     // [size][max_tokens]: each token's row at a rank, or -1
    WirePair* send_pairs;  // [size][max_tokens][columns]
    WirePair* recv_pairs;  // [size * max_tokens][columns]: by row of the runner's input
    std::byte* send_rows;  // [size][max_tokens][H]: rows to each other rank
    std::byte* input;      // [size * max_tokens][H]: the rows the runner reads
    int32_t* in_slots;     // [size * max_tokens][columns]
    float* in_weights;
    float* sums;  // [size * max_tokens][H]: the runner's weighted sums
    float* back;  // [size][max_tokens][H]: this rank's partial sums, from each rank
  };

  Arrays carve(ScratchCarver& c) const {
    const int64_t rows = size_ * p_.max_tokens, H = p_.hidden;
    return {c.take<WireHeader>(2 * size_),
            c.take<int32_t>(rows),
            c.take<int32_t>(rows),
            c.take<WirePair>(rows * p_.columns),
            c.take<WirePair>(rows * p_.columns),
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

  CommStep step(std::string_view name) const { return {name, p_.timeout_ms}; }

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
        fail(Errc::invalid_argument,
             "rank {}: hidden states are {} here but {} on rank {}: every rank must pass the same "
             "dtype",
             me_, dtype_name(dtype_), dtype_name(static_cast<DType>(h.dtype)), r);
      }
      got_[r] = h.rows;
    }
    if (!failed.empty()) {
      fail(Errc::comm,
           "rank {}: rank(s) {} refused their input (see their message) in step '{}'; no rows were "
           "exchanged",
           me_, failed, kCountStep);
    }
    // This rank's own rows first (packed there), then every other rank's in rank order.
    int64_t offset = got_[me_];
    got_offset_[me_] = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == me_) continue;
      got_offset_[r] = offset;
      offset += got_[r];
    }
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

  DispatcherProblem p_;
  Communicator& comm_;
  int size_;
  int me_;
  int slots_;  // this rank's local slots
  ExchangeArrays arrays_;
  std::vector<int64_t> sent_;        // rows sent to each rank this call
  std::vector<int64_t> got_;         // rows received from each rank
  std::vector<int64_t> got_offset_;  // where those rows start in the runner's input
  Tensor table_;                     // global_to_local on the device
  PinnedHost headers_;               // [2][size] WireHeader: sent, received
  PinnedHost bad_slot_;
  int32_t* bad_slot_device_ = nullptr;
  int64_t tokens_ = 0;
  DType dtype_ = DType::f32;
  int64_t row_bytes_ = 0;
};

}  // namespace

Capability nccl_all_to_all_supports(const Deployment& deployment) {
  const Options& o = deployment.options;
  if (!communicator_built(CommKind::nccl)) {
    return Capability::No(communicator_absent_reason(CommKind::nccl));
  }
  if (o.device.kind != DeviceKind::cuda) {
    return Capability::No("the NCCL communicator moves device memory: device=cuda");
  }
  if (o.ep.size != deployment.platform.world_size) {
    return Capability::No(fmt::format("ep size {} is not the launcher's {} rank(s)", o.ep.size,
                                      deployment.platform.world_size));
  }
  return Capability::Yes(fmt::format(
      "a2a nccl over {} GPU(s): each rank's rows go to the GPUs holding their experts, and the "
      "partial sums come back and are added in rank order",
      o.ep.size));
}

std::unique_ptr<Dispatcher> make_nccl_all_to_all_dispatcher(const DispatcherProblem& problem) {
  if (problem.comm == nullptr) {
    fail(Errc::internal, "the nccl all-to-all dispatcher has no communicator");
  }
  return std::make_unique<CudaAllToAllDispatcher>(problem);
}

void nccl_all_to_all_decide(Plan& plan) {
  const Options& o = plan.options;
  if (o.a2a_mode == A2AMode::low_latency) {
    fail(Errc::config_refused,
         "refused: a2a nccl with a2a mode low-latency: the GPU's low-latency mode (fixed slots "
         "per source rank, no host synchronisation, capturable in a CUDA graph) is not built; "
         "legal here: --a2a-mode auto or normal");
  }
  if (o.a2a_wire == A2AWire::e4m3) {
    fail(Errc::config_refused,
         "refused: a2a nccl with a2a wire e4m3: quantising the rows to e4m3 on the GPU before "
         "sending is not built; legal here: --a2a-wire auto or activations");
  }
  plan.a2a_mode = A2AMode::normal;
  plan.a2a_wire = A2AWire::activations;
  const int64_t H = plan.spec.hidden;
  const int columns = plan.spec.routing.top_k + plan.shared_slots;
  const auto pairs = static_cast<int64_t>(columns * sizeof(WirePair));
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "mode",
       "normal",
       std::string(o.a2a_mode == A2AMode::normal ? "asked" : "auto") +
           ": the only mode built on the GPU: a round of 16-byte headers read on the host, then "
           "rows and pairs of exact sizes",
       {{"low-latency", "not built on the GPU"}},
       std::nullopt});
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "wire format",
       "rows in the hidden states' dtype; partial sums in f32",
       fmt::format("{}: per token and destination GPU: {} bytes out as bf16 ({} as f32) with the "
                   "token's {} (slot, weight) pairs; {} back (f32 partial sums); a token goes to "
                   "at most min(ranks, {}) GPUs, once each",
                   o.a2a_wire == A2AWire::activations ? "asked" : "auto", H * 2 + pairs,
                   H * 4 + pairs, columns, H * 4, columns),
       {{"e4m3 rows with the activation scales", "not built on the GPU"}},
       std::nullopt});
}

}  // namespace moekit
