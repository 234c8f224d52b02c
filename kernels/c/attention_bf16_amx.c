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
 * How, for each (sequence, head), sixteen query rows at a time, in one pass over the keys, 32 at a time: their
 * scores (two float32 tiles: for each 32 dimensions, a tile of the queries, read from qkv as it is, times a tile of
 * the keys, laid out in pairs of dimensions exactly as attention_bf16.c lays them out), stored to a 2 KB buffer; the
 * weights 2^((score - bound) * scale * log2(e)) in float32 (attention_bf16.c's 2^t), rounded to bfloat16 into a 1 KB
 * tile, their sums taken from the rounded weights (one vdpbf16ps against ones a row); that tile times the values'
 * (laid out in pairs of rows as attention_bf16.c lays them out) into the weighted sums, 16 dimensions a tile, which
 * stay in tiles 0-3 to the end and are divided by the weights' sum on the way out. The next 32 keys' scores are
 * computed before this block's weights, so that the tiles work while the vector units do.
 *
 * The bound replaces the row's largest score, which a single pass does not know yet: softmax is the same whatever is
 * subtracted, and any bound at or above the largest keeps 2^t at or below 1. Cauchy-Schwarz about the keys' mean c
 * gives one for each query q: q.k = q.c + q.(k - c) <= q.c + |q| max|k - c|. On all-MiniLM-L6-v2 it puts a row's
 * largest weight at 2^-8 (median) down to 2^-54 (the smallest over its heads and layers; measured once, in float32 with
 * transformers, on 20 WikiText-2 passages and six 256-token windows of a 4,000-word document), where float32 (and
 * bfloat16, the same exponents) keeps 126 powers of two below 1: the weights lose nothing. Where a row's weights sum
 * below 2^-92 (its largest below 2^-101 at 512 keys, so that some weights that count would be subnormal), its sixteen
 * rows are computed again the way the single pass replaced: all scores stored, their largest found, then the softmax
 * and the weighted sum. That way also serves heads above 64 dimensions, whose sums do not fit the four tiles, and
 * sequences shorter than ONE_PASS_SHORTEST, where it is faster.
 *
 * Tiles: 0-3 the weighted sums, 4 a tile of queries or weights, 5 of keys or values, 6 and 7 the scores. Head sizes
 * that are not a multiple of 32, and sequences shorter than AMX_SHORTEST (a tile of 16 rows would be mostly padding),
 * go to attention_bf16.c's vdpbf16ps loops, included below.
 */
#include "attention_bf16.c"
#include "amx_tiles.c"

#define TILE_KEYS 16       /* keys a tile of scores holds (16 float32 columns) */
#define TILE_PAIRS 32      /* keys a tile of weights holds (32 bfloat16 a row), and head dimensions a query tile */
#define SUM_TILES 4        /* tiles 0-3: 64 dimensions of the weighted sum a pass */
#define AMX_SHORTEST 16    /* shorter sequences go to the vdpbf16ps loops: see kernels/attention.py */
/* Shorter sequences take two passes: the bound's own work (the keys' spread, each row's offset) outweighs the pass it
 * saves. One thread, 12 heads of 32, one pass's time over two passes': 1.22 / 1.17 / 1.00 at 48 / 64 / 96 tokens,
 * 0.98 / 0.97 at 112 / 117, 0.82 at 256; 6 heads of 64: 1.02 / 1.04 at 96 / 128, 0.95 / 0.90 at 160 / 192, 0.83 at
 * 256 (median of 40 interleaved calls of 8,192 tokens). */
#define ONE_PASS_SHORTEST(head_dim) ((head_dim) > 32 ? 160 : 112)

static inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
static inline int64_t lines(int64_t bytes) { return round_up(bytes, 64); }

/* Where one head's pieces live in a thread's scratch (attention_bf16_amx_scratch_bytes). */
typedef struct {
    int32_t *key_words;  /* keys in pairs of dimensions, padded to 32 keys */
    bf16 *value_pairs;   /* values in pairs of rows */
    float *scores;       /* two-pass: 16 rows of float32 scores, the bfloat16 weights over each */
    float *staged;       /* one pass: two buffers of 16 x 32 float32 scores */
    bf16 *weight_tiles;  /* one pass: two tiles of 16 x 32 bfloat16 weights */
    bf16 *query_tile;    /* a block's last rows, copied with zeros after */
    float *sums;         /* 16 rows of the float32 weighted sum */
} head_scratch;

#define STAGED_FLOATS (16 * TILE_PAIRS)  /* one buffer of staged scores: 16 rows of 32 keys */

static head_scratch carve(char *scratch, int64_t head_dim, int64_t padded) {
    head_scratch at;
    char *next = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    at.key_words = (int32_t *)next;
    next += lines(head_dim * padded * 2);
    at.value_pairs = (bf16 *)next;
    next += lines(head_dim * padded * 2);
    at.scores = (float *)next;
    next += lines(16 * padded * 4);
    at.staged = (float *)next;
    next += 2 * STAGED_FLOATS * 4;
    at.weight_tiles = (bf16 *)next;
    next += 2 * STAGED_FLOATS * 2;
    at.query_tile = (bf16 *)next;
    next += lines(16 * head_dim * 4);
    at.sums = (float *)next;
    return at;
}

/* Bytes of scratch one thread needs for sequences of at most `longest` tokens, at heads of head_dim: carve's pieces.
 * At least what attention_bf16.c's loops need, which serve the heads and sequences left. */
int64_t attention_bf16_amx_scratch_bytes(int64_t head_dim, int64_t longest) {
    const int64_t padded = round_up(longest, TILE_PAIRS);
    const int64_t tiled = 2 * lines(head_dim * padded * 2) + lines(16 * padded * 4) + 2 * STAGED_FLOATS * (4 + 2) +
                          2 * lines(16 * head_dim * 4) + 64;
    const int64_t looped = attention_bf16_scratch_bytes(head_dim, longest);
    return tiled > looped ? tiled : looped;
}

/* sqrt without libm (the library links nothing but what the compiler gives). */
static inline float square_root(float x) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))); }

