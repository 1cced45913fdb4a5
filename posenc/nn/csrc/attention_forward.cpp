// Flash-style attention forward with a positional bias computed per block from a policy (bias_rows.h,
// bias_piecewise.h), so no (H, Tq, Tk) tensor exists:
//   out_i = sum_j softmax_j(scale * q_i . k_j + bias(i, j)) v_j,  and lse_i = log sum_j exp(...)
// Queries in blocks (one task per batch row, head and block); keys in blocks with an online softmax.
#include <vector>

#include "bias_piecewise.h"
#include "bias_rows.h"

namespace {

struct Scratch {
    std::vector<float> scores, acc, max, sum, mass, x, rows, shifted_q, content_q;
};

// The softmax weight landing on each row index (Shaw's value term): written out (mass) and/or folded into the
// output as sum_t mass_t values[t] (values).
struct Mass {
    const RowArgs* rows;  // null: no mass
    void clear(Scratch& w, int64_t qn) const {
        if (rows) std::fill(w.mass.begin(), w.mass.begin() + qn * rows->length, 0.0f);
    }
    void rescale(Scratch& w, int64_t r, float alpha) const {
        if (rows) for (int64_t t = 0; t < rows->length; ++t) w.mass[r * rows->length + t] *= alpha;
    }
    void add(Scratch& w, int64_t r, const float* p, int64_t b, int64_t i, int64_t j0, int64_t n) const {
        if (rows) RowBias::scatter_to_row(w.mass.data() + r * rows->length, p, rows->length, rows->e[b] - i, j0, n);
    }
    // o (D) holds the row's output already; the mass is the row's sums times inv.
    void store(const Scratch& w, int64_t r, int64_t b, int64_t h, int64_t i, float inv, float* o, int64_t D) const {
        if (!rows) return;
        const float* m = w.mass.data() + r * rows->length;
        if (rows->mass) {
            const int64_t* s = rows->mass_strides;
            float* out = rows->mass + b * s[0] + h * s[1] + i * s[2];
            for (int64_t t = 0; t < rows->length; ++t) out[t] = m[t] * inv;
        }
        if (rows->values)
            for (int64_t t = 0; t < rows->length; ++t) {
                const float mt = m[t] * inv;
                const float* value = rows->values + t * D;
#pragma omp simd
                for (int64_t c = 0; c < D; ++c) o[c] += mt * value[c];
            }
    }
};

template <class Bias>
void query_block(const Attention& a, const Bias& bias, const Mass& mass, int64_t b, int64_t h, int64_t q0,
                 int64_t qn, Scratch& w) {
    const int64_t D = a.D, hk = a.kv_head(h);
    std::fill(w.acc.begin(), w.acc.begin() + qn * D, 0.0f);
    std::fill(w.max.begin(), w.max.begin() + qn, -INFINITY);
    std::fill(w.sum.begin(), w.sum.begin() + qn, 0.0f);
    mass.clear(w, qn);
    const float* q = a.at(a.q, a.q_strides, b, h, q0);
    bias.prepare(a, q, h, qn, w);
    int64_t ldq = a.q_strides[2];
    q = bias.content_query(a, q, ldq, h, qn, w);  // the scores' query: q, or (with q_shift) q + u in the scratch
    for (int64_t k0 = 0, k_end = a.key_end(q0, qn); k0 < k_end; k0 += a.kv_block) {
        const int64_t kn = std::min(a.kv_block, k_end - k0);
        float* s = w.scores.data();
        gemm(false, true, qn, kn, D, 1.0f, q, ldq, a.at(a.k, a.k_strides, b, hk, k0), a.k_strides[2], 0.0f, s, kn);
        for (int64_t r = 0; r < qn; ++r) {
            const int64_t i = q0 + r, n = a.valid(i, k0, kn);
            float* sr = s + r * kn;
            const float top = bias.add(sr, n, a.scale, b, h, i, k0, bias.scratch(w, r));
            const float alpha = online_softmax_block(sr, n, kn, top, w.max[r], w.sum[r]);
            if (alpha < 0.0f) continue;  // no key yet for this query
            if (alpha != 1.0f) {
                for (int64_t c = 0; c < D; ++c) w.acc[r * D + c] *= alpha;
                mass.rescale(w, r, alpha);
            }
            mass.add(w, r, sr, b, i, k0, n);
        }
        gemm(false, false, qn, D, kn, 1.0f, s, kn, a.at(a.v, a.v_strides, b, hk, k0), a.v_strides[2], 1.0f,
             w.acc.data(), D);
    }
    for (int64_t r = 0; r < qn; ++r) {
        const int64_t i = q0 + r;
        const float inv = 1.0f / w.sum[r];
        float* o = a.at(a.out, a.o_strides, b, h, i);
        for (int64_t c = 0; c < D; ++c) o[c] = w.acc[r * D + c] * inv;
        if (a.lse) a.lse[(b * a.H + h) * a.Tq + i] = w.max[r] + std::log(w.sum[r]);  // null: no backward wants it
        mass.store(w, r, b, h, i, inv, o, D);
    }
}

template <class Bias>
void forward(const Attention& a, const Bias& bias, const Mass& mass) {
    const int64_t q_blocks = (a.Tq + a.q_block - 1) / a.q_block, tasks = a.B * a.H * q_blocks;
#pragma omp parallel num_threads(a.threads) if (a.threads > 1 && tasks > 1)
    {
        const KernelThread thread;
        Scratch w;
        w.scores.resize(a.q_block * a.kv_block);
        w.acc.resize(a.q_block * a.D);
        w.max.resize(a.q_block);
        w.sum.resize(a.q_block);
        w.x.resize(a.kv_block);
        if (mass.rows) w.mass.resize(a.q_block * mass.rows->length);
        bias.reserve(a, w);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t qb = task % q_blocks, bh = task / q_blocks;
            const int64_t q0 = a.causal ? (q_blocks - 1 - qb) * a.q_block : qb * a.q_block;  // longest first
            query_block(a, bias, mass, bh / a.H, bh % a.H, q0, std::min(a.q_block, a.Tq - q0), w);
        }
    }
}

