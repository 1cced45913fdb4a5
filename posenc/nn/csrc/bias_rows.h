// The bias read from rows: bias(b, h, i, j) = rows[b, h, i, clamp(e[b] - i + j, 0, S - 1)].
// One row per head (a bias of m - n) or one per query (a content term); optional softmax mass per row index.
#pragma once
#include "attention.h"

struct RowBias {
    const float* data;
    int64_t stride_b, stride_h, stride_i, length;  // stride 0 on an axis shares the row over it
    const int64_t* e;                                // per batch row b
    float* grad;                                     // backward: d rows, same strides (or a per-thread copy)
    int64_t grad_stride_b, grad_stride_h, grad_stride_i;

    const float* row(int64_t b, int64_t h, int64_t i) const {
        return data + b * stride_b + h * stride_h + i * stride_i;
    }

    // s[j] = scale * s[j] + bias for the n valid keys of query i from key j0; returns their maximum.
    float add(float* s, int64_t n, float scale, int64_t b, int64_t h, int64_t i, int64_t j0) const {
        return add_row(row(b, h, i), length, e[b] - i, s, n, scale, j0);
    }

    // add() with the query's row r (S = length values) given.
    static float add_row(const float* r, int64_t length, int64_t e_minus_i, float* s, int64_t n, float scale,
                         int64_t j0) {
        const RowSpan span = row_span(e_minus_i, length, j0, j0 + n);
        const float low = r[0], high = r[length - 1];
        const float* mid = r + span.first - (span.low_end - j0);
        for (int64_t j = 0; j < span.low_end - j0; ++j) s[j] = s[j] * scale + low;
#pragma omp simd
        for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) s[j] = s[j] * scale + mid[j];
        for (int64_t j = span.high_start - j0; j < n; ++j) s[j] = s[j] * scale + high;
        return row_max(s, n);
    }

    // Backward: add dS of query i's valid keys to d rows (grad_base: this thread's copy when rows are shared
    // over the batch, whose b stride is 0 anyway).
    void backward(const float* ds, int64_t n, int64_t b, int64_t h, int64_t i, int64_t j0, float* grad_base) const {
        float* g = grad_base + b * grad_stride_b + h * grad_stride_h + i * grad_stride_i;
        scatter_to_row(g, ds, length, e[b] - i, j0, n);
    }

    // Add each value of one row of keys to the row index it reads (the transpose of the bias read).
    static void scatter_to_row(float* target, const float* values, int64_t S, int64_t e_minus_i, int64_t j0,
                               int64_t n) {
        const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
        float low = 0.0f, high = 0.0f;
#pragma omp simd reduction(+ : low)
        for (int64_t j = 0; j < span.low_end - j0; ++j) low += values[j];
        float* mid = target + span.first - (span.low_end - j0);
#pragma omp simd
        for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) mid[j] += values[j];
#pragma omp simd reduction(+ : high)
        for (int64_t j = span.high_start - j0; j < n; ++j) high += values[j];
        target[0] += low;
        target[S - 1] += high;
    }

    // dP += dmass at each key's row index (the transpose of accumulating the mass).
    static void gather_from_row(float* dp, const float* dmass, int64_t S, int64_t e_minus_i, int64_t j0, int64_t n) {
        const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
        const float* mid = dmass + span.first - (span.low_end - j0);
        for (int64_t j = 0; j < span.low_end - j0; ++j) dp[j] += dmass[0];
#pragma omp simd
        for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) dp[j] += mid[j];
        for (int64_t j = span.high_start - j0; j < n; ++j) dp[j] += dmass[S - 1];
    }
};

inline RowBias row_bias(const RowArgs& r) {
    const int64_t* s = r.strides;
    return RowBias{r.rows, s[0], s[1], s[2], r.length, r.e, r.grad, s[0], s[1], s[2]};
}
