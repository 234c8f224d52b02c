/* The CPU's arithmetic peak per instruction family: each function runs `rounds` rounds of one multiply-accumulate
 * instruction on ACCUMULATORS independent registers, its inputs register-resident, no memory touched in the loop.
 * Built by kernels/build.py's compiler driver and timed by bench/peak/alu.py, one call per thread.
 *
 * Why this many accumulators: a multiply-accumulate depends on its own last result, so one chain runs at one
 * instruction per latency (4-5 cycles); a core issues one or two a cycle, so eight to ten chains keep it busy.
 *
 * Each function carries its own target attribute rather than the library its flags: one library holds them all,
 * and bench/peak/alu.py calls only those this CPU's flags (/proc/cpuinfo) allow. The inputs come from `seed`, and the
 * accumulators are summed into the result, so the compiler can neither fold nor drop the loop.
 */
#include <immintrin.h>
#include <stdint.h>

/* Sixteen (AVX-512: thirty-two registers) or twelve (AVX2: sixteen) accumulators, named one by one: an array of
 * them made GCC 12 copy every register and spill one to the stack each round. Each starts at its own value: equal
 * ones GCC merges into one chain. The int8 steps are one instruction of inline assembly each: GCC 12 copies the
 * accumulator of every vpdpbusd intrinsic to another register (a move a product, and a spill each round). */
#define EACH_16(STEP) STEP(c0, 0) STEP(c1, 1) STEP(c2, 2) STEP(c3, 3) STEP(c4, 4) STEP(c5, 5) STEP(c6, 6) \
                      STEP(c7, 7) STEP(c8, 8) STEP(c9, 9) STEP(c10, 10) STEP(c11, 11) STEP(c12, 12) STEP(c13, 13) \
                      STEP(c14, 14) STEP(c15, 15)
#define EACH_12(STEP) STEP(c0, 0) STEP(c1, 1) STEP(c2, 2) STEP(c3, 3) STEP(c4, 4) STEP(c5, 5) STEP(c6, 6) \
                      STEP(c7, 7) STEP(c8, 8) STEP(c9, 9) STEP(c10, 10) STEP(c11, 11)

/* Operations an instruction counts for (a multiply and an add = 2), as bench/peak/alu.py counts them:
 * vpdpbusd zmm: 16 lanes x 4 int8 products, each added = 128; ymm: 64; vpmaddwd + vpaddd ymm: 16 products = 32;
 * vfmadd zmm: 16 float32 lanes x 2 = 32; ymm: 16;
 * vdpbf16ps zmm: 16 float32 lanes x 2 bfloat16 products, each added = 64. */

__attribute__((target("avx512f,avx512vnni")))
int64_t int8_avx512_vnni(int64_t rounds, const int8_t *seed) {
    const __m512i a = _mm512_loadu_si512(seed), b = _mm512_loadu_si512(seed + 64);
#define START(c, i) __m512i c = _mm512_add_epi32(_mm512_loadu_si512(seed + 128), _mm512_set1_epi32(i));
#define STEP(c, i) __asm__("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
#define SUM(c, i) sum = _mm512_add_epi32(sum, c);
    EACH_16(START)
    for (int64_t r = 0; r < rounds; r++) { EACH_16(STEP) }
    __m512i sum = _mm512_setzero_si512();
    EACH_16(SUM)
    return _mm512_reduce_add_epi32(sum);
#undef START
#undef STEP
#undef SUM
}

/* The two ymm int8 loops' rounds, around their own STEP: twelve int32 accumulators from `start`, and the total of
 * their lanes. */
#define START_INT32(c, i) __m256i c = _mm256_add_epi32(_mm256_loadu_si256(start), _mm256_set1_epi32(i));
#define SUM_INT32(c, i) sum = _mm256_add_epi32(sum, c);
#define YMM_INT32_ROUNDS                                    \
    EACH_12(START_INT32)                                    \
    for (int64_t r = 0; r < rounds; r++) { EACH_12(STEP) }  \
    __m256i sum = _mm256_setzero_si256();                   \
    EACH_12(SUM_INT32)                                      \
    return lanes_total(sum);

__attribute__((target("avx2")))
static int64_t lanes_total(__m256i sum) {
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, sum);
    int64_t total = 0;
    for (int i = 0; i < 8; i++) total += lanes[i];
    return total;
}

__attribute__((target("avx2,avxvnni")))
int64_t int8_avx_vnni(int64_t rounds, const int8_t *seed) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)seed), b = _mm256_loadu_si256((const __m256i *)(seed + 32));
    const __m256i *start = (const __m256i *)(seed + 64);
#define STEP(c, i) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(c) : "x"(a), "x"(b));
    YMM_INT32_ROUNDS
#undef STEP
}

/* int8 where there is no VNNI (AVX2 alone): the pair of instructions kernels/c/int8_products_avx2.c runs a product
 * with, vpmaddwd (int8 values widened to 16 bits: 16 products, summed in pairs into 8 int32 lanes) and vpaddd into
 * the accumulator; one asm block for both, so that the product, whose inputs never change, is not hoisted. */
__attribute__((target("avx2")))
int64_t int8_avx2_madd(int64_t rounds, const int16_t *seed) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)seed), b = _mm256_loadu_si256((const __m256i *)(seed + 16));
    const __m256i *start = (const __m256i *)(seed + 32);
#define STEP(c, i) { __m256i product; \
    __asm__("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(c), "=&x"(product) : "x"(a), "x"(b)); }
    YMM_INT32_ROUNDS
#undef STEP
}

