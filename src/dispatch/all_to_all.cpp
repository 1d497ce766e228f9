// The all-to-all dispatcher (a2a mpi): each rank holds its own tokens, sends each token's row
// once to every rank that holds one of its experts, with that rank's (slot, weight) pairs, and
// gets back that rank's weighted partial sum, which it adds into the token's output in rank
// order. It knows only the Communicator interface (comm/), so an NCCL communicator is one more
// row of the dispatcher table, not another dispatcher. The protocol and its bytes are in
// docs/EXPERT_PARALLEL.md.
//
//   normal:      round 1 carries each peer's row count with the rows' slots and weights (small);
//                round 2 the rows, of exact sizes, straight into the runner's input in source
//                rank order.
//   low-latency: one round: header, rows, then pairs, in one message into a fixed slot per
//                source rank, sized by max_tokens; no count round; the rows are then copied out
//                into the runner's input.
// Both then combine in one round: the partial sums go back by the reverse exchange. A rank's rows
// for its own experts never enter an exchange: they are packed straight into the runner's input
// (its first rows), and their sums are read where the runner left them.

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

// Leads every message of round 1 (normal) or of the one round (low-latency).
struct Header {
  int32_t status = 0;  // kOk, or kFailed: the sender's input failed and no rows follow
  int32_t rows = 0;
  int32_t dtype = 0;  // the rows' DType, which every rank must share
  int32_t reserved = 0;
};
constexpr int32_t kOk = 0;
constexpr int32_t kFailed = 1;
static_assert(sizeof(Header) == 16);

// One (slot, weight) pair of a row's columns on the wire; slot -1: an expert not on that rank.
struct Pair {
  int32_t slot;
  float weight;
};

constexpr int64_t kMaxElementBytes = 4;  // rows travel in the activations' dtype: f32 at most

int64_t round16(int64_t bytes) {
  return (bytes + 15) / 16 * 16;
}

class AllToAllDispatcher final : public Dispatcher {
 public:
  explicit AllToAllDispatcher(const DispatcherProblem& problem)
      : p_(problem),
        comm_(*problem.comm),
        size_(comm_.size()),
        me_(comm_.rank()),
        arrays_(size_),
        sent_(static_cast<size_t>(size_)),
        got_(static_cast<size_t>(size_)),
        got_offset_(static_cast<size_t>(size_)) {
    if (p_.max_tokens * size_ > p_.max_received_tokens) {
      fail(Errc::internal, "all-to-all planned for {} received tokens, fewer than {} ranks x {}",
           p_.max_received_tokens, size_, p_.max_tokens);
    }
  }

