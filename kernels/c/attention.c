/* Attention over packed sequences on a CPU, each sequence attending to itself alone, for sequences of up to 512
 * tokens. Built and loaded by kernels/attention.py, which checks it against torch's scaled_dot_product_attention
 * before use.
 *
 * Why: torch's CPU attention (the flash kernel behind F.scaled_dot_product_attention) costs about 80 us a layer for
 * one 34-token sentence of all-MiniLM-L6-v2 (12 heads of 32), where the arithmetic is 0.9 M multiply-adds; this
 * runs the whole batch of sequences in one call, a block of query rows at a time: scores, softmax, weighted sum of
 * values.
 *
 * Layout: qkv (tokens, 3 * hidden) float32 rows, query | key | value, each heads x head_dim; out (tokens, hidden).
 * Written with AVX-512 intrinsics (the library is loaded only where the CPU has them); exp as 2^n * p(r) with a
 * degree-6 polynomial on |r| <= ln 2 / 2, relative error below 2e-7.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define LANES 16

/* exp(x) for x <= 0, 16 lanes: 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, so r is exact
 * to float precision), p degree 6. Below -87 the result would leave float32's normal range: clamped there. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
}

static inline __mmask16 lanes_below(int64_t left) {
    return left >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* Query rows attended at once: each key vector loaded (scores) and each value vector loaded (the weighted sum) serves
 * this many rows, and their sums are as many independent chains of multiply-adds. One row at a time, each
 * multiply-add needs two loads and the weighted sum's chains wait on each other's latency: slower than torch's
 * attention from 128 tokens. In blocks of 8 it is faster at every length up to 512 (kernels/attention.py has the
 * figures); 16 is no faster than 8. */
#define QUERY_ROWS 8

/* Floats of scratch one thread needs for sequences of at most `longest` tokens: the keys transposed (head_dim x
 * longest rounded up to 16) and QUERY_ROWS rows of scores. */
int64_t attention_scratch_floats(int64_t head_dim, int64_t longest) {
    return (head_dim + QUERY_ROWS) * ((longest + LANES - 1) / LANES * LANES);
}

/* Rows first .. first + block - 1 of one head of one sequence (`base` its first row of qkv, `out_base` of out), with
 * its keys already in `keys_t` (head_dim x padded, scaled). Inlined with a constant `block`, so that the loops over
 * it unroll into `block` registers. */
static inline __attribute__((always_inline)) void attend_rows(
        const float *base, const float *keys_t, const float *values, float *scores, float *out_base, int64_t first,
        const int block, int64_t length, int64_t padded, int64_t stride, int64_t hidden, int64_t h,
        int64_t head_dim) {
    const float *query[QUERY_ROWS];
    __m512 top[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        query[r] = base + (first + r) * stride + h * head_dim;
        top[r] = _mm512_set1_ps(-3.0e38f);
    }
    for (int64_t j = 0; j < padded; j += LANES) {
        __m512 dot[QUERY_ROWS];
        for (int r = 0; r < block; r++) dot[r] = _mm512_setzero_ps();
        for (int64_t d = 0; d < head_dim; d++) {
            const __m512 key = _mm512_loadu_ps(keys_t + d * padded + j);
            for (int r = 0; r < block; r++) dot[r] = _mm512_fmadd_ps(_mm512_set1_ps(query[r][d]), key, dot[r]);
        }
        for (int r = 0; r < block; r++) {
            _mm512_storeu_ps(scores + r * padded + j, dot[r]);
            top[r] = _mm512_mask_max_ps(top[r], lanes_below(length - j), top[r], dot[r]);
        }
    }
    float inverse[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        const __m512 row_max = _mm512_set1_ps(_mm512_reduce_max_ps(top[r]));
        float *row_scores = scores + r * padded;
        __m512 sums = _mm512_setzero_ps();
        for (int64_t j = 0; j < padded; j += LANES) {
            const __m512 e = _mm512_maskz_mov_ps(
                lanes_below(length - j), exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row_scores + j), row_max)));
            _mm512_storeu_ps(row_scores + j, e);
            sums = _mm512_add_ps(sums, e);
        }
        inverse[r] = 1.0f / _mm512_reduce_add_ps(sums);
    }
    for (int64_t d = 0; d < head_dim; d += LANES) {
        __m512 sum[QUERY_ROWS];
        for (int r = 0; r < block; r++) sum[r] = _mm512_setzero_ps();
        for (int64_t j = 0; j < length; j++) {
            const __m512 value = _mm512_loadu_ps(values + j * stride + d);
            for (int r = 0; r < block; r++)
                sum[r] = _mm512_fmadd_ps(_mm512_set1_ps(scores[r * padded + j]), value, sum[r]);
        }
        for (int r = 0; r < block; r++)
            _mm512_storeu_ps(out_base + (first + r) * hidden + h * head_dim + d,
                             _mm512_mul_ps(sum[r], _mm512_set1_ps(inverse[r])));
    }
}

