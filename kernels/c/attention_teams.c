/* The team dispatch every CPU attention kernel shares (attention.c and attention_bf16.c for AVX-512,
 * attention_avx2.c): the (sequence, head) pairs of a packed batch split over OpenMP's threads, each thread with
 * scratch of its own, each pair handed to the kernel's own function for one head of one sequence. Included by those
 * files, never built alone.
 */
#include <omp.h>
#include <stdint.h>

/* One head of one sequence: each kernel's attend_head (attend_head_bf16 in attention_bf16.c). Their pointers are
 * untyped so that one team dispatch (below) serves them all. */
typedef void (*head_attention)(const void *qkv, int64_t start, int64_t length, int64_t h, int64_t heads,
                               int64_t head_dim, float scale, void *out, void *scratch);

/* Thread `me` of `team`'s share of attention over `count` sequences (rows starts[s] .. starts[s] + lengths[s] - 1 of
 * qkv) and every head: a run of (sequence, head) pairs, with `scratch` of its own. Never inlined, so that a profile
 * of the int8 layer (bench/peak/where_time_goes.py) tells its attention from the rest of its body. */
static __attribute__((noinline)) void attention_share_of(head_attention attend_one, const void *qkv,
                                                        const int64_t *starts, const int64_t *lengths, int64_t count,
                                                        int64_t heads, int64_t head_dim, float scale, void *out,
                                                        void *scratch, int64_t me, int64_t team) {
    const int64_t pairs = count * heads;
    for (int64_t pair = pairs * me / team; pair < pairs * (me + 1) / team; pair++)
        attend_one(qkv, starts[pair / heads], lengths[pair / heads], pair % heads, heads, head_dim, scale, out,
                   scratch);
}

/* Every (sequence, head) pair through `attend_one` on up to `threads` threads (OpenMP's: torch's own pool, as in
 * int8_products.c), each thread with `scratch_bytes` of `scratch` of its own. */
static void attend_packed_with(head_attention attend_one, const void *qkv, const int64_t *starts,
                               const int64_t *lengths, int64_t count, int64_t heads, int64_t head_dim, float scale,
                               void *out, char *scratch, int64_t scratch_bytes, int64_t threads) {
    if (threads > count * heads) threads = count * heads;
    if (threads <= 1) {
        attention_share_of(attend_one, qkv, starts, lengths, count, heads, head_dim, scale, out, scratch, 0, 1);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int64_t me = omp_get_thread_num();
        attention_share_of(attend_one, qkv, starts, lengths, count, heads, head_dim, scale, out,
                           scratch + me * scratch_bytes, me, omp_get_num_threads());
    }
}
