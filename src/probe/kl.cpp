// Log-softmax, KL divergence and percentiles (kl.h).
#include "probe/kl.h"

#include <algorithm>
#include <cmath>

namespace lamina::probe {

void LogSoftmax(const float* x, int n, std::vector<double>& out) {
  out.resize(n);
  const float max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  const double lse = max + std::log(sum);
  for (int i = 0; i < n; ++i) out[i] = x[i] - lse;
}

double KlDivergence(const float* p_logits, const float* q_logits, int n, std::vector<double>& lp,
                    std::vector<double>& lq) {
  LogSoftmax(p_logits, n, lp);
  LogSoftmax(q_logits, n, lq);
  double k = 0.0;
  for (int v = 0; v < n; ++v) k += std::exp(lp[v]) * (lp[v] - lq[v]);
  return std::max(0.0, k);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t idx =
      static_cast<size_t>(std::min<double>(v.size() - 1, std::floor(q * (v.size() - 1) + 0.5)));
  return v[idx];
}

}  // namespace lamina::probe
