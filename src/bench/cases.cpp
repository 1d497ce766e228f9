#include "bench/cases.hpp"

#include <charconv>
#include <utility>

#include "core/names.hpp"
#include "moekit/error.hpp"

namespace moekit::bench {
namespace {

constexpr NameTable<Routing, 2> kRoutings = {{Routing::uniform, "uniform"},
                                             {Routing::skewed, "skewed"}};

std::vector<BenchCase> all_cases() {
  using enum WeightFormat;
  const auto cuda = DeviceKind::cuda;
  std::vector<BenchCase> cases = {
      BenchCase::Routed("dsv3-decode", 256, 8, 7168, 2048, {fp8_block, bf16}, {1, 8, 64}, cuda),
      BenchCase::Routed("dsv3-prefill", 256, 8, 7168, 2048, {fp8_block, bf16}, {512, 4096, 16384},
                        cuda),
      BenchCase::Routed("qwen3-30b-a3b", 128, 8, 2048, 768, {bf16, fp8_block},
                        {1, 8, 64, 512, 4096}, cuda),
      BenchCase::Routed("mixtral-8x7b", 8, 2, 4096, 14336, {bf16}, {1, 64, 1024}, cuda),
      BenchCase::Routed("cpu-qwen3-30b-a3b", 128, 8, 2048, 768,
                        {bf16, int4_group, QuantParams::Int4GroupA8(), fp8_block}, {1, 16, 512},
                        DeviceKind::cpu),
  };
  cases[0].skewed_tokens = {64};
  cases[2].skewed_tokens = {512};
  return cases;
}

std::string_view device_kind_name(DeviceKind kind) {
  return kind == DeviceKind::cpu ? "cpu" : "cuda";
}

}  // namespace

BenchCase BenchCase::Routed(std::string name, int experts, int top_k, int64_t hidden,
                            int64_t intermediate, std::vector<QuantParams> formats,
                            std::vector<int64_t> tokens, DeviceKind device) {
  ModelSpec spec;
  spec.name = name;
  spec.n_experts = experts;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.routing = {.scoring = Scoring::softmax, .top_k = top_k, .renormalize = true};
  return {std::move(name), std::move(spec), std::move(formats), std::move(tokens), device, {}};
}

void BenchCase::time_only(std::vector<int64_t> counts) {
  tokens = std::move(counts);
  skewed_tokens.clear();
}

std::vector<BenchCase> headline_cases(DeviceKind device) {
  std::vector<BenchCase> cases;
  for (BenchCase& c : all_cases()) {
    if (c.device == device) cases.push_back(std::move(c));
  }
  return cases;
}

BenchCase find_case(std::string_view name, DeviceKind device) {
  std::string names;
  for (BenchCase& c : all_cases()) {
    if (c.name != name) continue;
    if (c.device == device) return std::move(c);
    fail(Errc::invalid_argument, "--case '{}' is a {} case: add --device {}", name,
         device_kind_name(c.device), device_kind_name(c.device));
  }
  for (const BenchCase& c : headline_cases(device)) names += (names.empty() ? "" : ", ") + c.name;
  fail(Errc::invalid_argument, "--case '{}' is not a {} case; the {} cases are {} (see --list)",
       name, device_kind_name(device), device_kind_name(device), names);
}

std::vector<int64_t> parse_token_list(std::string_view text) {
  std::vector<int64_t> tokens;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view entry = text.substr(start, comma - start);
    int64_t value = 0;
    const auto [end, error] = std::from_chars(entry.data(), entry.data() + entry.size(), value);
    if (entry.empty() || error != std::errc() || end != entry.data() + entry.size() || value < 1) {
      fail(Errc::invalid_argument,
           "--tokens '{}': '{}' is not a positive integer (expected a list such as 1,16,512)", text,
           entry);
    }
    tokens.push_back(value);
    if (comma == text.size()) return tokens;
    start = comma + 1;
  }
}

std::string_view routing_name(Routing routing) {
  return name_of(routing, kRoutings);
}

std::optional<Routing> parse_routing(std::string_view name) {
  return name_lookup(name, kRoutings);
}

}  // namespace moekit::bench
