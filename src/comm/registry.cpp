// The communicators this build has. MPI is built where CMake's FindMPI finds it
// (MOEKIT_MPI=AUTO|ON|OFF); its implementation, the one file that includes mpi.h, is
// comm/mpi/mpi_communicator.cpp. NCCL is built with CUDA and loaded at run time
// (comm/nccl/nccl_communicator.cpp), so whether it exists is a question about the machine.

#include "comm/communicator.hpp"
#include "moekit/error.hpp"

namespace moekit {

#ifdef MOEKIT_WITH_MPI
Communicator& mpi_world();
Communicator* mpi_world_if_made();
#endif
#ifdef MOEKIT_WITH_CUDA
// Empty where libnccl.so.2 loads and has what moekit uses.
std::string nccl_unavailable_reason();
// Across processes NCCL's id travels over `mpi` (under mpirun; nullptr in a build without MPI)
// or through MOEKIT_NCCL_ID_FILE.
Communicator& nccl_world(Communicator& (*mpi)());
Communicator* nccl_world_if_made();
#endif

void Communicator::enqueue_all_to_all(const ExecContext&, const Exchange&, const CommStep& step) {
  fail(Errc::internal,
       "step '{}': the {} communicator waits for each exchange on the host and enqueues none",
       step.name, name());
}

void Communicator::enqueue_all_reduce_sum(const ExecContext&, float*, int64_t, float*,
                                          const CommStep& step) {
  fail(Errc::internal,
       "step '{}': the {} communicator waits for each exchange on the host and enqueues none",
       step.name, name());
}

// A communicator that waits for each exchange has left nothing on the stream to wait for.
void Communicator::wait(const ExecContext&, const CommStep&) {}

bool communicator_built(CommKind kind) {
#ifdef MOEKIT_WITH_MPI
  if (kind == CommKind::mpi) return true;
#endif
#ifdef MOEKIT_WITH_CUDA
  if (kind == CommKind::nccl) return nccl_unavailable_reason().empty();
#endif
  return kind == CommKind::none;
}

std::string communicator_absent_reason(CommKind kind) {
  if (kind == CommKind::mpi) {
    return "this build of moekit has no MPI (it is built where CMake finds MPI: install "
           "libopenmpi-dev, or scripts/setup.sh, and configure with -DMOEKIT_MPI=AUTO or ON)";
  }
  if (kind == CommKind::nccl) {
#ifdef MOEKIT_WITH_CUDA
    return nccl_unavailable_reason();
#else
    return "this build of moekit has no CUDA, and the NCCL communicator is built with it "
           "(configure with -DMOEKIT_CUDA=AUTO or ON where nvcc is found)";
#endif
  }
  return "no communicator is built for this kind";
}

Communicator& world_communicator(CommKind kind) {
#ifdef MOEKIT_WITH_MPI
  if (kind == CommKind::mpi) return mpi_world();
#endif
#ifdef MOEKIT_WITH_CUDA
  if (kind == CommKind::nccl) {
#ifdef MOEKIT_WITH_MPI
    return nccl_world(mpi_world);
#else
    return nccl_world(nullptr);
#endif
  }
#endif
  fail(Errc::internal, "a plan asks for a communicator that is not built: {}",
       communicator_absent_reason(kind));
}

// MPI's first where both were made: it reaches the other ranks without the GPU, which may be
// what failed.
Communicator* active_world_communicator() {
#ifdef MOEKIT_WITH_MPI
  if (Communicator* comm = mpi_world_if_made(); comm != nullptr && comm->size() > 1) return comm;
#endif
#ifdef MOEKIT_WITH_CUDA
  if (Communicator* comm = nccl_world_if_made(); comm != nullptr && comm->size() > 1) return comm;
#endif
  return nullptr;
}

}  // namespace moekit
