/* The body of the one-call int8 encoder layer, over the products and attention kernels of the file that includes it:
 * int8_layer.c (VNNI products, AVX-512 attention) or int8_layer_avx2.c (AVX2's). That file's header says what the
 * layer computes and how; the products kernel gives `product_input` (the type of the rows it multiplies: int8 or
 * 16-bit), PRODUCTS_TAKE_12_BITS, and `products_share` (a thread's share of one product); attention_float32.c gives
 * `attention_share`. Never built alone.
 */
#include <math.h>

/* An int8 Linear layer: blocked weights (int8_products.c), per-output-column scales and bias, and the
 * per-input-channel factor its input is multiplied by before quantization (SmoothQuant's 1 / s; ones without
 * smoothing). */
typedef struct {
    const void *blocked; /* the products kernel's layout */
    const int32_t *correction;
    const float *input_scale, *weight_scale, *bias;
    int64_t in_features, out_features;
    int64_t input_bits; /* 8, or 12 (the feed-forward output layer only) */
} Int8Dense;

typedef struct {
    Int8Dense qkv, attention_output, expand, contract;
    const float *norm1_weight, *norm1_bias, *norm2_weight, *norm2_bias;
    double norm1_eps, norm2_eps;
    int64_t heads, head_dim;
} Int8Layer;

/* Rows per pass of the row-wise steps. All of a batch's rows at once made each step stream its int32 products
 * (rows x 1536 x 4 bytes for all-MiniLM-L6-v2's feed-forward) through memory, and the workspace outgrow what malloc
 * keeps for reuse: at 128 sentences of 30 tokens one layer took twice the modules' time. 192 rows' products are
 * 1.2 MB. A multiple of the products' row tile (6; the AVX2 kernel's 3). */
#define CHUNK_ROWS 192

/* The buffers of one call, carved out of one workspace (64-byte aligned pieces): whole-batch ones for attention's
 * input and output, a chunk's worth for the rest. */
typedef struct {
    product_input *quantized; /* chunk x max(hidden, intermediate); a 12-bit input's high parts where split */
    product_input *low;  /* chunk x intermediate: a 12-bit input's low parts, where split */
    float *row_scale;    /* chunk */
    int32_t *products;   /* chunk x max(3 hidden, intermediate) */
    int32_t *low_products; /* chunk x hidden: the low parts' */
    float *middle;       /* chunk x hidden: the attention sublayer's output */
    float *qkv;          /* rows x 3 hidden */
    float *attended;     /* rows x hidden */
    float *per_thread;   /* threads x per_thread_floats: a quantization buffer, or attention's scratch */
    int64_t per_thread_floats;
} Buffers;

/* Whether a 12-bit input (`twelve_bits`) runs as two int8 products (high and low parts), as a kernel of int8 inputs
 * needs; a kernel of 16-bit inputs takes it whole. A macro: within int8_layer's parallel region a function call here
 * changed the VNNI layer's machine code. */
#define SPLIT_TWELVE_BITS(twelve_bits) ((twelve_bits) && !PRODUCTS_TAKE_12_BITS)

static int64_t round_up(int64_t bytes) { return (bytes + 63) / 64 * 64; }

static Buffers carve(const Int8Layer *layer, int64_t rows, int64_t longest, int64_t threads, char *workspace,
                     int64_t *size) {
    const int64_t hidden = layer->heads * layer->head_dim, inner = layer->expand.out_features;
    const int64_t widest_in = hidden > inner ? hidden : inner, widest_out = 3 * hidden > inner ? 3 * hidden : inner;
    const int64_t attention_floats = attention_scratch_floats(layer->head_dim, longest);
    const int64_t chunk = rows < CHUNK_ROWS ? rows : CHUNK_ROWS;
    /* room for a 12-bit input's parts only where it is split */
    const int64_t twelve_bit_rows = SPLIT_TWELVE_BITS(layer->contract.input_bits == 12) ? chunk : 0;
    Buffers b;
    /* whole cache lines apart, so that no two threads write the same line */
    b.per_thread_floats = ((attention_floats > widest_in ? attention_floats : widest_in) + 15) / 16 * 16 + 16;
    int64_t offset = 0;
#define PIECE(field, type, count) \
    b.field = (type *)(workspace ? workspace + offset : 0); offset += round_up((int64_t)sizeof(type) * (count));
    PIECE(quantized, product_input, chunk * widest_in)
    PIECE(low, product_input, twelve_bit_rows * inner)
    PIECE(row_scale, float, chunk)
    PIECE(products, int32_t, chunk * widest_out)
    PIECE(low_products, int32_t, twelve_bit_rows * hidden)
    PIECE(middle, float, chunk * hidden)
    PIECE(qkv, float, rows * 3 * hidden)
    PIECE(attended, float, rows * hidden)
    PIECE(per_thread, float, threads * b.per_thread_floats)
#undef PIECE
    *size = offset;
    return b;
}