__attribute__((target("avx512f")))
double float32_avx512_fma(int64_t rounds, const float *seed) {
    const __m512 a = _mm512_loadu_ps(seed), b = _mm512_loadu_ps(seed + 16);
#define START(c, i) __m512 c = _mm512_add_ps(_mm512_loadu_ps(seed + 32), _mm512_set1_ps((float)i));
#define STEP(c, i) c = _mm512_fmadd_ps(a, b, c);
#define SUM(c, i) sum = _mm512_add_ps(sum, c);
    EACH_16(START)
    for (int64_t r = 0; r < rounds; r++) { EACH_16(STEP) }
    __m512 sum = _mm512_setzero_ps();
    EACH_16(SUM)
    return _mm512_reduce_add_ps(sum);
#undef START
#undef STEP
#undef SUM
}

__attribute__((target("avx2,fma")))
double float32_avx2_fma(int64_t rounds, const float *seed) {
    const __m256 a = _mm256_loadu_ps(seed), b = _mm256_loadu_ps(seed + 8);
#define START(c, i) __m256 c = _mm256_add_ps(_mm256_loadu_ps(seed + 16), _mm256_set1_ps((float)i));
#define STEP(c, i) c = _mm256_fmadd_ps(a, b, c);
#define SUM(c, i) sum = _mm256_add_ps(sum, c);
    EACH_12(START)
    for (int64_t r = 0; r < rounds; r++) { EACH_12(STEP) }
    __m256 sum = _mm256_setzero_ps();
    EACH_12(SUM)
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    double total = 0;
    for (int i = 0; i < 8; i++) total += lanes[i];
    return total;
#undef START
#undef STEP
#undef SUM
}

__attribute__((target("avx512f,avx512bf16")))
double bfloat16_avx512_dot(int64_t rounds, const float *seed) {
    /* 32 bfloat16 values a register, rounded from the seed's floats */
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(seed), _mm512_loadu_ps(seed + 16));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(seed + 16), _mm512_loadu_ps(seed));
#define START(c, i) __m512 c = _mm512_add_ps(_mm512_loadu_ps(seed + 32), _mm512_set1_ps((float)i));
#define STEP(c, i) c = _mm512_dpbf16_ps(c, a, b);
#define SUM(c, i) sum = _mm512_add_ps(sum, c);
    EACH_16(START)
    for (int64_t r = 0; r < rounds; r++) { EACH_16(STEP) }
    __m512 sum = _mm512_setzero_ps();
    EACH_16(SUM)
    return _mm512_reduce_add_ps(sum);
#undef START
#undef STEP
#undef SUM
}

/* AMX: eight tile registers, so four accumulators (16 x 16 int32 or float32 tiles), each a chain of one tile product
 * a round over two row tiles and two column tiles loaded once (stride 0: the seed's first 64 bytes on every row).
 * tdpbssd: 16 x 16 sums of 64 int8 products = 32,768 operations; tdpbf16ps: of 32 bfloat16 ones = 16,384. Linux lends
 * the tile registers to a process that asks (Linux 5.16+); each thread loads the tiles' shapes before using them. */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* 1 where Linux lends this process the tile registers, else 0 (bench/peak/alu.py then leaves the AMX loops out). */
int amx_usable(void) {
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

static int amx_ready(void) {
    typedef struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t bytes_per_row[16];
        uint8_t rows[16];
    } __attribute__((packed, aligned(64))) tile_shapes;
    if (!amx_usable()) return 0;
    tile_shapes shapes;
    memset(&shapes, 0, sizeof shapes);
    shapes.palette = 1;
    for (int t = 0; t < 8; t++) shapes.rows[t] = 16, shapes.bytes_per_row[t] = 64;
    __asm__ volatile("ldtilecfg %0" : : "m"(shapes));
    return 1;
}

/* The accumulators' first elements summed, as the other loops' results are (their sums keep the loop alive). */
#define AMX_ROUNDS(PRODUCT, TYPE)                                                                                   \
    if (!amx_ready()) return -1;                                                                                    \
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::);                \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"                               \
                     "tileloadd (%0,%1,1), %%tmm6\n\ttileloadd (%0,%1,1), %%tmm7" : : "r"(seed), "r"((int64_t)0)); \
    for (int64_t r = 0; r < rounds; r++)                                                                            \
        __asm__ volatile(PRODUCT " %%tmm6, %%tmm4, %%tmm0\n\t" PRODUCT " %%tmm7, %%tmm4, %%tmm1\n\t"                \
                         PRODUCT " %%tmm6, %%tmm5, %%tmm2\n\t" PRODUCT " %%tmm7, %%tmm5, %%tmm3" ::);               \
    TYPE out[4][256] __attribute__((aligned(64)));                                                                  \
    __asm__ volatile("tilestored %%tmm0, (%0,%1,1)\n\ttilestored %%tmm1, (%2,%1,1)\n\t"                             \
                     "tilestored %%tmm2, (%3,%1,1)\n\ttilestored %%tmm3, (%4,%1,1)"                                 \
                     : : "r"(out[0]), "r"((int64_t)64), "r"(out[1]), "r"(out[2]), "r"(out[3]) : "memory");         \
    __asm__ volatile("tilerelease" ::);                                                                             \
    return (double)out[0][0] + out[1][0] + out[2][0] + out[3][0];

int64_t int8_amx(int64_t rounds, const int8_t *seed) { AMX_ROUNDS("tdpbssd", int32_t) }

double bfloat16_amx(int64_t rounds, const float *seed) { AMX_ROUNDS("tdpbf16ps", float) }