/* One head of one sequence (rows start .. start + length - 1 of qkv): softmax(q k^T * scale) v into the same rows of
 * out. `scratch` holds attention_scratch_floats(head_dim, length) floats: the head's keys transposed and scaled, so
 * that 16 keys' scores are head_dim multiply-adds of whole vectors, and QUERY_ROWS rows of scores. head_dim must be
 * a multiple of 16 (checked by the caller). */
static void attend_head(const void *qkv_rows, int64_t start, int64_t length, int64_t h, int64_t heads,
                        int64_t head_dim, float scale, void *out_rows, void *scratch_space) {
    const float *qkv = qkv_rows;
    float *out = out_rows, *scratch = scratch_space;
    const int64_t hidden = heads * head_dim, stride = 3 * hidden, padded = (length + LANES - 1) / LANES * LANES;
    const float *base = qkv + start * stride;
    float *out_base = out + start * hidden;
    float *keys_t = scratch, *scores = scratch + head_dim * padded;
    const float *keys = base + hidden + h * head_dim, *values = base + 2 * hidden + h * head_dim;
    for (int64_t d = 0; d < head_dim; d++) {
        for (int64_t j = 0; j < length; j++) keys_t[d * padded + j] = keys[j * stride + d] * scale;
        for (int64_t j = length; j < padded; j++) keys_t[d * padded + j] = 0.0f;
    }
    /* Whole blocks, then the rest in blocks of 4, 2 and 1: a short sequence computes no rows it does not have. */
    int64_t first = 0;
#define ROWS(block) attend_rows(base, keys_t, values, scores, out_base, first, block, length, padded, stride, hidden, \
                                h, head_dim); first += block
    while (length - first >= QUERY_ROWS) { ROWS(QUERY_ROWS); }
    if (length - first >= 4) { ROWS(4); }
    if (length - first >= 2) { ROWS(2); }
    if (length - first >= 1) { ROWS(1); }
#undef ROWS
}

#include "attention_teams.c"

/* The float32 share, as int8_layer.c's team calls it. */
static inline void attention_share(const float *qkv, const int64_t *starts, const int64_t *lengths, int64_t count,
                                   int64_t heads, int64_t head_dim, float scale, float *out, float *scratch,
                                   int64_t me, int64_t team) {
    attention_share_of(attend_head, qkv, starts, lengths, count, heads, head_dim, scale, out, scratch, me, team);
}

/* Attention of every head of `count` packed sequences, each attending to itself alone, on up to `threads` threads.
 * Layout: qkv (tokens, 3 * hidden) float32 rows, query | key | value, each heads x head_dim; out (tokens, hidden).
 * `scratch` holds `scratch_floats` floats for each thread, at least attention_scratch_floats(head_dim, the longest
 * length). */
void attend_packed(const float *qkv, const int64_t *starts, const int64_t *lengths, int64_t count, int64_t heads,
                   int64_t head_dim, float scale, float *out, float *scratch, int64_t scratch_floats,
                   int64_t threads) {
    attend_packed_with(attend_head, qkv, starts, lengths, count, heads, head_dim, scale, out, (char *)scratch,
                       scratch_floats * (int64_t)sizeof(float), threads);
}
