#pragma once
// The CPU kernel sets a plan can be resolved for, each as a named Platform: the portable kernels,
// AVX2, AVX2 with AVX-512 BF16 or with AVX-512 VNNI alone, and everything this machine has. The
// layer suites and the matrix run on every set; a set this machine lacks is a reported skip.

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "moekit/platform.hpp"

namespace moekit::test {

enum class KernelSet { portable, avx2, avx512_bf16, avx512_vnni, all };

inline constexpr KernelSet kKernelSets[] = {KernelSet::portable, KernelSet::avx2,
                                            KernelSet::avx512_bf16, KernelSet::avx512_vnni,
                                            KernelSet::all};

inline std::string_view kernel_set_name(KernelSet set) {
  switch (set) {
    case KernelSet::portable:
      return "portable";
    case KernelSet::avx2:
      return "avx2";
    case KernelSet::avx512_bf16:
      return "avx512-bf16";
    case KernelSet::avx512_vnni:
      return "avx512-vnni";
    case KernelSet::all:
      return "all";
  }
  return "unknown";
}

// The name as a test's name may hold it (letters, digits and underscores).
inline std::string kernel_set_test_name(KernelSet set) {
  std::string name(kernel_set_name(set));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

// A kernel set on a machine: the Platform to resolve for, and the features of the set that the
// machine lacks (empty when it has them all).
struct KernelPlatform {
  Platform platform;
  std::string missing;
};

// The set on a machine that `machine` describes, with `threads` CPU threads. "all" is the
// machine as it is, so it is never missing anything.
inline KernelPlatform kernel_platform(KernelSet set, const Platform& machine, int threads) {
  if (set == KernelSet::portable) return {Platform::cpu_only(threads), ""};
  KernelPlatform result{machine, ""};
  result.platform.cpu_threads = threads;
  if (set == KernelSet::all) return result;
  const auto need = [&](bool has, std::string_view feature) {
    if (has) return;
    if (!result.missing.empty()) result.missing += ", ";
    result.missing += feature;
  };
  need(machine.avx2, "AVX2");
  need(machine.fma, "FMA");
  need(machine.f16c, "F16C");
  if (set == KernelSet::avx512_bf16) need(machine.avx512_bf16, "AVX-512 BF16");
  if (set == KernelSet::avx512_vnni) need(machine.avx512_vnni, "AVX-512 VNNI");
  // The AVX2 set is AVX2 alone: its e4m3 rounding too (CpuKernels::e4m3).
  if (set == KernelSet::avx2) result.platform.avx512f = false;
  result.platform.avx512_bf16 = set == KernelSet::avx512_bf16;
  result.platform.avx512_vnni = set == KernelSet::avx512_vnni;
  return result;
}

inline const Platform& this_machine() {
  static const Platform machine = Platform::probe();
  return machine;
}

inline KernelPlatform kernel_platform(KernelSet set, int threads) {
  return kernel_platform(set, this_machine(), threads);
}

// A test on one kernel set, its parameter a case with a `set`: skipped where this machine lacks
// the set, naming the set and what is missing, so no set drops out of a run unseen.
template <typename Case>
class KernelSetTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const KernelSet set = this->GetParam().set;
    const KernelPlatform on = kernel_platform(set, machine(), 1);
    if (!on.missing.empty()) {
      GTEST_SKIP() << "kernel set " << kernel_set_name(set) << " needs " << on.missing
                   << ", which this machine lacks";
    }
    platform_ = on.platform;
  }

  // The machine the sets are taken from: this one, unless a test of the skip says otherwise.
  virtual Platform machine() const { return this_machine(); }

  // The set's Platform with `threads` CPU threads.
  Platform platform(int threads) const {
    Platform p = platform_;
    p.cpu_threads = threads;
    return p;
  }

 private:
  Platform platform_;
};

}  // namespace moekit::test
