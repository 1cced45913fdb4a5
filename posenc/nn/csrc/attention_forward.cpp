// Flash-style attention forward with a positional bias read from per-head rows (no (H, Tq, Tk) tensor):
//   out_i = sum_j softmax_j(scale * q_i . k_j + bias(i, j)) v_j,  bias(i, j) = row[clamp(e_b - i + j, 0, S - 1)]
// Rows are (B|1, H, Tq|1, S): one row per head for a bias of m - n (ALiBi, KERPLE, T5, Sandwich), one per
// query for a content term (Shaw). Causal: query i (the last Tq of Tk keys) sees keys j <= i + Tk - Tq.
// Optional `mass` (B, H, Tq, S): the softmax weight landing on each row index (Shaw's value term).
#include "common.h"

#include <vector>

namespace {

struct Dims {
    int64_t B, H, Hkv, Tq, Tk, D;
};

struct Block {  // per-thread scratch
    std::vector<float> scores, acc, mass, max, sum;
};

// Scale one row of scores, add its bias, return its maximum over the n valid keys.
float bias_row(float* s, int64_t n, float scale, const float* row, int64_t S, int64_t e_minus_i, int64_t j0) {
    if (row) {
        const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
        const float low = row[0], high = row[S - 1];
        const float* mid = row + span.first - (span.low_end - j0);
        for (int64_t j = 0; j < span.low_end - j0; ++j) s[j] = s[j] * scale + low;
#pragma omp simd
        for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) s[j] = s[j] * scale + mid[j];
        for (int64_t j = span.high_start - j0; j < n; ++j) s[j] = s[j] * scale + high;
        scale = 1.0f;
    }
    float top = -INFINITY;
#pragma omp simd reduction(max : top)
    for (int64_t j = 0; j < n; ++j) {
        s[j] *= scale;
        top = s[j] > top ? s[j] : top;
    }
    return top;
}

// Add each weight of a row to the mass at its row index.
void add_mass(float* mass, const float* p, int64_t S, int64_t e_minus_i, int64_t j0, int64_t n) {
    const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
    float low = 0.0f, high = 0.0f;
#pragma omp simd reduction(+ : low)
    for (int64_t j = 0; j < span.low_end - j0; ++j) low += p[j];
    float* mid = mass + span.first - (span.low_end - j0);
    for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) mid[j] += p[j];
#pragma omp simd reduction(+ : high)
    for (int64_t j = span.high_start - j0; j < n; ++j) high += p[j];
    mass[0] += low;
    mass[S - 1] += high;
}