/* Bytes of workspace `int8_layer` needs for `rows` rows, sequences of at most `longest` tokens, `threads` threads. */
int64_t int8_layer_workspace(const Int8Layer *layer, int64_t rows, int64_t longest, int64_t threads) {
    int64_t size;
    carve(layer, rows, longest, threads, 0, &size);
    return size;
}

/* The largest |buffer[j]|, at least 1e-8. Taken on the floats' bits with the sign cleared (integer order is float
 * order for finite non-negative floats), as the numba kernel does. */
static float row_top(const float *restrict buffer, int64_t cols) {
    const int32_t *restrict bits = (const int32_t *)buffer;
    int32_t largest = 0;
    for (int64_t j = 0; j < cols; j++) {
        const int32_t magnitude = bits[j] & 0x7FFFFFFF;
        largest = magnitude > largest ? magnitude : largest;
    }
    float top;
    memcpy(&top, &largest, 4);
    return top > 1e-8f ? top : 1e-8f;
}

/* Quantizes buffer[0 .. cols - 1] (already smoothed) into whole values of -steps..steps, held in the products
 * kernel's input type; returns the row's scale. */
static inline float quantize_to(const float *restrict buffer, int64_t cols, float steps,
                                product_input *restrict values) {
    const float top = row_top(buffer, cols), to_int = steps / top;
    for (int64_t j = 0; j < cols; j++) {
        const float v = buffer[j] * to_int;
        values[j] = (product_input)(v + (v >= 0.0f ? 0.5f : -0.5f));
    }
    return top / steps;
}

/* To int8 values. */
static float quantize_buffer(const float *restrict buffer, int64_t cols, product_input *restrict values) {
    return quantize_to(buffer, cols, 127.0f, values);
}

#if PRODUCTS_TAKE_12_BITS
/* To 12 bits (2,047 steps a side), whole. */
static float quantize_buffer_12_bits(const float *restrict buffer, int64_t cols, product_input *restrict values) {
    return quantize_to(buffer, cols, 2047.0f, values);
}
#else

/* The same to 12 bits (2,047 steps a side), each value written as its high and low parts; returns the scale. */
static float quantize_buffer_12_bits(const float *restrict buffer, int64_t cols, int8_t *restrict high,
                                     int8_t *restrict low) {
    const float top = row_top(buffer, cols), to_int = 2047.0f / top;
    for (int64_t j = 0; j < cols; j++) {
        const float v = buffer[j] * to_int;
        const int32_t q = (int32_t)(v + (v >= 0.0f ? 0.5f : -0.5f));
        high[j] = (int8_t)(q >> 4);  /* an arithmetic shift: floor(q / 16) */
        low[j] = (int8_t)(q & 15);
    }
    return top / 2047.0f;
}
#endif

static void quantize_rows(const float *restrict x, int64_t first, int64_t last, const float *restrict input_scale,
                          int64_t cols, float *restrict buffer, product_input *restrict values,
                          float *restrict row_scale) {
    for (int64_t i = first; i < last; i++) {
        for (int64_t j = 0; j < cols; j++) buffer[j] = x[i * cols + j] * input_scale[j];
        row_scale[i] = quantize_buffer(buffer, cols, values + i * cols);
    }
}

/* (Each helper copies the struct's pointers into restrict locals: read through `dense->`, they might alias the
 * output, and the compiler would reload them at every element instead of vectorizing the loop.) */
static void dequantize_rows(const int32_t *restrict products, int64_t first, int64_t last,
                            const float *restrict row_scale, const Int8Dense *dense, float *restrict out) {
    const int64_t cols = dense->out_features;
    const float *restrict weight_scale = dense->weight_scale, *restrict bias = dense->bias;
    for (int64_t i = first; i < last; i++) {
        const float r = row_scale[i];
        for (int64_t j = 0; j < cols; j++)
            out[i * cols + j] = (float)products[i * cols + j] * (r * weight_scale[j]) + bias[j];
    }
}

