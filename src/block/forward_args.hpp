#pragma once
// The checks of forward()'s arguments that need no pass over their values: shapes, dtypes,
// devices, layouts, the batch limit, and that the output shares no memory with an input. The
// same for every device (they read only the views); the values are the checks stage's.

#include "moekit/layer.hpp"

namespace moekit {

// Throws invalid_argument naming the argument and what is wrong with it.
void check_forward_arguments(const Plan& plan, const TensorView& hidden, const TensorView& logits,
                             const TensorView& output, const RoutingResult* routing);

}  // namespace moekit
