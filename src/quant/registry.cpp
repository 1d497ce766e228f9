#include "quant/quant_method.hpp"

namespace moekit {

const std::vector<QuantEntry>& quant_table() {
  static const std::vector<QuantEntry> table = {
      {WeightFormat::f32, unquantized_supports_runner, make_unquantized},
      {WeightFormat::f16, unquantized_supports_runner, make_unquantized},
      {WeightFormat::bf16, unquantized_supports_runner, make_unquantized},
  };
  return table;
}

const QuantEntry* find_quant(WeightFormat format) {
  for (const QuantEntry& entry : quant_table()) {
    if (entry.format == format) return &entry;
  }
  return nullptr;
}

}  // namespace moekit
