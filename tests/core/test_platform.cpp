// A plan carries the platform it was made for; the machine that runs it must have every
// instruction set that platform claims.

#include <gtest/gtest.h>

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