void query_block(const Dims& d, int64_t b, int64_t h, int64_t q0, int64_t qn, int64_t kv_block, bool causal,
                 float scale, const float* q, const int64_t* qs, const float* k, const int64_t* ks, const float* v,
                 const int64_t* vs, float* out, const int64_t* os, float* lse, const BiasRows& bias, float* mass,
                 const int64_t* ms, Block& w) {
    const int64_t hk = h / (d.H / d.Hkv), D = d.D, S = bias.length;
    const float* qb = q + b * qs[0] + h * qs[1] + q0 * qs[2];
    const float* kb = k + b * ks[0] + hk * ks[1];
    const float* vb = v + b * vs[0] + hk * vs[1];
    const float* rows = bias.data ? bias.data + b * bias.stride_b + h * bias.stride_h : nullptr;
    float* mass_b = mass ? mass + b * ms[0] + h * ms[1] : nullptr;
    std::fill(w.acc.begin(), w.acc.begin() + qn * D, 0.0f);
    std::fill(w.max.begin(), w.max.begin() + qn, -INFINITY);
    std::fill(w.sum.begin(), w.sum.begin() + qn, 0.0f);
    if (mass) std::fill(w.mass.begin(), w.mass.begin() + qn * S, 0.0f);
    const int64_t shift = d.Tk - d.Tq;  // query i sits at key index i + shift
    const int64_t k_end = causal ? std::min(d.Tk, q0 + qn + shift) : d.Tk;
    for (int64_t k0 = 0; k0 < k_end; k0 += kv_block) {
        const int64_t kn = std::min(kv_block, k_end - k0);
        float* s = w.scores.data();
        gemm(false, true, qn, kn, D, 1.0f, qb, qs[2], kb + k0 * ks[2], ks[2], 0.0f, s, kn);
        for (int64_t r = 0; r < qn; ++r) {
            const int64_t i = q0 + r;
            float* sr = s + r * kn;
            const int64_t n = causal ? std::clamp<int64_t>(i + shift - k0 + 1, 0, kn) : kn;
            const float* row = rows ? rows + i * bias.stride_i : nullptr;
            const int64_t e_minus_i = bias.data ? bias.e[b] - i : 0;
            const float top = n ? bias_row(sr, n, scale, row, S, e_minus_i, k0) : -INFINITY;
            const float m_new = std::max(w.max[r], top);
            if (m_new == -INFINITY) { std::fill(sr, sr + kn, 0.0f); continue; }
            const float alpha = exp_nonpositive(w.max[r] - m_new);
            float total = 0.0f;
#pragma omp simd reduction(+ : total)
            for (int64_t j = 0; j < n; ++j) { sr[j] = exp_nonpositive(sr[j] - m_new); total += sr[j]; }
            std::fill(sr + n, sr + kn, 0.0f);
            w.sum[r] = w.sum[r] * alpha + total;
            w.max[r] = m_new;
            if (alpha != 1.0f) {
                for (int64_t c = 0; c < D; ++c) w.acc[r * D + c] *= alpha;
                if (mass) for (int64_t t = 0; t < S; ++t) w.mass[r * S + t] *= alpha;
            }
            if (mass) add_mass(w.mass.data() + r * S, sr, S, e_minus_i, k0, n);
        }
        gemm(false, false, qn, D, kn, 1.0f, s, kn, vb + k0 * vs[2], vs[2], 1.0f, w.acc.data(), D);
    }
    for (int64_t r = 0; r < qn; ++r) {
        const int64_t i = q0 + r;
        const float inv = 1.0f / w.sum[r];
        float* o = out + b * os[0] + h * os[1] + i * os[2];
        for (int64_t c = 0; c < D; ++c) o[c] = w.acc[r * D + c] * inv;
        lse[(b * d.H + h) * d.Tq + i] = w.max[r] + std::log(w.sum[r]);
        if (mass) {
            float* m = mass_b + i * ms[2];
            for (int64_t t = 0; t < S; ++t) m[t] = w.mass[r * S + t] * inv;
        }
    }
}

}  // namespace

// shape = (B, H, Hkv, Tq, Tk, D); *_strides = (b, h, t) in elements, the last dim contiguous.
// lse (B, H, Tq) contiguous. rows/e may be null (plain attention); mass may be null.
extern "C" int posenc_attention_forward(const float* q, const int64_t* q_strides, const float* k,
                                        const int64_t* k_strides, const float* v, const int64_t* v_strides,
                                        float* out, const int64_t* o_strides, float* lse, const int64_t* shape,
                                        float scale, int causal, const float* rows, const int64_t* row_strides,
                                        int64_t row_length, const int64_t* e, float* mass,
                                        const int64_t* mass_strides, int64_t q_block, int64_t kv_block,
                                        int threads) {
    const Dims d{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]};
    const BiasRows bias{rows, rows ? row_strides[0] : 0, rows ? row_strides[1] : 0, rows ? row_strides[2] : 0,
                        row_length, e};
    const int64_t q_blocks = (d.Tq + q_block - 1) / q_block, tasks = d.B * d.H * q_blocks;
#pragma omp parallel num_threads(threads) if (threads > 1 && tasks > 1)
    {
        const FlushDenormals flush;
        const int saved = blas_threads_local(1);
        Block w;
        w.scores.resize(q_block * kv_block);
        w.acc.resize(q_block * d.D);
        w.max.resize(q_block);
        w.sum.resize(q_block);
        if (mass) w.mass.resize(q_block * row_length);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t qb = task % q_blocks, bh = task / q_blocks;
            const int64_t q0 = causal ? (q_blocks - 1 - qb) * q_block : qb * q_block;  // longest first
            query_block(d, bh / d.H, bh % d.H, q0, std::min(q_block, d.Tq - q0), kv_block, causal, scale, q,
                        q_strides, k, k_strides, v, v_strides, out, o_strides, lse, bias, mass, mass_strides, w);
        }
        blas_threads_local(saved);
    }
    return 0;
}
