/* attention.c's attention over packed sequences, for x86-64 CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2 and 3,
 * Intel before Skylake-SP): the same algorithm, eight floats a vector instead of sixteen. Built and loaded by
 * kernels/attention.py where attention.c cannot run, and checked against torch's scaled_dot_product_attention the
 * same way before use.
 *
 * Why: without it such a CPU ran torch's attention, one call per sequence or one padded call per batch (python -m
 * bench.peak.attention compares the two).
 *
 * Layout as attention.c's: qkv (tokens, 3 * hidden) float32 rows, query | key | value, each heads x head_dim; out
 * (tokens, hidden). head_dim a multiple of 8. exp as there: 2^n * p(r), degree 6, relative error below 2e-7.
 */
#include <immintrin.h>
#include <stdint.h>

#include "attention_teams.c"

#define LANES 8
/* Query rows attended at once, as in attention.c: 8 sums, a key or value vector and a broadcast take 10 of AVX2's
 * 16 registers. */
#define QUERY_ROWS 8

/* exp(x) for x <= 0, 8 lanes: attention.c's exp_nonpositive in AVX2. */
static inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

/* All-ones in the lanes below `left` (the keys a vector still has), zeros above. */
static inline __m256 lanes_below(int64_t left) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(left > LANES ? LANES : left)), index));
}

static inline float largest_lane(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

static inline float lane_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* Floats of scratch one thread needs for sequences of at most `longest` tokens: the keys transposed (head_dim x
 * longest rounded up to 8) and QUERY_ROWS rows of scores. */
int64_t attention_scratch_floats(int64_t head_dim, int64_t longest) {
    return (head_dim + QUERY_ROWS) * ((longest + LANES - 1) / LANES * LANES);
}

/* attention.c's attend_rows: rows first .. first + block - 1 of one head of one sequence, its keys already in
 * `keys_t`; inlined with a constant `block`, so that the loops over it unroll into registers. */
static inline __attribute__((always_inline)) void attend_rows(
        const float *base, const float *keys_t, const float *values, float *scores, float *out_base, int64_t first,
        const int block, int64_t length, int64_t padded, int64_t stride, int64_t hidden, int64_t h,
        int64_t head_dim) {
    const float *query[QUERY_ROWS];
    __m256 top[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        query[r] = base + (first + r) * stride + h * head_dim;
        top[r] = _mm256_set1_ps(-3.0e38f);
    }
    for (int64_t j = 0; j < padded; j += LANES) {
        __m256 dot[QUERY_ROWS];
        for (int r = 0; r < block; r++) dot[r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < head_dim; d++) {
            const __m256 key = _mm256_loadu_ps(keys_t + d * padded + j);
            for (int r = 0; r < block; r++) dot[r] = _mm256_fmadd_ps(_mm256_set1_ps(query[r][d]), key, dot[r]);
        }
        const __m256 keys_left = lanes_below(length - j);
        for (int r = 0; r < block; r++) {
            _mm256_storeu_ps(scores + r * padded + j, dot[r]);
            top[r] = _mm256_blendv_ps(top[r], _mm256_max_ps(top[r], dot[r]), keys_left);
        }
    }
    float inverse[QUERY_ROWS];
    for (int r = 0; r < block; r++) {
        const __m256 row_max = _mm256_set1_ps(largest_lane(top[r]));
        float *row_scores = scores + r * padded;
        __m256 sums = _mm256_setzero_ps();
        for (int64_t j = 0; j < padded; j += LANES) {
            const __m256 e = _mm256_and_ps(lanes_below(length - j),
                                           exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row_scores + j), row_max)));
            _mm256_storeu_ps(row_scores + j, e);
            sums = _mm256_add_ps(sums, e);
        }
        inverse[r] = 1.0f / lane_sum(sums);
    }
    for (int64_t d = 0; d < head_dim; d += LANES) {
        __m256 sum[QUERY_ROWS];
        for (int r = 0; r < block; r++) sum[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < length; j++) {
            const __m256 value = _mm256_loadu_ps(values + j * stride + d);
            for (int r = 0; r < block; r++)
                sum[r] = _mm256_fmadd_ps(_mm256_set1_ps(scores[r * padded + j]), value, sum[r]);
        }
        for (int r = 0; r < block; r++)
            _mm256_storeu_ps(out_base + (first + r) * hidden + h * head_dim + d,
                             _mm256_mul_ps(sum[r], _mm256_set1_ps(inverse[r])));
    }
}

/* One head of one sequence, as attention.c's attend_head: the keys transposed and scaled into scratch, then the rows
 * in blocks of QUERY_ROWS, 4, 2 and 1. */
static void attend_head(const void *qkv_rows, int64_t start, int64_t length, int64_t h, int64_t heads,
                        int64_t head_dim, float scale, void *out_rows, void *scratch_space) {
    const float *qkv = qkv_rows;
    float *out = out_rows, *scratch = scratch_space;
    const int64_t hidden = heads * head_dim, stride = 3 * hidden, padded = (length + LANES - 1) / LANES * LANES;
    const float *base = qkv + start * stride;
    float *keys_t = scratch, *scores = scratch + head_dim * padded;
    const float *keys = base + hidden + h * head_dim, *values = base + 2 * hidden + h * head_dim;
    for (int64_t d = 0; d < head_dim; d++)
        for (int64_t j = 0; j < padded; j++) keys_t[d * padded + j] = j < length ? keys[j * stride + d] * scale : 0.0f;
    float *out_base = out + start * hidden;
    int64_t first = 0;
#define ROWS(block) attend_rows(base, keys_t, values, scores, out_base, first, block, length, padded, stride, hidden, \
                                h, head_dim); first += block
    while (length - first >= QUERY_ROWS) { ROWS(QUERY_ROWS); }
    if (length - first >= 4) { ROWS(4); }
    if (length - first >= 2) { ROWS(2); }
    if (length - first >= 1) { ROWS(1); }
#undef ROWS
}

/* attention.c's attend_packed, the same call. */
void attend_packed(const float *qkv, const int64_t *starts, const int64_t *lengths, int64_t count, int64_t heads,
                   int64_t head_dim, float scale, float *out, float *scratch, int64_t scratch_floats,
                   int64_t threads) {
    attend_packed_with(attend_head, qkv, starts, lengths, count, heads, head_dim, scale, out, (char *)scratch,
                       scratch_floats * (int64_t)sizeof(float), threads);
}
