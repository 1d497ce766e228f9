#include "contracts/exec.hpp"

#include "moekit/error.hpp"

namespace moekit {

ThreadPool& ExecContext::threads() const {
  if (pool == nullptr) fail(Errc::internal, "a CPU stage was given no thread pool");
  return *pool;
}

}  // namespace moekit
