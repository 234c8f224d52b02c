/* int8_layer.c's whole int8 encoder layer in one call, for x86-64 CPUs with AMX (Intel Sapphire Rapids and later):
 * the same body (int8_layer_body.c) and attention (attention.c), over int8_products_amx.c's products, which run
 * sixteen rows at a time on AMX's tiles and the rest on the VNNI loops. Built and loaded by kernels/int8_layer.py
 * where the CPU has AMX, and checked against the reference formulas before use; its bits are int8_layer.c's (the
 * products are the same exact integers).
 */
#include "int8_products_amx.c"
#include "attention.c"
#include "int8_layer_body.c"
