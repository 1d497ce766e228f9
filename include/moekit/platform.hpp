#pragma once
// What the machine offers. Probed in one place (Platform::probe); resolve() takes it as an input,
// so tests can ask what a plan would be on a machine they do not run on.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moekit {

struct GpuInfo {
  int index = 0;
  int compute_major = 0;
  int compute_minor = 0;
  std::string name;
  int sm_count = 0;
  int64_t memory_bytes = 0;  // global memory
  int64_t l2_bytes = 0;
};

struct Platform {
  int cpu_threads = 1;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;  // f16 <-> f32 conversion, which every AVX2 CPU also has
  bool avx512f = false;
  // AVX-512 BF16 dot products (vdpbf16ps), with the AVX-512 F, BW, VL and DQ the kernels that
  // use it are compiled for, and an OS that saves the zmm state.
  bool avx512_bf16 = false;
  // AVX-512 VNNI 16-bit dot products on 256-bit vectors (vpdpwssd with AVX-512 VL), likewise.
  bool avx512_vnni = false;
  // Who made the CPU and which family (CPUID's vendor string and display family: "AuthenticAMD"
  // and 0x17 on Zen 2): what a kernel's tuning was measured on, for the choices that differ
  // between machines of the same instruction sets (choose_cpu_kernels). Empty and 0 off x86.
  std::string cpu_vendor;
  int cpu_family = 0;
  std::vector<GpuInfo> gpus;
  bool cuda_runtime = false;  // this build of moekit links a CUDA runtime
  // Why `gpus` is empty in a build with a CUDA runtime (the runtime's answer: no driver, no
  // device); empty otherwise.
  std::string gpu_note;
  // The ranks the launcher started (mpirun's environment; 1 and 0 outside one). resolve() needs
  // them for a2a mpi and for summing a2a none's partial outputs across processes.
  int world_size = 1;
  int world_rank = 0;
  // Of them, the ranks on this host (all of them where the launcher does not say): whether rows
  // between ranks move through shared memory or over a network.
  int world_local_size = 1;
  // This rank's place among the ranks on its machine: the GPU the NCCL communicator runs it on.
  int world_local_rank = 0;

  static Platform probe();
  static Platform cpu_only(int threads);
  std::string summary() const;
  // The instruction sets this platform claims that `actual` lacks ("AVX-512 BF16, AVX2"), or
  // nothing: what a plan made for this platform would need of the machine that runs it.
  std::optional<std::string> missing_on(const Platform& actual) const;
};

}  // namespace moekit
