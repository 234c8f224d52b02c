/* The vector vocabulary attention_float32.c is written in, for AVX-512: sixteen floats a vector, masks in mask
 * registers. vectors_avx2.c gives the same names for AVX2. Included by attention.c, never built alone.
 */
#include <immintrin.h>
#include <stdint.h>

#define LANES 16

typedef __m512 floats;
typedef __mmask16 lane_mask;

static inline floats floats_load(const float *from) { return _mm512_loadu_ps(from); }
static inline void floats_store(float *to, floats v) { _mm512_storeu_ps(to, v); }
static inline floats floats_zero(void) { return _mm512_setzero_ps(); }
static inline floats floats_all(float x) { return _mm512_set1_ps(x); }
static inline floats floats_add(floats a, floats b) { return _mm512_add_ps(a, b); }
static inline floats floats_sub(floats a, floats b) { return _mm512_sub_ps(a, b); }
static inline floats floats_mul(floats a, floats b) { return _mm512_mul_ps(a, b); }
static inline floats floats_max(floats a, floats b) { return _mm512_max_ps(a, b); }
/* a * b + c and c - a * b, each rounded once. */
static inline floats floats_fmadd(floats a, floats b, floats c) { return _mm512_fmadd_ps(a, b, c); }
static inline floats floats_fnmadd(floats a, floats b, floats c) { return _mm512_fnmadd_ps(a, b, c); }
static inline floats floats_round(floats v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* 2^n for whole numbers n in float32's normal exponent range, built from the exponent bits. */
static inline floats floats_pow2(floats n) {
    const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(exponent);
}

/* The lanes below `left` (the keys a vector still has). */
static inline lane_mask lanes_below(int64_t left) {
    return left >= LANES ? (lane_mask)0xFFFF : (lane_mask)((1u << left) - 1u);
}
/* max(top, v) in the lanes of `mask`, top in the others. */
static inline floats floats_max_in(floats top, lane_mask mask, floats v) {
    return _mm512_mask_max_ps(top, mask, top, v);
}
/* v in the lanes of `mask`, zero in the others. */
static inline floats floats_keep(lane_mask mask, floats v) { return _mm512_maskz_mov_ps(mask, v); }

static inline float largest_lane(floats v) { return _mm512_reduce_max_ps(v); }
static inline float lane_sum(floats v) { return _mm512_reduce_add_ps(v); }
