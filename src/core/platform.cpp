#include "moekit/platform.hpp"

#include <algorithm>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <thread>

#include <fmt/format.h>

namespace moekit {

Platform Platform::probe() {
  Platform platform;
  platform.cpu_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  platform.avx2 = __builtin_cpu_supports("avx2");
  platform.fma = __builtin_cpu_supports("fma");
  platform.avx512f = __builtin_cpu_supports("avx512f");
  // clang's __builtin_cpu_supports has no "f16c"; CPUID leaf 1 says it in ECX.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  platform.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#endif
  // This build links no CUDA runtime, so it cannot see or use a GPU; the GPU runners that would
  // need one are not built either, and resolve() says so.
  platform.cuda_runtime = false;
  return platform;
}

Platform Platform::cpu_only(int threads) {
  Platform platform;
  platform.cpu_threads = std::max(1, threads);
  return platform;
}

std::string Platform::summary() const {
  std::string text = fmt::format("{} CPU threads", cpu_threads);
  if (avx2) text += ", AVX2";
  if (fma) text += ", FMA";
  if (f16c) text += ", F16C";
  if (avx512f) text += ", AVX-512F";
  if (!cuda_runtime) return text + "; no CUDA runtime in this build";
  if (gpus.empty()) return text + "; no GPU";
  for (const GpuInfo& gpu : gpus) {
    text += fmt::format("; GPU {} {} (sm_{}{})", gpu.index, gpu.name, gpu.compute_major,
                        gpu.compute_minor);
  }
  return text;
}

}  // namespace moekit