/* A pair of bfloat16 words as float32 lanes: the low ones (the first of each pair) and the high ones. */
static inline __m512 low_halves(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
static inline __m512 high_halves(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000)));
}

/* The keys' mean (centre, head_dim floats) and their largest distance from it, read off the laid-out keys sixteen
 * keys a vector, so that nothing is summed across lanes but once a dimension. */
static float key_spread(const int32_t *key_words, int64_t length, int64_t padded, int64_t head_dim, float *centre) {
    for (int64_t p = 0; p < head_dim / 2; p++) {
        __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
        for (int64_t j = 0; j < length; j += LANES) {  /* keys past `length` are laid out as zeros */
            const __m512i pairs = _mm512_loadu_si512(key_words + p * padded + j);
            low = _mm512_add_ps(low, low_halves(pairs));
            high = _mm512_add_ps(high, high_halves(pairs));
        }
        centre[2 * p] = _mm512_reduce_add_ps(low) / (float)length;
        centre[2 * p + 1] = _mm512_reduce_add_ps(high) / (float)length;
    }
    __m512 farthest = _mm512_setzero_ps();
    for (int64_t j = 0; j < length; j += LANES) {
        __m512 distance = _mm512_setzero_ps();
        for (int64_t p = 0; p < head_dim / 2; p++) {
            const __m512i pairs = _mm512_loadu_si512(key_words + p * padded + j);
            const __m512 low = _mm512_sub_ps(low_halves(pairs), _mm512_set1_ps(centre[2 * p]));
            const __m512 high = _mm512_sub_ps(high_halves(pairs), _mm512_set1_ps(centre[2 * p + 1]));
            distance = _mm512_fmadd_ps(low, low, _mm512_fmadd_ps(high, high, distance));
        }
        farthest = _mm512_mask_max_ps(farthest, lanes_below(length - j), farthest, distance);
    }
    return square_root(_mm512_reduce_max_ps(farthest));
}

