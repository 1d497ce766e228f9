#pragma once
// A decode step's few entries (at most kTinyEntries, one per lane) placed in the contiguous
// layout with tile 1 by one warp, in whatever kernel needs the places: the one-launch sort +
// gather (permute.cu), and the wgmma decode GEMMs that find their tiles from the router's ids
// themselves (GemmChoice::rows_from_hidden). An entry's row is the number of entries here with a
// lower slot plus the earlier entries with its own slot: the row the one-block sort gives it, so
// every kernel agrees with sort_by_slot without a launch between them.

#include <cstdint>

namespace moekit::runner::cuda {

constexpr int kTinyEntries = 32;

// An entry's id as a local slot, or -1 (not on this rank, or out of range); `table` maps global
// ids to local slots ([n_global], -1 = not here) where the ids are global, else null.
__device__ __forceinline__ int tiny_local_slot(int id, const int32_t* table, int n_global,
                                               int n_slots) {
  if (table != nullptr) id = id >= 0 && id < n_global ? table[id] : -1;
  return id >= 0 && id < n_slots ? id : -1;
}

struct TinyPlace {
  int row;   // this lane's entry's row, -1 where its slot is -1
  int used;  // rows in use: the entries here
};

// Called by all 32 lanes of a warp with their entry's slot (lanes from `entries` on: -1).
__device__ __forceinline__ TinyPlace tiny_place(int slot, int entries, int lane) {
  int row = 0, used = 0;
  for (int j = 0; j < entries; ++j) {
    const int other = __shfl_sync(0xFFFFFFFFu, slot, j);
    if (other < 0) continue;
    ++used;
    if (other < slot || (other == slot && j < lane)) ++row;
  }
  return {slot >= 0 ? row : -1, used};
}

}  // namespace moekit::runner::cuda
