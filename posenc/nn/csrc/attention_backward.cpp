// Backward of attention_forward.cpp, flash style: P is recomputed per block from q, k, the bias row and the
// saved log-sum-exp, so no (Tq, Tk) tensor is stored. One task per (batch, key/value head) owns dk, dv of
// that head (GQA: the query heads of its group run in the same task).
//   dP = dO v^T (+ dmass at each key's row index), dS = P * (dP - delta_i), delta_i = dO_i . O_i (+ dmass_i . mass_i)
//   dq += scale dS k, dk += scale dS^T q, dv += P^T dO, drow[index(i, j)] += dS_ij
#include "common.h"

#include <vector>

namespace {

struct Dims {
    int64_t B, H, Hkv, Tq, Tk, D;
};

struct Tensor3 {  // a (B, H, T, D) float tensor: data and (b, h, t) strides
    const float* data;
    const int64_t* strides;
    const float* at(int64_t b, int64_t h, int64_t t) const {
        return data + b * strides[0] + h * strides[1] + t * strides[2];
    }
};

struct Grad3 {
    float* data;
    const int64_t* strides;
    float* at(int64_t b, int64_t h, int64_t t) const { return data + b * strides[0] + h * strides[1] + t * strides[2]; }
};

// Add each gradient of a row to its row index (the transpose of the forward's bias read).
void add_row_grad(float* grad, const float* ds, int64_t S, int64_t e_minus_i, int64_t j0, int64_t n) {
    const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
    float low = 0.0f, high = 0.0f;
#pragma omp simd reduction(+ : low)
    for (int64_t j = 0; j < span.low_end - j0; ++j) low += ds[j];
    float* mid = grad + span.first - (span.low_end - j0);
    for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) mid[j] += ds[j];
#pragma omp simd reduction(+ : high)
    for (int64_t j = span.high_start - j0; j < n; ++j) high += ds[j];
    grad[0] += low;
    grad[S - 1] += high;
}

// The forward's weights of one row: exp(scale * s + bias - lse).
void weights_row(float* s, int64_t n, int64_t kn, float scale, const float* row, int64_t S, int64_t e_minus_i,
                 int64_t j0, float lse) {
    if (row) {
        const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
        const float* mid = row + span.first - (span.low_end - j0);
        for (int64_t j = 0; j < span.low_end - j0; ++j) s[j] = s[j] * scale + row[0];
        for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) s[j] = s[j] * scale + mid[j];
        for (int64_t j = span.high_start - j0; j < n; ++j) s[j] = s[j] * scale + row[S - 1];
        for (int64_t j = 0; j < n; ++j) s[j] = exp_nonpositive(s[j] - lse);
    } else {
        for (int64_t j = 0; j < n; ++j) s[j] = exp_nonpositive(s[j] * scale - lse);
    }
    std::fill(s + n, s + kn, 0.0f);
}

// dP += dmass at each key's row index (the transpose of the forward's add_mass).
void add_mass_grad(float* dp, const float* dmass, int64_t S, int64_t e_minus_i, int64_t j0, int64_t n) {
    const RowSpan span = row_span(e_minus_i, S, j0, j0 + n);
    const float* mid = dmass + span.first - (span.low_end - j0);
    for (int64_t j = 0; j < span.low_end - j0; ++j) dp[j] += dmass[0];
    for (int64_t j = span.low_end - j0; j < span.high_start - j0; ++j) dp[j] += mid[j];
    for (int64_t j = span.high_start - j0; j < n; ++j) dp[j] += dmass[S - 1];
}

struct Scratch {
    std::vector<float> p, dp, delta;
};

struct Args {
    Dims d;
    float scale;
    bool causal;
    int64_t q_block, kv_block;
    Tensor3 q, k, v, out, dout, mass, dmass;
    Grad3 dq, dk, dv;
    const float* lse;
    BiasRows bias;
    float* drow;
    const int64_t* drow_strides;
};

