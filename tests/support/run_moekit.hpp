#pragma once
// The built `moekit` binary run as a subprocess, for the tests of its commands.

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace moekit::test {

// Its exit code and what it printed on stdout and stderr together.
struct CommandResult {
  int exit_code = -1;
  std::string output;
  bool mentions(const std::string& text) const { return output.find(text) != std::string::npos; }
};

// Runs `moekit <args>`, after `launcher` (mpirun and its flags) where one is given; args are
// passed to the shell as written.
inline CommandResult run_moekit(const std::string& args, const std::string& launcher = "") {
  const std::string command = launcher + (launcher.empty() ? "" : " ") +
                              "'" MOEKIT_BINARY_DIR "/tools/moekit' " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for: " << command;
    return result;
  }
  char buffer[4096];
  size_t read = 0;
  while ((read = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    result.output.append(buffer, read);
  }
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace moekit::test