  bool collective() const override { return true; }

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    carve(counter);
    return counter.bytes();
  }

  DispatchOutput dispatch(const ExecContext& ctx, const TensorView& hidden,
                          const int32_t* global_ids, const float* weights, float* combined,
                          void* scratch) override {
    (void)combined;
    const Arrays a = carve_at(scratch);
    const int64_t T = hidden.dim(0), H = p_.hidden;
    if (T > p_.max_tokens) {
      fail(Errc::internal, "dispatch of {} tokens exceeds the {} planned", T, p_.max_tokens);
    }
    tokens_ = T;
    dtype_ = hidden.dtype;
    const int64_t row_bytes = dtype_storage_bytes(dtype_, H);
    pack(hidden, global_ids, weights, row_bytes, a);
    if (p_.mode == A2AMode::low_latency) {
      exchange_low_latency(ctx, row_bytes, a);
    } else {
      exchange_normal(ctx, row_bytes, a);
    }
    const int64_t received = std::accumulate(got_.begin(), got_.end(), int64_t{0});
    return {TensorView::contiguous(a.input, dtype_, {received, H}),
            a.in_slots,
            a.in_weights,
            received,
            p_.columns,
            a.sums};
  }

  void combine(const ExecContext& ctx, const DispatchOutput&, float* combined,
               void* scratch) override {
    const Arrays a = carve_at(scratch);
    const int64_t H = p_.hidden, row = H * static_cast<int64_t>(sizeof(float));
    for (int r = 0; r < size_; ++r) {
      const bool other = r != me_;
      arrays_.send_offsets[r] = got_offset_[r] * row;
      arrays_.send_bytes[r] = other ? got_[r] * row : 0;
      arrays_.recv_offsets[r] = r * p_.max_tokens * row;
      arrays_.recv_capacity[r] = other ? sent_[r] * row : 0;
    }
    comm_.all_to_all(ctx, arrays_.view(a.sums, a.back), step("combine: partial sums"));
    // Each element adds its ranks' parts in rank order, whatever order they arrived in. The
    // loop's lambda holds one pointer, which std::function stores without allocating.
    const Sum sum{a.back, a.sums,  a.token_of,    sent_.data(), combined,
                  H,      tokens_, p_.max_tokens, size_,        me_};
    ctx.threads().parallel_for(H, [&sum](int64_t h0, int64_t h1) { sum.columns(h0, h1); });
  }

  void abandon(const ExecContext& ctx, void* scratch) override {
    const Arrays a = carve_at(scratch);
    std::fill(sent_.begin(), sent_.end(), 0);
    for (int r = 0; r < size_; ++r) {
      write_header(message_at(a, r), kFailed, 0);
      arrays_.send_offsets[r] = r * message_capacity();
      arrays_.send_bytes[r] = sizeof(Header);
      arrays_.recv_offsets[r] = r * message_capacity();
      arrays_.recv_capacity[r] = message_capacity();
    }
    comm_.all_to_all(ctx, arrays_.view(a.send_msg, a.recv_msg), first_step());
  }

 private:
  struct Arrays {
    std::byte* send_msg;  // [size][message_capacity()]: round 1 / the one round
    std::byte* recv_msg;  // the same, from each source rank
    // normal: [size][max_tokens][H] rows per destination; low-latency: [size][max_tokens]
    // [columns] pairs per destination, staged until the rows' count places them
    std::byte* send_rows;
    std::byte* input;   // [size * max_tokens][H]: the rows the runner reads, by source rank
    int32_t* in_slots;  // [size * max_tokens][columns]
    float* in_weights;
    float* sums;        // [size * max_tokens][H]: the runner's weighted sums
    float* back;        // [size][max_tokens][H]: this rank's partial sums, from each rank
    int32_t* token_of;  // [size][max_tokens]: the token of each row sent to a rank
    int32_t* dest_of;   // [columns]: one token's destination per column
  };

  Arrays carve(ScratchCarver& c) const {
    const int64_t rows = size_ * p_.max_tokens, H = p_.hidden;
    const bool normal = p_.mode == A2AMode::normal;
    return {c.take<std::byte>(size_ * message_capacity()),
            c.take<std::byte>(size_ * message_capacity()),
            c.take<std::byte>(normal ? rows * H * kMaxElementBytes : pairs_bytes(rows)),
            c.take<std::byte>(rows * H * kMaxElementBytes),
            c.take<int32_t>(rows * p_.columns),
            c.take<float>(rows * p_.columns),
            c.take<float>(rows * H),
            c.take<float>(rows * H),
            c.take<int32_t>(rows),
            c.take<int32_t>(p_.columns)};
  }
  Arrays carve_at(void* scratch) const {
    ScratchCarver carver(scratch);
    return carve(carver);
  }

  int64_t pairs_bytes(int64_t rows) const {
    return rows * p_.columns * static_cast<int64_t>(sizeof(Pair));
  }
  // Normal: header and pairs. Low-latency: header, rows, pairs.
  int64_t message_capacity() const {
    const int64_t rows =
        p_.mode == A2AMode::low_latency ? p_.max_tokens * p_.hidden * kMaxElementBytes : 0;
    return round16(static_cast<int64_t>(sizeof(Header)) + rows + pairs_bytes(p_.max_tokens));
  }
  // The rows a message to or from rank r carries: none to or from this rank itself.
  int64_t rows_on_wire(int r, int64_t rows) const { return r == me_ ? 0 : rows; }
  // Where a message's pairs start: after the header, and in low-latency mode after its rows.
  int64_t pairs_at(int64_t rows, int64_t row_bytes) const {
    return static_cast<int64_t>(sizeof(Header)) +
           (p_.mode == A2AMode::low_latency ? rows * row_bytes : 0);
  }
  std::byte* message_at(const Arrays& a, int r) const {
    return a.send_msg + r * message_capacity();
  }

  static void write_header(std::byte* at, int32_t status, int64_t rows, DType dtype = DType::f32) {
    const Header h{status, static_cast<int32_t>(rows), static_cast<int32_t>(dtype), 0};
    std::memcpy(at, &h, sizeof h);
  }

  CommStep step(std::string_view name) const { return {name, p_.timeout_ms}; }
  CommStep first_step() const {
    return step(p_.mode == A2AMode::low_latency ? "dispatch: rows (low-latency)"
                                                : "dispatch: counts and expert slots");
  }

  int destination(int32_t id) const { return id >= p_.physical ? me_ : id / p_.per_rank; }
  int32_t slot_there(int32_t id) const {
    return id >= p_.physical ? p_.global_to_local[id] : id % p_.per_rank;
  }

  // Each token's row once per destination rank, with that rank's pairs; in normal mode the rows
  // go to send_rows and the pairs into round 1's messages; in low-latency mode the rows go into
  // the message and the pairs to send_rows, to follow the rows once their count is known.
  void pack(const TensorView& hidden, const int32_t* ids, const float* weights, int64_t row_bytes,
            const Arrays& a) {
    std::fill(sent_.begin(), sent_.end(), 0);
    const int columns = p_.columns;
    const auto n_global = static_cast<int32_t>(p_.global_to_local.size());
    const auto* rows = static_cast<const std::byte*>(hidden.data);
    const bool low_latency = p_.mode == A2AMode::low_latency;
    for (int64_t t = 0; t < tokens_; ++t) {
      const int32_t* id = ids + t * columns;
      for (int j = 0; j < columns; ++j) {
        if (id[j] < 0 || id[j] >= n_global) {
          fail(Errc::internal, "routed expert id {} out of range", id[j]);
        }
        a.dest_of[j] = destination(id[j]);
      }
      for (int j = 0; j < columns; ++j) {
        const int r = a.dest_of[j];
        if (std::find(a.dest_of, a.dest_of + j, r) != a.dest_of + j) continue;
        const int64_t i = sent_[r]++;
        a.token_of[r * p_.max_tokens + i] = static_cast<int32_t>(t);
        std::byte* pairs_to = low_latency ? a.send_rows + pairs_bytes(r * p_.max_tokens + i)
                                          : message_at(a, r) + sizeof(Header) + pairs_bytes(i);
        auto* pairs = reinterpret_cast<Pair*>(pairs_to);
        for (int k = 0; k < columns; ++k) {
          pairs[k] = {a.dest_of[k] == r ? slot_there(id[k]) : -1, weights[t * columns + k]};
        }
        std::byte* to = r == me_      ? a.input + i * row_bytes
                        : low_latency ? message_at(a, r) + sizeof(Header) + i * row_bytes
                                      : a.send_rows + (r * p_.max_tokens + i) * row_bytes;
        std::memcpy(to, rows + t * row_bytes, static_cast<size_t>(row_bytes));
      }
    }
  }

  void exchange_normal(const ExecContext& ctx, int64_t row_bytes, const Arrays& a) {
    const int64_t capacity = message_capacity();
    for (int r = 0; r < size_; ++r) {
      write_header(message_at(a, r), kOk, sent_[r], dtype_);
      arrays_.send_offsets[r] = r * capacity;
      arrays_.send_bytes[r] = static_cast<int64_t>(sizeof(Header)) + pairs_bytes(sent_[r]);
      arrays_.recv_offsets[r] = r * capacity;
      arrays_.recv_capacity[r] = capacity;
    }
    comm_.all_to_all(ctx, arrays_.view(a.send_msg, a.recv_msg), first_step());
    read_headers(a, row_bytes);
    for (int r = 0; r < size_; ++r) {
      const bool other = r != me_;
      arrays_.send_offsets[r] = r * p_.max_tokens * row_bytes;
      arrays_.send_bytes[r] = other ? sent_[r] * row_bytes : 0;
      arrays_.recv_offsets[r] = got_offset_[r] * row_bytes;
      arrays_.recv_capacity[r] = other ? got_[r] * row_bytes : 0;
    }
    comm_.all_to_all(ctx, arrays_.view(a.send_rows, a.input), step("dispatch: rows"));
    unpack_pairs(a, row_bytes);
  }

  void exchange_low_latency(const ExecContext& ctx, int64_t row_bytes, const Arrays& a) {
    const int64_t capacity = message_capacity();
    for (int r = 0; r < size_; ++r) {
      write_header(message_at(a, r), kOk, sent_[r], dtype_);
      const int64_t pairs = pairs_at(rows_on_wire(r, sent_[r]), row_bytes);
      std::memcpy(message_at(a, r) + pairs, a.send_rows + pairs_bytes(r * p_.max_tokens),
                  static_cast<size_t>(pairs_bytes(sent_[r])));
      arrays_.send_offsets[r] = r * capacity;
      arrays_.send_bytes[r] = pairs + pairs_bytes(sent_[r]);
      arrays_.recv_offsets[r] = r * capacity;
      arrays_.recv_capacity[r] = capacity;
    }
    comm_.all_to_all(ctx, arrays_.view(a.send_msg, a.recv_msg), first_step());
    read_headers(a, row_bytes);
    for (int r = 0; r < size_; ++r) {
      if (got_[r] == 0 || r == me_) continue;
      std::memcpy(a.input + got_offset_[r] * row_bytes, a.recv_msg + r * capacity + sizeof(Header),
                  static_cast<size_t>(got_[r] * row_bytes));
    }
    unpack_pairs(a, row_bytes);
  }

  // What each source rank said it sends: a failure, or a row count this rank has room for, in
  // this rank's dtype; then where its rows go in the runner's input.
  void read_headers(const Arrays& a, int64_t row_bytes) {
    std::string failed;
    for (int r = 0; r < size_; ++r) {
      Header h;
      std::memcpy(&h, a.recv_msg + r * message_capacity(), sizeof h);
      if (arrays_.received[r] < static_cast<int64_t>(sizeof(Header))) {
        fail(Errc::comm, "rank {}: rank {} sent {} bytes in step '{}', less than a header", me_, r,
             arrays_.received[r], first_step().name);
      }
      if (h.status == kFailed) {
        failed += (failed.empty() ? "" : ", ") + std::to_string(r);
        continue;
      }
      if (h.status != kOk || h.rows < 0 || h.rows > p_.max_tokens ||
          arrays_.received[r] !=
              pairs_at(rows_on_wire(r, h.rows), row_bytes) + pairs_bytes(h.rows)) {
        fail(Errc::comm, "rank {}: rank {} sent a malformed message in step '{}'", me_, r,
             first_step().name);
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
           me_, failed, first_step().name);
    }
    // This rank's own rows first (packed there already), then every other rank's in rank order.
    int64_t offset = got_[me_];
    got_offset_[me_] = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == me_) continue;
      got_offset_[r] = offset;
      offset += got_[r];
    }
  }

  // The pairs of every received row into the runner's (slot, weight) arrays, checked: a slot must
  // be one of this rank's.
  void unpack_pairs(const Arrays& a, int64_t row_bytes) {
    const int columns = p_.columns;
    const int slots = static_cast<int>(std::count_if(
        p_.global_to_local.begin(), p_.global_to_local.end(), [](int32_t s) { return s >= 0; }));
    for (int r = 0; r < size_; ++r) {
      // Behind rows of an odd count of 16-bit values the pairs are not 4-byte aligned.
      const std::byte* pairs =
          a.recv_msg + r * message_capacity() + pairs_at(rows_on_wire(r, got_[r]), row_bytes);
      const int64_t first = got_offset_[r] * columns;
      for (int64_t e = 0; e < got_[r] * columns; ++e) {
        Pair pair;
        std::memcpy(&pair, pairs + e * static_cast<int64_t>(sizeof(Pair)), sizeof pair);
        if (pair.slot < -1 || pair.slot >= slots) {
          fail(Errc::comm, "rank {}: rank {} sent expert slot {}, not one of this rank's {}", me_,
               r, pair.slot, slots);
        }
        a.in_slots[first + e] = pair.slot;
        a.in_weights[first + e] = pair.weight;
      }
    }
  }

  // combine()'s sum over columns [h0, h1) of every token.
  struct Sum {
    const float* back;
    const float* own;  // the runner's sums of this rank's own rows, its first
    const int32_t* token_of;
    const int64_t* sent;
    float* combined;
    int64_t H, tokens, max_tokens;
    int size, me;

    void columns(int64_t h0, int64_t h1) const {
      const auto n = static_cast<size_t>(h1 - h0);
      for (int64_t t = 0; t < tokens; ++t) std::fill_n(combined + t * H + h0, n, 0.0f);
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < sent[r]; ++i) {
          const float* part = r == me ? own + i * H : back + (r * max_tokens + i) * H;
          float* out = combined + static_cast<int64_t>(token_of[r * max_tokens + i]) * H;
          for (int64_t h = h0; h < h1; ++h) out[h] += part[h];
        }
      }
    }
  };

  DispatcherProblem p_;
  Communicator& comm_;
  int size_;
  int me_;
  ExchangeArrays arrays_;
  std::vector<int64_t> sent_;        // rows sent to each rank this call
  std::vector<int64_t> got_;         // rows received from each rank
  std::vector<int64_t> got_offset_;  // where those rows start in the runner's input
  int64_t tokens_ = 0;
  DType dtype_ = DType::f32;
};

}  // namespace

