/* The int8 x int8 -> int32 matrix product of an int8 Linear layer, for x86-64 CPUs with AVX512-VNNI, tuned for the
 * few rows of a search query (one sentence: 10-60 tokens). Built and loaded by kernels/int8_products.py, which checks
 * every result shape against torch._int_mm before use; the products are exact integers, equal to _int_mm's bit for
 * bit, so switching between the two changes no result.
 *
 * Why: at the row counts of one query, torch._int_mm spends far more than the multiply-adds need (it also pads
 * its input to 17 rows). At 34 rows all-MiniLM-L6-v2's 24 products took 1.02 ms with it against 0.77 ms here, on
 * one core, and 0.91 against 0.46 on two (BENCHMARKS.md, "One query at a time on a CPU"); at 2048 rows the two are
 * within 5%. The weights are laid out in blocks once, when the layer is built.
 *
 * How: VPDPBUSD multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products to an int32 lane. The
 * activations are signed, so each byte is fed as a + 128 (an XOR with 0x80) and 128 * (column sum of the
 * weights) is subtracted at the end: (a + 128) . w - 128 * sum(w) = a . w, exactly. The weights are laid out in
 * blocks of 64 output columns, and within a block as [k / 4][64 columns][4 consecutive k]: one 64-byte load
 * holds 16 columns' next 4 weights, the shape VPDPBUSD takes. A block (64 columns x K) is 24 KiB at K = 384 and
 * stays in L1 while up to 6 input rows at a time run over it: 6 x 4 accumulators, 4 weight registers and one
 * broadcast fit the 32 vector registers.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define BLOCK_COLUMNS 64
#define ROW_TILE 6

/* What int8_layer.c's body needs to know of a products kernel: the type of the input rows it takes, and whether a
 * 12-bit input goes in as one row (else as its high and low int8 parts, two products). */
typedef int8_t product_input;
#define PRODUCTS_TAKE_12_BITS 0

/* Bytes `block_weights` writes for a (k, n) matrix; k must be a multiple of 4. */
int64_t blocked_size(int64_t k, int64_t n) {
    return (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS * BLOCK_COLUMNS * k;
}

/* w (k, n) int8, row-major -> `blocked` (blocked_size bytes, columns past n zero) and
 * `correction`[n] = 128 * (sum of column n), what the unsigned inputs add. */
void block_weights(const int8_t *w, int64_t k, int64_t n, int8_t *blocked, int32_t *correction) {
    memset(blocked, 0, (size_t)blocked_size(k, n));
    for (int64_t col = 0; col < n; col++) {
        int32_t sum = 0;
        int8_t *block = blocked + col / BLOCK_COLUMNS * BLOCK_COLUMNS * k;
        int64_t lane = col % BLOCK_COLUMNS;
        for (int64_t row = 0; row < k; row++) {
            int8_t v = w[row * n + col];
            sum += v;
            block[((row / 4) * BLOCK_COLUMNS + lane) * 4 + row % 4] = v;
        }
        correction[col] = 128 * sum;
    }
}

/* ROWS input rows times one block of the weights, for each ROWS in 1..6, into c (ldc apart) less the correction.
 * A macro, not one function taking the row count: the ROWS x 4 accumulators must be an array of exactly that size,
 * every loop over it unrolled, for the compiler to keep all of them in registers. Small changes to this shape
 * (the driver's pointer arithmetic included) made gcc 12 keep some in memory, 1.1-1.3x slower: check
 * `objdump -d` for stores to %rsp after editing. */
#define ROWS_TIMES_BLOCK(ROWS)                                                                                  \
    static inline __attribute__((always_inline)) void rows_times_block_##ROWS(                                \
            const int8_t *a, int64_t lda, const int8_t *block, int64_t steps, int32_t *c, int64_t ldc,        \
            const int32_t *correction, int64_t columns, const int8_t *next) {                                 \
        __m512i acc[ROWS][4];                                                                                 \
        for (int r = 0; r < ROWS; r++)                                                                        \
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_si512();                                   \
        const __m512i to_unsigned = _mm512_set1_epi32((int32_t)0x80808080);                                   \
        for (int64_t step = 0; step < steps; step++) {                                                        \
            _mm_prefetch((const char *)(next + step * 256), _MM_HINT_T0);                                     \
            _mm_prefetch((const char *)(next + step * 256 + 64), _MM_HINT_T0);                                \
            _mm_prefetch((const char *)(next + step * 256 + 128), _MM_HINT_T0);                               \
            _mm_prefetch((const char *)(next + step * 256 + 192), _MM_HINT_T0);                               \
            const __m512i w0 = _mm512_loadu_si512(block + step * 256);                                        \
            const __m512i w1 = _mm512_loadu_si512(block + step * 256 + 64);                                   \
            const __m512i w2 = _mm512_loadu_si512(block + step * 256 + 128);                                  \
            const __m512i w3 = _mm512_loadu_si512(block + step * 256 + 192);                                  \
            for (int r = 0; r < ROWS; r++) {                                                                  \
                int32_t four;                                                                                 \
                memcpy(&four, a + r * lda + step * 4, 4);                                                     \
                __m512i x = _mm512_xor_si512(_mm512_set1_epi32(four), to_unsigned);                           \
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, w0);                                            \
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, w1);                                            \
                acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], x, w2);                                            \
                acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], x, w3);                                            \
            }                                                                                                 \
        }                                                                                                     \
        for (int j = 0; j < 4; j++) {                                                                         \
            int64_t left = columns - 16 * j;                                                                  \
            if (left <= 0) break;                                                                             \
            __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);                  \
            __m512i fix = _mm512_maskz_loadu_epi32(mask, correction + 16 * j);                                \
            for (int r = 0; r < ROWS; r++)                                                                    \
                _mm512_mask_storeu_epi32(c + r * ldc + 16 * j, mask, _mm512_sub_epi32(acc[r][j], fix));       \
        }                                                                                                     \
    }
