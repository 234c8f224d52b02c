/* The int8 x int8 -> int32 matrix product of an int8 Linear layer, for x86-64 CPUs with AVX2 and no AVX512-VNNI
 * (AMD Zen 2 and 3, Intel before Ice Lake). Built and loaded by kernels/int8_products.py where int8_products.c (VNNI)
 * cannot run; checked the same way against the exact products before use, and exact like it, so every path gives
 * the same bits.
 *
 * Why: torch._int_mm on such a CPU runs about 2 G multiply-adds a second on two cores, 30x slower than float32's
 * matrix product (python -m bench.peak.int8_products measures all three), so an int8 model was far slower than float32.
 *
 * How: VPMADDWD multiplies 16-bit pairs and adds each pair into an int32 lane, exactly (no saturation, unlike
 * VPMADDUBSW's 16-bit sums, which int8 activations and weights can overflow). The caller widens int8 inputs to 16 bits
 * (a pass over m x k bytes against m x k x n multiply-adds); the weights are laid out once, when the layer is built, in
 * blocks of 32 output columns, within a block as [k / 2][32 columns][2 consecutive k] 16-bit values: one 32-byte load
 * holds 8 columns' next two weights.
 * 12-bit inputs (the late-interaction models' feed-forward output layers) are 16-bit values already, and take one
 * product where the VNNI kernel needs two.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define BLOCK_COLUMNS 32
#define ROW_TILE 3 /* 3 rows x 4 vectors of 8 int32 sums, a broadcast and a product in AVX2's 16 registers */

/* As int8_products.c's: 16-bit input rows, and a 12-bit one in one product. */
typedef int16_t product_input;
#define PRODUCTS_TAKE_12_BITS 1

/* Bytes `block_weights` writes for a (k, n) matrix; k must be even. */
int64_t blocked_size(int64_t k, int64_t n) {
    return (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS * BLOCK_COLUMNS * k * (int64_t)sizeof(int16_t);
}

/* w (k, n) int8, row-major -> `blocked` (blocked_size bytes, columns past n zero). `correction` is the VNNI
 * kernel's (what its unsigned inputs add); signed products need none, so it is zero here, the same call for both. */
void block_weights(const int8_t *w, int64_t k, int64_t n, int16_t *blocked, int32_t *correction) {
    memset(blocked, 0, (size_t)blocked_size(k, n));
    for (int64_t col = 0; col < n; col++) {
        int16_t *block = blocked + col / BLOCK_COLUMNS * BLOCK_COLUMNS * k;
        const int64_t lane = col % BLOCK_COLUMNS;
        for (int64_t row = 0; row < k; row++)
            block[((row / 2) * BLOCK_COLUMNS + lane) * 2 + row % 2] = w[row * n + col];
        correction[col] = 0;
    }
}

/* The lanes of a vector of 8 int32 that column `left` columns from the end still has: all-ones where stored. */
static inline __m256i stored_lanes(int64_t left) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(left > 8 ? 8 : left)), index);
}

/* ROWS rows of 16-bit inputs times one block of the weights into c (ldc apart). A macro for the same reason as the
 * VNNI kernel's: the ROWS x 4 sums stay in registers only as a fixed-size array with every loop over it unrolled. */
#define ROWS_TIMES_BLOCK(ROWS)                                                                                  \
    static inline __attribute__((always_inline)) void rows_times_block_##ROWS(                                \
            const int16_t *a, int64_t lda, const int16_t *block, int64_t steps, int32_t *c, int64_t ldc,      \
            int64_t columns) {                                                                                \
        __m256i sum[ROWS][4];                                                                                 \
        for (int r = 0; r < ROWS; r++)                                                                        \
            for (int j = 0; j < 4; j++) sum[r][j] = _mm256_setzero_si256();                                   \
        for (int64_t step = 0; step < steps; step++) {                                                        \
            const __m256i *w = (const __m256i *)(block + step * 2 * BLOCK_COLUMNS);                           \
            for (int r = 0; r < ROWS; r++) {                                                                  \
                int32_t pair;                                                                                 \
                memcpy(&pair, a + r * lda + step * 2, 4);                                                     \
                const __m256i x = _mm256_set1_epi32(pair);                                                    \
                for (int j = 0; j < 4; j++)                                                                   \
                    sum[r][j] = _mm256_add_epi32(sum[r][j], _mm256_madd_epi16(x, _mm256_loadu_si256(w + j))); \
            }                                                                                                 \
        }                                                                                                     \
        for (int j = 0; j < 4; j++) {                                                                         \
            const int64_t left = columns - 8 * j;                                                             \
            if (left <= 0) break;                                                                             \
            for (int r = 0; r < ROWS; r++) {                                                                  \
                if (left >= 8) _mm256_storeu_si256((__m256i *)(c + r * ldc + 8 * j), sum[r][j]);              \
                else _mm256_maskstore_epi32(c + r * ldc + 8 * j, stored_lanes(left), sum[r][j]);               \
            }                                                                                                 \
        }                                                                                                     \
    }
