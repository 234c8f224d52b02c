/* The float32 attention algorithm over packed sequences, each sequence attending to itself alone, written once in
 * the vector vocabulary of vectors_avx512.c / vectors_avx2.c: attention.c includes it after the AVX-512 one,
 * attention_avx2.c after the AVX2 one. Never built alone.
 *
 * For each (sequence, head): the head's keys transposed and scaled, then a block of query rows at a time: scores,
 * softmax, weighted sum of values. exp as 2^n * p(r) with a degree-6 polynomial on |r| <= ln 2 / 2, relative error
 * below 2e-7.
 *
 * Layout: qkv (tokens, 3 * hidden) float32 rows, query | key | value, each heads x head_dim; out (tokens, hidden).
 * head_dim a multiple of LANES (checked by kernels/attention.py).
 */
#include <stdint.h>

#include "attention_teams.c"

/* exp(x) for x <= 0: 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, so r is exact to float
 * precision), p degree 6. Below -87 the result would leave float32's normal range: clamped there. */
static inline floats exp_nonpositive(floats x) {
    x = floats_max(x, floats_all(-87.0f));
    const floats n = floats_round(floats_mul(x, floats_all(1.44269504088896341f)));
    floats r = floats_fnmadd(n, floats_all(0.693359375f), x);
    r = floats_fnmadd(n, floats_all(-2.12194440e-4f), r);
    floats p = floats_all(1.0f / 720.0f);
    p = floats_fmadd(p, r, floats_all(1.0f / 120.0f));
    p = floats_fmadd(p, r, floats_all(1.0f / 24.0f));
    p = floats_fmadd(p, r, floats_all(1.0f / 6.0f));
    p = floats_fmadd(p, r, floats_all(0.5f));
    p = floats_fmadd(p, r, floats_all(1.0f));
    p = floats_fmadd(p, r, floats_all(1.0f));
    return floats_mul(p, floats_pow2(n));
}

/* Query rows attended at once: each key vector loaded (scores) and each value vector loaded (the weighted sum) serves
 * this many rows, and their sums are as many independent chains of multiply-adds. One row at a time, each
 * multiply-add needs two loads and the weighted sum's chains wait on each other's latency: slower than torch's
 * attention from 128 tokens. In blocks of 8 it is faster at every length up to 512 with AVX-512 (kernels/attention.py
 * has the figures); 16 is no faster than 8. With AVX2, 8 sums, a key or value vector and a broadcast take 10 of its 16
 * registers. */
#define QUERY_ROWS 8

/* Floats of scratch one thread needs for sequences of at most `longest` tokens: the keys transposed (head_dim x
 * longest rounded up to LANES) and QUERY_ROWS rows of scores. */
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
    floats top[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        query[r] = base + (first + r) * stride + h * head_dim;
        top[r] = floats_all(-3.0e38f);
    }
    for (int64_t j = 0; j < padded; j += LANES) {
        floats dot[QUERY_ROWS];
        for (int r = 0; r < block; r++) dot[r] = floats_zero();
        for (int64_t d = 0; d < head_dim; d++) {
            const floats key = floats_load(keys_t + d * padded + j);
            for (int r = 0; r < block; r++) dot[r] = floats_fmadd(floats_all(query[r][d]), key, dot[r]);
        }
        for (int r = 0; r < block; r++) {
            floats_store(scores + r * padded + j, dot[r]);
            top[r] = floats_max_in(top[r], lanes_below(length - j), dot[r]);
        }
    }
    float inverse[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        const floats row_max = floats_all(largest_lane(top[r]));
        float *row_scores = scores + r * padded;
        floats sums = floats_zero();
        for (int64_t j = 0; j < padded; j += LANES) {
            const floats e = floats_keep(lanes_below(length - j),
                                         exp_nonpositive(floats_sub(floats_load(row_scores + j), row_max)));
            floats_store(row_scores + j, e);
            sums = floats_add(sums, e);
        }
        inverse[r] = 1.0f / lane_sum(sums);
    }
    for (int64_t d = 0; d < head_dim; d += LANES) {
        floats sum[QUERY_ROWS];
        for (int r = 0; r < block; r++) sum[r] = floats_zero();
        for (int64_t j = 0; j < length; j++) {
            const floats value = floats_load(values + j * stride + d);
            for (int r = 0; r < block; r++)
                sum[r] = floats_fmadd(floats_all(scores[r * padded + j]), value, sum[r]);
        }
        for (int r = 0; r < block; r++)
            floats_store(out_base + (first + r) * hidden + h * head_dim + d,
                         floats_mul(sum[r], floats_all(inverse[r])));
    }
}

/* One head of one sequence (rows start .. start + length - 1 of qkv): softmax(q k^T * scale) v into the same rows of
 * out. `scratch` holds attention_scratch_floats(head_dim, length) floats: the head's keys transposed and scaled, so
 * that LANES keys' scores are head_dim multiply-adds of whole vectors, and QUERY_ROWS rows of scores. */
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

/* Attention of every head of `count` packed sequences, each attending to itself alone, on up to `threads` threads.
 * `scratch` holds `scratch_floats` floats for each thread, at least attention_scratch_floats(head_dim, the longest
 * length). */
void attend_packed(const float *qkv, const int64_t *starts, const int64_t *lengths, int64_t count, int64_t heads,
                   int64_t head_dim, float scale, float *out, float *scratch, int64_t scratch_floats,
                   int64_t threads) {
    attend_packed_with(attend_head, qkv, starts, lengths, count, heads, head_dim, scale, out, (char *)scratch,
                       scratch_floats * (int64_t)sizeof(float), threads);
}

/* The float32 share, as int8_layer.c's and int8_layer_avx2.c's teams call it. */
static inline void attention_share(const float *qkv, const int64_t *starts, const int64_t *lengths, int64_t count,
                                   int64_t heads, int64_t head_dim, float scale, float *out, float *scratch,
                                   int64_t me, int64_t team) {
    attention_share_of(attend_head, qkv, starts, lengths, count, heads, head_dim, scale, out, scratch, me, team);
}
