// A bias that is a piecewise-linear function, per head, of a feature of the distance scaled per query:
//   bias(b, h, i, j) = slope[h, s] * x + intercept[h, s],  x = feature[e[b] - i + j] / divisor[b, i],
// s = the number of knots below x. FIRE (Li et al. 2023) is f(psi(i - j) / psi(max(L, i))) with f a ReLU MLP of
// one input: exactly piecewise linear, with a knot where each hidden unit turns on. feature falls (weakly) as
// the key moves right, so x does too and each segment is one run of keys: no per-key search.
#pragma once
#include "attention.h"

struct PiecewiseBias {
    const PiecewiseArgs& p;

    // Call run(segment, first, end) for the runs of keys [0, n) with equal segment; x non-increasing.
    template <class Run>
    void runs(const float* x, int64_t n, Run&& run) const {
        const float* knots = p.knots;
        int64_t seg = std::lower_bound(knots, knots + p.n_knots, x[0]) - knots;  // knots below x[0]
        for (int64_t j = 0; j < n;) {
            int64_t end = n;
            if (seg > 0) {  // the run lasts while x > knots[seg - 1]
                const float limit = knots[seg - 1];
                end = std::partition_point(x + j, x + n, [limit](float v) { return v > limit; }) - x;
            }
            if (end > j) run(seg, j, end);
            j = end;
            if (j < n) seg = std::lower_bound(knots, knots + seg, x[j]) - knots;
        }
    }

    float features(float* x, int64_t n, int64_t b, int64_t i, int64_t j0) const {
        const float* f = p.feature + (p.e[b] - i + j0);
        const float div = p.divisor[b * p.divisor_stride_b + i];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) x[j] = f[j] / div;
        return div;
    }

    float add(float* s, int64_t n, float scale, int64_t b, int64_t h, int64_t i, int64_t j0, float* x) const {
        if (n == 0) return -INFINITY;
        features(x, n, b, i, j0);
        const float* slope = p.slope + h * (p.n_knots + 1);
        const float* intercept = p.intercept + h * (p.n_knots + 1);
        runs(x, n, [&](int64_t seg, int64_t first, int64_t end) {
            const float a = slope[seg], c = intercept[seg];
#pragma omp simd
            for (int64_t j = first; j < end; ++j) s[j] = s[j] * scale + (a * x[j] + c);
        });
        return row_max(s, n);
    }

    // Per-thread gradient sums; the caller adds them up.
    struct Grads {
        float *feature, *divisor, *slope, *intercept;
    };

    void backward(const float* ds, int64_t n, int64_t b, int64_t h, int64_t i, int64_t j0, float* x,
                  const Grads& g) const {
        if (n == 0) return;
        const float div = features(x, n, b, i, j0);
        const int64_t K1 = p.n_knots + 1, u0 = p.e[b] - i + j0;
        const float* slope = p.slope + h * K1;
        float d_div = 0.0f;  // x = f / div: dL/ddiv = -sum dx * x / div
        runs(x, n, [&](int64_t seg, int64_t first, int64_t end) {
            const float a = slope[seg], inv = 1.0f / div;
            float sum = 0.0f, sum_x = 0.0f, dx_x = 0.0f;
#pragma omp simd reduction(+ : sum, sum_x, dx_x)
            for (int64_t j = first; j < end; ++j) {
                sum += ds[j];
                sum_x += ds[j] * x[j];
                dx_x += ds[j] * a * x[j];
                g.feature[u0 + j] += ds[j] * a * inv;
            }
            g.slope[h * K1 + seg] += sum_x;
            g.intercept[h * K1 + seg] += sum;
            d_div -= dx_x * inv;
        });
        g.divisor[b * (p.divisor_stride_b ? p.divisor_stride_b : 0) + i] += d_div;
    }
};
