/* One whole int8 encoder layer of BERT (post-LN) in one call, over packed sequences, on x86-64 CPUs with
 * AVX512-VNNI. Built and loaded by kernels/int8_layer.py, which checks it against the layer's own modules before use.
 *
 * Why: at one sentence a batch, a layer's arithmetic on all-MiniLM-L6-v2 is about 0.2 ms on one core, and the
 * modules around it (module calls, tensor allocations, seven row-step calls and five C calls a layer) cost as much
 * again, all of it on one thread. Here the layer is one call, and one team of threads runs every step of it:
 *
 *   quantize x per row (smoothed)    -> int8 products with (query | key | value) -> dequantize, plus bias
 *   attention of each sequence       -> quantize -> products -> dequantize + bias + residual x, LayerNorm -> h
 *   quantize h                       -> products -> dequantize + bias, GELU, quantize (smoothed for the next)
 *                                    -> products -> dequantize + bias + residual h, LayerNorm -> out
 *
 * The feed-forward output layer's input may be quantized to 12 bits (its `input_bits`; the others' are int8): each
 * value v is then written as its high and low parts, v = 16 high + low (high -128..127, low 0..15), and the product
 * runs twice, once for each part, combined as 16 p_high + p_low: the exact 12-bit product, at twice the cost.
 *
 * Row-wise steps split the rows between the threads, products their column blocks, attention its (sequence, head)
 * pairs; a barrier separates the steps. Every step but attention runs over chunks of CHUNK_ROWS rows. Every row-wise
 * step is kernels/int8_reference.py's formula, operation for operation (built with -ffp-contract=off, so no
 * multiply-add is fused into one rounding): rounding half away from zero, GELU by erf (Abramowitz & Stegun 7.1.28),
 * LayerNorm's mean and variance summed in double precision in eight interleaved partial sums. Its bits equal the
 * reference's, and the numba kernels' (kernels/int8_numba.py); attention is attention.c's.
 *
 * The threads are OpenMP's, shared with torch (see int8_products.c).
 */
#include "int8_products.c"
#include "attention.c"
#include "int8_layer_body.c"
