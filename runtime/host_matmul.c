/* The host's grouped matmul at few rows an expert (runtime/host_matmul.py builds and loads it).

   y[b, r, n] = sum_k x[b, r, k] * w[ids[b], n, k]   for r < rows[b]; 0 for rows[b] <= r < M

   x: [B, M, K] float32, contiguous (the bf16 inputs widened, exactly).
   w: bf16 (as uint16), expert e's row n at w + e * stride_e + n * stride_n, its K values contiguous.
   y: [B, M, N] bf16, each sum rounded once to the nearest even bf16 (a bf16 matmul's rounding point).

   At decode a routed expert sees a few rows, so each of its weights is used a few times: the pass is bound by
   reading the weights, and each is read from memory once (its row stays in cache while the expert's rows use
   it), and OUTS weight rows are read at once (several streams from memory in flight a thread). The sums run in
   float32 over LANES partial sums, added in a fixed order: deterministic for a given K. */

#include <stdint.h>
#include <string.h>

/* The defaults are the H200 host's best of bench/probe_host_kernel.py's variants (2026-12-03, call g: 64 Qwen3-MoE
   experts at 1, 2 and 4 rows, gate/up and down, 15 threads): OUTS 4 with PREFETCH 512 read 68-99 GB/s where
   torch.bmm read 43-77 and OUTS 1 with no prefetch 48-95. Machines without AVX-512 were not measured. */
#if defined(__AVX512F__)
#define LANES 16 /* one 512-bit register of float32 */
#ifndef OUTS
#define OUTS 4 /* weight rows read together: 4 streams from memory, each x load used 4 times (32 registers) */
#endif
#ifndef PREFETCH
#define PREFETCH 512 /* bf16 values ahead of the loads to prefetch each weight row from (0: the hardware's alone) */
#endif
#else
#define LANES 8 /* one 256-bit register (AVX2), or what the compiler makes of it */
#ifndef OUTS
#define OUTS 2 /* (16 registers) */
#endif
#ifndef PREFETCH
#define PREFETCH 0
#endif
#endif
#define ROWS 4 /* rows taken together on the weight rows */

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

/* y[r * N + o] = bf16(dot(x + r * K, w + o * ldw)) for r < R, o < O; R and O are constants where this is inlined
   (its loops unrolled, the sums kept in vector registers: GCC's vector extensions), one sum a (row, weight row). */
static inline __attribute__((always_inline)) void dots(const uint16_t *restrict w, long ldw, int O,
                                                      const float *restrict x, long K, int R, uint16_t *y, long N) {
    fvec acc[ROWS][OUTS];
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < OUTS; o++) acc[r][o] = (fvec){0};
    long i = 0;
    for (; i + LANES <= K; i += LANES) {
        fvec wf[OUTS];
        for (int o = 0; o < O; o++) {
            if (PREFETCH) __builtin_prefetch(w + o * ldw + i + PREFETCH);
            uvec u = __builtin_convertvector(*(const hvec_u *)(w + o * ldw + i), uvec) << 16;
            wf[o] = (fvec)u; /* the bits as float32: bf16 widened exactly */
        }
        for (int r = 0; r < R; r++) {
            fvec xv = *(const fvec_u *)(x + r * K + i);
            for (int o = 0; o < O; o++) acc[r][o] += xv * wf[o];
        }
    }
    for (int r = 0; r < R; r++)
        for (int o = 0; o < O; o++) {
            float s = 0.0f;
            for (int l = 0; l < LANES; l++) s += acc[r][o][l];
            for (long j = i; j < K; j++) s += x[r * K + j] * widen(w[o * ldw + j]);
            y[r * N + o] = narrow(s);
        }
}

/* dots at the R of a block of rows (1-4), each a constant there */
#define DOTS(W, O, Y)                                                                                          \
    switch (R) {                                                                                               \
        case 1: dots(W, ldw, O, xr, K, 1, Y, N); break;                                                       \
        case 2: dots(W, ldw, O, xr, K, 2, Y, N); break;                                                       \
        case 3: dots(W, ldw, O, xr, K, 3, Y, N); break;                                                       \
        default: dots(W, ldw, O, xr, K, 4, Y, N); break;                                                      \
    }

/* Weight rows [n0, n1) of one expert (``w`` its row n0) through its m rows of x, into y's columns n0.. */
static void row_block(const uint16_t *w, long ldw, long count, const float *x, long K, long m, uint16_t *y, long N) {
    for (long o0 = 0; o0 < count; o0 += OUTS, w += OUTS * ldw, y += OUTS) {
        long O = count - o0 < OUTS ? count - o0 : OUTS;
        for (long r0 = 0; r0 < m; r0 += ROWS) {
            long R = m - r0 < ROWS ? m - r0 : ROWS;
            const float *xr = x + r0 * K;
            uint16_t *yr = y + r0 * N;
            if (O == OUTS) {
                DOTS(w, OUTS, yr)
            } else { /* the block's last weight rows, one at a time */
                for (long o = 0; o < O; o++) DOTS(w + o * ldw, 1, yr + o)
            }
        }
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
        uint16_t *yb = y + b * M * N;
        row_block(w + ids[b] * stride_e + n0 * stride_n, stride_n, n1 - n0, x + b * M * K, K, m, yb + n0, N);
        for (long r = m; r < M; r++)
            for (long n = n0; n < n1; n++) yb[r * N + n] = 0;
    }
}