Capability all_to_all_supports(const Deployment& deployment) {
  const Options& o = deployment.options;
  if (!communicator_built(CommKind::mpi)) {
    return Capability::No(communicator_absent_reason(CommKind::mpi));
  }
  if (o.device.kind != DeviceKind::cpu) {
    return Capability::No("the MPI communicator moves host memory: device=cpu");
  }
  if (o.ep.size != deployment.platform.world_size) {
    return Capability::No(fmt::format("ep size {} is not the launcher's {} rank(s)", o.ep.size,
                                      deployment.platform.world_size));
  }
  return Capability::Yes(fmt::format(
      "a2a mpi over {} rank(s): each rank's rows go to the ranks holding their experts, and the "
      "partial sums come back and are added in rank order",
      o.ep.size));
}

int64_t all_to_all_max_received_tokens(const Options& options) {
  return options.max_tokens * options.ep.size;
}

std::unique_ptr<Dispatcher> make_all_to_all_dispatcher(const DispatcherProblem& problem) {
  if (problem.comm == nullptr)
    fail(Errc::internal, "the all-to-all dispatcher has no communicator");
  return std::make_unique<AllToAllDispatcher>(problem);
}

// Decode batches are latency-bound: a round of counts costs as much as the rows, and fixed slots
// of max_tokens rows per source stay small. Prefill batches make fixed slots large and most of
// them empty, while the count round costs little beside the rows.
constexpr int64_t kLowLatencyMaxTokens = 128;