// The bias policies: reserve() sizes a thread's scratch, prepare() runs once per query block before its keys,
// content_query() gives the query block the scores read (and its leading dimension), scratch() hands add() what it
// needs for row r of the block, add() biases a block of scores.

// A policy whose bias needs nothing per query block: no scratch of its own, q read as it is.
struct NothingPerBlock {
    void reserve(const Attention&, Scratch&) const {}
    void prepare(const Attention&, const float*, int64_t, int64_t, Scratch&) const {}
    const float* content_query(const Attention&, const float* q, int64_t&, int64_t, int64_t, Scratch&) const {
        return q;
    }
};

// Rows read from memory (RowArgs.rows).
struct RowPolicy : NothingPerBlock {
    RowBias rows;
    float* scratch(Scratch&, int64_t) const { return nullptr; }
    float add(float* s, int64_t n, float scale, int64_t b, int64_t h, int64_t i, int64_t j0, float*) const {
        return rows.add(s, n, scale, b, h, i, j0);
    }
};

// Rows formed per query block from a table (RowArgs.table): the block's rows (qn, S) = table_scale * (q +
// row_shift[h]) . table[h], in the thread's scratch, then read as RowPolicy reads rows.
struct TableRowPolicy {
    const RowArgs& args;
    void reserve(const Attention& a, Scratch& w) const {
        w.rows.resize(a.q_block * args.length);
        if (args.row_shift) w.shifted_q.resize(a.q_block * a.D);
        if (args.q_shift) w.content_q.resize(a.q_block * a.D);
    }
    // q + shift[h] for the block's qn rows, into out (qn, D).
    static const float* shifted(const Attention& a, const float* q, int64_t ldq, const float* shift, int64_t h,
                                int64_t qn, std::vector<float>& out) {
        for (int64_t r = 0; r < qn; ++r)
            for (int64_t c = 0; c < a.D; ++c) out[r * a.D + c] = q[r * ldq + c] + shift[h * a.D + c];
        return out.data();
    }
    void prepare(const Attention& a, const float* q, int64_t h, int64_t qn, Scratch& w) const {
        int64_t ldq = a.q_strides[2];
        if (args.row_shift) {
            q = shifted(a, q, ldq, args.row_shift, h, qn, w.shifted_q);
            ldq = a.D;
        }
        gemm(false, true, qn, args.length, a.D, args.table_scale, q, ldq, args.table + h * args.table_stride_h, a.D,
             0.0f, w.rows.data(), args.length);
    }
    const float* content_query(const Attention& a, const float* q, int64_t& ldq, int64_t h, int64_t qn,
                               Scratch& w) const {
        if (!args.q_shift) return q;
        q = shifted(a, q, ldq, args.q_shift, h, qn, w.content_q);
        ldq = a.D;
        return q;
    }
    float* scratch(Scratch& w, int64_t r) const { return w.rows.data() + r * args.length; }
    float add(float* s, int64_t n, float scale, int64_t b, int64_t, int64_t i, int64_t j0, float* row) const {
        return RowBias::add_row(row, args.length, args.e[b] - i, s, n, scale, j0);
    }
};

// The piecewise bias, evaluating its feature for a block of keys into the thread's x.
struct PiecewisePolicy : NothingPerBlock {
    PiecewiseBias pieces;
    float* scratch(Scratch& w, int64_t) const { return w.x.data(); }
    float add(float* s, int64_t n, float scale, int64_t b, int64_t h, int64_t i, int64_t j0, float* x) const {
        return pieces.add(s, n, scale, b, h, i, j0, x);
    }
};

}  // namespace

extern "C" int posenc_attention_rows_forward(const Attention* a, const RowArgs* r) {
    const Mass mass{r->mass || r->values ? r : nullptr};
    if (r->table) forward(*a, TableRowPolicy{*r}, mass);
    else forward(*a, RowPolicy{{}, row_bias(*r)}, mass);
    return 0;
}

extern "C" int posenc_attention_piecewise_forward(const Attention* a, const PiecewiseArgs* p) {
    forward(*a, PiecewisePolicy{{}, PiecewiseBias{*p}}, Mass{nullptr});
    return 0;
}
