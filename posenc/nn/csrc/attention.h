// The arguments of the attention kernels, as C structs that posenc/nn/fused_attention.py mirrors with ctypes.
// q (B, H, Tq, D), k and v (B, Hkv, Tk, D): float32, (b, h, t) strides in elements (0 on a size-1 axis), the
// last dim contiguous. The Tq queries are the last Tq of the Tk keys (causal: query i sees keys j <= i + Tk - Tq).
#pragma once
#include "common.h"

struct Attention {
    const float *q, *k, *v;
    float *out, *lse;  // out like q; lse (B, H, Tq) contiguous: log-sum-exp per query (forward: null skips it)
    const float* dout;  // backward only, then:
    float *dq, *dk, *dv;  // zero-filled by the caller (accumulated)
    int64_t q_strides[3], k_strides[3], v_strides[3], o_strides[3], do_strides[3], dq_strides[3], dk_strides[3],
        dv_strides[3];
    int64_t B, H, Hkv, Tq, Tk, D;
    float scale;
    int32_t causal;
    int64_t q_block, kv_block;
    int32_t threads;

    const float* at(const float* base, const int64_t* s, int64_t b, int64_t h, int64_t t) const {
        return base + b * s[0] + h * s[1] + t * s[2];
    }
    float* at(float* base, const int64_t* s, int64_t b, int64_t h, int64_t t) const {
        return base + b * s[0] + h * s[1] + t * s[2];
    }
    int64_t kv_head(int64_t h) const { return h / (H / Hkv); }
    int64_t shift() const { return Tk - Tq; }
    // Keys [k0, k0 + kn) that query i sees.
    int64_t valid(int64_t i, int64_t k0, int64_t kn) const {
        return causal ? std::clamp<int64_t>(i + shift() - k0 + 1, 0, kn) : kn;
    }
    int64_t key_end(int64_t q0, int64_t qn) const { return causal ? std::min(Tk, q0 + qn + shift()) : Tk; }
};

// Row bias arguments (bias_rows.h): rows (B|1, H, Tq|1, S), e (B,); mass (B, H, Tq, S) or null.
// Forward only, without rows: table (H|1, S, D) forms each query's row in the kernel, row = table_scale * (q +
// row_shift[h]) . table (Shaw's q . a^K, Transformer-XL's (q + v) . W_R R: a decode step's product less), values
// (S, D) adds sum_t mass_t values[t] to the output (Shaw's value term) without writing the mass, and q_shift (H, D)
// shifts the query of the content scores (Transformer-XL's u).
struct RowArgs {
    const float* rows;
    int64_t strides[3];
    int64_t length;
    const int64_t* e;
    float* grad;  // backward: d rows, contiguous like rows (or null); the kernel writes every entry
    float* mass;  // forward: softmax mass per row index (or null)
    const float* dmass;  // backward: its gradient (or null)
    int64_t mass_strides[3];
    const float* table;  // forward, rows null: (H|1, S, D), rows of D contiguous
    int64_t table_stride_h;  // 0: one table for every head
    float table_scale;
    const float* values;  // forward: (S, D) contiguous (or null)
    const float *row_shift, *q_shift;  // forward with a table: (H, D) contiguous (or null)
};

// Piecewise-linear bias arguments (bias_piecewise.h).
struct PiecewiseArgs {
    const float* feature;  // (S,) over r = n - m, non-increasing along r
    int64_t length;
    const int64_t* e;  // (B,): key j of query i reads feature[e[b] - i + j]
    const float* divisor;  // (B|1, Tq): x = feature / divisor
    int64_t divisor_stride_b, divisor_rows;
    const float* knots;  // (K,) ascending
    int64_t n_knots;
    const float *slope, *intercept;  // (H, K + 1) contiguous
    float *d_feature, *d_divisor, *d_slope, *d_intercept;  // backward, zero-filled, contiguous
};
