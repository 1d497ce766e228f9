// A sum over the ranks that every rank gets bit for bit alike, from all_to_all alone: rank p
// owns segment p of the data, receives every rank's copy of it, adds them in rank order and
// sends the sum back to everyone. Arrival order never enters the sum.

#include <algorithm>
#include <cstring>

#include "comm/communicator.hpp"

namespace moekit {
namespace {

int64_t segment_length(int size, int64_t count) {
  return (count + size - 1) / size;
}

}  // namespace

void host_segment_sum(const ExecContext&, float* out, const float* parts, int64_t stride,
                      int n_parts, int64_t n) {
  if (out != parts) std::memcpy(out, parts, static_cast<size_t>(n) * sizeof(float));
  for (int p = 1; p < n_parts; ++p) {
    const float* part = parts + p * stride;
    for (int64_t i = 0; i < n; ++i) out[i] += part[i];
  }
}

int64_t fixed_order_reduce_scratch(int size, int64_t count) {
  return segment_length(size, count) * size;
}

void fixed_order_all_reduce(Communicator& comm, ExchangeArrays& a, const ExecContext& ctx,
                            float* data, int64_t count, float* scratch, const CommStep& step,
                            SegmentSum sum, bool enqueued) {
  const auto exchange = [&](const Exchange& x) {
    if (enqueued) {
      comm.enqueue_all_to_all(ctx, x, step);
    } else {
      comm.all_to_all(ctx, x, step);
    }
  };
  const int size = comm.size(), me = comm.rank();
  const int64_t seg = segment_length(size, count);
  const auto begin = [&](int p) { return std::min(count, p * seg); };
  const auto length = [&](int p) { return std::min(count, (p + 1) * seg) - begin(p); };
  constexpr auto kFloat = static_cast<int64_t>(sizeof(float));
  for (int p = 0; p < size; ++p) {
    a.send_offsets[p] = begin(p) * kFloat;
    a.send_bytes[p] = length(p) * kFloat;
    a.recv_offsets[p] = p * seg * kFloat;
    a.recv_capacity[p] = length(me) * kFloat;
  }
  exchange(a.view(data, scratch));
  const int64_t n = length(me);
  sum(ctx, data + begin(me), scratch, seg, size, n);
  // The gather: this rank's summed segment to every other rank, theirs into place here.
  for (int p = 0; p < size; ++p) {
    const bool other = p != me;
    a.send_offsets[p] = begin(me) * kFloat;
    a.send_bytes[p] = other ? n * kFloat : 0;
    a.recv_offsets[p] = begin(p) * kFloat;
    a.recv_capacity[p] = other ? length(p) * kFloat : 0;
  }
  exchange(a.view(data, data));
}

}  // namespace moekit
