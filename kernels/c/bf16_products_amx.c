/* A bfloat16 network's Linear layers (y = x W^T + b, bfloat16 in and out) on Intel AMX's tiles, for x86-64 CPUs with
 * AMX-BF16 (Sapphire Rapids and later). Built and loaded by kernels/bf16_linear.py, which checks it against float32
 * products of the same bfloat16 numbers before use.
 *
 * Why: torch's bfloat16 Linear (oneDNN) lays a layer's weights out for AMX again at every call: at the few rows of
 * one query (all-MiniLM-L6-v2, 21 tokens, one core) its 24 products a sentence took 72% of the forward pass, 132 us
 * each, about 140 G FLOP/s against the tiles' 3,300 a core. Here the weights are laid out once, when the layer is
 * built.
 *
 * How: TDPBF16PS multiplies a 16 x 32 tile of bfloat16 rows by a 32 x 16 one into 16 x 16 float32 sums. The
 * weights are laid out in blocks of 64 output columns, within a block as [k / 2][64 columns][2 consecutive k]: a B
 * tile (16 columns x 32 inputs) is then 16 rows of 64 bytes, 256 bytes apart. For each block and each 16 input rows:
 * four float32 tiles (one per 16 columns), and for each 32 inputs one tile of the rows and, in turn, the four tiles
 * of weights (two tile registers, alternating, so that a load need not wait for the product reading the other).
 * The last rows (fewer than 16) take tile shapes of that many rows. Float32 sums over k in one fixed order, the bias
 * added, rounded once to bfloat16 (to nearest even): a row's result does not depend on the other rows of the batch.
 */
#include <omp.h>

#include "amx_tiles.c"

typedef uint16_t bf16;

#define BLOCK_COLUMNS 64
#define TILE_INPUTS 32 /* bfloat16 inputs a tile row holds */
#define ROW_CHUNK 128  /* rows run over all of a thread's blocks before the next: blocks_share */

/* bfloat16 elements `bf16_block_weights` writes for k inputs and n outputs (k a multiple of 32, checked by the
 * caller). */
int64_t bf16_blocked_size(int64_t k, int64_t n) {
    return (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS * BLOCK_COLUMNS * k;
}

/* w (n, k) bfloat16, row-major (nn.Linear's weight) -> `blocked` (bf16_blocked_size elements, columns past n zero). */
void bf16_block_weights(const bf16 *w, int64_t k, int64_t n, bf16 *blocked) {
    memset(blocked, 0, (size_t)bf16_blocked_size(k, n) * sizeof(bf16));
    for (int64_t col = 0; col < n; col++) {
        bf16 *block = blocked + col / BLOCK_COLUMNS * BLOCK_COLUMNS * k;
        const int64_t lane = col % BLOCK_COLUMNS;
        for (int64_t input = 0; input < k; input++)
            block[((input / 2) * BLOCK_COLUMNS + lane) * 2 + input % 2] = w[col * k + input];
    }
}

/* Tiles 0-3 (sums) and 4 (rows) of `rows` rows, 5 and 6 (weights) of 16. */
static void load_product_tiles(int rows) { load_tiles(7, 5, rows); }

/* Rows first .. first + rows - 1 (rows <= 16, the tiles loaded for that many) of a times one block of 64 columns,
 * plus the bias, into those rows of out (its block's first column; n apart); `columns` of them are stored (the
 * block's columns past n are zero weights). */
static void rows_times_block(const bf16 *a, int64_t first, int rows, int64_t k, const bf16 *block, const float *bias,
                             bf16 *out, int64_t n, int64_t columns) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t input = 0; input < k; input += TILE_INPUTS) {
        const bf16 *weights = block + input / 2 * BLOCK_COLUMNS * 2;
        _tile_loadd(4, a + first * k + input, k * 2);
        _tile_loadd(5, weights, BLOCK_COLUMNS * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, weights + 32, BLOCK_COLUMNS * 4);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, weights + 64, BLOCK_COLUMNS * 4);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, weights + 96, BLOCK_COLUMNS * 4);
        _tile_dpbf16ps(3, 4, 6);
    }
    float sums[16][BLOCK_COLUMNS] __attribute__((aligned(64)));
    _tile_stored(0, sums[0], BLOCK_COLUMNS * 4);
    _tile_stored(1, sums[0] + 16, BLOCK_COLUMNS * 4);
    _tile_stored(2, sums[0] + 32, BLOCK_COLUMNS * 4);
    _tile_stored(3, sums[0] + 48, BLOCK_COLUMNS * 4);
    for (int r = 0; r < rows; r++) {
        bf16 *row_out = out + (first + r) * n;
        for (int64_t c = 0; c < columns; c += 16) {
            const __mmask16 lanes = columns - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (columns - c)) - 1u);
            const __m512 sum = _mm512_add_ps(_mm512_load_ps(sums[r] + c), _mm512_maskz_loadu_ps(lanes, bias + c));
            _mm256_mask_storeu_epi16(row_out + c, lanes, (__m256i)_mm512_cvtneps_pbh(sum));
        }
    }
}

