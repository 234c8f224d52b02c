/* int8_layer.c's whole int8 encoder layer in one call, for x86-64 CPUs with AVX2 and FMA but no AVX512-VNNI (AMD Zen
 * 2 and 3, Intel before Ice Lake): the same body (int8_layer_body.c) over int8_products_avx2.c's products and
 * attention_avx2.c's attention. Built and loaded by kernels/int8_layer.py where int8_layer.c cannot run, and checked
 * the same way against the reference formulas before use.
 *
 * Why: on such a CPU the int8 layers ran as modules, and a profile of all-MiniLM-L6-v2 at 16 sentences a batch
 * (one thread) spent 42% in the products and as much again in what surrounds them: quantizing rows 22%, GELU 8%,
 * residual and LayerNorm 5%, widening rows to 16 bits and other tensor copies 5%, each step a module call.
 *
 * What differs from int8_layer.c: rows are quantized straight into the 16-bit values the products take (no
 * widening pass), and the feed-forward output layer's 12-bit input is one product, not two. The bits are the
 * reference formulas' all the same; attention's are attention_avx2.c's, which sums in another order than
 * attention.c, so the two layers' outputs differ in their last bits.
 */
#include "int8_products_avx2.c"
#include "attention_avx2.c"
#include "int8_layer_body.c"