A2AModeChoice choose_a2a_mode(const Options& options) {
  switch (options.a2a_mode) {
    case A2AMode::normal:
      return {A2AMode::normal, "asked"};
    case A2AMode::low_latency:
      return {A2AMode::low_latency, "asked"};
    case A2AMode::auto_:
      break;
  }
  if (options.max_tokens <= kLowLatencyMaxTokens) {
    return {A2AMode::low_latency,
            fmt::format("auto: max_tokens {} <= {} (decode): one exchange, no count round",
                        options.max_tokens, kLowLatencyMaxTokens)};
  }
  return {A2AMode::normal,
          fmt::format("auto: max_tokens {} > {} (prefill): counts first, then rows of exact size",
                      options.max_tokens, kLowLatencyMaxTokens)};
}

void all_to_all_decide(Plan& plan) {
  const A2AModeChoice choice = choose_a2a_mode(plan.options);
  plan.a2a_mode = choice.mode;
  const int64_t H = plan.spec.hidden;
  const int columns = plan.spec.routing.top_k + plan.shared_slots;
  const int64_t pairs = columns * static_cast<int64_t>(sizeof(Pair));
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "mode",
       std::string(a2a_mode_name(choice.mode)),
       choice.reason,
       {{choice.mode == A2AMode::normal ? "low-latency" : "normal",
         choice.mode == A2AMode::normal
             ? "fixed slots of max_tokens rows per source rank, mostly empty at this size"
             : "a round of counts before the rows"}},
       std::nullopt});
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "wire format",
       "rows in the hidden states' dtype; partial sums in f32",
       fmt::format("per token and destination rank: {} bytes out as bf16 ({} as f32) with its "
                   "{} (slot, weight) pairs, {} bytes back; a token goes to at most min(ranks, {}) "
                   "ranks, once each",
                   H * 2 + pairs, H * 4 + pairs, columns, H * 4, columns),
       {{"e4m3 rows with per-128 scales", "not built: rows travel as the activations came"}},
       std::nullopt});
}

}  // namespace moekit
