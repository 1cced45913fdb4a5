// CoPE (Golovneva et al. 2024) inside a flash-style kernel, forward and backward; no (Tq, Tk) tensor exists.
//   g_ij = sigmoid(scale q_i . k_j), p_ij = sum_{t=j..i} g_it (a running sum from the query back, so key blocks
//   run right to left), bias_ij = w rows[i, ceil p] + (1 - w) rows[i, floor p] with p clamped to P - 1 and
//   w = p - floor p; out_i = sum_j softmax_j(scale q_i . k_j + bias_ij) v_j. rows (B, H, Tq, P) = q . e[n].
// Backward: dL = P (dP - delta); d rows from dL; dp_ij = dL_ij (rows[ceil] - rows[floor]) where p <= P - 1;
// dg_it = sum_{j <= t} dp_ij = D_i - sum_{j > t} dp_ij, with the row total D_i from a first sweep; the logit's
// gradient is dL + dg g (1 - g), and the matrix products are those of attention. Keys past the point where a row's
// count reaches P - 1 have dp = 0 and dg = 0: neither sweep computes their gates, and the first stops there (a
// training step at T = 2048, P = 64: 2.0-2.1x `none` -> 1.27x on the Intel Xeon, the backward ~7x its forward before).
#include <vector>

#include "attention.h"

struct CopeArgs {  // mirrored by posenc/nn/fused_attention.py
    const float* rows;  // (B, H, Tq, P) contiguous
    int64_t positions;  // P
    float* grad;  // backward: d rows, zero-filled, like rows
};