/* GELU(dequantized + bias), times the next layer's input scale, quantized per row into values / row_scale (in
 * place: each row's scale is read before it is overwritten); to 12 bits where `low` is given: the high parts into
 * values and the low ones into low, or, where the products take 12-bit inputs whole, all into values (`low` then
 * only says 12 bits). */
static void gelu_quantize_rows(const int32_t *restrict products, int64_t first, int64_t last,
                               float *restrict row_scale, const Int8Dense *dense,
                               const float *restrict next_input_scale, float *restrict buffer,
                               product_input *restrict values, product_input *restrict low) {
    const int64_t cols = dense->out_features;
    const float *restrict weight_scale = dense->weight_scale, *restrict bias = dense->bias;
    for (int64_t i = first; i < last; i++) {
        const float r = row_scale[i];
        for (int64_t j = 0; j < cols; j++) {
            const float v = (float)products[i * cols + j] * (r * weight_scale[j]) + bias[j];
            /* GELU(v) = (v + |v| erf(|v| / sqrt 2)) / 2, erf(t) = 1 - (1 + a1 t + ... + a6 t^6)^-16 for t >= 0 */
            const float a = fabsf(v) * 0.7071067811865476f, t = a < 5.5f ? a : 5.5f;  /* fminf: a libm call */
            const float p = 1.0f + t * (0.0705230784f + t * (0.0422820123f + t * (0.0092705272f + t * (
                0.0001520143f + t * (0.0002765672f + t * 0.0000430638f)))));
            const float p2 = p * p, p4 = p2 * p2, p8 = p4 * p4;
            const float erf = 1.0f - 1.0f / (p8 * p8);
            buffer[j] = 0.5f * (v + fabsf(v) * erf) * next_input_scale[j];
        }
#if PRODUCTS_TAKE_12_BITS
        row_scale[i] = low ? quantize_buffer_12_bits(buffer, cols, values + i * cols)
                           : quantize_buffer(buffer, cols, values + i * cols);
#else
        row_scale[i] = low ? quantize_buffer_12_bits(buffer, cols, values + i * cols, low + i * cols)
                           : quantize_buffer(buffer, cols, values + i * cols);
#endif
    }
}

/* products = 16 products + low_products, rows first .. last - 1: a 12-bit input's product from its parts'. */
static void combine_rows(int32_t *restrict products, const int32_t *restrict low_products, int64_t first,
                         int64_t last, int64_t cols) {
    for (int64_t j = first * cols; j < last * cols; j++) products[j] = products[j] * 16 + low_products[j];
}

/* LayerNorm(dequantized + bias + residual). Sums in double, eight independent partial sums (so the compiler keeps
 * them in one vector without reordering any one sum). */
static void residual_norm_rows(const int32_t *restrict products, int64_t first, int64_t last,
                               const float *restrict row_scale, const Int8Dense *dense,
                               const float *restrict residual, const float *restrict weight,
                               const float *restrict bias, double eps, float *restrict out) {
    const int64_t cols = dense->out_features, whole = cols / 8 * 8;
    const float *restrict weight_scale = dense->weight_scale, *restrict dense_bias = dense->bias;
    for (int64_t i = first; i < last; i++) {
        const float r = row_scale[i];
        float *row = out + i * cols;
        for (int64_t j = 0; j < cols; j++)
            row[j] = (float)products[i * cols + j] * (r * weight_scale[j]) + dense_bias[j] + residual[i * cols + j];
        double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0}, total = 0.0;
        for (int64_t j = 0; j < whole; j += 8)
            for (int u = 0; u < 8; u++) partial[u] += (double)row[j + u];
        for (int64_t j = whole; j < cols; j++) total += (double)row[j];
        for (int u = 0; u < 8; u++) total += partial[u];
        const double mean = total / (double)cols;
        double spread_partial[8] = {0, 0, 0, 0, 0, 0, 0, 0}, spread = 0.0;
        for (int64_t j = 0; j < whole; j += 8)
            for (int u = 0; u < 8; u++) {
                const double d = (double)row[j + u] - mean;
                spread_partial[u] += d * d;
            }
        for (int64_t j = whole; j < cols; j++) spread += ((double)row[j] - mean) * ((double)row[j] - mean);
        for (int u = 0; u < 8; u++) spread += spread_partial[u];
        const float inverse = (float)(1.0 / sqrt(spread / (double)cols + eps)), shift = (float)mean;
        for (int64_t j = 0; j < cols; j++) row[j] = (row[j] - shift) * inverse * weight[j] + bias[j];
    }
}