/* 16 bfloat16 values as float32 (exact: a bfloat16 is a float32's upper half); bf16_layer_amx.c's row-wise steps
 * use it too. */
static inline __m512 widen(const bf16 *from) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)from)), 16));
}

/* A block's first `rows` rows of the weighted sum (float32, head_dim apart), each divided by its weights' sum (times
 * `inverse`), into their rows of out (hidden apart), bfloat16. */
static inline void write_rows(const float *sums, const float *inverse, int64_t rows, int64_t head_dim, bf16 *out_rows,
                              int64_t hidden) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < head_dim; d += LANES)
            _mm256_storeu_si256((__m256i *)(out_rows + r * hidden + d), (__m256i)_mm512_cvtneps_pbh(
                _mm512_mul_ps(_mm512_loadu_ps(sums + r * head_dim + d), _mm512_set1_ps(inverse[r]))));
}

/* The scores of the block's queries (a tile, rows query_stride bytes apart) against keys first .. first + 31, into
 * `staged` (16 rows of 32 float32). */
static inline void stage_scores(const bf16 *query_rows, int64_t query_stride, const int32_t *key_words,
                                int64_t padded, int64_t head_dim, int64_t first, float *staged) {
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t d = 0; d < head_dim; d += TILE_PAIRS) {
        _tile_loadd(4, query_rows + d, query_stride);
        _tile_loadd(5, key_words + d / 2 * padded + first, padded * 4);
        _tile_dpbf16ps(6, 4, 5);
        _tile_loadd(5, key_words + d / 2 * padded + first + TILE_KEYS, padded * 4);
        _tile_dpbf16ps(7, 4, 5);
    }
    _tile_stored(6, staged, TILE_PAIRS * 4);
    _tile_stored(7, staged + TILE_KEYS, TILE_PAIRS * 4);
}

/* One row's weights for 32 staged keys, rounded to bfloat16 into its row of the weight tile (0 for the keys whose lane
 * valid_low, for the first 16, or valid_high leaves out); their sum added to *total. */
static inline __attribute__((always_inline)) void row_weights(const float *staged_row, __m512 to_log2, __m512 offset,
                                                              __mmask16 valid_low, __mmask16 valid_high,
                                                              bf16 *tile_row, __m512 *total, __m512bh ones) {
    const __m512 e0 = _mm512_maskz_mov_ps(valid_low, pow2_for_weights(
        _mm512_fmsub_ps(_mm512_load_ps(staged_row), to_log2, offset)));
    const __m512 e1 = _mm512_maskz_mov_ps(valid_high, pow2_for_weights(
        _mm512_fmsub_ps(_mm512_load_ps(staged_row + TILE_KEYS), to_log2, offset)));
    const __m512bh weights = _mm512_cvtne2ps_pbh(e1, e0);
    _mm512_store_si512(tile_row, (__m512i)weights);
    *total = _mm512_dpbf16_ps(*total, weights, ones);
}

/* A block of 16 query rows (the first `rows` of them real) in one pass over the keys (the file's comment), heads of
 * 32 or 64 dimensions. Returns 0, having written nothing, where a row's weights came out too small to trust. */
