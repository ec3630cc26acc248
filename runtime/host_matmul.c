/* The host's grouped matmul at few rows an expert (runtime/host_matmul.py builds and loads it).

   y[b, r, n] = sum_k x[b, r, k] * w[ids[b], n, k]   for r < rows[b]; 0 for rows[b] <= r < M

   x: [B, M, K] float32, contiguous (the bf16 inputs widened, exactly).
   w: bf16 (as uint16), expert e's row n at w + e * stride_e + n * stride_n, its K values contiguous.
   y: [B, M, N] bf16, each sum rounded once to the nearest even bf16 (a bf16 matmul's rounding point).

   At decode a routed expert sees a few rows, so each of its weights is used a few times: the pass is bound by
   reading the weights, and each is read from memory once (its row stays in cache while the expert's rows use
   it). The sums run in float32 over LANES partial sums, added in a fixed order: deterministic for a given K. */

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define LANES 16 /* one 512-bit register of float32 */
#define CHAINS 4 /* independent sums a row (an add waits for the last: 4 hide its latency; 32 registers) */
#else
#define LANES 8 /* one 256-bit register (AVX2), or what the compiler makes of it */
#define CHAINS 2 /* (16 registers) */
#endif
#define STEP (LANES * CHAINS)
#define ROWS 4 /* rows taken together on one weight row */

static inline float widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t narrow(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

typedef float fvec __attribute__((vector_size(LANES * sizeof(float))));
typedef float fvec_u __attribute__((vector_size(LANES * sizeof(float)), aligned(4))); /* an unaligned load */
typedef uint32_t uvec __attribute__((vector_size(LANES * sizeof(uint32_t))));
typedef uint16_t hvec_u __attribute__((vector_size(LANES * sizeof(uint16_t)), aligned(2)));

/* res[r] = dot(x + r * K, w) for r < R; R is a constant where this is inlined (its loops unrolled, the partial
   sums kept in vector registers: GCC's vector extensions). */
static inline __attribute__((always_inline)) void dots(const uint16_t *restrict w, const float *restrict x,
                                                      long K, int R, float *restrict res) {
    fvec acc[ROWS][CHAINS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < CHAINS; c++) acc[r][c] = (fvec){0};
    long i = 0;
    for (; i + STEP <= K; i += STEP) {
        for (int c = 0; c < CHAINS; c++) {
            uvec u = __builtin_convertvector(*(const hvec_u *)(w + i + c * LANES), uvec) << 16;
            fvec wf = (fvec)u; /* the bits as float32: bf16 widened exactly */
            for (int r = 0; r < R; r++) acc[r][c] += *(const fvec_u *)(x + r * K + i + c * LANES) * wf;
        }
    }
    for (int r = 0; r < R; r++) {
        fvec v = acc[r][0];
        for (int c = 1; c < CHAINS; c++) v += acc[r][c];
        float s = 0.0f;
        for (int l = 0; l < LANES; l++) s += v[l];
        for (long j = i; j < K; j++) s += x[r * K + j] * widen(w[j]);
        res[r] = s;
    }
}

static void row_block(const uint16_t *w, const float *x, long K, long m, long N, long n, uint16_t *y) {
    float res[ROWS];
    for (long r0 = 0; r0 < m; r0 += ROWS) {
        long R = m - r0 < ROWS ? m - r0 : ROWS;
        const float *xr = x + r0 * K;
        switch (R) {
            case 1: dots(w, xr, K, 1, res); break;
            case 2: dots(w, xr, K, 2, res); break;
            case 3: dots(w, xr, K, 3, res); break;
            default: dots(w, xr, K, 4, res); break;
        }
        for (long r = 0; r < R; r++) y[(r0 + r) * N + n] = narrow(res[r]);
    }
}

int host_matmul_version(void) { return 1; }

void grouped_rows(const float *x, long B, long M, long K, const uint16_t *w, long stride_e, long stride_n, long N,
                  const int64_t *ids, const int64_t *rows, uint16_t *y, int threads, long block) {
    long blocks = (N + block - 1) / block;
    long items = B * blocks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (long it = 0; it < items; it++) {
        long b = it / blocks, n0 = (it % blocks) * block;
        long n1 = n0 + block < N ? n0 + block : N;
        long m = rows[b] < 0 ? 0 : rows[b] < M ? rows[b] : M;
        const uint16_t *we = w + ids[b] * stride_e;
        const float *xb = x + b * M * K;
        uint16_t *yb = y + b * M * N;
        for (long n = n0; n < n1; n++) {
            row_block(we + n * stride_n, xb, K, m, N, n, yb);
            for (long r = m; r < M; r++) yb[r * N + n] = 0;
        }
    }
}
