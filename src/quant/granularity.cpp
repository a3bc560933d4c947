// W4A4 granularity chosen per layer from ρ (quant_algorithms.h): the time model, the greedy
// planner of the mixed mode, and the per-layer error it ranks by.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "common/check.h"
#include "cpu/view_access.h"
#include "nibble/formats.h"
#include "nibble/quant_algorithms.h"
#include "nibble/quantize.h"
#include "nibble/tensor.h"

namespace nibble {

double w4a4_group_time_factor(int rho) { return 1.0 + rho / 64.0; }

GranularityPlan plan_w4a4_granularity(const std::vector<GranularityLayer>& layers, int rho,
                                      double budget) {
  const detail::ArgCheck check("plan_w4a4_granularity");
  check.condition(rho > 0, "rho",
                  "must be positive (tensor_core_ratio of the target GPU), got " +
                      std::to_string(rho));
  check.condition(std::isfinite(budget) && budget >= 0, "budget",
                  "must be a finite fraction >= 0 of the all-per-channel time, got " +
                      std::to_string(budget));
  for (size_t i = 0; i < layers.size(); ++i) {
    const GranularityLayer& l = layers[i];
    check.condition(l.n > 0 && l.k > 0, "layers",
                    "must have positive n and k, got " + std::to_string(l.n) + "x" +
                        std::to_string(l.k) + " at layer " + std::to_string(i) + " (" + l.name +
                        ")");
    check.condition(std::isfinite(l.error_per_channel) && std::isfinite(l.error_group) &&
                        l.error_per_channel >= 0 && l.error_group >= 0,
                    "layers", "must have finite errors >= 0, got " +
                                  std::to_string(l.error_per_channel) + " and " +
                                  std::to_string(l.error_group) + " at layer " +
                                  std::to_string(i) + " (" + l.name + ")");
  }
  GranularityPlan plan;
  plan.rho = rho;
  plan.budget = budget;
  plan.group_factor = w4a4_group_time_factor(rho);
  double base_time = 0;  // MACs of the all-per-channel model
  for (const GranularityLayer& l : layers) {
    base_time += static_cast<double>(l.n) * static_cast<double>(l.k);
    plan.error_per_channel += l.error_per_channel;
    plan.error_group += l.error_group;
    GranularityChoice c;
    c.name = l.name;
    c.error_gain = l.error_per_channel - l.error_group;
    c.added_time = static_cast<double>(l.n) * static_cast<double>(l.k) * (plan.group_factor - 1);
    plan.layers.push_back(c);
  }
  // Greedy by gain per unit of added time (a knapsack's ratio rule); a stable order makes ties
  // go to the earlier layer.
  std::vector<size_t> order(layers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan.layers[a].error_gain / plan.layers[a].added_time >
           plan.layers[b].error_gain / plan.layers[b].added_time;
  });
  const double allowed = budget * base_time;
  double added = 0;
  for (const size_t i : order) {
    GranularityChoice& c = plan.layers[i];
    if (c.error_gain <= 0) continue;
    if (added + c.added_time > allowed) continue;  // a smaller layer further down may still fit
    c.group = true;
    added += c.added_time;
  }
  plan.time_vs_per_channel = base_time > 0 ? 1.0 + added / base_time : 1.0;
  for (size_t i = 0; i < layers.size(); ++i)
    plan.error += plan.layers[i].group ? layers[i].error_group : layers[i].error_per_channel;
  return plan;
}

std::string GranularityPlan::describe() const {
  size_t groups = 0;
  for (const GranularityChoice& c : layers) groups += c.group ? 1 : 0;
  char head[512];
  std::snprintf(head, sizeof head,
                "W4A4 mixed granularity: rho = %d, a g128 layer is modelled at %.3fx its "
                "per-channel time; budget %.1f%% over all-per-channel. %zu of %zu layers g128: "
                "modelled time %.3fx all-per-channel, summed error %.4g (all per channel %.4g, "
                "all g128 %.4g)",
                rho, group_factor, 100 * budget, groups, layers.size(), time_vs_per_channel, error,
                error_per_channel, error_group);
  std::string s = head;
  for (const GranularityChoice& c : layers) {
    char line[256];
    std::snprintf(line, sizeof line, "\n  %s: %s (error gain %.4g for %.3g extra MACs)",
                  c.name.c_str(), c.group ? "w4a4_g128" : "w4a4_pc", c.error_gain,
                  c.added_time);
    s += line;
  }
  return s;
}

double weight_quantization_error(const TensorView& w, const WeightFormat& format,
                                 std::span<const float> input_mean_square) {
  const detail::ArgCheck check("weight_quantization_error");
  check.tensor(w, "w", 2);
  check.dtype(w, "w", {DType::f32, DType::f16, DType::bf16});
  check.rows_packed(w, "w");
  check.device(w, "w", Device::cpu());
  const int64_t n = w.size(0), k = w.size(1);
  check.condition(input_mean_square.empty() || static_cast<int64_t>(input_mean_square.size()) == k,
                  "input_mean_square",
                  "must be empty or hold K = " + std::to_string(k) + " values, got " +
                      std::to_string(input_mean_square.size()));
  for (const float v : input_mean_square)
    if (!(std::isfinite(v) && v >= 0))  // (the message is built only on failure)
      check.fail("input_mean_square", "must hold finite values >= 0, got " + std::to_string(v));
  QuantizedWeight q(format, n, k);  // quantize_weight checks the format against the shape
  quantize_weight(w, q.view());
  Tensor deq = Tensor::empty(DType::f32, {n, k});
  dequantize_weight(q.view(), deq.view());
  const float* d = deq.view().ptr<float>();
  double err = 0, ref = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const double weight = input_mean_square.empty() ? 1.0 : input_mean_square[size_t(c)];
      const double x = cpu::get_float(w, r, c), e = x - d[r * k + c];
      err += weight * e * e;
      ref += weight * x * x;
    }
  return ref > 0 ? err / ref : 0.0;
}

}  // namespace nibble
