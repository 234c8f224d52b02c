/* attention.c's attention over packed sequences, for x86-64 CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2 and 3,
 * Intel before Skylake-SP): attention_float32.c's algorithm in AVX2's vocabulary (vectors_avx2.c), eight floats a
 * vector instead of sixteen. Built and loaded by kernels/attention.py where attention.c cannot run, and checked
 * against torch's scaled_dot_product_attention the same way before use.
 *
 * Why: without it such a CPU ran torch's attention, one call per sequence or one padded call per batch (python -m
 * bench.peak.attention compares the two).
 *
 * Layout as attention.c's; head_dim a multiple of 8.
 */
#include "vectors_avx2.c"
#include "attention_float32.c"