namespace {

inline float sigmoid(float x) {  // both branches take exp of a non-positive number
    const float e = exp_nonpositive(-std::abs(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

struct Row {  // one query's view of a block: its keys' logits, gates and counted positions
    float *s, *gate, *count;
    int64_t n;
};

// s = scale * s + bias at the positions counted from carry (returned updated: the gates of the n keys added).
float logits_row(const Row& row, float scale, const float* rows, int64_t P, float carry) {
    float *s = row.s, *gate = row.gate, *count = row.count;
    const int64_t n = row.n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
        s[j] *= scale;
        gate[j] = sigmoid(s[j]);
    }
    // count[j] = carry + gates from j to the row's end: summed from the query back, the reference's order
#pragma omp simd reduction(inscan, + : carry)
    for (int64_t t = 0; t < n; ++t) {
        carry += gate[n - 1 - t];
#pragma omp scan inclusive(carry)
        count[n - 1 - t] = carry;
    }
    const float top = static_cast<float>(P - 1);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
        const float p = std::min(count[j], top);  // >= 0: truncation is floor
        const int32_t low = static_cast<int32_t>(p);
        const float w = p - static_cast<float>(low);
        s[j] += w * rows[low + (w > 0.0f)] + (1.0f - w) * rows[low];  // ceil p = floor p + (w > 0)
    }
    return carry;
}

// logits_row for keys right to left in chunks, each key's gate and count kept at its own place, until the carry
// reaches P - 1: every key left of that point (the first `far` keys of the row) clamps to the last entry, s = scale *
// s + rows[P - 1] (the value logits_row gives it: its weight on the upper entry is 0), without a gate; and no
// gradient reaches a far key's gate (every key it counts for lies left of it, clamped too). A decode step against
// 4k keys and P = 64 computes ~130 gates a head instead of 4k; a backward, ~2P per query instead of every key's.
float logits_until_clamped(const Row& row, float scale, const float* rows, int64_t P, float carry, int64_t& far) {
    constexpr int64_t CHUNK = 64;
    const float top = static_cast<float>(P - 1);
    int64_t end = row.n;
    for (; end > 0 && carry < top; end -= CHUNK) {
        const int64_t start = std::max<int64_t>(0, end - CHUNK);
        carry = logits_row(Row{row.s + start, row.gate + start, row.count + start, end - start}, scale, rows, P,
                           carry);
    }
    far = std::max<int64_t>(end, 0);
    float* s = row.s;
    const float last = rows[P - 1];
#pragma omp simd
    for (int64_t j = 0; j < far; ++j) s[j] = s[j] * scale + last;
    return carry;
}

struct Scratch {
    std::vector<float> s, dp, acc, max, sum, carry, gate, count, dpos, delta, total, right;
    explicit Scratch(const Attention& a)
        : s(a.q_block * a.kv_block), dp(a.q_block * a.kv_block), acc(a.q_block * a.D), max(a.q_block),
          sum(a.q_block), carry(a.q_block), gate(a.kv_block), count(a.kv_block), dpos(a.kv_block), delta(a.Tq),
          total(a.q_block), right(a.q_block) {}
    Row row(float* s_row, int64_t n) { return Row{s_row, gate.data(), count.data(), n}; }
};

int64_t last_block(int64_t keys, int64_t kv_block) { return (keys + kv_block - 1) / kv_block - 1; }

void forward_block(const Attention& a, const CopeArgs& c, int64_t b, int64_t h, int64_t q0, int64_t qn,
                   Scratch& w) {
    const int64_t D = a.D, hk = a.kv_head(h), P = c.positions;
    std::fill(w.acc.begin(), w.acc.begin() + qn * D, 0.0f);
    std::fill(w.max.begin(), w.max.begin() + qn, -INFINITY);
    std::fill(w.sum.begin(), w.sum.begin() + qn, 0.0f);
    std::fill(w.carry.begin(), w.carry.begin() + qn, 0.0f);
    const float* q = a.at(a.q, a.q_strides, b, h, q0);
    const int64_t k_end = a.key_end(q0, qn);
    for (int64_t kb = last_block(k_end, a.kv_block); kb >= 0; --kb) {  // right to left
        const int64_t k0 = kb * a.kv_block, kn = std::min(a.kv_block, k_end - k0);
        float* s = w.s.data();
        gemm(false, true, qn, kn, D, 1.0f, q, a.q_strides[2], a.at(a.k, a.k_strides, b, hk, k0), a.k_strides[2],
             0.0f, s, kn);
        for (int64_t r = 0; r < qn; ++r) {
            const int64_t i = q0 + r, n = a.valid(i, k0, kn);
            float* sr = s + r * kn;
            const float* rows = c.rows + ((b * a.H + h) * a.Tq + i) * P;
            int64_t far;
            w.carry[r] = logits_until_clamped(w.row(sr, n), a.scale, rows, P, w.carry[r], far);
            const float alpha = online_softmax_block(sr, n, kn, row_max(sr, n), w.max[r], w.sum[r]);
            if (alpha < 0.0f) continue;  // no key yet for this query
            if (alpha != 1.0f)
                for (int64_t d = 0; d < D; ++d) w.acc[r * D + d] *= alpha;
        }
        gemm(false, false, qn, D, kn, 1.0f, s, kn, a.at(a.v, a.v_strides, b, hk, k0), a.v_strides[2], 1.0f,
             w.acc.data(), D);
    }
    for (int64_t r = 0; r < qn; ++r) {
        const int64_t i = q0 + r;
        const float inv = 1.0f / w.sum[r];
        float* o = a.at(a.out, a.o_strides, b, h, i);
        for (int64_t d = 0; d < D; ++d) o[d] = w.acc[r * D + d] * inv;
        a.lse[(b * a.H + h) * a.Tq + i] = w.max[r] + std::log(w.sum[r]);
    }
}

// The gradients of one row of a block whose first `far` keys are clamped (logits_until_clamped). first: only add
// up D_i (total). Otherwise turn s into P and dp into the logit's gradient, and add to d rows; `right` carries dp
// summed over the keys right of this block.
void backward_row(const CopeArgs& c, const Row& row, int64_t far, float* dp, float* dpos, int64_t row_at, float lse,
                  float delta, bool first, float& total, float& right) {
    const float* rows = c.rows + row_at;
    const float top = static_cast<float>(c.positions - 1);
    float *s = row.s, *count = row.count, *gate = row.gate;
    const int64_t n = row.n;
#pragma omp simd
    for (int64_t j = first ? far : 0; j < n; ++j) {  // the first sweep reads the counted keys' alone
        s[j] = exp_nonpositive(s[j] - lse);  // P
        dp[j] = s[j] * (dp[j] - delta);  // d logit through the softmax
    }
#pragma omp simd
    for (int64_t j = far; j < n; ++j) {  // the keys with a count: the far ones have no gradient through it
        const float p = std::min(count[j], top);
        const int32_t low = static_cast<int32_t>(p);
        const float slope = rows[low + (p > static_cast<float>(low))] - rows[low];
        dpos[j] = count[j] <= top ? dp[j] * slope : 0.0f;  // clamp passes p <= top
    }
    if (first) {
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = far; j < n; ++j) sum += dpos[j];
        total += sum;
        return;
    }
    // d rows, two entries per key. Counts fall as j grows: far keys (a prefix) are clamped to the last entry,
    // then runs of keys share their floor; sum each in registers before touching memory.
    float* grad = c.grad + row_at;
    const int64_t near = std::partition_point(count + far, count + n, [top](float v) { return v > top; }) - count;
    float clamped = 0.0f;
#pragma omp simd reduction(+ : clamped)
    for (int64_t j = 0; j < near; ++j) clamped += dp[j];
    grad[c.positions - 1] += clamped;
    int32_t run = -1;
    float at_low = 0.0f, at_high = 0.0f;
    const auto flush = [&]() {
        if (run < 0) return;
        grad[run] += at_low;
        if (run + 1 < c.positions) grad[run + 1] += at_high;  // at the last entry w = 0
    };
    for (int64_t j = near; j < n; ++j) {
        const int32_t low = static_cast<int32_t>(count[j]);  // count <= top here
        if (low != run) {
            flush();
            run = low;
            at_low = at_high = 0.0f;
        }
        const float w = count[j] - static_cast<float>(low);
        at_low += dp[j] * (1.0f - w);
        at_high += dp[j] * w;
    }
    flush();
    float carry = right;  // dg_j = D - (dp summed over keys right of j); 0 for the far keys (not added)
    const int64_t counted = n - far;
#pragma omp simd reduction(inscan, + : carry)
    for (int64_t t = 0; t < counted; ++t) {
        dp[n - 1 - t] += (total - carry) * gate[n - 1 - t] * (1.0f - gate[n - 1 - t]);
#pragma omp scan exclusive(carry)
        carry += dpos[n - 1 - t];
    }
    right = carry;
}

void backward_sweep(const Attention& a, const CopeArgs& c, int64_t b, int64_t h, int64_t q0, int64_t qn, bool first,
                    Scratch& w) {
    const int64_t D = a.D, hk = a.kv_head(h), P = c.positions;
    std::fill(w.carry.begin(), w.carry.begin() + qn, 0.0f);
    std::fill(w.right.begin(), w.right.begin() + qn, 0.0f);
    if (first) std::fill(w.total.begin(), w.total.begin() + qn, 0.0f);
    const float* q = a.at(a.q, a.q_strides, b, h, q0);
    const float* dout = a.at(a.dout, a.do_strides, b, h, q0);
    const int64_t k_end = a.key_end(q0, qn);
    const float top = static_cast<float>(P - 1);
    for (int64_t kb = last_block(k_end, a.kv_block); kb >= 0; --kb) {
        // the first sweep adds up the counted keys' dpos only: once every row's count has reached P - 1, the keys
        // left of here are all clamped and add nothing
        if (first && std::all_of(w.carry.begin(), w.carry.begin() + qn, [top](float v) { return v >= top; })) break;
        const int64_t k0 = kb * a.kv_block, kn = std::min(a.kv_block, k_end - k0);
        float *s = w.s.data(), *dp = w.dp.data();
        const float* k = a.at(a.k, a.k_strides, b, hk, k0);
        gemm(false, true, qn, kn, D, 1.0f, q, a.q_strides[2], k, a.k_strides[2], 0.0f, s, kn);
        gemm(false, true, qn, kn, D, 1.0f, dout, a.do_strides[2], a.at(a.v, a.v_strides, b, hk, k0), a.v_strides[2],
             0.0f, dp, kn);
        for (int64_t r = 0; r < qn; ++r) {
            const int64_t i = q0 + r, n = a.valid(i, k0, kn), row_at = ((b * a.H + h) * a.Tq + i) * P;
            const Row row = w.row(s + r * kn, n);
            int64_t far;
            w.carry[r] = logits_until_clamped(row, a.scale, c.rows + row_at, P, w.carry[r], far);
            backward_row(c, row, far, dp + r * kn, w.dpos.data(), row_at, a.lse[(b * a.H + h) * a.Tq + i], w.delta[i],
                         first, w.total[r], w.right[r]);
            std::fill(row.s + n, row.s + kn, 0.0f);
            std::fill(dp + r * kn + n, dp + r * kn + kn, 0.0f);
        }
        if (first) continue;
        gemm(true, false, kn, D, qn, 1.0f, s, kn, dout, a.do_strides[2], 1.0f, a.at(a.dv, a.dv_strides, b, hk, k0),
             a.dv_strides[2]);
        gemm(false, false, qn, D, kn, a.scale, dp, kn, k, a.k_strides[2], 1.0f, a.at(a.dq, a.dq_strides, b, h, q0),
             a.dq_strides[2]);
        gemm(true, false, kn, D, qn, a.scale, dp, kn, q, a.q_strides[2], 1.0f, a.at(a.dk, a.dk_strides, b, hk, k0),
             a.dk_strides[2]);
    }
}

}  // namespace

