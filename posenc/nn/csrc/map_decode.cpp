// A decode step under a position map (posenc/nn/runs_attention.py, used by mapped_decode.py): one query per head
// against runs of consecutive keys, each run scored by its map's rotated query against its own key table (the keys
// as that map rotates them), one softmax over every run together, and the values of the attended keys. In one call
// per layer what was a product per run, their concatenation, the scale, the softmax and a product per span of
// attended keys, each an operator with every cache line cold after the previous layer's keys and values.
#include <vector>

#include "common.h"

struct RunsArgs {
    const float* q;  // (M, B, Hkv, G, D) contiguous: each map's rotated queries, G query heads per key head
    const float* const* keys;  // per key table: (B, Hkv, T, D), last dim contiguous
    const int64_t* key_strides;  // (tables, 3): the b, h and t strides of each key table
    const float* v;  // (B, Hkv, T, D), last dim contiguous
    int64_t v_strides[3];
    const int64_t* runs;  // (n_runs, 4): map, key table, first key, end key
    int64_t n_runs, B, Hkv, G, D;
    float scale;
    float* out;  // (B, Hkv, G, D) contiguous
    int64_t block;  // keys per product
    int32_t threads;
};

namespace {

void one_task(const RunsArgs& a, int64_t b, int64_t h, float* scores, float* acc, float* max, float* sum) {
    const int64_t G = a.G, D = a.D;
    std::fill(acc, acc + G * D, 0.0f);
    std::fill(max, max + G, -INFINITY);
    std::fill(sum, sum + G, 0.0f);
    const float* v = a.v + b * a.v_strides[0] + h * a.v_strides[1];
    for (int64_t run = 0; run < a.n_runs; ++run) {
        const int64_t* r = a.runs + 4 * run;
        const int64_t map = r[0], table = r[1], first = r[2], end = r[3];
        const float* q = a.q + ((map * a.B + b) * a.Hkv + h) * G * D;
        const int64_t* ks = a.key_strides + 3 * table;
        const float* k = a.keys[table] + b * ks[0] + h * ks[1];
        for (int64_t k0 = first; k0 < end; k0 += a.block) {
            const int64_t kn = std::min(a.block, end - k0);
            gemm(false, true, G, kn, D, a.scale, q, D, k + k0 * ks[2], ks[2], 0.0f, scores, kn);
            for (int64_t g = 0; g < G; ++g) {
                float* s = scores + g * kn;
                const float alpha = online_softmax_block(s, kn, kn, row_max(s, kn), max[g], sum[g]);
                if (alpha >= 0.0f && alpha != 1.0f)
                    for (int64_t c = 0; c < D; ++c) acc[g * D + c] *= alpha;
            }
            gemm(false, false, G, D, kn, 1.0f, scores, kn, v + k0 * a.v_strides[2], a.v_strides[2], 1.0f, acc, D);
        }
    }
    float* out = a.out + (b * a.Hkv + h) * G * D;
    for (int64_t g = 0; g < G; ++g) {
        const float inv = 1.0f / sum[g];
        for (int64_t c = 0; c < D; ++c) out[g * D + c] = acc[g * D + c] * inv;
    }
}

}  // namespace

extern "C" int posenc_attention_runs(const RunsArgs* a) {
    const int64_t tasks = a->B * a->Hkv;
#pragma omp parallel num_threads(a->threads) if (a->threads > 1 && tasks > 1)
    {
        const KernelThread thread;
        std::vector<float> scores(a->G * a->block), acc(a->G * a->D), max(a->G), sum(a->G);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task)
            one_task(*a, task / a->Hkv, task % a->Hkv, scores.data(), acc.data(), max.data(), sum.data());
    }
    return 0;
}
