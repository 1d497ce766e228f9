#pragma once
// The oracle's router: float64, written apart from src/routing from the definitions in
// docs/ARCHITECTURE.md ("Semantics"). Scores by softmax, sigmoid or sqrt(softplus); the choice
// adds the correction bias, the weights do not; with groups, a group scores its best choice
// (max) or its two best (top2_sum) and the best topk_group groups are kept; top-k by choice,
// ties to the lower id; weights renormalised if asked, then times routed_scaling_factor.
//
// The layer routes in float32, so where two choices (or two groups) lie within kTieTolerance of
// each other at the edge of the selection, either one is a right answer: the check accepts the
// layer's set there, and the oracle then computes that token with the layer's set (and its own
// weights for it), so that the output comparison judges the experts, not the tie.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/spec.hpp"

namespace moekit::test {

// Choices this close (relative to the larger of 1 and the value) tie: float32 routing moves a
// sigmoid or softmax score by about 1e-7.
inline constexpr double kTieTolerance = 1e-6;
// Reported weights must match the oracle's within this, relative to the larger of 1 and the
// weight.
inline constexpr double kRoutingWeightTolerance = 1e-6;

inline std::vector<double> float64_values(const TensorView& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, t.numel(), f.data());
  return {f.begin(), f.end()};
}

inline std::vector<double> routing_scores(Scoring scoring, const double* logits, int n) {
  std::vector<double> s(static_cast<size_t>(n));
  switch (scoring) {
    case Scoring::softmax: {
      const double top = *std::max_element(logits, logits + n);
      double total = 0.0;
      for (int e = 0; e < n; ++e) total += s[e] = std::exp(logits[e] - top);
      for (double& v : s) v /= total;
      break;
    }
    case Scoring::sigmoid:
      for (int e = 0; e < n; ++e) s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
      break;
    case Scoring::sqrt_softplus:
      for (int e = 0; e < n; ++e) {
        const double x = logits[e];
        s[e] = std::sqrt(x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)));
      }
      break;
  }
  return s;
}

// Which `count` of `candidates` a ranking by `value` keeps, ties to the lower id: `kept` best
// first. Where the last kept and the first dropped tie (kTieTolerance), any `count` of
// `mandatory` + `optional` that holds all of `mandatory` is as right.
struct Selection {
  std::vector<int> kept;
  std::vector<int> mandatory;
  std::vector<int> optional;
};

inline bool ties(double a, double b) {
  return std::fabs(a - b) <= kTieTolerance * std::max({1.0, std::fabs(a), std::fabs(b)});
}

inline Selection select_best(const std::vector<double>& value, std::vector<int> candidates,
                             int count) {
  std::sort(candidates.begin(), candidates.end(),
            [&](int a, int b) { return value[a] != value[b] ? value[a] > value[b] : a < b; });
  Selection s;
  s.kept.assign(candidates.begin(), candidates.begin() + count);
  const bool tie = count < static_cast<int>(candidates.size()) &&
                   ties(value[candidates[count - 1]], value[candidates[count]]);
  if (!tie) {
    s.mandatory = s.kept;
    return s;
  }
  const double last = value[candidates[count - 1]], first_dropped = value[candidates[count]];
  for (int c : candidates) {
    if (value[c] > last && !ties(value[c], last)) {
      s.mandatory.push_back(c);
    } else if (value[c] >= first_dropped || ties(value[c], first_dropped)) {
      s.optional.push_back(c);
    }
  }
  return s;
}

