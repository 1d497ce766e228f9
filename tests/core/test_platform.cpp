// A plan carries the platform it was made for; the machine that runs it must have every
// instruction set that platform claims.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/testing.hpp"

namespace moekit {
namespace {

Platform avx2_machine() {
  Platform p = Platform::cpu_only(2);
  p.avx2 = p.fma = p.f16c = true;
  return p;
}

// Sets environment variables for a scope and restores what was there.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(std::vector<std::pair<std::string, std::string>> values) {
    for (auto& [name, value] : values) {
      const char* before = std::getenv(name.c_str());
      saved_.push_back(
          {name, before != nullptr ? std::optional<std::string>(before) : std::nullopt});
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, before] : saved_) {
      if (before) {
        setenv(name.c_str(), before->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

struct LauncherCase {
  const char* name;
  std::vector<std::pair<std::string, std::string>> environment;
  int size, rank, local_rank;
};

// The ranks a launcher started, and each one's place on its machine (the GPU the NCCL
// communicator gives it), from mpirun's environment or moekit's own for a launcher without MPI.
TEST(PlatformProbe, ReadsTheRanksFromTheLaunchersEnvironment) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MOEKIT_WORLD_SIZE"}) {
    if (std::getenv(name) != nullptr) GTEST_SKIP() << "run under a launcher (" << name << " set)";
  }
  const LauncherCase cases[] = {
      {"none", {}, 1, 0, 0},
      {"OpenMPI",
       {{"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_RANK", "3"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
       4,
       3,
       1},
      {"MPICH", {{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}, {"MPI_LOCALRANKID", "1"}}, 2, 1, 1},
      {"without MPI",
       {{"MOEKIT_WORLD_SIZE", "8"}, {"MOEKIT_WORLD_RANK", "6"}, {"MOEKIT_WORLD_LOCAL_RANK", "6"}},
       8,
       6,
       6},
      {"not a number", {{"MOEKIT_WORLD_SIZE", "two"}}, 1, 0, 0},
  };
  for (const LauncherCase& c : cases) {
    SCOPED_TRACE(c.name);
    const ScopedEnvironment environment(c.environment);
    const Platform platform = Platform::probe();
    EXPECT_EQ(platform.world_size, c.size);
    EXPECT_EQ(platform.world_rank, c.rank);
    EXPECT_EQ(platform.world_local_rank, c.local_rank);
  }
}

// The CPU's maker and family, which the kernels' tuning was measured by (choose_cpu_kernels), as
// /proc/cpuinfo has them where Linux gives that file.
TEST(PlatformProbe, NamesTheCpusMakerAndFamily) {
#if defined(__x86_64__) || defined(__i386__)
  const Platform p = Platform::probe();
  EXPECT_EQ(p.cpu_vendor.size(), 12u) << p.cpu_vendor;
  EXPECT_GT(p.cpu_family, 0);
  EXPECT_NE(p.summary().find(p.cpu_vendor), std::string::npos) << p.summary();
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, vendor, family;
  while (std::getline(cpuinfo, line) && (vendor.empty() || family.empty())) {
    const auto value = [&] { return line.substr(line.find(':') + 2); };
    if (line.rfind("vendor_id", 0) == 0) vendor = value();
    if (line.rfind("cpu family", 0) == 0) family = value();
  }
  if (vendor.empty() || family.empty()) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  EXPECT_EQ(p.cpu_vendor, vendor);
  EXPECT_EQ(p.cpu_family, std::stoi(family));
#else
  GTEST_SKIP() << "CPUID is x86's";
#endif
}

TEST(PlatformMissingOn, NothingWhenTheMachineHasEveryClaimedFeature) {
  Platform planned = avx2_machine();
  Platform actual = avx2_machine();
  actual.avx512_bf16 = true;
  EXPECT_FALSE(planned.missing_on(actual).has_value());
  EXPECT_FALSE(Platform::cpu_only(8).missing_on(Platform::cpu_only(1)).has_value());
}

TEST(PlatformMissingOn, NamesEachMissingFeature) {
  Platform planned = avx2_machine();
  planned.avx512_bf16 = true;
  planned.avx512_vnni = true;
  const std::optional<std::string> missing = planned.missing_on(avx2_machine());
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(*missing, "AVX-512 BF16, AVX-512 VNNI");
  EXPECT_EQ(avx2_machine().missing_on(Platform::cpu_only(2)).value_or(""), "AVX2, FMA, F16C");
}

// Where this machine lacks one of the features the kernels use, a plan made for a machine with it
// is refused when the layer is built, before any kernel could meet an illegal instruction.
TEST(PlanForAnotherMachine, IsRefusedWhenTheLayerIsBuilt) {
  const Platform here = Platform::probe();
  Platform richer = here;
  if (!here.avx512_vnni) {
    richer.avx512_vnni = true;
  } else if (!here.avx512_bf16) {
    richer.avx512_bf16 = true;
  } else if (!here.avx2) {
    richer.avx2 = true;
  } else {
    GTEST_SKIP() << "this machine has every instruction set a plan can claim";
  }
  const ModelSpec spec = ModelSpec::demo();
  const Plan plan = resolve(spec, Options{}, richer);
  const RandomWeights weights = RandomWeights::make(spec, DType::bf16, 3);
  try {
    MoeLayer layer(plan, weights.view());
    FAIL() << "built a layer for a machine with more than this one";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("lacks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit
