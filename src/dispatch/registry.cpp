#include "dispatch/dispatcher.hpp"

namespace moekit {

const std::vector<DispatcherEntry>& dispatcher_table() {
  static const std::vector<DispatcherEntry> table = {
      {A2AKind::none, DispatcherKind::standard, DispatchFormat::standard, standard_supports,
       standard_max_received_tokens, make_standard_dispatcher, standard_decide},
      {A2AKind::mpi, DispatcherKind::all_to_all, DispatchFormat::standard, all_to_all_supports,
       all_to_all_max_received_tokens, make_all_to_all_dispatcher, all_to_all_decide},
#ifdef MOEKIT_WITH_CUDA
      {A2AKind::nccl, DispatcherKind::all_to_all, DispatchFormat::standard,
       nccl_all_to_all_supports, all_to_all_max_received_tokens, make_nccl_all_to_all_dispatcher,
       nccl_all_to_all_decide},
#endif
  };
  return table;
}

const DispatcherEntry* find_dispatcher(A2AKind a2a) {
  for (const DispatcherEntry& entry : dispatcher_table()) {
    if (entry.a2a == a2a) return &entry;
  }
  return nullptr;
}

}  // namespace moekit
