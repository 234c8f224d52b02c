/* A bfloat16 network's whole encoder layer in one call, for x86-64 CPUs with AMX-BF16: the four products on AMX's
 * tiles (bf16_products_amx.c), attention on them too (attention_bf16_amx.c), the residual sums, LayerNorms and GELU
 * between, one team of threads throughout. Built and loaded by kernels/bf16_layer.py, and checked against the layer's
 * own torch modules before use.
 *
 * Why: at the few rows of one query the Python around a bfloat16 layer (module calls, allocations, a dozen torch ops
 * a layer, each on one thread at those sizes) cost more than its products once they ran on the tiles: py-spy on one
 * core, 21-token sentences through all-MiniLM-L6-v2, put the tile products at about a fifth of the time.
 *
 * What it computes: what the layer's modules compute in bfloat16, rounded where they round. Each product's output
 * (float32 sums plus the bias) is rounded to bfloat16; the residual sum is rounded to bfloat16 as torch's bfloat16
 * addition is, then normalized in float32 and rounded again; GELU (exact, erf's) of the rounded feed-forward input,
 * computed in float32, rounded. Summation orders differ from torch's, so the two differ in last bits only. Each row's
 * result depends on its own sequence alone: a sequence gets the same bits alone or in any batch, on any number of
 * threads.
 *
 * Layout: x and out (rows, hidden) bfloat16, row-major, the rows `count` packed sequences and, after them, any spare
 * rows (model.row_buckets'); weights in the products kernel's blocks, biases and LayerNorm parameters float32.
 */
#include <math.h>

#include "bf16_products_amx.c"
#include "attention_bf16_amx.c"

typedef struct {
    const bf16 *blocked; /* bf16_block_weights' layout */
    const float *bias;
    int64_t in_features, out_features;
} Bf16Dense;

typedef struct {
    Bf16Dense qkv, attention_output, expand, contract;
    const float *norm1_weight, *norm1_bias, *norm2_weight, *norm2_bias;
    double norm1_eps, norm2_eps;
    int64_t heads, head_dim;
} Bf16Layer;

/* The buffers of one call, carved out of one workspace in 64-byte pieces. */
typedef struct {
    bf16 *qkv;       /* rows x 3 hidden */
    bf16 *attended;  /* rows x hidden */
    bf16 *dense;     /* rows x hidden: a product's output before its residual sum */
    bf16 *middle;    /* rows x hidden: the attention sublayer's output */
    bf16 *inner;     /* rows x intermediate: the feed-forward's, GELU's */
    char *scratch;   /* threads x scratch_bytes: attention's, or a row-wise step's float32 row */
    int64_t scratch_bytes;
} LayerBuffers;

static LayerBuffers carve_layer(const Bf16Layer *layer, int64_t rows, int64_t longest, int64_t threads, char *workspace,
                                int64_t *size) {
    const int64_t hidden = layer->heads * layer->head_dim, inner = layer->expand.out_features;
    LayerBuffers b;
    const int64_t attention_bytes = attention_bf16_amx_scratch_bytes(layer->head_dim, longest);
    b.scratch_bytes = lines(attention_bytes > hidden * 4 ? attention_bytes : hidden * 4);
    int64_t offset = 0;
#define PIECE(field, type, count) \
    b.field = (type *)(workspace ? workspace + offset : 0); offset += lines((int64_t)sizeof(type) * (count));
    PIECE(qkv, bf16, rows * 3 * hidden)
    PIECE(attended, bf16, rows * hidden)
    PIECE(dense, bf16, rows * hidden)
    PIECE(middle, bf16, rows * hidden)
    PIECE(inner, bf16, rows * inner)
    PIECE(scratch, char, threads * b.scratch_bytes)
#undef PIECE
    *size = offset;
    return b;
}

/* Bytes of workspace `bf16_layer` needs for `rows` rows, sequences of at most `longest` tokens, `threads` threads. */
int64_t bf16_layer_workspace(const Bf16Layer *layer, int64_t rows, int64_t longest, int64_t threads) {
    int64_t size;
    carve_layer(layer, rows, longest, threads, 0, &size);
    return size;
}

/* Thread `me` of `team`'s share of out (m, n) = a (m, k) times a dense layer's blocked weights plus its bias: a run of
 * whole 64-column blocks. */