/* out (rows, hidden) = the layer applied to x (rows, hidden), float32, both row-major; the rows are `count` packed
 * sequences (starts[s] .. starts[s] + lengths[s] - 1, none longer than `longest`), each attending to itself alone.
 * `workspace`: int8_layer_workspace(...) bytes, 64-byte aligned. */
void int8_layer(const Int8Layer *layer, const float *x, int64_t rows, const int64_t *starts, const int64_t *lengths,
                int64_t count, int64_t longest, float *out, char *workspace, int64_t threads) {
    int64_t size;
    const Buffers b = carve(layer, rows, longest, threads, workspace, &size);
    const int64_t hidden = layer->heads * layer->head_dim, inner = layer->expand.out_features;
    const float scale = (float)(1.0 / sqrt((double)layer->head_dim));  /* as kernels/attention.py passes it */
    const int twelve_bits = layer->contract.input_bits == 12;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int64_t me = omp_get_thread_num(), team = omp_get_num_threads();
        float *mine = b.per_thread + me * b.per_thread_floats;
        /* (Each chunk's row-wise steps take rows first .. last - 1 of the chunk; the helpers index from the
         * chunk's first row.) */
        for (int64_t start = 0; start < rows; start += CHUNK_ROWS) {
            const int64_t n = rows - start < CHUNK_ROWS ? rows - start : CHUNK_ROWS;
            const int64_t first = n * me / team, last = n * (me + 1) / team;
            quantize_rows(x + start * hidden, first, last, layer->qkv.input_scale, hidden, mine, b.quantized,
                          b.row_scale);
#pragma omp barrier
            products_share(b.quantized, n, hidden, layer->qkv.blocked, layer->qkv.correction, 3 * hidden, b.products,
                           me, team);
#pragma omp barrier
            dequantize_rows(b.products, first, last, b.row_scale, &layer->qkv, b.qkv + start * 3 * hidden);
#pragma omp barrier
        }
        attention_share(b.qkv, starts, lengths, count, layer->heads, layer->head_dim, scale, b.attended, mine, me,
                        team);
#pragma omp barrier
        for (int64_t start = 0; start < rows; start += CHUNK_ROWS) {
            const int64_t n = rows - start < CHUNK_ROWS ? rows - start : CHUNK_ROWS;
            const int64_t first = n * me / team, last = n * (me + 1) / team;
            quantize_rows(b.attended + start * hidden, first, last, layer->attention_output.input_scale, hidden,
                          mine, b.quantized, b.row_scale);
#pragma omp barrier
            products_share(b.quantized, n, hidden, layer->attention_output.blocked,
                           layer->attention_output.correction, hidden, b.products, me, team);
#pragma omp barrier
            residual_norm_rows(b.products, first, last, b.row_scale, &layer->attention_output, x + start * hidden,
                               layer->norm1_weight, layer->norm1_bias, layer->norm1_eps, b.middle);
            quantize_rows(b.middle, first, last, layer->expand.input_scale, hidden, mine, b.quantized, b.row_scale);
#pragma omp barrier
            products_share(b.quantized, n, hidden, layer->expand.blocked, layer->expand.correction, inner,
                           b.products, me, team);
#pragma omp barrier
            gelu_quantize_rows(b.products, first, last, b.row_scale, &layer->expand, layer->contract.input_scale,
                               mine, b.quantized, twelve_bits ? b.low : 0);
#pragma omp barrier
            products_share(b.quantized, n, inner, layer->contract.blocked, layer->contract.correction, hidden,
                           b.products, me, team);
            if (SPLIT_TWELVE_BITS(twelve_bits))
                products_share(b.low, n, inner, layer->contract.blocked, layer->contract.correction, hidden,
                               b.low_products, me, team);
#pragma omp barrier
            if (SPLIT_TWELVE_BITS(twelve_bits)) combine_rows(b.products, b.low_products, first, last, hidden);
            residual_norm_rows(b.products, first, last, b.row_scale, &layer->contract, b.middle,
                               layer->norm2_weight, layer->norm2_bias, layer->norm2_eps, out + start * hidden);
#pragma omp barrier
        }
    }
}
