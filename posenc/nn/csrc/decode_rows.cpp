// The bias row of a decode step: one query per batch row against its Tk keys, written out once per step for every
// layer's SDPA mask (posenc/nn/decode_paths.py). The same per-key arithmetic as the attention kernels' blocks
// (bias_piecewise.h), in one call instead of a dozen PyTorch operators, each of which ran with every cache line
// cold after the previous layer's keys and values streamed through.
#include <vector>

#include "bias_piecewise.h"

// out (B, H, 1, Tk) contiguous: bias(b, h, 0, j) with x = feature[e[b] + j] / divisor[b, 0] (the query is row 0).
extern "C" int posenc_piecewise_row(const PiecewiseArgs* p, int64_t B, int64_t H, int64_t Tk, float* out) {
    const PiecewiseBias bias{*p};
    const int64_t K1 = p->n_knots + 1;
    std::vector<float> x(Tk);
    for (int64_t b = 0; b < B; ++b) {
        bias.features(x.data(), Tk, b, 0, 0);
        for (int64_t h = 0; h < H; ++h) {
            float* row = out + (b * H + h) * Tk;
            const float* slope = p->slope + h * K1;
            const float* intercept = p->intercept + h * K1;
            bias.runs(x.data(), Tk, [&](int64_t seg, int64_t first, int64_t end) {
                const float a = slope[seg], c = intercept[seg];
#pragma omp simd
                for (int64_t j = first; j < end; ++j) row[j] = a * x[j] + c;
            });
        }
    }
    return 0;
}
