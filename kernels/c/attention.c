/* Attention over packed sequences on a CPU with AVX-512, each sequence attending to itself alone, for sequences of up
 * to 512 tokens. Built and loaded by kernels/attention.py, which checks it against torch's
 * scaled_dot_product_attention before use. The algorithm is attention_float32.c's, in AVX-512's vocabulary
 * (vectors_avx512.c); attention_avx2.c is the same in AVX2's.
 *
 * Why: torch's CPU attention (the flash kernel behind F.scaled_dot_product_attention) costs about 80 us a layer for
 * one 34-token sentence of all-MiniLM-L6-v2 (12 heads of 32), where the arithmetic is 0.9 M multiply-adds; this
 * runs the whole batch of sequences in one call, a block of query rows at a time: scores, softmax, weighted sum of
 * values.
 *
 * Layout: qkv (tokens, 3 * hidden) float32 rows, query | key | value, each heads x head_dim; out (tokens, hidden).
 * head_dim a multiple of 16. int8_layer.c and attention_bf16.c include this file (its vocabulary and team dispatch).
 */
#include "vectors_avx512.c"
#include "attention_float32.c"

