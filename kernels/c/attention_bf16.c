/* attention.c's attention over packed sequences, for a bfloat16 network: qkv read and out written in bfloat16, the
 * two products (scores, weighted sum of values) in AVX512-BF16's dot products of pairs (vdpbf16ps: two bfloat16
 * multiply-adds a float32 lane, exact products, float32 sums), softmax in float32. Built and loaded by
 * kernels/attention.py, which checks it against torch's scaled_dot_product_attention before use.
 *
 * Why: a bfloat16 network's attention ran attention.c in float32 (13% of a bfloat16 ColBERT rerank's profile), so
 * every layer copied qkv to float32 and the output back, and each float32 multiply-add did half the work of a
 * vdpbf16ps. The only rounding added: the softmax weights go into the weighted sum as bfloat16 (relative error 2^-9
 * each), where the network's own linear layers round every output so.
 *
 * Layout: qkv (tokens, 3 * hidden) bfloat16 rows, query | key | value, each heads x head_dim; out (tokens, hidden)
 * bfloat16. A head's keys and values are first laid out in pairs, as vdpbf16ps takes them (below).
 */
#include "attention.c"

#include <string.h>

typedef uint16_t bf16;

#define LOG2_E 1.44269504088896341f

/* 2^t for t <= 0, 16 lanes, to the precision the weights keep (they are rounded to bfloat16, relative error up to
 * 2^-9): 2^floor(t) * p(f), where f = t - floor(t) in [0, 1) comes in one instruction (vreduceps) and p is a degree-3
 * polynomial fitted to 2^f over [0, 1) for least relative error (7.5e-5, a twenty-sixth of the rounding that follows),
 * scaled by vscalefps, which takes the floor of t itself and gives 0 far below. Five instructions, where a fourth
 * degree (2.7e-6) took six for digits the rounding drops: softmax is most of a long sequence's attention. */
static inline __m512 pow2_for_weights(__m512 t) {
    const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(0.0780245364f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2260672f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.695833504f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.999925256f));
    return _mm512_scalef_ps(p, t);
}

/* exp(x) for x <= 0: 2^(x log2(e)). */
static inline __m512 exp_for_weights(__m512 x) {
    return pow2_for_weights(_mm512_mul_ps(x, _mm512_set1_ps(LOG2_E)));
}

/* Bytes of scratch one thread needs for sequences of at most `longest` tokens, `longest` rounded up to 16 (padded):
 * keys and values in pairs (head_dim x padded bfloat16 each), QUERY_ROWS rows of float32 scores and as many of
 * bfloat16 weights. Every piece a whole number of 64-byte lines. */
int64_t attention_bf16_scratch_bytes(int64_t head_dim, int64_t longest) {
    const int64_t padded = (longest + LANES - 1) / LANES * LANES;
    return 2 * head_dim * padded * 2 + QUERY_ROWS * padded * 4 + QUERY_ROWS * padded * 2 + 64;
}

static inline int32_t pair_at(const bf16 *where) {
    int32_t pair;
    memcpy(&pair, where, sizeof pair);
    return pair;
}

/* A 16 x 16 block of 32-bit words, a row a vector, transposed in place: words, pairs of words, then 128-bit quarters
 * twice interleaved, 64 shuffles where a word at a time it is 256 loads and 256 stores. */
