// The aggregate lm-evaluation-harness reports for per-document scores: the mean and its standard
// error (sample standard deviation / sqrt(n)).
#pragma once

#include <cmath>
#include <limits>
#include <vector>

namespace megatron::eval {

// numpy's mean: summed, then divided.
inline double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? std::numeric_limits<double>::quiet_NaN() : sum / double(values.size());
}

// lm-eval's mean_stderr; NaN with fewer than two values (lm-eval prints N/A).
inline double mean_stderr(const std::vector<double>& values) {
  if (values.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double n = double(values.size()), m = mean(values);
  double squares = 0;
  for (double v : values) squares += (v - m) * (v - m);
  return std::sqrt(squares / (n - 1)) / std::sqrt(n);
}

}  // namespace megatron::eval
