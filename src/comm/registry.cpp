// The communicators this build has. MPI is built where CMake's FindMPI finds it
// (MOEKIT_MPI=AUTO|ON|OFF); its implementation, the one file that includes mpi.h, is
// comm/mpi/mpi_communicator.cpp.

#include "comm/communicator.hpp"
#include "moekit/error.hpp"

namespace moekit {

#ifdef MOEKIT_WITH_MPI
Communicator& mpi_world();
Communicator* mpi_world_if_made();
#endif

bool communicator_built(CommKind kind) {
#ifdef MOEKIT_WITH_MPI
  if (kind == CommKind::mpi) return true;
#endif
  return kind == CommKind::none;
}

std::string communicator_absent_reason(CommKind kind) {
  if (kind == CommKind::mpi) {
    return "this build of moekit has no MPI (it is built where CMake finds MPI: install "
           "libopenmpi-dev, or scripts/setup.sh, and configure with -DMOEKIT_MPI=AUTO or ON)";
  }
  return "no communicator is built for this kind";
}

Communicator& world_communicator(CommKind kind) {
#ifdef MOEKIT_WITH_MPI
  if (kind == CommKind::mpi) return mpi_world();
#endif
  fail(Errc::internal, "a plan asks for a communicator that is not built: {}",
       communicator_absent_reason(kind));
}

Communicator* active_world_communicator() {
#ifdef MOEKIT_WITH_MPI
  if (Communicator* comm = mpi_world_if_made(); comm != nullptr && comm->size() > 1) return comm;
#endif
  return nullptr;
}

}  // namespace moekit
