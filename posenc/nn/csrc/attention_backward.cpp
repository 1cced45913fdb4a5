// Backward of attention_forward.cpp, flash style: P is recomputed per block from q, k, the bias policy and the
// saved log-sum-exp, so no (Tq, Tk) tensor is stored. One task per (batch row, key/value head) owns that head's
// dk, dv (GQA: the query heads of its group run in the same task).
//   dP = dO v^T (+ dmass at each key's row index), dS = P * (dP - delta_i), delta_i = dO_i . O_i (+ dmass_i . mass_i)
//   dq += scale dS k, dk += scale dS^T q, dv += P^T dO, and the bias policy takes dS for its own gradients.
#include <vector>

#include "bias_piecewise.h"
#include "bias_rows.h"

namespace {

struct Scratch {
    std::vector<float> p, dp, delta, x;
};

// Gradient sums a thread may own: a bias shared by several tasks is summed per thread, then added up.
struct Partials {
    std::vector<float> data;
    int64_t size = 0;
    void reserve(int64_t per_thread, int threads) {
        size = per_thread;
        data.assign(per_thread * threads, 0.0f);
    }
    float* mine() { return size ? data.data() + omp_get_thread_num() * size : nullptr; }
    void add_to(float* target, int threads) const {
        for (int t = 0; t < threads; ++t)
            for (int64_t x = 0; x < size; ++x) target[x] += data[t * size + x];
    }
    void sum_into(float* target, int threads) const {  // target = the sum (it may hold anything before)
        std::fill(target, target + size, 0.0f);
        add_to(target, threads);
    }
};

struct RowPolicy {
    RowBias rows;
    const RowArgs& args;
    bool shared;  // one row serves several batch rows: each thread sums into its own copy
    float add(float* s, int64_t n, float scale, int64_t b, int64_t h, int64_t i, int64_t j0, float*) const {
        return rows.add(s, n, scale, b, h, i, j0);
    }
    void mass_grad(float* dp, int64_t n, int64_t b, int64_t h, int64_t i, int64_t j0) const {
        if (!args.dmass) return;
        const int64_t* s = args.mass_strides;
        RowBias::gather_from_row(dp, args.dmass + b * s[0] + h * s[1] + i * s[2], rows.length, rows.e[b] - i, j0, n);
    }
    float mass_delta(int64_t b, int64_t h, int64_t i) const {
        if (!args.dmass) return 0.0f;
        const int64_t* s = args.mass_strides;
        const float *m = args.mass + b * s[0] + h * s[1] + i * s[2], *g = args.dmass + b * s[0] + h * s[1] + i * s[2];
        float acc = 0.0f;
        for (int64_t t = 0; t < rows.length; ++t) acc += m[t] * g[t];
        return acc;
    }
    void backward(const float* ds, int64_t n, int64_t b, int64_t h, int64_t i, int64_t j0, float*, float* mine) const {
        if (rows.grad) rows.backward(ds, n, b, h, i, j0, shared ? mine : rows.grad);
    }
    // Zero the d rows this (b, h) owns before adding to them (the caller allocates them uninitialised: a row
    // per query is as large as the scores' block, and zeroing it here is parallel and close to its use).
    void start(int64_t b, int64_t h, int64_t tq) const {
        if (!rows.grad || shared) return;
        float* g = rows.grad + b * rows.grad_stride_b + h * rows.grad_stride_h;
        for (int64_t i = 0; i < (rows.grad_stride_i ? tq : 1); ++i)
            std::fill(g + i * rows.grad_stride_i, g + i * rows.grad_stride_i + rows.length, 0.0f);
    }
};

struct PiecewisePolicy {
    PiecewiseBias bias;
    int64_t K1;
    float add(float* s, int64_t n, float scale, int64_t b, int64_t h, int64_t i, int64_t j0, float* x) const {
        return bias.add(s, n, scale, b, h, i, j0, x);
    }
    void mass_grad(float*, int64_t, int64_t, int64_t, int64_t, int64_t) const {}
    void start(int64_t, int64_t, int64_t) const {}
    float mass_delta(int64_t, int64_t, int64_t) const { return 0.0f; }
    // mine: [feature (S) | divisor (rows x Tq) | slope (H x K1) | intercept (H x K1)]
    void backward(const float* ds, int64_t n, int64_t b, int64_t h, int64_t i, int64_t j0, float* x,
                  float* mine) const {
        const PiecewiseArgs& p = bias.p;
        float* divisor = mine + p.length;
        float* slope = divisor + p.divisor_rows * tq;
        PiecewiseBias::Grads g{mine, divisor, slope, slope + h_count * K1};
        bias.backward(ds, n, b, h, i, j0, x, g);
    }
    int64_t tq, h_count;
};

template <class Policy>
void head_backward(const Attention& a, const Policy& policy, int64_t b, int64_t h, float* mine, Scratch& w) {
    const int64_t D = a.D, hk = a.kv_head(h);
    policy.start(b, h, a.Tq);
    for (int64_t i = 0; i < a.Tq; ++i) {  // delta_i = sum_j P_ij dP_ij
        const float* o = a.at(a.out, a.o_strides, b, h, i);
        const float* g = a.at(a.dout, a.do_strides, b, h, i);
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t c = 0; c < D; ++c) acc += o[c] * g[c];
        w.delta[i] = acc + policy.mass_delta(b, h, i);
    }
    for (int64_t q0 = 0; q0 < a.Tq; q0 += a.q_block) {
        const int64_t qn = std::min(a.q_block, a.Tq - q0);
        const float* q = a.at(a.q, a.q_strides, b, h, q0);
        const float* dout = a.at(a.dout, a.do_strides, b, h, q0);
        for (int64_t k0 = 0, k_end = a.key_end(q0, qn); k0 < k_end; k0 += a.kv_block) {
            const int64_t kn = std::min(a.kv_block, k_end - k0);
            float *p = w.p.data(), *dp = w.dp.data();
            gemm(false, true, qn, kn, D, 1.0f, q, a.q_strides[2], a.at(a.k, a.k_strides, b, hk, k0), a.k_strides[2],
                 0.0f, p, kn);
            gemm(false, true, qn, kn, D, 1.0f, dout, a.do_strides[2], a.at(a.v, a.v_strides, b, hk, k0),
                 a.v_strides[2], 0.0f, dp, kn);
            for (int64_t r = 0; r < qn; ++r) {
                const int64_t i = q0 + r, n = a.valid(i, k0, kn);
                float *pr = p + r * kn, *dpr = dp + r * kn;
                policy.add(pr, n, a.scale, b, h, i, k0, w.x.data());
                const float lse = a.lse[(b * a.H + h) * a.Tq + i];
#pragma omp simd
                for (int64_t j = 0; j < n; ++j) pr[j] = exp_nonpositive(pr[j] - lse);
                std::fill(pr + n, pr + kn, 0.0f);
                policy.mass_grad(dpr, n, b, h, i, k0);
                const float delta = w.delta[i];
#pragma omp simd
                for (int64_t j = 0; j < kn; ++j) dpr[j] = pr[j] * (dpr[j] - delta);  // dS, 0 where masked
                policy.backward(dpr, n, b, h, i, k0, w.x.data(), mine);
            }
            gemm(true, false, kn, D, qn, 1.0f, p, kn, dout, a.do_strides[2], 1.0f,
                 a.at(a.dv, a.dv_strides, b, hk, k0), a.dv_strides[2]);
            gemm(false, false, qn, D, kn, a.scale, dp, kn, a.at(a.k, a.k_strides, b, hk, k0), a.k_strides[2], 1.0f,
                 a.at(a.dq, a.dq_strides, b, h, q0), a.dq_strides[2]);
            gemm(true, false, kn, D, qn, a.scale, dp, kn, q, a.q_strides[2], 1.0f,
                 a.at(a.dk, a.dk_strides, b, hk, k0), a.dk_strides[2]);
        }
    }
}