static int attend_block_one_pass(const bf16 *query_rows, int64_t query_stride, int64_t rows, const head_scratch *at,
                                 const float *centre, float radius, int64_t length, int64_t padded, int64_t head_dim,
                                 float scale, bf16 *out_rows, int64_t hidden) {
    const int tiles = (int)(head_dim / 16);
    const __m512 to_log2 = _mm512_set1_ps(scale * LOG2_E);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);  /* bfloat16 1.0 */
    float offset[16];  /* each row's bound, times scale * log2(e); rows past the block's are zeros, so 0 */
    for (int r = 0; r < 16; r++) {
        const bf16 *query = (const bf16 *)((const char *)query_rows + r * query_stride);
        __m512 along = _mm512_setzero_ps(), square = _mm512_setzero_ps();
        for (int64_t d = 0; d < head_dim; d += LANES) {
            const __m512 q = widen(query + d);
            along = _mm512_fmadd_ps(q, _mm512_loadu_ps(centre + d), along);
            square = _mm512_fmadd_ps(q, q, square);
        }
        const float bound = _mm512_reduce_add_ps(along) + square_root(_mm512_reduce_add_ps(square)) * radius;
        offset[r] = bound * scale * LOG2_E;
    }
    __m512 total[16];
    for (int r = 0; r < 16; r++) total[r] = _mm512_setzero_ps();
    _tile_zero(0);
    _tile_zero(1);
    if (tiles > 2) { _tile_zero(2); _tile_zero(3); }
    stage_scores(query_rows, query_stride, at->key_words, padded, head_dim, 0, at->staged);
    for (int64_t first = 0, turn = 0; first < padded; first += TILE_PAIRS, turn ^= 1) {
        const float *staged = at->staged + turn * STAGED_FLOATS;
        bf16 *weights = at->weight_tiles + turn * STAGED_FLOATS;
        if (first + TILE_PAIRS < padded)
            stage_scores(query_rows, query_stride, at->key_words, padded, head_dim, first + TILE_PAIRS,
                         at->staged + (turn ^ 1) * STAGED_FLOATS);
        const int64_t left = length - first;
        if (left >= TILE_PAIRS) {
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++)
                row_weights(staged + r * TILE_PAIRS, to_log2, _mm512_set1_ps(offset[r]), 0xffff, 0xffff,
                            weights + r * TILE_PAIRS, &total[r], ones);
        } else {  /* the last keys: zero weights past the sequence */
            const __mmask16 low = left >= TILE_KEYS ? 0xffff : lanes_below(left);
            const __mmask16 high = left > TILE_KEYS ? lanes_below(left - TILE_KEYS) : 0;
            for (int r = 0; r < 16; r++)
                row_weights(staged + r * TILE_PAIRS, to_log2, _mm512_set1_ps(offset[r]), low, high,
                            weights + r * TILE_PAIRS, &total[r], ones);
        }
        _tile_loadd(4, weights, TILE_PAIRS * 2);
        const bf16 *tile_values = at->value_pairs + first / 2 * head_dim * 2;
        /* Tile numbers are immediates: one line a tile. */
        _tile_loadd(5, tile_values, head_dim * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(5, tile_values + 32, head_dim * 4);
        _tile_dpbf16ps(1, 4, 5);
        if (tiles > 2) {
            _tile_loadd(5, tile_values + 64, head_dim * 4);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(5, tile_values + 96, head_dim * 4);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    float inverse[16];
    for (int64_t r = 0; r < rows; r++) {
        const float sum = _mm512_reduce_add_ps(total[r]);
        if (!(sum >= 0x1p-92f)) return 0;  /* also NaN */
        inverse[r] = 1.0f / sum;
    }
    _tile_stored(0, at->sums, head_dim * 4);
    _tile_stored(1, at->sums + 16, head_dim * 4);
    if (tiles > 2) { _tile_stored(2, at->sums + 32, head_dim * 4); _tile_stored(3, at->sums + 48, head_dim * 4); }
    write_rows(at->sums, inverse, rows, head_dim, out_rows, hidden);
    return 1;
}

/* A block of 16 query rows (the first `rows` of them real) in two passes: every score stored, each row's largest
 * found, then the weights and the weighted sum (the file's comment says when). */
static void attend_block_two_pass(const bf16 *query_rows, int64_t query_stride, int64_t rows, const head_scratch *at,
                                  int64_t length, int64_t padded, int64_t head_dim, float scale, bf16 *out_rows,
                                  int64_t hidden) {
    float *scores = at->scores;
    /* Scores: scores[r][j] for the block's 16 rows and every key (padded to 16), float32, padded * 4 apart. */
    const int64_t key_blocks = round_up(length, TILE_KEYS) / TILE_KEYS;
    for (int64_t block = 0; block < key_blocks; block++) {
        _tile_zero(6);
        for (int64_t d = 0; d < head_dim; d += TILE_PAIRS) {
            _tile_loadd(4, query_rows + d, query_stride);
            _tile_loadd(5, at->key_words + d / 2 * padded + block * TILE_KEYS, padded * 4);
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
            const bf16 *tile_values = at->value_pairs + (pair_block / 2 * head_dim + dims) * 2;
            /* Tile numbers are immediates: one case a tile. */
            _tile_loadd(5, tile_values, head_dim * 4);
            _tile_dpbf16ps(0, 4, 5);
            if (tiles > 1) { _tile_loadd(5, tile_values + 32, head_dim * 4); _tile_dpbf16ps(1, 4, 5); }
            if (tiles > 2) { _tile_loadd(5, tile_values + 64, head_dim * 4); _tile_dpbf16ps(2, 4, 5); }
            if (tiles > 3) { _tile_loadd(5, tile_values + 96, head_dim * 4); _tile_dpbf16ps(3, 4, 5); }
        }
        _tile_stored(0, at->sums + dims, head_dim * 4);
        if (tiles > 1) _tile_stored(1, at->sums + dims + 16, head_dim * 4);
        if (tiles > 2) _tile_stored(2, at->sums + dims + 32, head_dim * 4);
        if (tiles > 3) _tile_stored(3, at->sums + dims + 48, head_dim * 4);
    }
    write_rows(at->sums, inverse, rows, head_dim, out_rows, hidden);
}

/* One head of one sequence on AMX's tiles (the caller checked head_dim % 32 == 0 and length >= AMX_SHORTEST). */
static void attend_head_tiles(const bf16 *qkv, int64_t start, int64_t length, int64_t h, int64_t heads,
                              int64_t head_dim, float scale, bf16 *out, char *scratch) {
    const int64_t hidden = heads * head_dim, stride = 3 * hidden, padded = round_up(length, TILE_PAIRS);
    const bf16 *base = qkv + start * stride;
    const bf16 *queries = base + h * head_dim, *keys = queries + hidden, *values = keys + hidden;
    const head_scratch at = carve(scratch, head_dim, padded);

    /* Keys and values laid out as attention_bf16.c lays them out, padded to 32 keys with zeros: a tile of keys is 16
     * rows (pairs of dimensions) of 16 keys, padded * 4 bytes apart; a tile of values 16 pairs of rows of 16
     * dimensions, head_dim * 4 apart. */
    lay_out_keys(keys, stride, length, padded, head_dim, at.key_words);
    lay_out_values(values, stride, length, padded / 2, head_dim, at.value_pairs);
    const int one_pass = head_dim <= SUM_TILES * 16 && length >= ONE_PASS_SHORTEST(head_dim);
    float centre[SUM_TILES * 16];
    const float radius = one_pass ? key_spread(at.key_words, length, padded, head_dim, centre) : 0.0f;

    load_square_tiles(8);
    for (int64_t first = 0; first < length; first += 16) {
        const int64_t rows = length - first < 16 ? length - first : 16;
        /* The block's queries: read in place where 16 rows are there, else copied with zeros after (a tile must not
         * read past the batch). */
        const bf16 *query_rows = queries + first * stride;
        int64_t query_stride = stride * 2;
        if (rows < 16) {
            memset(at.query_tile, 0, 16 * head_dim * 2);
            for (int64_t r = 0; r < rows; r++)
                memcpy(at.query_tile + r * head_dim, query_rows + r * stride, head_dim * 2);
            query_rows = at.query_tile;
            query_stride = head_dim * 2;
        }
        bf16 *out_rows = out + (start + first) * hidden + h * head_dim;
        if (!one_pass || !attend_block_one_pass(query_rows, query_stride, rows, &at, centre, radius, length, padded,
                                                head_dim, scale, out_rows, hidden))
            attend_block_two_pass(query_rows, query_stride, rows, &at, length, padded, head_dim, scale, out_rows,
                                  hidden);
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
