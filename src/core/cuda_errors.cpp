#include "core/cuda_errors.hpp"

#include "moekit/error.hpp"

namespace moekit::cuda_errors {

void invalid_argument(const std::string& message) {
  throw Error(Errc::invalid_argument, message);
}

void internal(const std::string& message) {
  throw Error(Errc::internal, message);
}

}  // namespace moekit::cuda_errors
