// Shared pieces of posenc's CPU kernels: BLAS access, a vectorisable exp, and the bias row helper.
// Built by posenc/nn/native.py with plain g++ (no torch headers), loaded with ctypes.
// Matrices are float32, row-major, with a leading dimension (elements between rows).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

typedef void (*sgemm_fn)(const char*, const char*, const int*, const int*, const int*, const float*,
                         const float*, const int*, const float*, const int*, const float*, float*, const int*);
typedef int (*threads_local_fn)(const int*);  // MKL's Fortran-style entry point: by pointer

// Set once from Python: torch's own BLAS (MKL's Fortran sgemm_) and its per-thread thread count.
extern sgemm_fn posenc_sgemm;
extern threads_local_fn posenc_blas_threads_local;

// Set this thread's BLAS thread count (1 inside our own parallel loops); returns the previous one.
static inline int blas_threads_local(int n) { return posenc_blas_threads_local ? posenc_blas_threads_local(&n) : 0; }

// Flush denormals to zero in this thread while alive (restored after). Weights far below the row's maximum
// (ALiBi at long distances) make products near 1e-38 whose denormal results cost ~10% of an attention call.
// They are below float32's normal range, so flushing them changes no normal result.
struct FlushDenormals {
#if defined(__x86_64__) || defined(__i386__)
    unsigned saved = _mm_getcsr();
    FlushDenormals() { _mm_setcsr(saved | 0x8040); }  // FTZ (bit 15) and DAZ (bit 6)
    ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// What each thread of a kernel's parallel region holds while it runs: denormals flushed, and BLAS on this one
// thread (the region's threads are the parallelism); both restored when it ends.
struct KernelThread {
    const FlushDenormals flush;
    const int saved_blas_threads = blas_threads_local(1);
    ~KernelThread() { blas_threads_local(saved_blas_threads); }
};

// Row-major C (m x n) = alpha * op(A) (m x k) @ op(B) (k x n) + beta * C.
// A row-major matrix is the column-major transpose, so this is the column-major C^T = op(B)^T op(A)^T.
static inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                        const float* b, int ldb, float beta, float* c, int ldc) {
    const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
    posenc_sgemm(&ta, &tb, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

// exp(x) for x <= 0 (scores minus their running max) to ~1 ulp: 2^(x log2 e) split as 2^n * 2^f,
// |f| <= 1/2, with the degree-7 Taylor polynomial of 2^f (error < 6e-9). Below -87, exactly 0.
static inline float exp_nonpositive(float x) {
    const float t = std::max(x, -87.0f) * 1.4426950408889634f;  // -inf stays out of the integer cast
    const float n = std::nearbyint(t);
    const float f = (t - n) * 0.6931471805599453f;  // 2^(t-n) = e^f, |f| <= ln2 / 2
    float p = 1.9841269841e-4f;
    p = p * f + 1.3888888889e-3f;
    p = p * f + 8.3333333333e-3f;
    p = p * f + 4.1666666667e-2f;
    p = p * f + 1.6666666667e-1f;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

// One key block of an online softmax for one query row: sr[0, n) holds the row's scores (their max is
// `top`), sr[n, kn) is padding. Exponentiates the scores in place against the new running max, zeroes the
// padding, folds the block into `max` and `sum`, and returns the factor the row's earlier accumulators must
// be multiplied by (1 when the max did not move). Returns -1 when the row has no key yet (every score
// -inf): the block is zeroed and nothing else changes.
static inline float online_softmax_block(float* sr, int64_t n, int64_t kn, float top, float& max, float& sum) {
    const float m_new = std::max(max, top);
    if (m_new == -INFINITY) {
        std::fill(sr, sr + kn, 0.0f);
        return -1.0f;
    }
    const float alpha = exp_nonpositive(max - m_new);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) {
        sr[j] = exp_nonpositive(sr[j] - m_new);
        total += sr[j];
    }
    std::fill(sr + n, sr + kn, 0.0f);
    sum = sum * alpha + total;
    max = m_new;
    return alpha;
}

// The bias of query row i over keys j in [j0, j1) reads row[clamp(e - i + j, 0, S - 1)] (a row of S
// values in key order). Split [j0, j1) where the index is below 0 (reads row[0]), inside, and above
// S - 1 (reads row[S - 1]), so each part is a broadcast or a contiguous run.
struct RowSpan {
    int64_t low_end, high_start, first;  // [j0, low_end) -> row[0]; [low_end, high_start) -> row[first + j - low_end]
};

static inline RowSpan row_span(int64_t e_minus_i, int64_t S, int64_t j0, int64_t j1) {
    RowSpan s;
    s.low_end = std::clamp(-e_minus_i, j0, j1);           // j < -e_minus_i  <=>  index < 0
    s.high_start = std::clamp(S - e_minus_i, s.low_end, j1);  // j >= S - e_minus_i  <=>  index > S - 1
    s.first = e_minus_i + s.low_end;
    return s;
}

static inline float row_max(const float* s, int64_t n) {
    float top = -INFINITY;
#pragma omp simd reduction(max : top)
    for (int64_t j = 0; j < n; ++j) top = s[j] > top ? s[j] : top;
    return top;
}
