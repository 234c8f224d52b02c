/* attention_bf16.c's attention for a bfloat16 network, with both products on Intel AMX's tiles (TDPBF16PS: a 16 x 32
 * tile of bfloat16 times a 32 x 16 one into 16 x 16 float32 sums, 8,192 multiply-adds an instruction where vdpbf16ps
 * does 32). Built and loaded by kernels/attention.py where the CPU has AMX, and checked against torch's
 * scaled_dot_product_attention as attention_bf16.c is.
 *
 * Why: past about 150 tokens of heads of 32, torch's own bfloat16 attention (on AMX) overtook attention_bf16.c, and
 * still ran at about a tenth of the tiles' peak: 350 us a head-layer of a 256-token window, 12 heads of 32, two
 * threads of a Sapphire Rapids-class Xeon, which made the windows of a long input cost more a token than short
 * passages.
 *
 * How, for each (sequence, head), sixteen query rows at a time: the scores of the block against sixteen keys at a
 * time (one float32 tile: for each 32 dimensions, a tile of the queries, read from qkv as it is, times a tile of the
 * keys, laid out in pairs of dimensions exactly as attention_bf16.c lays them out), stored; softmax in float32 rows
 * (attention_bf16.c's 2^t), the weights rounded to bfloat16 over their own row of scores, zeros past the sequence
 * (one buffer: at 256 tokens, keys, values and scores are already as large as a core's first-level cache); then the
 * weighted sum, 16 dimensions a tile (up to four, so 64 dimensions a pass), for each 32 keys a tile of the weights
 * times a tile of the values, laid out in pairs of rows as attention_bf16.c lays them out; divided by the weights'
 * sum on the way out. Rounding as attention_bf16.c's: float32 sums, weights in bfloat16.
 *
 * Tiles: 0-3 the weighted sums, 4 a tile of queries or weights, 5 of keys or values, 6 the scores. Head sizes that
 * are not a multiple of 32, and sequences shorter than AMX_SHORTEST (a tile of 16 rows would be mostly padding), go
 * to attention_bf16.c's vdpbf16ps loops, included below.
 */
#include "attention_bf16.c"
#include "amx_tiles.c"

#define TILE_KEYS 16       /* keys a tile of scores holds (16 float32 columns) */
#define TILE_PAIRS 32      /* keys a tile of weights holds (32 bfloat16 a row), and head dimensions a query tile */
#define SUM_TILES 4        /* tiles 0-3: 64 dimensions of the weighted sum a pass */
#define AMX_SHORTEST 16    /* shorter sequences go to the vdpbf16ps loops: see kernels/attention.py */

static inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
static inline int64_t lines(int64_t bytes) { return round_up(bytes, 64); }

/* Bytes of scratch one thread needs for sequences of at most `longest` tokens, at heads of head_dim: keys and values
 * in pairs, padded to 32 keys; 16 rows of float32 scores (the weights over them); 16 rows of queries (a block's last
 * rows, copied); 16 rows of the float32 weighted sum. At least what attention_bf16.c's loops need, which serve the
 * heads and sequences left. */
int64_t attention_bf16_amx_scratch_bytes(int64_t head_dim, int64_t longest) {
    const int64_t padded = round_up(longest, TILE_PAIRS);
    const int64_t tiled = 2 * lines(head_dim * padded * 2) + lines(16 * padded * 4) +
                          2 * lines(16 * head_dim * 4) + 64;
    const int64_t looped = attention_bf16_scratch_bytes(head_dim, longest);
    return tiled > looped ? tiled : looped;
}