extern "C" int posenc_cope_forward(const Attention* a, const CopeArgs* c) {
    const int64_t q_blocks = (a->Tq + a->q_block - 1) / a->q_block, tasks = a->B * a->H * q_blocks;
#pragma omp parallel num_threads(a->threads) if (a->threads > 1 && tasks > 1)
    {
        const KernelThread thread;
        Scratch w(*a);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t qb = q_blocks - 1 - task % q_blocks, bh = task / q_blocks;  // longest first
            const int64_t q0 = qb * a->q_block;
            forward_block(*a, *c, bh / a->H, bh % a->H, q0, std::min(a->q_block, a->Tq - q0), w);
        }
    }
    return 0;
}

extern "C" int posenc_cope_backward(const Attention* a, const CopeArgs* c) {
    const int64_t tasks = a->B * a->Hkv, group = a->H / a->Hkv;
#pragma omp parallel num_threads(a->threads) if (a->threads > 1 && tasks > 1)
    {
        const KernelThread thread;
        Scratch w(*a);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t b = task / a->Hkv, hk = task % a->Hkv;
            for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
                for (int64_t i = 0; i < a->Tq; ++i) {  // delta_i = dO_i . O_i
                    const float *o = a->at(a->out, a->o_strides, b, h, i), *g = a->at(a->dout, a->do_strides, b, h, i);
                    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                    for (int64_t d = 0; d < a->D; ++d) acc += o[d] * g[d];
                    w.delta[i] = acc;
                }
                for (int64_t q0 = 0; q0 < a->Tq; q0 += a->q_block) {
                    const int64_t qn = std::min(a->q_block, a->Tq - q0);
                    backward_sweep(*a, *c, b, h, q0, qn, true, w);
                    backward_sweep(*a, *c, b, h, q0, qn, false, w);
                }
            }
        }
    }
    return 0;
}
