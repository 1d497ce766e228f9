#include "moekit/error.hpp"

namespace moekit {

const char* errc_name(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid argument";
    case Errc::config_refused:
      return "configuration refused";
    case Errc::out_of_memory:
      return "out of memory";
    case Errc::io:
      return "i/o error";
    case Errc::internal:
      return "internal error";
    case Errc::comm:
      return "communication failed";
  }
  return "error";
}

}  // namespace moekit
