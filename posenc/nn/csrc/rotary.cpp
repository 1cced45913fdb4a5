// RoPE in one pass: out = x rotated pairwise by the angles whose cos/sin are given (Su et al. 2021, eq. 34).
// x, out (B, H, T, Dh) with (b, h, t) strides and a contiguous last dim; cos/sin (B|1, T, R/2) with (b, t)
// strides. sign = -1 rotates backwards (the gradient of a rotation). Pairs are (x[i], x[i + R/2]) (half-split)
// or (x[2i], x[2i + 1]) (interleaved); dims past R are copied.
#include "common.h"

// The arithmetic of torch's mul then addcmul, which the other rotation paths use (the eager kernel, a decode
// step's Turns): a * c rounded, then fma(-b, s, that). gcc's default -ffp-contract=fast fused the other product
// instead (fma(a, c, -b * s)), and a third of the outputs differed from theirs by an ulp: a key rotated here and
// the same key rotated by a decode step's Turns were not the same key. So no contraction, and the fma written.
#pragma GCC optimize("fp-contract=off")

sgemm_fn posenc_sgemm = nullptr;
threads_local_fn posenc_blas_threads_local = nullptr;

extern "C" void posenc_set_blas(sgemm_fn gemm, threads_local_fn threads_local) {
    posenc_sgemm = gemm;
    posenc_blas_threads_local = threads_local;
}

namespace {

inline void rotate_half_split(const float* x, float* o, const float* c, const float* s, int64_t half, float sign) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half], sn = sign * s[i];
        o[i] = std::fma(-b, sn, a * c[i]);
        o[i + half] = std::fma(a, sn, b * c[i]);
    }
}

inline void rotate_interleaved(const float* x, float* o, const float* c, const float* s, int64_t half, float sign) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
        const float a = x[2 * i], b = x[2 * i + 1], sn = sign * s[i];
        o[2 * i] = std::fma(-b, sn, a * c[i]);
        o[2 * i + 1] = std::fma(a, sn, b * c[i]);
    }
}

}  // namespace

// shape = (B, H, T, Dh, R); strides in elements.
extern "C" void posenc_rotate(const float* x, const int64_t* x_strides, float* out, const int64_t* o_strides,
                              const float* cos, const float* sin, const int64_t* cs_strides, const int64_t* shape,
                              int interleaved, float sign, int threads) {
    const int64_t B = shape[0], H = shape[1], T = shape[2], D = shape[3], R = shape[4], half = R / 2;
    // One task per (batch row, head), walking its T rows in order: x and out stream sequentially and the
    // (T, R/2) tables stay in cache. (Heads innermost made H strided streams per row: ~2x a copy's time.)
    const int64_t tasks = B * H;
    const auto rows = [&](int64_t bh) {
        const int64_t b = bh / H, h = bh % H;
        const float* xr = x + b * x_strides[0] + h * x_strides[1];
        float* orow = out + b * o_strides[0] + h * o_strides[1];
        const float* c = cos + b * cs_strides[0];
        const float* s = sin + b * cs_strides[0];
        for (int64_t t = 0; t < T; ++t, xr += x_strides[2], orow += o_strides[2], c += cs_strides[1],
                     s += cs_strides[1]) {
            if (interleaved) rotate_interleaved(xr, orow, c, s, half, sign);
            else rotate_half_split(xr, orow, c, s, half, sign);
            if (R < D) std::memcpy(orow + R, xr + R, (D - R) * sizeof(float));
        }
    };
    if (threads > 1 && tasks * T * D >= (1 << 16)) {
#pragma omp parallel for num_threads(threads)
        for (int64_t bh = 0; bh < tasks; ++bh) rows(bh);
    } else {  // a decode step's few rows: no OpenMP region at all (entering one cost more than the rotation)
        for (int64_t bh = 0; bh < tasks; ++bh) rows(bh);
    }
}

// A decode step's q and k rotated into one output, in one call (a decode step pays every call from Python in every
// layer); k by its own tables (xPos scales them the other way), or q's. layout (27): q's x strides (3), out strides
// (3), cos/sin strides (2), shape (5), then k's thirteen, then k's first element in out.
extern "C" void posenc_rotate_pair(const float* q, const float* k, float* out, const float* cos_q, const float* sin_q,
                                   const float* cos_k, const float* sin_k, const int64_t* layout, int interleaved,
                                   int threads) {
    posenc_rotate(q, layout, out, layout + 3, cos_q, sin_q, layout + 6, layout + 8, interleaved, 1.0f, threads);
    posenc_rotate(k, layout + 13, out + layout[26], layout + 16, cos_k, sin_k, layout + 19, layout + 21, interleaved,
                  1.0f, threads);
}