/* One head of one sequence on AMX's tiles (the caller checked head_dim % 32 == 0 and length >= AMX_SHORTEST). */
static void attend_head_tiles(const bf16 *qkv, int64_t start, int64_t length, int64_t h, int64_t heads,
                              int64_t head_dim, float scale, bf16 *out, char *scratch) {
    const int64_t hidden = heads * head_dim, stride = 3 * hidden, padded = round_up(length, TILE_PAIRS);
    const bf16 *base = qkv + start * stride;
    const bf16 *queries = base + h * head_dim, *keys = queries + hidden, *values = keys + hidden;
    char *next = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int32_t *key_words = (int32_t *)next;
    next += lines(head_dim * padded * 2);
    bf16 *value_pairs = (bf16 *)next;
    next += lines(head_dim * padded * 2);
    float *scores = (float *)next;  /* and the weights, bfloat16, over each row's first half */
    next += lines(16 * padded * 4);
    bf16 *query_tile = (bf16 *)next;
    next += lines(16 * head_dim * 4);
    float *sums = (float *)next;

    /* Keys and values laid out as attention_bf16.c lays them out, padded to 32 keys with zeros: a tile of keys is 16
     * rows (pairs of dimensions) of 16 keys, padded * 4 bytes apart; a tile of values 16 pairs of rows of 16
     * dimensions, head_dim * 4 apart. */
    lay_out_keys(keys, stride, length, padded, head_dim, key_words);
    lay_out_values(values, stride, length, padded / 2, head_dim, value_pairs);

    load_square_tiles(7);
    const int64_t key_blocks = round_up(length, TILE_KEYS) / TILE_KEYS;
    for (int64_t first = 0; first < length; first += 16) {
        const int64_t rows = length - first < 16 ? length - first : 16;
        /* The block's queries: read in place where 16 rows are there, else copied with zeros after (a tile must not
         * read past the batch). */
        const bf16 *query_rows = queries + first * stride;
        int64_t query_stride = stride * 2;
        if (rows < 16) {
            memset(query_tile, 0, 16 * head_dim * 2);
            for (int64_t r = 0; r < rows; r++) memcpy(query_tile + r * head_dim, query_rows + r * stride, head_dim * 2);
            query_rows = query_tile;
            query_stride = head_dim * 2;
        }
        /* Scores: scores[r][j] for the block's 16 rows and every key (padded to 16), float32, padded * 4 apart. */
        for (int64_t block = 0; block < key_blocks; block++) {
            _tile_zero(6);
            for (int64_t d = 0; d < head_dim; d += TILE_PAIRS) {
                _tile_loadd(4, query_rows + d, query_stride);
                _tile_loadd(5, key_words + d / 2 * padded + block * TILE_KEYS, padded * 4);
                _tile_dpbf16ps(6, 4, 5);
            }
            _tile_stored(6, scores + block * TILE_KEYS, padded * 4);
        }
        /* Softmax of each of the block's rows over the sequence's keys, into bfloat16 weights written over the row's
         * own scores (each vector's two halves land where scores already read lay), zeros up to `padded`: 2^t with t
         * = (score - the row's largest) * scale * log2(e), one multiply-add a score. Rows past the sequence get zero
         * weights (their sums are dropped, but must not be NaN). Two running maxima and sums, so that a row's
         * vectors do not wait on one another. */
        float inverse[16];
        const __m512 to_log2 = _mm512_set1_ps(scale * LOG2_E);
        for (int64_t r = 0; r < rows; r++) {
            const float *row_scores = scores + r * padded;
            bf16 *row_weights = (bf16 *)(scores + r * padded);
            __m512 top0 = _mm512_set1_ps(-3.0e38f), top1 = top0;
            int64_t j = 0;
            for (; j + 2 * LANES <= length; j += 2 * LANES) {
                top0 = _mm512_max_ps(top0, _mm512_loadu_ps(row_scores + j));
                top1 = _mm512_max_ps(top1, _mm512_loadu_ps(row_scores + j + LANES));
            }
            for (; j < length; j += LANES)
                top0 = _mm512_mask_max_ps(top0, lanes_below(length - j), top0, _mm512_loadu_ps(row_scores + j));
            const __m512 offset = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(top0, top1)) * scale * LOG2_E);
            __m512 total0 = _mm512_setzero_ps(), total1 = total0;
            for (j = 0; j + 2 * LANES <= length; j += 2 * LANES) {
                const __m512 e0 = pow2_for_weights(_mm512_fmsub_ps(_mm512_loadu_ps(row_scores + j), to_log2, offset));
                const __m512 e1 = pow2_for_weights(
                    _mm512_fmsub_ps(_mm512_loadu_ps(row_scores + j + LANES), to_log2, offset));
                _mm512_storeu_si512(row_weights + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
                total0 = _mm512_add_ps(total0, e0);
                total1 = _mm512_add_ps(total1, e1);
            }
            for (; j < length; j += LANES) {
                const __m512 e = _mm512_maskz_mov_ps(lanes_below(length - j), pow2_for_weights(
                    _mm512_fmsub_ps(_mm512_loadu_ps(row_scores + j), to_log2, offset)));
                _mm256_storeu_si256((__m256i *)(row_weights + j), (__m256i)_mm512_cvtneps_pbh(e));
                total0 = _mm512_add_ps(total0, e);
            }
            for (; j < padded; j += LANES) _mm256_storeu_si256((__m256i *)(row_weights + j), _mm256_setzero_si256());
            inverse[r] = 1.0f / _mm512_reduce_add_ps(_mm512_add_ps(total0, total1));
        }
        for (int64_t r = rows; r < 16; r++) memset(scores + r * padded, 0, padded * 2);
        /* Weighted sum of the values, up to 64 dimensions a pass, then each row divided by its weights' sum. */
        for (int64_t dims = 0; dims < head_dim; dims += SUM_TILES * 16) {
            const int tiles = (int)((head_dim - dims) / 16 < SUM_TILES ? (head_dim - dims) / 16 : SUM_TILES);
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t pair_block = 0; pair_block < padded; pair_block += TILE_PAIRS) {
                _tile_loadd(4, (const bf16 *)scores + pair_block, padded * 4);
                const bf16 *tile_values = value_pairs + (pair_block / 2 * head_dim + dims) * 2;
                /* Tile numbers are immediates: one case a tile. */
                _tile_loadd(5, tile_values, head_dim * 4);
                _tile_dpbf16ps(0, 4, 5);
                if (tiles > 1) { _tile_loadd(5, tile_values + 32, head_dim * 4); _tile_dpbf16ps(1, 4, 5); }
                if (tiles > 2) { _tile_loadd(5, tile_values + 64, head_dim * 4); _tile_dpbf16ps(2, 4, 5); }
                if (tiles > 3) { _tile_loadd(5, tile_values + 96, head_dim * 4); _tile_dpbf16ps(3, 4, 5); }
            }
            _tile_stored(0, sums + dims, head_dim * 4);
            if (tiles > 1) _tile_stored(1, sums + dims + 16, head_dim * 4);
            if (tiles > 2) _tile_stored(2, sums + dims + 32, head_dim * 4);
            if (tiles > 3) _tile_stored(3, sums + dims + 48, head_dim * 4);
        }
        for (int64_t r = 0; r < rows; r++) {
            bf16 *row_out = out + (start + first + r) * hidden + h * head_dim;
            for (int64_t d = 0; d < head_dim; d += LANES)
                _mm256_storeu_si256((__m256i *)(row_out + d), (__m256i)_mm512_cvtneps_pbh(
                    _mm512_mul_ps(_mm512_loadu_ps(sums + r * head_dim + d), _mm512_set1_ps(inverse[r]))));
        }
    }
    _tile_release();
}

/* One head of one sequence: on the tiles where they serve, else attention_bf16.c's loops. */
static void attend_head_amx(const void *qkv, int64_t start, int64_t length, int64_t h, int64_t heads,
                            int64_t head_dim, float scale, void *out, void *scratch) {
    if (head_dim % TILE_PAIRS == 0 && length >= AMX_SHORTEST)
        attend_head_tiles(qkv, start, length, h, heads, head_dim, scale, out, scratch);
    else
        attend_head_bf16(qkv, start, length, h, heads, head_dim, scale, out, scratch);
}

/* attend_packed_bf16 on AMX's tiles: `scratch` holds `scratch_bytes` bytes for each thread, at least
 * attention_bf16_amx_scratch_bytes(head_dim, the longest length). */
void attend_packed_bf16_amx(const bf16 *qkv, const int64_t *starts, const int64_t *lengths, int64_t count,
                            int64_t heads, int64_t head_dim, float scale, bf16 *out, char *scratch,
                            int64_t scratch_bytes, int64_t threads) {
    attend_packed_with(attend_head_amx, qkv, starts, lengths, count, heads, head_dim, scale, out, scratch,
                       scratch_bytes, threads);
}
