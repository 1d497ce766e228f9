#include "dispatch/dispatcher.hpp"

#include "moekit/error.hpp"

namespace moekit {

StandardDispatcher::StandardDispatcher(std::vector<int32_t> global_to_local, int64_t max_entries)
    : global_to_local_(std::move(global_to_local)), local_ids_(static_cast<size_t>(max_entries)) {}

DispatchOutput StandardDispatcher::dispatch(const TensorView& hidden, const int32_t* global_ids,
                                            const float* weights, int columns) {
  const int64_t entries = hidden.dim(0) * columns;
  if (entries > static_cast<int64_t>(local_ids_.size())) {
    fail(Errc::internal, "dispatch of {} entries exceeds the {} planned", entries,
         local_ids_.size());
  }
  const auto n_global = static_cast<int32_t>(global_to_local_.size());
  for (int64_t e = 0; e < entries; ++e) {
    const int32_t id = global_ids[e];
    if (id < 0 || id >= n_global) fail(Errc::internal, "routed expert id {} out of range", id);
    local_ids_[e] = global_to_local_[id];
  }
  return {hidden, local_ids_.data(), weights, hidden.dim(0), columns};
}

}  // namespace moekit