void head_backward(const Args& a, int64_t b, int64_t h, float* drow, Scratch& w) {
    const Dims& d = a.d;
    const int64_t hk = h / (d.H / d.Hkv), D = d.D, S = a.bias.length, shift = d.Tk - d.Tq;
    const float* rows = a.bias.data ? a.bias.data + b * a.bias.stride_b + h * a.bias.stride_h : nullptr;
    for (int64_t i = 0; i < d.Tq; ++i) {  // delta_i = sum_j P_ij dP_ij
        const float* o = a.out.at(b, h, i);
        const float* g = a.dout.at(b, h, i);
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t c = 0; c < D; ++c) acc += o[c] * g[c];
        if (a.dmass.data) {
            const float* m = a.mass.at(b, h, i);
            const float* gm = a.dmass.at(b, h, i);
            for (int64_t t = 0; t < S; ++t) acc += m[t] * gm[t];
        }
        w.delta[i] = acc;
    }
    for (int64_t q0 = 0; q0 < d.Tq; q0 += a.q_block) {
        const int64_t qn = std::min(a.q_block, d.Tq - q0);
        const int64_t k_end = a.causal ? std::min(d.Tk, q0 + qn + shift) : d.Tk;
        for (int64_t k0 = 0; k0 < k_end; k0 += a.kv_block) {
            const int64_t kn = std::min(a.kv_block, k_end - k0);
            float* p = w.p.data();
            float* dp = w.dp.data();
            gemm(false, true, qn, kn, D, 1.0f, a.q.at(b, h, q0), a.q.strides[2], a.k.at(b, hk, k0), a.k.strides[2],
                 0.0f, p, kn);
            gemm(false, true, qn, kn, D, 1.0f, a.dout.at(b, h, q0), a.dout.strides[2], a.v.at(b, hk, k0),
                 a.v.strides[2], 0.0f, dp, kn);
            for (int64_t r = 0; r < qn; ++r) {
                const int64_t i = q0 + r;
                const int64_t n = a.causal ? std::clamp<int64_t>(i + shift - k0 + 1, 0, kn) : kn;
                const int64_t e_minus_i = a.bias.data ? a.bias.e[b] - i : 0;
                const float* row = rows ? rows + i * a.bias.stride_i : nullptr;
                float* pr = p + r * kn;
                float* dpr = dp + r * kn;
                weights_row(pr, n, kn, a.scale, row, S, e_minus_i, k0, a.lse[(b * d.H + h) * d.Tq + i]);
                if (a.dmass.data) add_mass_grad(dpr, a.dmass.at(b, h, i), S, e_minus_i, k0, n);
                const float delta = w.delta[i];
                for (int64_t j = 0; j < kn; ++j) dpr[j] = pr[j] * (dpr[j] - delta);  // dS, 0 where masked
                if (drow) add_row_grad(drow + i * a.drow_strides[2], dpr, S, e_minus_i, k0, n);
            }
            gemm(true, false, kn, D, qn, 1.0f, p, kn, a.dout.at(b, h, q0), a.dout.strides[2], 1.0f,
                 a.dv.at(b, hk, k0), a.dv.strides[2]);
            gemm(false, false, qn, D, kn, a.scale, dp, kn, a.k.at(b, hk, k0), a.k.strides[2], 1.0f,
                 a.dq.at(b, h, q0), a.dq.strides[2]);
            gemm(true, false, kn, D, qn, a.scale, dp, kn, a.q.at(b, h, q0), a.q.strides[2], 1.0f,
                 a.dk.at(b, hk, k0), a.dk.strides[2]);
        }
    }
}

}  // namespace

// Gradients dq, dk, dv must be zero-filled by the caller (they are accumulated). drow (same extent as rows,
// strides drow_strides; may be null) is accumulated too; when rows are shared over the batch (row stride 0
// on b) each thread sums into its own copy first. dmass/mass may be null.
extern "C" int posenc_attention_backward(
    const float* q, const int64_t* q_strides, const float* k, const int64_t* k_strides, const float* v,
    const int64_t* v_strides, const float* out, const int64_t* o_strides, const float* dout,
    const int64_t* do_strides, const float* lse, float* dq, const int64_t* dq_strides, float* dk,
    const int64_t* dk_strides, float* dv, const int64_t* dv_strides, const int64_t* shape, float scale, int causal,
    const float* rows, const int64_t* row_strides, int64_t row_length, const int64_t* e, float* drow,
    const int64_t* drow_strides, const float* mass, const float* dmass, const int64_t* mass_strides,
    int64_t q_block, int64_t kv_block, int threads) {
    Args a{{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]}, scale, causal != 0, q_block, kv_block,
           {q, q_strides}, {k, k_strides}, {v, v_strides}, {out, o_strides}, {dout, do_strides},
           {mass, mass_strides}, {dmass, mass_strides}, {dq, dq_strides}, {dk, dk_strides}, {dv, dv_strides}, lse,
           {rows, rows ? row_strides[0] : 0, rows ? row_strides[1] : 0, rows ? row_strides[2] : 0, row_length, e},
           drow, drow_strides};
    const Dims& d = a.d;
    const int64_t tasks = d.B * d.Hkv, group = d.H / d.Hkv;
    const bool shared = drow && drow_strides[0] == 0 && d.B > 1;  // one row for every batch row: private sums
    const int64_t per_thread = shared ? d.H * drow_strides[1] : 0;
    std::vector<float> partial(shared ? per_thread * threads : 0, 0.0f);
#pragma omp parallel num_threads(threads) if (threads > 1 && tasks > 1)
    {
        const FlushDenormals flush;
        const int saved = blas_threads_local(1);
        Scratch w;
        w.p.resize(q_block * kv_block);
        w.dp.resize(q_block * kv_block);
        w.delta.resize(d.Tq);
        float* mine = shared ? partial.data() + omp_get_thread_num() * per_thread : nullptr;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t b = task / d.Hkv, hk = task % d.Hkv;
            for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
                float* grad = drow ? (shared ? mine : drow + b * drow_strides[0]) + h * drow_strides[1] : nullptr;
                head_backward(a, b, h, grad, w);
            }
        }
        blas_threads_local(saved);
    }
    for (int t = 0; t < (shared ? threads : 0); ++t)
        for (int64_t x = 0; x < per_thread; ++x) drow[x] += partial[t * per_thread + x];
    return 0;
}