// Whether `chosen` (distinct ids) is one of the sets a selection allows.
inline bool allows(const Selection& s, const std::vector<int>& chosen) {
  if (chosen.size() != s.kept.size()) return false;
  const auto in = [](const std::vector<int>& v, int x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  for (int m : s.mandatory) {
    if (!in(chosen, m)) return false;
  }
  for (int c : chosen) {
    if (!in(s.mandatory, c) && !in(s.optional, c)) return false;
  }
  return true;
}

// Every set of `count` groups a group selection allows: its mandatory groups and each
// combination of its optional ones.
inline std::vector<std::vector<int>> allowed_sets(const Selection& s) {
  std::vector<std::vector<int>> sets;
  const int need = static_cast<int>(s.kept.size() - s.mandatory.size());
  std::vector<int> pick = s.mandatory;
  const auto extend = [&](auto&& self, size_t from) -> void {
    if (static_cast<int>(pick.size() - s.mandatory.size()) == need) {
      sets.push_back(pick);
      return;
    }
    for (size_t i = from; i < s.optional.size(); ++i) {
      pick.push_back(s.optional[i]);
      self(self, i + 1);
      pick.pop_back();
    }
  };
  extend(extend, 0);
  return sets;
}

// One token routed by the oracle: its scores, choices, and the selection of groups and experts.
class TokenRouter {
 public:
  TokenRouter(const RoutingSpec& spec, int n_experts, const double* logits, const double* bias)
      : spec_(spec), n_(n_experts), score_(routing_scores(spec.scoring, logits, n_experts)) {
    choice_ = score_;
    if (bias) {
      for (int e = 0; e < n_; ++e) choice_[e] += bias[e];
    }
  }

  // The oracle's own experts, best choice first.
  std::vector<int> experts() const {
    return select_best(choice_, candidates(groups().kept), spec_.top_k).kept;
  }

  // Whether `chosen` is a right answer: the oracle's own set, or another that ties allow.
  bool allows(const std::vector<int>& chosen) const {
    for (const std::vector<int>& kept : allowed_sets(groups())) {
      if (test::allows(select_best(choice_, candidates(kept), spec_.top_k), chosen)) return true;
    }
    return false;
  }

  // The weights of `chosen`: unbiased scores, renormalised if asked, scaled.
  std::vector<double> weights(const std::vector<int>& chosen) const {
    std::vector<double> w;
    double total = 0.0;
    for (int e : chosen) total += w.emplace_back(score_[e]);
    for (double& v : w) {
      if (spec_.renormalize && total > 0.0) v /= total;
      v *= spec_.routed_scaling_factor;
    }
    return w;
  }

 private:
  int group_size() const { return n_ / std::max(1, spec_.n_group); }

  Selection groups() const {
    if (spec_.n_group <= 1) return {{0}, {0}, {}};
    const int size = group_size();
    std::vector<double> value(static_cast<size_t>(spec_.n_group));
    for (int g = 0; g < spec_.n_group; ++g) {
      std::vector<double> members(choice_.begin() + g * size, choice_.begin() + (g + 1) * size);
      std::sort(members.begin(), members.end(), std::greater<>());
      value[g] = spec_.group_score == GroupScore::max ? members[0] : members[0] + members[1];
    }
    std::vector<int> all(static_cast<size_t>(spec_.n_group));
    std::iota(all.begin(), all.end(), 0);
    return select_best(value, all, spec_.topk_group);
  }

  // The experts of the kept groups (every expert when ungrouped).
  std::vector<int> candidates(const std::vector<int>& kept_groups) const {
    std::vector<int> c;
    if (spec_.n_group <= 1) {
      c.resize(static_cast<size_t>(n_));
      std::iota(c.begin(), c.end(), 0);
      return c;
    }
    const int size = group_size();
    for (int g : kept_groups) {
      for (int e = g * size; e < (g + 1) * size; ++e) c.push_back(e);
    }
    return c;
  }

  const RoutingSpec& spec_;
  int n_;
  std::vector<double> score_;
  std::vector<double> choice_;
};

// The oracle's routing of a batch: logical expert ids and weights [T, top_k], and where the
// routing the layer reported differs from it (beyond ties), one line per token.
struct OracleRouting {
  int64_t top_k = 0;
  std::vector<int32_t> ids;
  std::vector<double> weights;
  std::vector<std::string> disagreements;

  // The layer's reported routing agrees: the same experts per token (ties aside), weights
  // within kRoutingWeightTolerance.
  ::testing::AssertionResult agrees() const {
    if (disagreements.empty()) return ::testing::AssertionSuccess();
    ::testing::AssertionResult failure = ::testing::AssertionFailure();
    failure << disagreements.size() << " tokens routed differently from the oracle:";
    for (size_t i = 0; i < std::min<size_t>(disagreements.size(), 8); ++i) {
      failure << "\n  " << disagreements[i];
    }
    return failure;
  }
};

inline std::string id_list(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

// Routes `logits` [T, E] by `spec` with `correction_bias` ([E], when the spec has one) and checks
// the routing a layer reported for them (ids and weights [T, top_k]; none: nothing to check).
inline OracleRouting oracle_routing(const ModelSpec& spec, const TensorView& correction_bias,
                                    const TensorView& logits, const std::vector<int32_t>& ids,
                                    const std::vector<float>& weights) {
  const int E = spec.n_experts, k = spec.routing.top_k;
  const int64_t T = logits.dim(0);
  const std::vector<double> x = float64_values(logits);
  const std::vector<double> bias =
      spec.routing.correction_bias ? float64_values(correction_bias) : std::vector<double>();
  OracleRouting r{k,
                  std::vector<int32_t>(static_cast<size_t>(T * k)),
                  std::vector<double>(static_cast<size_t>(T * k)),
                  {}};
  for (int64_t t = 0; t < T; ++t) {
    const TokenRouter router(spec.routing, E, &x[t * E], bias.empty() ? nullptr : bias.data());
    std::vector<int> chosen = router.experts();
    if (ids.empty()) {
      const std::vector<double> w = router.weights(chosen);
      std::copy(chosen.begin(), chosen.end(), r.ids.begin() + t * k);
      std::copy(w.begin(), w.end(), r.weights.begin() + t * k);
      continue;
    }
    const std::vector<int> reported(ids.begin() + t * k, ids.begin() + (t + 1) * k);
    std::vector<int> own_sorted = chosen, reported_sorted = reported;
    std::sort(own_sorted.begin(), own_sorted.end());
    std::sort(reported_sorted.begin(), reported_sorted.end());
    const bool distinct =
        std::adjacent_find(reported_sorted.begin(), reported_sorted.end()) == reported_sorted.end();
    const bool same = own_sorted == reported_sorted;
    if (same || (distinct && router.allows(reported))) {
      chosen = reported;
    } else {
      r.disagreements.push_back(fmt::format("token {}: experts {}, the oracle's {}", t,
                                            id_list(reported), id_list(chosen)));
    }
    const std::vector<double> w = router.weights(chosen);
    for (int j = 0; j < k; ++j) {
      r.ids[t * k + j] = chosen[j];
      r.weights[t * k + j] = w[j];
      const double got = weights[t * k + j];
      if (chosen == reported &&
          !(std::fabs(got - w[j]) <= kRoutingWeightTolerance * std::max(1.0, std::fabs(w[j])))) {
        r.disagreements.push_back(
            fmt::format("token {} expert {}: weight {}, the oracle's {}", t, chosen[j], got, w[j]));
      }
    }
  }
  return r;
}

inline OracleRouting oracle_routing(const ModelSpec& spec, const TensorView& correction_bias,
                                    const TensorView& logits) {
  return oracle_routing(spec, correction_bias, logits, {}, {});
}

}  // namespace moekit::test
