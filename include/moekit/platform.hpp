#pragma once
// What the machine offers. Probed in one place (Platform::probe); resolve() takes it as an input,
// so tests can ask what a plan would be on a machine they do not run on.

#include <string>
#include <vector>

namespace moekit {

struct GpuInfo {
  int index = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::string name;
};

struct Platform {
  int cpu_threads = 1;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;  // f16 <-> f32 conversion, which every AVX2 CPU also has
  bool avx512f = false;
  std::vector<GpuInfo> gpus;
  bool cuda_runtime = false;  // this build of moekit links a CUDA runtime

  static Platform probe();
  static Platform cpu_only(int threads);
  std::string summary() const;
};

}  // namespace moekit