/* Columns of block b that out (n columns) has: 64, or fewer in the last block. */
static inline int64_t block_columns(int64_t n, int64_t b) {
    return n - b * BLOCK_COLUMNS < BLOCK_COLUMNS ? n - b * BLOCK_COLUMNS : BLOCK_COLUMNS;
}

/* Blocks first_block .. last_block - 1 of out, every row: ROW_CHUNK rows at a time over all of the blocks (the chunk's
 * rows stay in L2 while the blocks pass over them, where a block at a time over every row of a bulk batch read the
 * rows from memory again for each block: 2x torch's time at 4,096 rows), 16 rows a tile, then the rows left. */
static void blocks_share(const bf16 *a, int64_t m, int64_t k, const bf16 *blocked, const float *bias, int64_t n,
                         bf16 *out, int64_t first_block, int64_t last_block) {
    const int64_t whole = m / 16 * 16;
    if (whole > 0) {
        load_product_tiles(16);
        for (int64_t chunk = 0; chunk < whole; chunk += ROW_CHUNK) {
            const int64_t chunk_end = chunk + ROW_CHUNK < whole ? chunk + ROW_CHUNK : whole;
            for (int64_t b = first_block; b < last_block; b++)
                for (int64_t first = chunk; first < chunk_end; first += 16)
                    rows_times_block(a, first, 16, k, blocked + b * BLOCK_COLUMNS * k, bias + b * BLOCK_COLUMNS,
                                     out + b * BLOCK_COLUMNS, n, block_columns(n, b));
        }
    }
    if (whole < m) {
        load_product_tiles((int)(m - whole));
        for (int64_t b = first_block; b < last_block; b++)
            rows_times_block(a, whole, (int)(m - whole), k, blocked + b * BLOCK_COLUMNS * k, bias + b * BLOCK_COLUMNS,
                             out + b * BLOCK_COLUMNS, n, block_columns(n, b));
    }
    _tile_release();
}

/* out (m, n) bfloat16 = a (m, k) bfloat16, row-major, times the blocked weights, plus `bias` (n float32, zeros for
 * none), on up to `threads` of OpenMP's threads (torch's own pool: int8_products.c says why), each a run of whole
 * 64-column blocks, so that each block of weights is read by one thread. */
void bf16_linear(const bf16 *a, int64_t m, int64_t k, const bf16 *blocked, const float *bias, int64_t n, bf16 *out,
                 int64_t threads) {
    const int64_t blocks = (n + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS;
    if (m <= 0) return;
    if (threads > blocks) threads = blocks;
    if (threads <= 1) {
        blocks_share(a, m, k, blocked, bias, n, out, 0, blocks);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
        blocks_share(a, m, k, blocked, bias, n, out, blocks * me / team, blocks * (me + 1) / team);
    }
}
