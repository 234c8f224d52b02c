/* What every kernel on Intel AMX's tiles shares (int8_products_amx.c, attention_bf16_amx.c): Linux's permission and
 * the tile shapes. Included by those files, never built alone.
 *
 * AMX's registers must be asked of Linux once per process (arch_prctl, Linux 5.16+: `amx_request`, called by the
 * loader before anything else in the library), and each thread loads the tile shapes before its first tile
 * instruction (`load_square_tiles`).
 */
#ifndef AMX_TILES_C
#define AMX_TILES_C
#include <errno.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* 0 once this process may use AMX's tile registers, else the errno of Linux's refusal. */
int amx_request(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : errno;
}

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_shapes;

/* Tiles 0 .. count - 1 in this thread, each 64 bytes a row: the first `short_tiles` of them `rows` rows, the others
 * 16 (a product over the last rows of a batch: its rows' and sums' tiles shorter, the weights' whole). */
static void load_tiles(int count, int short_tiles, int rows) {
    tile_shapes shapes;
    memset(&shapes, 0, sizeof shapes);
    shapes.palette = 1;
    for (int t = 0; t < count; t++) {
        shapes.rows[t] = (uint8_t)(t < short_tiles ? rows : 16);
        shapes.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&shapes);
}

/* Tiles 0 .. count - 1 in this thread: each the largest, 16 rows of 64 bytes. */
static void load_square_tiles(int count) { load_tiles(count, 0, 16); }
#endif
