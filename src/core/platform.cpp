#include "moekit/platform.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <thread>

#include <fmt/format.h>

#include "core/cuda_device.hpp"

namespace moekit {

#if defined(__x86_64__) || defined(__i386__)
namespace {

// The AVX-512 features are asked of CPUID directly, as F16C is, so that g++ and clang builds
// give one answer whatever their __builtin_cpu_supports knows of them.

// Whether the OS saves the zmm state, which AVX-512 instructions of any width need.
bool os_saves_zmm() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // SSE, AVX, opmask, upper halves of zmm0-15 and zmm16-31.
  constexpr unsigned kZmmState = 0xE6;
  return (xcr0_lo & kZmmState) == kZmmState;
}

bool probe_avx512_vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!os_saves_zmm() || __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ebx & bit_AVX512F) != 0 && (ebx & bit_AVX512VL) != 0 && (ecx & bit_AVX512VNNI) != 0;
}

bool probe_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!os_saves_zmm() || __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const unsigned max_subleaf = eax;
  const bool base = (ebx & bit_AVX512F) != 0 && (ebx & bit_AVX512BW) != 0 &&
                    (ebx & bit_AVX512VL) != 0 && (ebx & bit_AVX512DQ) != 0;
  if (!base || max_subleaf < 1) return false;
  __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx);
  return (eax & bit_AVX512BF16) != 0;  // leaf 7 subleaf 1, EAX bit 5
}

}  // namespace
#endif

namespace {

// Read from the launcher's environment rather than from MPI, so that probing starts no MPI:
// OpenMPI's mpirun sets OMPI_COMM_WORLD_*, PMI-based launchers (MPICH, Slurm) PMI_* (MPICH's
// local rank MPI_LOCALRANKID), and a launcher without MPI that bootstraps the NCCL communicator
// by file sets MOEKIT_WORLD_* (docs/EXPERT_PARALLEL.md).
int launcher_variable(std::initializer_list<const char*> names, int otherwise) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      char* end = nullptr;
      const long parsed = std::strtol(value, &end, 10);
      if (*end == '\0' && parsed >= 0 && parsed < (1 << 20)) return static_cast<int>(parsed);
    }
  }
  return otherwise;
}

}  // namespace

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
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) != 0) {
    char vendor[12];
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    platform.cpu_vendor.assign(vendor, sizeof vendor);
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0) {
    platform.f16c = (ecx & bit_F16C) != 0;
    // The display family: the extended family is added where the base family is 0xF.
    const int base_family = static_cast<int>((eax >> 8) & 0xF);
    platform.cpu_family =
        base_family == 0xF ? base_family + static_cast<int>((eax >> 20) & 0xFF) : base_family;
  }
  platform.avx512_bf16 = probe_avx512_bf16();
  platform.avx512_vnni = probe_avx512_vnni();
#endif
  // A build without a CUDA runtime cannot see or use a GPU; the GPU runners that would need one
  // are not built either, and resolve() says so. With one, a machine without a driver or GPU
  // answers none, and gpu_note says why.
  platform.world_size =
      std::max(1, launcher_variable({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MOEKIT_WORLD_SIZE"}, 1));
  platform.world_rank =
      launcher_variable({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "MOEKIT_WORLD_RANK"}, 0);
  platform.world_local_size = std::clamp(
      launcher_variable({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, platform.world_size), 1,
      platform.world_size);
  platform.world_local_rank = launcher_variable(
      {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MOEKIT_WORLD_LOCAL_RANK"}, 0);
  platform.cuda_runtime = cuda_device::built_with_cuda();
  if (platform.cuda_runtime) platform.gpus = cuda_device::probe(platform.gpu_note);
  return platform;
}

Platform Platform::cpu_only(int threads) {
  Platform platform;
  platform.cpu_threads = std::max(1, threads);
  return platform;
}

std::optional<std::string> Platform::missing_on(const Platform& actual) const {
  const std::pair<bool Platform::*, const char*> features[] = {
      {&Platform::avx2, "AVX2"},
      {&Platform::fma, "FMA"},
      {&Platform::f16c, "F16C"},
      {&Platform::avx512f, "AVX-512F"},
      {&Platform::avx512_bf16, "AVX-512 BF16"},
      {&Platform::avx512_vnni, "AVX-512 VNNI"}};
  std::string missing;
  for (const auto& [feature, name] : features) {
    if (this->*feature && !(actual.*feature))
      missing += (missing.empty() ? "" : ", ") + std::string(name);
  }
  if (missing.empty()) return std::nullopt;
  return missing;
}

std::string Platform::summary() const {
  std::string text = world_size > 1 ? fmt::format("rank {} of {}, ", world_rank, world_size) : "";
  if (world_size > 1 && world_local_size < world_size) {
    text += fmt::format("{} of them on this host, ", world_local_size);
  }
  text += fmt::format("{} CPU threads", cpu_threads);
  if (!cpu_vendor.empty()) text += fmt::format(" ({} family {:x}h)", cpu_vendor, cpu_family);
  if (avx2) text += ", AVX2";
  if (fma) text += ", FMA";
  if (f16c) text += ", F16C";
  if (avx512f) text += ", AVX-512F";
  if (avx512_bf16) text += ", AVX-512 BF16";
  if (avx512_vnni) text += ", AVX-512 VNNI";
  if (!cuda_runtime) return text + "; no CUDA runtime in this build";
  if (gpus.empty()) return text + (gpu_note.empty() ? "; no GPU" : "; no GPU: " + gpu_note);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  for (const GpuInfo& gpu : gpus) {
    text += fmt::format("; GPU {} {} (sm_{}{}, {} SMs, {:.1f} GiB, L2 {:.0f} MiB)", gpu.index,
                        gpu.name, gpu.compute_major, gpu.compute_minor, gpu.sm_count,
                        static_cast<double>(gpu.memory_bytes) / kGiB,
                        static_cast<double>(gpu.l2_bytes) / (1024.0 * 1024.0));
  }
  return text;
}

}  // namespace moekit
