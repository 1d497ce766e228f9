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
//
// The rows on the wire are the hidden states as they came, or (the plan's wire, for f32 and bf16
// hidden states) e4m3 codes with GEMM1's activation scales, quantised once per token on the
// sending rank and restored on arrival to rows that the runner quantises to the same codes and
// scales (quant/activation_wire.hpp).

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"
#include "quant/activation_wire.hpp"

namespace moekit {
namespace {

// Leads every message of round 1 (normal) or of the one round (low-latency).
struct Header {
  int32_t status = 0;  // kOk, or kFailed: the sender's input failed and no rows follow
  int32_t rows = 0;
  int32_t dtype = 0;  // the rows' DType, which every rank must share
  int32_t e4m3 = 0;   // 1: the rows are e4m3 codes with their scales (E4m3Wire)
};
constexpr int32_t kOk = 0;
constexpr int32_t kFailed = 1;
static_assert(sizeof(Header) == 16);

// One (slot, weight) pair of a row's columns on the wire; slot -1: an expert not on that rank.
struct Pair {
  int32_t slot;
  float weight;
};

constexpr int64_t kMaxElementBytes = 4;  // the activations' dtypes: f32 at most

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
        got_offset_(static_cast<size_t>(size_)),
        e4m3_wire_(e4m3_wire(problem.quant, problem.hidden)) {
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
    e4m3_ = p_.wire == A2AWire::e4m3 && e4m3_wire_carries(dtype_);
    row_bytes_ = dtype_storage_bytes(dtype_, H);
    wire_bytes_ = e4m3_ ? e4m3_wire_.row_bytes() : row_bytes_;
    pack(hidden, global_ids, weights, a);
    if (p_.mode == A2AMode::low_latency) {
      exchange_low_latency(ctx, a);
    } else {
      exchange_normal(ctx, a);
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
      write_header(message_at(a, r), kFailed, 0, DType::f32, false);
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
    std::byte* input;    // [size * max_tokens][H]: the rows the runner reads, by source rank
    std::byte* wire_in;  // e4m3 wire, normal mode: the rows as they arrive, before restoring
    std::byte* encoded;  // e4m3 wire: one token's row on the wire
    float* widened;      // e4m3 wire: one token's row as f32, before quantising
    int32_t* in_slots;   // [size * max_tokens][columns]
    float* in_weights;
    float* sums;        // [size * max_tokens][H]: the runner's weighted sums
    float* back;        // [size][max_tokens][H]: this rank's partial sums, from each rank
    int32_t* token_of;  // [size][max_tokens]: the token of each row sent to a rank
    int32_t* dest_of;   // [columns]: one token's destination per column
  };

  Arrays carve(ScratchCarver& c) const {
    const int64_t rows = size_ * p_.max_tokens, H = p_.hidden;
    const bool normal = p_.mode == A2AMode::normal, e4m3 = p_.wire == A2AWire::e4m3;
    return {c.take<std::byte>(size_ * message_capacity()),
            c.take<std::byte>(size_ * message_capacity()),
            c.take<std::byte>(normal ? rows * max_wire_row_bytes() : pairs_bytes(rows)),
            c.take<std::byte>(rows * H * kMaxElementBytes),
            c.take<std::byte>(normal && e4m3 ? rows * e4m3_wire_.row_bytes() : 0),
            c.take<std::byte>(e4m3 ? e4m3_wire_.row_bytes() : 0),
            c.take<float>(e4m3 ? H : 0),
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
  // The most bytes a row takes on the wire, whatever the activations' dtype.
  int64_t max_wire_row_bytes() const {
    const int64_t e4m3 = p_.wire == A2AWire::e4m3 ? e4m3_wire_.row_bytes() : 0;
    return std::max(p_.hidden * kMaxElementBytes, e4m3);
  }
  // Normal: header and pairs. Low-latency: header, rows, pairs.
  int64_t message_capacity() const {
    const int64_t rows = p_.mode == A2AMode::low_latency ? p_.max_tokens * max_wire_row_bytes() : 0;
    return round16(static_cast<int64_t>(sizeof(Header)) + rows + pairs_bytes(p_.max_tokens));
  }
  // The rows a message to or from rank r carries: none to or from this rank itself.
  int64_t rows_on_wire(int r, int64_t rows) const { return r == me_ ? 0 : rows; }
  // Where a message's pairs start: after the header, and in low-latency mode after its rows.
  int64_t pairs_at(int64_t rows) const {
    return static_cast<int64_t>(sizeof(Header)) +
           (p_.mode == A2AMode::low_latency ? rows * wire_bytes_ : 0);
  }
  std::byte* message_at(const Arrays& a, int r) const {
    return a.send_msg + r * message_capacity();
  }

  static void write_header(std::byte* at, int32_t status, int64_t rows, DType dtype, bool e4m3) {
    const Header h{status, static_cast<int32_t>(rows), static_cast<int32_t>(dtype), e4m3 ? 1 : 0};
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
  // the message and the pairs to send_rows, to follow the rows once their count is known. On the
  // e4m3 wire a token's row is quantised once, for the first other rank it goes to.
  void pack(const TensorView& hidden, const int32_t* ids, const float* weights, const Arrays& a) {
    std::fill(sent_.begin(), sent_.end(), 0);
    const int columns = p_.columns;
    const auto n_global = static_cast<int32_t>(p_.global_to_local.size());
    const auto* rows = static_cast<const std::byte*>(hidden.data);
    const bool low_latency = p_.mode == A2AMode::low_latency;
    for (int64_t t = 0; t < tokens_; ++t) {
      const int32_t* id = ids + t * columns;
      const std::byte* row = rows + t * row_bytes_;
      bool encoded = false;
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
        if (r == me_) {
          std::memcpy(a.input + i * row_bytes_, row, static_cast<size_t>(row_bytes_));
          continue;
        }
        if (e4m3_ && !encoded) {
          convert_to_f32(row, dtype_, p_.hidden, a.widened);
          encode_e4m3_row(e4m3_wire_, p_.quant, a.widened, a.encoded);
          encoded = true;
        }
        std::byte* to = low_latency ? message_at(a, r) + sizeof(Header) + i * wire_bytes_
                                    : a.send_rows + (r * p_.max_tokens + i) * wire_bytes_;
        std::memcpy(to, e4m3_ ? a.encoded : row, static_cast<size_t>(wire_bytes_));
      }
    }
  }

  void exchange_normal(const ExecContext& ctx, const Arrays& a) {
    const int64_t capacity = message_capacity();
    for (int r = 0; r < size_; ++r) {
      write_header(message_at(a, r), kOk, sent_[r], dtype_, e4m3_);
      arrays_.send_offsets[r] = r * capacity;
      arrays_.send_bytes[r] = static_cast<int64_t>(sizeof(Header)) + pairs_bytes(sent_[r]);
      arrays_.recv_offsets[r] = r * capacity;
      arrays_.recv_capacity[r] = capacity;
    }
    comm_.all_to_all(ctx, arrays_.view(a.send_msg, a.recv_msg), first_step());
    read_headers(a);
    for (int r = 0; r < size_; ++r) {
      const bool other = r != me_;
      arrays_.send_offsets[r] = r * p_.max_tokens * wire_bytes_;
      arrays_.send_bytes[r] = other ? sent_[r] * wire_bytes_ : 0;
      arrays_.recv_offsets[r] = got_offset_[r] * wire_bytes_;
      arrays_.recv_capacity[r] = other ? got_[r] * wire_bytes_ : 0;
    }
    // Rows as they came land in the runner's input; e4m3 rows beside it, to be restored.
    comm_.all_to_all(ctx, arrays_.view(a.send_rows, e4m3_ ? a.wire_in : a.input),
                     step("dispatch: rows"));
    if (e4m3_) {
      for (int r = 0; r < size_; ++r) {
        if (r != me_) restore(ctx, r, a.wire_in + got_offset_[r] * wire_bytes_, a);
      }
    }
    unpack_pairs(a);
  }

  void exchange_low_latency(const ExecContext& ctx, const Arrays& a) {
    const int64_t capacity = message_capacity();
    for (int r = 0; r < size_; ++r) {
      write_header(message_at(a, r), kOk, sent_[r], dtype_, e4m3_);
      const int64_t pairs = pairs_at(rows_on_wire(r, sent_[r]));
      std::memcpy(message_at(a, r) + pairs, a.send_rows + pairs_bytes(r * p_.max_tokens),
                  static_cast<size_t>(pairs_bytes(sent_[r])));
      arrays_.send_offsets[r] = r * capacity;
      arrays_.send_bytes[r] = pairs + pairs_bytes(sent_[r]);
      arrays_.recv_offsets[r] = r * capacity;
      arrays_.recv_capacity[r] = capacity;
    }
    comm_.all_to_all(ctx, arrays_.view(a.send_msg, a.recv_msg), first_step());
    read_headers(a);
    for (int r = 0; r < size_; ++r) {
      if (got_[r] == 0 || r == me_) continue;
      const std::byte* rows = a.recv_msg + r * capacity + sizeof(Header);
      if (e4m3_) {
        restore(ctx, r, rows, a);
      } else {
        std::memcpy(a.input + got_offset_[r] * row_bytes_, rows,
                    static_cast<size_t>(got_[r] * row_bytes_));
      }
    }
    unpack_pairs(a);
  }

  // Rank r's e4m3 rows, from `rows` on, into its rows of the runner's input, over the pool (the
  // loop's lambda holds one pointer, which std::function stores without allocating).
  void restore(const ExecContext& ctx, int r, const std::byte* rows, const Arrays& a) const {
    const Restore job{e4m3_wire_,  rows,       a.input + got_offset_[r] * row_bytes_,
                      wire_bytes_, row_bytes_, dtype_};
    ctx.threads().parallel_for(got_[r], [&job](int64_t i0, int64_t i1) { job.rows(i0, i1); });
  }
  struct Restore {
    E4m3Wire wire;
    const std::byte* from;
    std::byte* to;
    int64_t wire_bytes, row_bytes;
    DType dtype;

    void rows(int64_t i0, int64_t i1) const {
      for (int64_t i = i0; i < i1; ++i) {
        decode_e4m3_row(wire, from + i * wire_bytes, dtype, to + i * row_bytes);
      }
    }
  };

  // What each source rank said it sends: a failure, or a row count this rank has room for, in
  // this rank's dtype; then where its rows go in the runner's input.
  void read_headers(const Arrays& a) {
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
      // Before the sizes, which differ with the rows on the wire.
      if (h.status == kOk && h.e4m3 != (e4m3_ ? 1 : 0)) {
        fail(Errc::comm, "rank {}: rank {} sends {} rows, this rank {}: the ranks' plans differ",
             me_, r, h.e4m3 != 0 ? "e4m3" : "unquantised", e4m3_ ? "e4m3" : "unquantised");
      }
      if (h.status != kOk || h.rows < 0 || h.rows > p_.max_tokens ||
          arrays_.received[r] != pairs_at(rows_on_wire(r, h.rows)) + pairs_bytes(h.rows)) {
        fail(Errc::comm, "rank {}: rank {} sent a malformed message in step '{}'", me_, r,
             first_step().name);
      }
      if (h.dtype != static_cast<int32_t>(dtype_)) {
        fail_dtype_mismatch(me_, dtype_, static_cast<DType>(h.dtype), r);
      }
      got_[r] = h.rows;
    }
    if (!failed.empty()) fail_refused_input(me_, failed, first_step().name);
    rows_by_source(got_, me_, got_offset_);
  }

  // The pairs of every received row into the runner's (slot, weight) arrays, checked: a slot must
  // be one of this rank's.
  void unpack_pairs(const Arrays& a) {
    const int columns = p_.columns;
    const int slots = static_cast<int>(std::count_if(
        p_.global_to_local.begin(), p_.global_to_local.end(), [](int32_t s) { return s >= 0; }));
    for (int r = 0; r < size_; ++r) {
      // Behind rows of an odd count of 16-bit values the pairs are not 4-byte aligned.
      const std::byte* pairs =
          a.recv_msg + r * message_capacity() + pairs_at(rows_on_wire(r, got_[r]));
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
  E4m3Wire e4m3_wire_;
  int64_t tokens_ = 0;
  DType dtype_ = DType::f32;
  bool e4m3_ = false;       // this call's rows travel as e4m3
  int64_t row_bytes_ = 0;   // a row of the runner's input
  int64_t wire_bytes_ = 0;  // a row on the wire
};

}  // namespace

Capability all_to_all_supports_over(const Deployment& deployment, CommKind comm,
                                    std::string_view what) {
  const Options& o = deployment.options;
  if (!communicator_built(comm)) return Capability::No(communicator_absent_reason(comm));
  const DeviceKind buffers = comm == CommKind::nccl ? DeviceKind::cuda : DeviceKind::cpu;
  if (o.device.kind != buffers) {
    return Capability::No(fmt::format("the {} communicator moves {} memory: device={}",
                                      comm == CommKind::nccl ? "NCCL" : "MPI",
                                      buffers == DeviceKind::cuda ? "device" : "host",
                                      buffers == DeviceKind::cuda ? "cuda" : "cpu"));
  }
  if (o.ep.size != deployment.platform.world_size) {
    return Capability::No(fmt::format("ep size {} is not the launcher's {} rank(s)", o.ep.size,
                                      deployment.platform.world_size));
  }
  return Capability::Yes(fmt::format(
      "a2a {} over {} {}: each rank's rows go to the {} holding their experts, and the partial "
      "sums come back and are added in rank order",
      comm == CommKind::nccl ? "nccl" : "mpi", o.ep.size, what, what));
}

Capability all_to_all_supports(const Deployment& deployment) {
  return all_to_all_supports_over(deployment, CommKind::mpi, "rank(s)");
}

void fail_refused_input(int me, const std::string& ranks, std::string_view step) {
  fail(Errc::comm,
       "rank {}: rank(s) {} refused their input (see their message) in step '{}'; no rows were "
       "exchanged",
       me, ranks, step);
}

void fail_dtype_mismatch(int me, DType mine, DType theirs, int rank) {
  fail(Errc::invalid_argument,
       "rank {}: hidden states are {} here but {} on rank {}: every rank must pass the same dtype",
       me, dtype_name(mine), dtype_name(theirs), rank);
}

void rows_by_source(const std::vector<int64_t>& got, int me, std::vector<int64_t>& offsets) {
  int64_t offset = got[static_cast<size_t>(me)];
  for (size_t r = 0; r < got.size(); ++r) {
    if (static_cast<int>(r) == me) {
      offsets[r] = 0;
      continue;
    }
    offsets[r] = offset;
    offset += got[r];
  }
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

// Within one host rows move through shared memory faster than the CPU quantises and restores
// them: at 2 ranks x 256 tokens of H=1024 (docs/EXPERT_PARALLEL.md) dispatch took 0.06 ms with
// bf16 rows and 0.6 ms with e4m3 ones, whose quantising (about 1.2 ns a value) and restoring
// (0.6 ns) cost more than the half of the bytes they save; that pays from about 3 Gbit/s of
// network down.
A2AWireChoice choose_a2a_wire(const Options& options, const QuantParams& quant,
                              const Platform& platform) {
  const std::optional<std::string> refusal = e4m3_wire_refusal(quant);
  switch (options.a2a_wire) {
    case A2AWire::activations:
      return {A2AWire::activations, "asked"};
    case A2AWire::e4m3:
      if (refusal) {
        fail(Errc::config_refused,
             "refused: a2a wire e4m3 with weights={}: {}; legal here: --a2a-wire auto or "
             "activations, or weights fp8-block or fp8-tensor with dynamic activations",
             quant.name(), *refusal);
      }
      return {A2AWire::e4m3, "asked"};
    case A2AWire::auto_:
      break;
  }
  if (refusal) return {A2AWire::activations, "auto: " + *refusal};
  if (platform.world_local_size >= platform.world_size) {
    return {A2AWire::activations,
            fmt::format("auto: every rank is on this host ({} of {}), where shared memory moves "
                        "rows faster than quantising and restoring them to e4m3 takes "
                        "(--a2a-wire e4m3 halves the bytes anyway)",
                        platform.world_local_size, platform.world_size)};
  }
  return {A2AWire::e4m3,
          fmt::format("auto: {} quantises GEMM1's inputs to e4m3 anyway, and {} of the {} ranks "
                      "are on other hosts; quantised on the sending rank with the runner's "
                      "numerics (the same codes and scales), half the bytes of bf16 rows",
                      quant.name(), platform.world_size - platform.world_local_size,
                      platform.world_size)};
}

void all_to_all_decide(Plan& plan) {
  const A2AModeChoice choice = choose_a2a_mode(plan.options);
  plan.a2a_mode = choice.mode;
  const A2AWireChoice wire = choose_a2a_wire(plan.options, plan.quant, plan.platform);
  plan.a2a_wire = wire.wire;
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
  // Bytes per token and destination rank, each way.
  const std::string as_they_come =
      fmt::format("{} bytes out as bf16 ({} as f32)", H * 2 + pairs, H * 4 + pairs);
  const std::string tail = fmt::format(
      "with the token's {} (slot, weight) pairs; {} back (f32 partial sums); a token "
      "goes to at most min(ranks, {}) ranks, once each",
      columns, H * 4, columns);
  if (wire.wire == A2AWire::e4m3) {
    const E4m3Wire w = e4m3_wire(plan.quant, H);
    plan.decisions.push_back(
        {PlanLayer::dispatcher,
         "wire format",
         fmt::format("e4m3 rows with one f32 scale per {} columns (f32 and bf16 hidden states; "
                     "f16 as it is); partial sums in f32",
                     w.group),
         fmt::format("{}; per token and destination rank: {} bytes out ({} code bytes + {} "
                     "scale bytes) instead of {}, {}",
                     wire.reason, w.row_bytes() + pairs, H, w.groups() * 4, as_they_come, tail),
         {{"activations", "twice the bytes, and the runner rounds them to e4m3 anyway"}},
         std::nullopt});
    return;
  }
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "wire format",
       "rows in the hidden states' dtype; partial sums in f32",
       fmt::format("{}; per token and destination rank: {} {}", wire.reason, as_they_come, tail),
       {{"e4m3 rows with the activation scales",
         e4m3_wire_refusal(plan.quant)
             .value_or(plan.options.a2a_wire == A2AWire::activations
                           ? "asked for the activations as they are"
                           : "on one host it costs more time than the bytes it saves")}},
       std::nullopt});
}

}  // namespace moekit