static inline void transpose_words(__m512i rows[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        rows[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        rows[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        rows[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        rows[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_i32x4(rows[8 * i + k], rows[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_i32x4(rows[8 * i + k], rows[8 * i + 4 + k], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        rows[k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);
        rows[8 + k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);
    }
}

/* A head's keys (rows `stride` apart) as vdpbf16ps and AMX's tiles take them: for each pair of dimensions p, each
 * key j's (k[j][2p], k[j][2p + 1]) as one 32-bit word at key_words[p * padded + j]; zeros from `length` to `padded`
 * (their scores are dropped, but must not be NaN). Sixteen keys by sixteen pairs a transpose; the keys and pairs
 * left over (a length's last keys, a head of 16 dimensions' last 8 pairs) a word at a time. */
static void lay_out_keys(const bf16 *keys, int64_t stride, int64_t length, int64_t padded, int64_t head_dim,
                         int32_t *key_words) {
    const int64_t whole_keys = length / 16 * 16, whole_pairs = head_dim / 32 * 16;
    for (int64_t first = 0; first < whole_keys; first += 16)
        for (int64_t p0 = 0; p0 < whole_pairs; p0 += 16) {
            __m512i rows[16];
            for (int j = 0; j < 16; j++) rows[j] = _mm512_loadu_si512(keys + (first + j) * stride + 2 * p0);
            transpose_words(rows);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(key_words + (p0 + p) * padded + first, rows[p]);
        }
    for (int64_t p = 0; p < head_dim / 2; p++) {
        for (int64_t j = p < whole_pairs ? whole_keys : 0; j < length; j++)
            key_words[p * padded + j] = pair_at(keys + j * stride + 2 * p);
        for (int64_t j = length; j < padded; j++) key_words[p * padded + j] = 0;
    }
}

/* A head's values (rows `stride` apart) in pairs of rows: `pairs` rows of value_pairs, row m each dimension d's
 * (v[2m][d], v[2m + 1][d]), 16 dimensions at a time; rows past `length` are zeros (an odd length's last row pairs
 * with zeros, whose weights are 0 too). */
static void lay_out_values(const bf16 *values, int64_t stride, int64_t length, int64_t pairs, int64_t head_dim,
                           bf16 *value_pairs) {
    uint16_t index[32];
    for (int i = 0; i < 16; i++) index[2 * i] = (uint16_t)i, index[2 * i + 1] = (uint16_t)(16 + i);
    const __m512i interleave_index = _mm512_loadu_si512(index);
    for (int64_t m = 0; m < pairs; m++) {
        const bf16 *even = values + 2 * m * stride, *odd = even + stride;
        for (int64_t d = 0; d < head_dim; d += LANES) {
            const __m256i low = 2 * m < length ? _mm256_loadu_si256((const __m256i *)(even + d))
                                               : _mm256_setzero_si256();
            const __m256i high = 2 * m + 1 < length ? _mm256_loadu_si256((const __m256i *)(odd + d))
                                                    : _mm256_setzero_si256();
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            _mm512_storeu_si512(value_pairs + (m * head_dim + d) * 2, _mm512_permutexvar_epi16(interleave_index, both));
        }
    }
}

/* Rows first .. first + block - 1 of one head of one sequence, inlined with a constant `block` (attend_rows in
 * attention_float32.c says why). keys_pairs: for each pair of dimensions p, each key j's (k[j][2p], k[j][2p + 1]), so
 * that 16 keys' scores are head_dim / 2 vdpbf16ps. value_pairs: for each pair of rows m, each dimension d's
 * (v[2m][d], v[2m + 1][d]), so that 16 dimensions of the weighted sum take one vdpbf16ps per two keys. */
static inline __attribute__((always_inline)) void attend_rows_bf16(
        const bf16 *base, const bf16 *keys_pairs, const bf16 *value_pairs, float *scores, bf16 *weights,
        bf16 *out_base, int64_t first, const int block, int64_t length, int64_t padded, int64_t stride,
        int64_t hidden, int64_t h, int64_t head_dim, float scale) {
    const bf16 *query[QUERY_ROWS];
    __m512 top[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        query[r] = base + (first + r) * stride + h * head_dim;
        top[r] = _mm512_set1_ps(-3.0e38f);
    }
    for (int64_t j = 0; j < padded; j += LANES) {
        __m512 dot[QUERY_ROWS];
        for (int r = 0; r < block; r++) dot[r] = _mm512_setzero_ps();
        for (int64_t p = 0; p < head_dim / 2; p++) {
            const __m512bh key = (__m512bh)_mm512_loadu_si512(keys_pairs + (p * padded + j) * 2);
            for (int r = 0; r < block; r++)
                dot[r] = _mm512_dpbf16_ps(dot[r], (__m512bh)_mm512_set1_epi32(pair_at(query[r] + 2 * p)), key);
        }
        for (int r = 0; r < block; r++) {
            dot[r] = _mm512_mul_ps(dot[r], _mm512_set1_ps(scale));
            _mm512_storeu_ps(scores + r * padded + j, dot[r]);
            top[r] = _mm512_mask_max_ps(top[r], lanes_below(length - j), top[r], dot[r]);
        }
    }
    float inverse[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        const __m512 row_max = _mm512_set1_ps(_mm512_reduce_max_ps(top[r]));
        const float *row_scores = scores + r * padded;
        bf16 *row_weights = weights + r * padded;
        __m512 sums = _mm512_setzero_ps();
        for (int64_t j = 0; j < padded; j += LANES) {
            const __m512 e = _mm512_maskz_mov_ps(
                lanes_below(length - j), exp_for_weights(_mm512_sub_ps(_mm512_loadu_ps(row_scores + j), row_max)));
            _mm256_storeu_si256((__m256i *)(row_weights + j), (__m256i)_mm512_cvtneps_pbh(e));
            sums = _mm512_add_ps(sums, e);
        }
        inverse[r] = 1.0f / _mm512_reduce_add_ps(sums);
    }
    const int64_t row_pairs = (length + 1) / 2;  /* an odd length's last pair: its second weight and value are 0 */
    for (int64_t d = 0; d < head_dim; d += LANES) {
        __m512 sum[QUERY_ROWS];
        for (int r = 0; r < block; r++) sum[r] = _mm512_setzero_ps();
        for (int64_t m = 0; m < row_pairs; m++) {
            const __m512bh value = (__m512bh)_mm512_loadu_si512(value_pairs + (m * head_dim + d) * 2);
            for (int r = 0; r < block; r++)
                sum[r] = _mm512_dpbf16_ps(sum[r], (__m512bh)_mm512_set1_epi32(pair_at(weights + r * padded + 2 * m)),
                                          value);
        }
        for (int r = 0; r < block; r++)
            _mm256_storeu_si256((__m256i *)(out_base + (first + r) * hidden + h * head_dim + d),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(sum[r], _mm512_set1_ps(inverse[r]))));
    }
}

/* One head of one sequence (rows start .. start + length - 1 of qkv) into the same rows of out, with `scratch` of
 * attention_bf16_scratch_bytes(head_dim, length) bytes. head_dim must be a multiple of 16 (checked by the caller). */
static void attend_head_bf16(const void *qkv_rows, int64_t start, int64_t length, int64_t h, int64_t heads,
                             int64_t head_dim, float scale, void *out_rows, void *scratch_space) {
    const bf16 *qkv = qkv_rows;
    bf16 *out = out_rows;
    char *scratch = scratch_space;
    const int64_t hidden = heads * head_dim, stride = 3 * hidden, padded = (length + LANES - 1) / LANES * LANES;
    const bf16 *base = qkv + start * stride;
    const bf16 *keys = base + hidden + h * head_dim, *values = base + 2 * hidden + h * head_dim;
    bf16 *keys_pairs = (bf16 *)scratch, *value_pairs = keys_pairs + head_dim * padded;
    float *scores = (float *)(value_pairs + head_dim * padded);
    bf16 *weights = (bf16 *)(scores + QUERY_ROWS * padded);
    lay_out_keys(keys, stride, length, padded, head_dim, (int32_t *)keys_pairs);
    lay_out_values(values, stride, length, (length + 1) / 2, head_dim, value_pairs);
    bf16 *out_base = out + start * hidden;
    int64_t first = 0;
#define ROWS(block) attend_rows_bf16(base, keys_pairs, value_pairs, scores, weights, out_base, first, block, length, \
                                     padded, stride, hidden, h, head_dim, scale); first += block
    while (length - first >= QUERY_ROWS) { ROWS(QUERY_ROWS); }
    if (length - first >= 4) { ROWS(4); }
    if (length - first >= 2) { ROWS(2); }
    if (length - first >= 1) { ROWS(1); }
#undef ROWS
}

/* attend_packed (attention_float32.c) in bfloat16: `scratch` holds `scratch_bytes` bytes for each thread, at least
 * attention_bf16_scratch_bytes(head_dim, the longest length). */
void attend_packed_bf16(const bf16 *qkv, const int64_t *starts, const int64_t *lengths, int64_t count, int64_t heads,
                        int64_t head_dim, float scale, bf16 *out, char *scratch, int64_t scratch_bytes,
                        int64_t threads) {
    attend_packed_with(attend_head_bf16, qkv, starts, lengths, count, heads, head_dim, scale, out, scratch,
                       scratch_bytes, threads);
}