ROWS_TIMES_BLOCK(1) ROWS_TIMES_BLOCK(2) ROWS_TIMES_BLOCK(3)

/* Thread `me` of `team`'s part of c: whole column blocks when there are enough of them for every thread, else
 * (few blocks, many rows) slices of rows over each block, so each part reads one block from memory. */
static void products_part(const int16_t *a, int64_t m, int64_t k, const int16_t *blocked, int64_t n, int32_t *c,
                          int64_t me, int64_t team) {
    const int64_t blocks = (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS, tiles = (m + ROW_TILE - 1) / ROW_TILE;
    const int64_t slices = team > blocks ? (team + blocks - 1) / blocks < tiles ? (team + blocks - 1) / blocks
                                                                                : tiles : 1;
    const int64_t parts = blocks * slices, steps = k / 2;
    for (int64_t part = parts * me / team; part < parts * (me + 1) / team; part++) {
        const int64_t b = part / slices, slice = part % slices;
        const int64_t first = tiles * slice / slices * ROW_TILE, end = tiles * (slice + 1) / slices * ROW_TILE;
        const int64_t last = end < m ? end : m;
        const int16_t *block = blocked + b * steps * 2 * BLOCK_COLUMNS;
        const int64_t columns = n - b * BLOCK_COLUMNS < BLOCK_COLUMNS ? n - b * BLOCK_COLUMNS : BLOCK_COLUMNS;
        int64_t r = first;
        for (; r + ROW_TILE <= last; r += ROW_TILE)
            rows_times_block_3(a + r * k, k, block, steps, c + r * n + b * BLOCK_COLUMNS, n, columns);
        if (last - r == 2) rows_times_block_2(a + r * k, k, block, steps, c + r * n + b * BLOCK_COLUMNS, n, columns);
        if (last - r == 1) rows_times_block_1(a + r * k, k, block, steps, c + r * n + b * BLOCK_COLUMNS, n, columns);
    }
}

/* Thread `me` of `team`'s share, with int8_products.c's arguments, as int8_layer_avx2.c's team calls it: signed
 * inputs need no correction. */
static inline void products_share(const int16_t *a, int64_t m, int64_t k, const int16_t *blocked,
                                  const int32_t *correction, int64_t n, int32_t *c, int64_t me, int64_t team) {
    (void)correction;
    products_part(a, m, k, blocked, n, c, me, team);
}

/* c (m, n) int32 = a (m, k) 16-bit values, row-major, times the blocked (k, n) weights, on up to `threads` of
 * torch's OpenMP threads (this library resolves to torch's libgomp, as int8_products.c explains). Exact while
 * k x max|a| x 128 < 2^31: 12-bit inputs and k up to 8,191 (kernels.int8_products.TWELVE_BIT_MAX_INPUTS). */
void matmul_blocked_16(const int16_t *a, int64_t m, int64_t k, const int16_t *blocked, int64_t n, int32_t *c,
                       int64_t threads) {
    if (m <= 0) return;
    const int64_t most = (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS * ((m + ROW_TILE - 1) / ROW_TILE);
    if (threads > most) threads = most;
    if (threads <= 1) {
        products_part(a, m, k, blocked, n, c, 0, 1);
        return;
    }
#pragma omp parallel num_threads(threads)
    products_part(a, m, k, blocked, n, c, omp_get_thread_num(), omp_get_num_threads());
}