ROWS_TIMES_BLOCK(1) ROWS_TIMES_BLOCK(2) ROWS_TIMES_BLOCK(3) ROWS_TIMES_BLOCK(4) ROWS_TIMES_BLOCK(5) ROWS_TIMES_BLOCK(6)

/* Rows first_row .. last_row - 1 of c = a times blocks first_block .. last_block - 1 of the blocked weights. */
static void rows_times_blocks(const int8_t *a, int64_t first_row, int64_t last_row, int64_t k, const int8_t *blocked,
                              const int32_t *correction, int64_t n, int32_t *c, int64_t first_block,
                              int64_t last_block) {
    int64_t steps = k / 4;
    for (int64_t b = first_block; b < last_block; b++) {
        const int8_t *block = blocked + b * steps * 4 * BLOCK_COLUMNS;
        int64_t columns = n - b * BLOCK_COLUMNS;
        if (columns > BLOCK_COLUMNS) columns = BLOCK_COLUMNS;
        int32_t *cb = c + b * BLOCK_COLUMNS;
        const int32_t *fix = correction + b * BLOCK_COLUMNS;
        /* The last row tile over this block fetches the next block into L1 as it goes. */
        const int8_t *next = b + 1 < last_block ? block + steps * 4 * BLOCK_COLUMNS : block;
        int64_t r = first_row;
        for (; r + ROW_TILE <= last_row; r += ROW_TILE)
            rows_times_block_6(a + r * k, k, block, steps, cb + r * n, n, fix, columns, next);
        switch (last_row - r) {
            case 5: rows_times_block_5(a + r * k, k, block, steps, cb + r * n, n, fix, columns, next); break;
            case 4: rows_times_block_4(a + r * k, k, block, steps, cb + r * n, n, fix, columns, next); break;
            case 3: rows_times_block_3(a + r * k, k, block, steps, cb + r * n, n, fix, columns, next); break;
            case 2: rows_times_block_2(a + r * k, k, block, steps, cb + r * n, n, fix, columns, next); break;
            case 1: rows_times_block_1(a + r * k, k, block, steps, cb + r * n, n, fix, columns, next); break;
        }
    }
}

/* What runs a thread's rows of some blocks, and the row tiles a split of a block's rows keeps whole: these loops and
 * their tiles of 6 rows, unless a file including this one (int8_products_amx.c) names its own. */
#ifndef SPLIT_ROWS
#define SPLIT_ROWS ROW_TILE
#define RUN_ROWS rows_times_blocks
#endif

/* Thread `me` of `team`'s share of c (m, n) int32 = a (m, k) int8 times the blocked (k, n) weights: a run of whole
 * 64-column blocks and every row, so each block is read by one thread; only when the team outnumbers the blocks is
 * each block's rows also split, in whole row tiles. */
static void products_share(const int8_t *a, int64_t m, int64_t k, const int8_t *blocked, const int32_t *correction,
                           int64_t n, int32_t *c, int64_t me, int64_t team) {
    if (m <= 0) return;
    const int64_t blocks = (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS, tiles = (m + SPLIT_ROWS - 1) / SPLIT_ROWS;
    int64_t row_parts = team > blocks ? (team + blocks - 1) / blocks : 1;
    if (row_parts > tiles) row_parts = tiles;
    if (row_parts == 1) {
        RUN_ROWS(a, 0, m, k, blocked, correction, n, c, blocks * me / team, blocks * (me + 1) / team);
        return;
    }
    const int64_t parts = blocks * row_parts;
    for (int64_t part = parts * me / team; part < parts * (me + 1) / team; part++) {
        const int64_t b = part / row_parts, slice = part % row_parts;
        const int64_t first = tiles * slice / row_parts * SPLIT_ROWS;
        const int64_t last = tiles * (slice + 1) / row_parts * SPLIT_ROWS;
        RUN_ROWS(a, first, last < m ? last : m, k, blocked, correction, n, c, b, b + 1);
    }
}

/* c (m, n) int32 = a (m, k) int8, row-major, times the blocked (k, n) weights, on up to `threads` threads.
 *
 * The threads are OpenMP's, and this library shares torch's OpenMP runtime: torch loads its libgomp.so.1 into the
 * process's global namespace, so this library's libgomp.so.1 resolves to that copy, and the threads that run
 * torch's own parallel loops run these too (two pools on the same cores would spin against each other). */
void matmul_blocked(const int8_t *a, int64_t m, int64_t k, const int8_t *blocked, const int32_t *correction,
                   int64_t n, int32_t *c, int64_t threads) {
    const int64_t most = (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS * ((m + SPLIT_ROWS - 1) / SPLIT_ROWS);
    if (threads > most) threads = most;
    if (threads <= 1) {
        products_share(a, m, k, blocked, correction, n, c, 0, 1);
        return;
    }
#pragma omp parallel num_threads(threads)
    products_share(a, m, k, blocked, correction, n, c, omp_get_thread_num(), omp_get_num_threads());
}
