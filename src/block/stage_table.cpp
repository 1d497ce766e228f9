#include "block/stages.hpp"

namespace moekit {

const std::vector<StageEntry>& stage_table() {
  static const std::vector<StageEntry> table = {
      {DeviceKind::cpu, "cpu", make_cpu_finite_checks, make_cpu_router, make_cpu_output_sum},
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
