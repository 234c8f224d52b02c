/* int8_products.c's products with Intel AMX (Sapphire Rapids and later) doing the rows it can take sixteen at a time:
 * the same blocked weights, the same interface (`products_share`, `matmul_blocked`), the same exact integers. Built
 * and loaded by kernels/int8_products.py, and inside int8_layer_amx.c by kernels/int8_layer.py, each checked against
 * the exact products before use.
 *
 * Why: one AMX instruction (TDPBSSD) multiplies a 16 x 64 tile of signed bytes by a 64 x 16 one into a 16 x 16 tile
 * of int32 sums: 16,384 multiply-adds, where one AVX512-VNNI instruction does 64. On a 2-core Sapphire Rapids,
 * torch._int_mm (oneDNN, on AMX) reached 2,795 GOP/s on 2048-square products against the VNNI loops' register-bound
 * peak of 1,729 (`python -m bench.peak`), and the VNNI products were most of an int8 layer's time.
 *
 * How: the blocked layout ([k / 4][64 columns][4 consecutive k] a block) is already the one an AMX B tile takes: a
 * tile of 16 columns x 64 inputs is 16 rows of 64 bytes, 256 bytes apart in the block. Sixteen input rows at a time,
 * for each block of 64 columns: four int32 tiles (one per 16 columns), and for each 64 inputs one tile of the rows
 * and, in turn, the four tiles of weights (two tile registers, alternating, so that a load need not wait for the
 * product reading the other). Signed bytes by signed bytes, so no correction. The rows left over (fewer than 16) and
 * a k that is not a multiple of 64 go to the VNNI loops, included below.
 * Linux's permission and the tile shapes: amx_tiles.c.
 */
#include <stdint.h>

#include "amx_tiles.c"

#define TILE_ROWS 16
#define TILE_INPUTS 64 /* bytes a tile row holds: 64 inputs of the rows, or 16 columns x 4 inputs of the weights */

/* int8_products.c's share of a product and matmul_blocked, over these rows: split only in whole tiles of 16 rows. */
#define SPLIT_ROWS TILE_ROWS
#define RUN_ROWS amx_rows_times_blocks
static void amx_rows_times_blocks(const int8_t *a, int64_t first_row, int64_t last_row, int64_t k,
                                  const int8_t *blocked, const int32_t *correction, int64_t n, int32_t *c,
                                  int64_t first_block, int64_t last_block);
#include "int8_products.c"

/* Every tile in use 16 rows of 64 bytes: 0-3 the int32 sums of 16 columns each, 4 the rows, 5 and 6 the weights. */
static void load_tile_shapes(void) { load_square_tiles(7); }

/* Rows row .. row + 15 of c (ldc apart) = those rows of a (k bytes each, k a multiple of 64) times one 64-column
 * block; `columns` of them are stored (the block's columns past n are zero weights). */
static void tile_times_block(const int8_t *a, int64_t k, const int8_t *block, int32_t *c, int64_t ldc,
                             int64_t columns) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t input = 0; input < k; input += TILE_INPUTS) {
        const int8_t *weights = block + input / 4 * BLOCK_COLUMNS * 4;
        _tile_loadd(4, a + input, k);
        _tile_loadd(5, weights, BLOCK_COLUMNS * 4);
        _tile_dpbssd(0, 4, 5);
        _tile_loadd(6, weights + 64, BLOCK_COLUMNS * 4);
        _tile_dpbssd(1, 4, 6);
        _tile_loadd(5, weights + 128, BLOCK_COLUMNS * 4);
        _tile_dpbssd(2, 4, 5);
        _tile_loadd(6, weights + 192, BLOCK_COLUMNS * 4);
        _tile_dpbssd(3, 4, 6);
    }
    if (columns == BLOCK_COLUMNS) {
        _tile_stored(0, c, ldc * 4);
        _tile_stored(1, c + 16, ldc * 4);
        _tile_stored(2, c + 32, ldc * 4);
        _tile_stored(3, c + 48, ldc * 4);
        return;
    }
    int32_t sums[TILE_ROWS][BLOCK_COLUMNS] __attribute__((aligned(64)));
    _tile_stored(0, sums[0], BLOCK_COLUMNS * 4);
    _tile_stored(1, sums[0] + 16, BLOCK_COLUMNS * 4);
    _tile_stored(2, sums[0] + 32, BLOCK_COLUMNS * 4);
    _tile_stored(3, sums[0] + 48, BLOCK_COLUMNS * 4);
    for (int r = 0; r < TILE_ROWS; r++) memcpy(c + r * ldc, sums[r], (size_t)columns * 4);
}

/* Rows first_row .. last_row - 1 of c = a times blocks first_block .. last_block - 1: whole tiles of 16 rows on AMX,
 * the rest on the VNNI loops. */
static void amx_rows_times_blocks(const int8_t *a, int64_t first_row, int64_t last_row, int64_t k,
                                  const int8_t *blocked, const int32_t *correction, int64_t n, int32_t *c,
                                  int64_t first_block, int64_t last_block) {
    const int64_t tiled_rows = k % TILE_INPUTS == 0 ? (last_row - first_row) / TILE_ROWS * TILE_ROWS : 0;
    if (tiled_rows > 0) {
        load_tile_shapes();
        for (int64_t b = first_block; b < last_block; b++) {
            const int8_t *block = blocked + b * k * BLOCK_COLUMNS;
            int64_t columns = n - b * BLOCK_COLUMNS;
            if (columns > BLOCK_COLUMNS) columns = BLOCK_COLUMNS;
            for (int64_t r = first_row; r < first_row + tiled_rows; r += TILE_ROWS)
                tile_times_block(a + r * k, k, block, c + r * n + b * BLOCK_COLUMNS, n, columns);
        }
        _tile_release();
    }
    if (first_row + tiled_rows < last_row)
        rows_times_blocks(a, first_row + tiled_rows, last_row, k, blocked, correction, n, c, first_block, last_block);
}
