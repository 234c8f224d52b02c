/* vectors_avx512.c's vocabulary for AVX2 and FMA: eight floats a vector, masks as all-ones lanes (selected by blend
 * or and, where AVX-512 has mask registers), reductions in two halves. Included by attention_avx2.c, never built
 * alone.
 */
#include <immintrin.h>
#include <stdint.h>

#define LANES 8

typedef __m256 floats;
typedef __m256 lane_mask;

static inline floats floats_load(const float *from) { return _mm256_loadu_ps(from); }
static inline void floats_store(float *to, floats v) { _mm256_storeu_ps(to, v); }
static inline floats floats_zero(void) { return _mm256_setzero_ps(); }
static inline floats floats_all(float x) { return _mm256_set1_ps(x); }
static inline floats floats_add(floats a, floats b) { return _mm256_add_ps(a, b); }
static inline floats floats_sub(floats a, floats b) { return _mm256_sub_ps(a, b); }
static inline floats floats_mul(floats a, floats b) { return _mm256_mul_ps(a, b); }
static inline floats floats_max(floats a, floats b) { return _mm256_max_ps(a, b); }
static inline floats floats_fmadd(floats a, floats b, floats c) { return _mm256_fmadd_ps(a, b, c); }
static inline floats floats_fnmadd(floats a, floats b, floats c) { return _mm256_fnmadd_ps(a, b, c); }
static inline floats floats_round(floats v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline floats floats_pow2(floats n) {
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(exponent);
}

/* All-ones in the lanes below `left`, zeros above: eight lanes of a row of eight all-ones then eight zeros. A load
 * rather than a compare against the lane numbers: attention_float32.c asks for the mask once per row of its block,
 * and with the compare its scores loop took 1.45x the time at 256 tokens (python -m bench.peak.attention). */
static inline lane_mask lanes_below(int64_t left) {
    static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_ps((const float *)(ones_then_zeros + LANES - (left > LANES ? LANES : left)));
}
static inline floats floats_max_in(floats top, lane_mask mask, floats v) {
    return _mm256_blendv_ps(top, _mm256_max_ps(top, v), mask);
}
static inline floats floats_keep(lane_mask mask, floats v) { return _mm256_and_ps(mask, v); }

static inline float largest_lane(floats v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
static inline float lane_sum(floats v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
