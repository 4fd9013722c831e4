// Distribution math shared by the probe and `lamina score`: log-softmax of a logit row, KL
// divergence between two logit rows, and percentiles of a sample.
#pragma once

#include <vector>

namespace lamina::probe {

// log-softmax of x[0..n) into out (resized to n); double precision so tiny KLs stay exact.
void LogSoftmax(const float* x, int n, std::vector<double>& out);

// KL(p || q) of the distributions the two logit rows define, clamped at 0; lp and lq are
// scratch.
double KlDivergence(const float* p_logits, const float* q_logits, int n, std::vector<double>& lp,
                    std::vector<double>& lq);

// The q-quantile (0..1, nearest rank) of v; 0 when empty.
double Percentile(std::vector<double> v, double q);

}  // namespace lamina::probe
