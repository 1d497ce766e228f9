// Times the all-to-all dispatcher on its own: random routings of random bf16 rows, dispatch()
// and combine() each after a barrier (the experts between them are not run: their sums are
// whatever the buffer holds), the bytes each sent counted by the communicator, and the
// communicator's bare all-to-all of exactly those bytes per peer, all in the same run. a2a mpi
// keeps its buffers in host memory, a2a nccl on the rank's GPU, whose stream each timing waits
// for.

#include "bench/a2a.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "comm/communicator.hpp"
#include "core/thread_pool.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"
#include "moekit/plan.hpp"
#include "moekit/testing.hpp"

namespace moekit::bench {
namespace {

struct RankResult {
  int64_t tokens = 0;
  int64_t rows_received = 0;
  double dispatch_s = 0.0;
  double combine_s = 0.0;
  int64_t dispatch_bytes = 0;  // sent to other ranks per call
  int64_t combine_bytes = 0;
  double bare_dispatch_s = 0.0;
  double bare_combine_s = 0.0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int64_t> minus(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

int64_t total(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// The dispatcher's inputs and outputs where its communicator keeps its buffers: host memory,
// or the plan's GPU (copied there from the host's random values).
struct BenchBuffers {
  Tensor hidden, ids, weights, combined;
  Buffer scratch;
};

BenchBuffers bench_buffers(const Plan& plan, const Dispatcher& dispatcher, int64_t T,
                           std::mt19937_64& rng) {
  const ModelSpec& spec = plan.spec;
  const int columns = spec.routing.top_k;
  const Device device = plan.options.device;
  const std::vector<int>& table =
      plan.location.rank_table[static_cast<size_t>(plan.options.ep.rank)];
  Tensor ids = Tensor::empty(DType::i32, {T * columns});
  std::vector<int> logical(static_cast<size_t>(spec.n_experts));
  std::iota(logical.begin(), logical.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(logical.begin(), logical.end(), rng);
    for (int j = 0; j < columns; ++j) ids.data<int32_t>()[t * columns + j] = table[logical[j]];
  }
  Tensor weights = Tensor::empty(DType::f32, {T * columns});
  std::fill_n(weights.data<float>(), T * columns, 1.0f / static_cast<float>(columns));
  const auto on_device = [&](Tensor host) {
    if (device.kind == DeviceKind::cpu) return host;
    Tensor t = Tensor::empty(host.view().dtype, host.view().shape, device);
    copy(t, host);
    return t;
  };
  return {on_device(random_tensor({T, spec.hidden}, DType::bf16, rng)), on_device(std::move(ids)),
          on_device(std::move(weights)), Tensor::empty(DType::f32, {T, spec.hidden}, device),
          Buffer::allocate(device, dispatcher.scratch_bytes())};
}

RankResult bench_one(const Plan& plan, Communicator& comm, int64_t T, int repeats, uint64_t seed) {
  const ModelSpec& spec = plan.spec;
  const int columns = spec.routing.top_k, rank = comm.rank();
  std::vector<int32_t> global_to_local(static_cast<size_t>(plan.location.physical), -1);
  for (int s = 0; s < plan.local_routed; ++s) global_to_local[plan.first_local + s] = s;
  const DispatcherEntry* entry = find_dispatcher(plan.options.a2a);
  std::unique_ptr<Dispatcher> dispatcher =
      entry->create({.hidden = spec.hidden,
                     .columns = columns,
                     .max_tokens = T,
                     .max_received_tokens = plan.max_received_tokens,
                     .global_to_local = std::move(global_to_local),
                     .device = plan.options.device,
                     .comm = &comm,
                     .timeout_ms = plan.options.comm_timeout_ms,
                     .mode = plan.a2a_mode,
                     .wire = plan.a2a_wire,
                     .quant = plan.quant,
                     .physical = plan.location.physical,
                     .per_rank = plan.location.per_rank()});
  std::mt19937_64 rng(seed + static_cast<uint64_t>(rank));
  BenchBuffers b = bench_buffers(plan, *dispatcher, T, rng);
  const bool on_gpu = plan.options.device.kind == DeviceKind::cuda;
  // On the GPU the default stream: a timing ends when the work it enqueued there has run.
  const ExecContext ctx{.device = plan.options.device,
                        .pool = on_gpu ? nullptr : &ThreadPool::shared(plan.threads)};
  const auto finished = [&] {
    if (on_gpu) synchronize_stream(nullptr);
    return std::chrono::steady_clock::now();
  };

  RankResult r{.tokens = T};
  std::vector<double> dispatch_s, combine_s;
  constexpr int kWarmup = 2;
  for (int call = -kWarmup; call < repeats; ++call) {
    comm.barrier({"bench: align the ranks", plan.options.comm_timeout_ms});
    const std::vector<int64_t> before = comm.bytes_sent_to();
    const auto t0 = std::chrono::steady_clock::now();
    const DispatchOutput out =
        dispatcher->dispatch(ctx, b.hidden.view(), b.ids.data<int32_t>(), b.weights.data<float>(),
                             b.combined.data<float>(), b.scratch.data());
    const auto t1 = finished();
    const std::vector<int64_t> between = comm.bytes_sent_to();
    comm.barrier({"bench: align the ranks", plan.options.comm_timeout_ms});
    const auto t2 = std::chrono::steady_clock::now();
    dispatcher->combine(ctx, out, b.combined.data<float>(), b.scratch.data());
    const auto t3 = finished();
    if (call < 0) continue;
    dispatch_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    combine_s.push_back(std::chrono::duration<double>(t3 - t2).count());
    if (call == 0) {
      const std::vector<int64_t> dispatch_to = minus(between, before);
      const std::vector<int64_t> combine_to = minus(comm.bytes_sent_to(), between);
      r.rows_received = out.tokens;
      r.dispatch_bytes = total(dispatch_to);
      r.combine_bytes = total(combine_to);
      // Every rank times the bare exchanges together, once its own counts are known.
      r.bare_dispatch_s = comm.bare_all_to_all_seconds(dispatch_to, repeats);
      r.bare_combine_s = comm.bare_all_to_all_seconds(combine_to, repeats);
    }
  }
  r.dispatch_s = median(dispatch_s);
  r.combine_s = median(combine_s);
  return r;
}

// Every rank's result on rank 0, through the communicator's buffers.
std::vector<RankResult> gather(Communicator& comm, const RankResult& mine, Device device,
                               int64_t timeout_ms) {
  const int size = comm.size();
  std::vector<RankResult> all(static_cast<size_t>(size));
  ExchangeArrays a(size);
  constexpr auto kBytes = static_cast<int64_t>(sizeof(RankResult));
  for (int p = 0; p < size; ++p) {
    a.send_offsets[p] = 0;
    a.send_bytes[p] = p == 0 ? kBytes : 0;
    a.recv_offsets[p] = p * kBytes;
    a.recv_capacity[p] = comm.rank() == 0 ? kBytes : 0;
  }
  const CommStep step{"bench: gather the results", timeout_ms};
  if (comm.buffers() == DeviceKind::cpu) {
    comm.all_to_all({}, a.view(&mine, all.data()), step);
    return all;
  }
  RankResult staged = mine;
  const Tensor send = Tensor::empty(DType::i8, {kBytes}, device);
  const Tensor recv = Tensor::empty(DType::i8, {size * kBytes}, device);
  copy(send, TensorView::contiguous(&staged, DType::i8, {kBytes}));
  comm.all_to_all({.device = device}, a.view(send.view().data, recv.view().data), step);
  copy(TensorView::contiguous(all.data(), DType::i8, {size * kBytes}), recv);
  return all;
}

}  // namespace

std::string run_a2a_bench(const ModelSpec& spec, const Options& options, const Platform& platform,
                          const std::vector<int64_t>& tokens, int repeats, uint64_t seed) {
  // Every plan first: a refusal ends the run before any rank waits for another.
  std::vector<Plan> plans;
  for (const int64_t T : tokens) {
    Options o = options;
    o.max_tokens = T;
    plans.push_back(resolve(spec, o, platform));
  }
  Communicator& comm = world_communicator(plans.front().comm);
  std::string text;
  for (const Plan& plan : plans) {
    const int64_t T = plan.options.max_tokens;
    const std::vector<RankResult> all = gather(comm, bench_one(plan, comm, T, repeats, seed),
                                               plan.options.device, plan.options.comm_timeout_ms);
    if (comm.rank() != 0) continue;
    text += fmt::format(
        "\n{} ranks, {} tokens per rank, H={} top-{} of {} experts, bf16 rows, {} on the wire, {} "
        "mode; median of {} after a barrier each\n",
        comm.size(), T, spec.hidden, spec.routing.top_k, spec.n_experts,
        plan.a2a_wire == A2AWire::e4m3 ? "e4m3" : "bf16", a2a_mode_name(plan.a2a_mode), repeats);
    text += fmt::format("{:>4} {:>9} {:>12} {:>12} {:>12} {:>12} {:>9} {:>12} {:>12} {:>9} {:>9}\n",
                        "rank", "rows in", "dispatch ms", "out KiB", "bare ms", "combine ms",
                        "back KiB", "bare ms", "d+c / bare", "GB/s", "bare GB/s");
    double rows_sum = 0.0, rows_max = 0.0;
    for (int p = 0; p < comm.size(); ++p) {
      const RankResult& r = all[static_cast<size_t>(p)];
      const double seconds = r.dispatch_s + r.combine_s;
      const double bare = std::max(1e-9, r.bare_dispatch_s + r.bare_combine_s);
      // What this rank sent to the others, both ways, per second of dispatch plus combine.
      const auto bytes = static_cast<double>(r.dispatch_bytes + r.combine_bytes);
      text += fmt::format(
          "{:>4} {:>9} {:>12.3f} {:>12.1f} {:>12.3f} {:>12.3f} {:>9.1f} {:>12.3f} "
          "{:>12.2f} {:>9.1f} {:>9.1f}\n",
          p, r.rows_received, r.dispatch_s * 1e3, static_cast<double>(r.dispatch_bytes) / 1024.0,
          r.bare_dispatch_s * 1e3, r.combine_s * 1e3, static_cast<double>(r.combine_bytes) / 1024.0,
          r.bare_combine_s * 1e3, seconds / bare, bytes / std::max(1e-9, seconds) / 1e9,
          bytes / bare / 1e9);
      rows_sum += static_cast<double>(r.rows_received);
      rows_max = std::max(rows_max, static_cast<double>(r.rows_received));
    }
    text += fmt::format(
        "imbalance: the most loaded rank receives {:.2f}x the mean rows; bare = {} of the same "
        "bytes per peer, in one call per direction\n",
        rows_sum > 0 ? rows_max / (rows_sum / comm.size()) : 0.0,
        comm.buffers() == DeviceKind::cpu ? "MPI_Alltoallv" : "grouped ncclSend/ncclRecv");
  }
  return text;
}

}  // namespace moekit::bench