static void dense_share(const bf16 *a, int64_t m, const Bf16Dense *dense, bf16 *out, int64_t me, int64_t team) {
    const int64_t blocks = (dense->out_features + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS;
    if (blocks * me / team < blocks * (me + 1) / team)
        blocks_share(a, m, dense->in_features, dense->blocked, dense->bias, dense->out_features, out,
                     blocks * me / team, blocks * (me + 1) / team);
}

/* 16 float32 values rounded to bfloat16, to nearest even (vcvtneps2bf16), as torch rounds. */
static inline void narrow(bf16 *to, __m512 v) { _mm256_storeu_si256((__m256i *)to, (__m256i)_mm512_cvtneps_pbh(v)); }

/* Rows first .. last - 1 of out = LayerNorm(bf16(dense + residual)) in float32, rounded to bfloat16; `row` holds a
 * row's sums. cols a multiple of 16 (the tiles' inputs are multiples of 32). */
static void residual_norm(const bf16 *restrict dense, const bf16 *restrict residual, int64_t first, int64_t last,
                          int64_t cols, const float *restrict weight, const float *restrict bias, double eps,
                          float *restrict row, bf16 *restrict out) {
    for (int64_t i = first; i < last; i++) {
        __m512 total = _mm512_setzero_ps();
        for (int64_t j = 0; j < cols; j += 16) {
            /* torch's bfloat16 addition: the sum rounded to bfloat16 */
            const __m512 sum = _mm512_add_ps(widen(dense + i * cols + j), widen(residual + i * cols + j));
            const __m512 rounded = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(sum)), 16));
            _mm512_storeu_ps(row + j, rounded);
            total = _mm512_add_ps(total, rounded);
        }
        const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(total) / (float)cols);
        __m512 spread = _mm512_setzero_ps();
        for (int64_t j = 0; j < cols; j += 16) {
            const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(row + j), mean);
            spread = _mm512_fmadd_ps(d, d, spread);
        }
        const __m512 inverse = _mm512_set1_ps(
            (float)(1.0 / sqrt((double)_mm512_reduce_add_ps(spread) / (double)cols + eps)));
        for (int64_t j = 0; j < cols; j += 16) {
            const __m512 normed = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j), mean), inverse);
            narrow(out + i * cols + j, _mm512_fmadd_ps(normed, _mm512_loadu_ps(weight + j), _mm512_loadu_ps(bias + j)));
        }
    }
}

/* Rows first .. last - 1 of x (cols each, a multiple of 16) through GELU in place: (v + |v| erf(|v| / sqrt 2)) / 2,
 * erf(t) = 1 - (1 + a1 t + ... + a6 t^6)^-16 for t >= 0 (Abramowitz and Stegun 7.1.28, error below 3e-7: within
 * float32's rounding of the bfloat16 result), as int8_layer_body.c computes it. */
static void gelu_rows(bf16 *restrict x, int64_t first, int64_t last, int64_t cols) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t j = first * cols; j < last * cols; j += 16) {
        const __m512 v = widen(x + j), magnitude = _mm512_andnot_ps(sign, v);
        const __m512 t = _mm512_min_ps(_mm512_mul_ps(magnitude, _mm512_set1_ps(0.7071067811865476f)),
                                       _mm512_set1_ps(5.5f));
        __m512 p = _mm512_set1_ps(0.0000430638f);
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.0002765672f));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.0001520143f));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.0092705272f));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.0422820123f));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.0705230784f));
        p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
        const __m512 p2 = _mm512_mul_ps(p, p), p4 = _mm512_mul_ps(p2, p2), p8 = _mm512_mul_ps(p4, p4);
        const __m512 erf = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(1.0f),
                                                                             _mm512_mul_ps(p8, p8)));
        narrow(x + j, _mm512_mul_ps(_mm512_set1_ps(0.5f), _mm512_fmadd_ps(magnitude, erf, v)));
    }
}

/* out (rows, hidden) = the layer applied to x (rows, hidden), bfloat16; the rows are `count` packed sequences
 * (starts[s] .. starts[s] + lengths[s] - 1, none longer than `longest`), each attending to itself alone.
 * `workspace`: bf16_layer_workspace(...) bytes. */
void bf16_layer(const Bf16Layer *layer, const bf16 *x, int64_t rows, const int64_t *starts, const int64_t *lengths,
                int64_t count, int64_t longest, bf16 *out, char *workspace, int64_t threads) {
    int64_t size;
    const LayerBuffers b = carve_layer(layer, rows, longest, threads, workspace, &size);
    const int64_t hidden = layer->heads * layer->head_dim, inner = layer->expand.out_features;
    const float scale = (float)(1.0 / sqrt((double)layer->head_dim));  /* as kernels/attention.py passes it */
    /* Rows after the last sequence (model.row_buckets' spare rows) hold no token: attention gives them zeros. */
    int64_t used = 0;
    for (int64_t s = 0; s < count; s++) used = starts[s] + lengths[s] > used ? starts[s] + lengths[s] : used;
    memset(b.attended + used * hidden, 0, (size_t)((rows - used) * hidden) * sizeof(bf16));
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
        const int64_t first = rows * me / team, last = rows * (me + 1) / team;
        char *mine = b.scratch + me * b.scratch_bytes;
        float *row = (float *)mine;  /* the row-wise steps' float32 row, in attention's scratch */
        dense_share(x, rows, &layer->qkv, b.qkv, me, team);
#pragma omp barrier
        attention_share_of(attend_head_amx, b.qkv, starts, lengths, count, layer->heads, layer->head_dim, scale,
                           b.attended, mine, me, team);
#pragma omp barrier
        dense_share(b.attended, rows, &layer->attention_output, b.dense, me, team);
#pragma omp barrier
        residual_norm(b.dense, x, first, last, hidden, layer->norm1_weight, layer->norm1_bias, layer->norm1_eps, row,
                      b.middle);
#pragma omp barrier
        dense_share(b.middle, rows, &layer->expand, b.inner, me, team);
#pragma omp barrier
        gelu_rows(b.inner, first, last, inner);
#pragma omp barrier
        dense_share(b.inner, rows, &layer->contract, b.dense, me, team);
#pragma omp barrier
        residual_norm(b.dense, b.middle, first, last, hidden, layer->norm2_weight, layer->norm2_bias,
                      layer->norm2_eps, row, out);
    }
}