template <class Policy>
void backward(const Attention& a, const Policy& policy, Partials& partials) {
    const int64_t tasks = a.B * a.Hkv, group = a.H / a.Hkv;
#pragma omp parallel num_threads(a.threads) if (a.threads > 1 && tasks > 1)
    {
        const KernelThread thread;
        Scratch w;
        w.p.resize(a.q_block * a.kv_block);
        w.dp.resize(a.q_block * a.kv_block);
        w.delta.resize(a.Tq);
        w.x.resize(a.kv_block);
        float* mine = partials.mine();
#pragma omp for schedule(static, 1)  // a fixed split: per-thread sums add up the same way every run
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t b = task / a.Hkv, hk = task % a.Hkv;
            for (int64_t h = hk * group; h < (hk + 1) * group; ++h) head_backward(a, policy, b, h, mine, w);
        }
    }
}

}  // namespace

extern "C" int posenc_attention_rows_backward(const Attention* a, const RowArgs* r) {
    const RowBias rows = row_bias(*r);
    const bool shared = r->grad && r->strides[0] == 0 && a->B > 1;
    Partials partials;
    // rows are contiguous (1, H, Tq|1, S): one copy is H * stride_h floats
    if (shared) partials.reserve(a->H * (r->strides[1] ? r->strides[1] : r->length), a->threads);
    backward(*a, RowPolicy{rows, *r, shared}, partials);
    if (shared) partials.sum_into(r->grad, a->threads);
    return 0;
}

extern "C" int posenc_attention_piecewise_backward(const Attention* a, const PiecewiseArgs* p) {
    const int64_t K1 = p->n_knots + 1;
    Partials partials;
    const int64_t sizes[4] = {p->length, p->divisor_rows * a->Tq, a->H * K1, a->H * K1};
    partials.reserve(sizes[0] + sizes[1] + sizes[2] + sizes[3], a->threads);
    backward(*a, PiecewisePolicy{PiecewiseBias{*p}, K1, a->Tq, a->H}, partials);
    float* targets[4] = {p->d_feature, p->d_divisor, p->d_slope, p->d_intercept};
    for (int t = 0; t < a->threads; ++t) {
        const float* part = partials.data.data() + t * partials.size;
        for (int g = 0; g < 4; part += sizes[g], ++g)
            for (int64_t x = 0; x < sizes[g]; ++x) targets[g][x] += part[x];
    }
    return 0;
}
