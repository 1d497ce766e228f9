#include "block/stages.hpp"

namespace moekit {

const std::vector<StageEntry>& stage_table() {
  static const std::vector<StageEntry> table = {
      {DeviceKind::cpu, "cpu", make_cpu_finite_checks, make_cpu_router, make_cpu_output_sum},
#ifdef MOEKIT_WITH_CUDA
      {DeviceKind::cuda, "cuda", make_cuda_finite_checks, make_cuda_router, make_cuda_output_sum},
#endif
  };
  return table;
}

const StageEntry* find_stages(DeviceKind device) {
  for (const StageEntry& entry : stage_table()) {
    if (entry.device == device) return &entry;
  }
  return nullptr;
}

}  // namespace moekit
