/*
 * How the native linears (avx2_linear.c, bf16_linear.c) walk a call: which rows and
 * panels each kernel block gets, and on how many threads. The kernels differ only in
 * their blocks and layouts.
 *
 * Rows go in equal chunks of at most CHUNK_BLOCKS blocks that stay in L2 while every
 * panel passes over them (64 rows in blocks of up to 6: 32 and 32, not 48 and 16, so that
 * the team's shares of the pairs are equal too). (chunk, panel) pairs are split between
 * torch's OpenMP team (see bf16_attention.c for why it is torch's). A chunk's rows go in
 * equal blocks (20 rows in blocks of up to 6: 5, 5, 5, 5, not 6, 6, 6, 2).
 */
#ifndef EMBEDSERVE_LINEAR_BLOCKS_H
#define EMBEDSERVE_LINEAR_BLOCKS_H

#include <Python.h>
#include <omp.h>

/* Blocks per chunk of rows: 48 float32 rows (6 per block) or 96 bf16 rows (12 per block)
 * of up to 4,096 columns (786 KB) stay in a 1 MB L2; measured against 4, 16 and 32 blocks
 * at 256 and 512 rows. */
#define CHUNK_BLOCKS 8
/* Below this many multiply-adds a call runs on one thread: waking the team costs more. */
#define SERIAL_MACS 65536
/* Up to this many rows a chunk's second block warms the next panel (``linear_block``):
 * there each weight meets a few dozen rows, and the first block's stream from memory is
 * what bounds the call (a 20-token query's step 14-18 % faster in bf16; 20-128-token
 * steps 5-9 % faster on avx2_linear.c, measured on an AVX-512 host running it); warming
 * at every size made 32 x 512 steps 7 % slower. */
#define WARM_NEXT_MAX_ROWS 128

/* One kernel block: ``size`` rows from ``row`` by panel ``panel``, of the call ``call``.
 * ``warm_next``: the block may pull panel ``panel + 1``'s weights toward L2 meanwhile
 * (set on a chunk's second block: the first streamed this panel from memory, the rest
 * find it in L1, and memory would sit idle while they run). */
typedef void (*linear_block)(const void *call, Py_ssize_t row, int size, Py_ssize_t panel, int warm_next);

/* A kernel's block functions come in two variants per row count R, ``blockR`` and
 * ``warming_blockR`` (the one that warms the next panel), made by the kernel's
 * ``ROW_BLOCK(R, NAME, WARM)``; these instantiate both for R = 1..6 or 1..12 and list
 * them by row count (index 0 unused), the tables ``run_block`` picks from. */
#define BOTH_VARIANTS(R) ROW_BLOCK(R, block, 0) ROW_BLOCK(R, warming_block, 1)
#define FOR_1_TO_6(M) M(1) M(2) M(3) M(4) M(5) M(6)
#define FOR_1_TO_12(M) FOR_1_TO_6(M) M(7) M(8) M(9) M(10) M(11) M(12)
#define PLAIN_ENTRY(R) block##R,
#define WARMING_ENTRY(R) warming_block##R,

/* A call's walk: ``rows`` rows by ``panels`` panels of ``panel_width`` outputs over ``k``
 * inputs, the rows in ``chunks`` chunks of blocks of at most ``max_block_rows`` rows. */
typedef struct {
    Py_ssize_t rows, panels, chunks;
    int max_block_rows, warm;
    linear_block block;
    const void *call;
} BlockWalk;

static BlockWalk block_walk(Py_ssize_t rows, Py_ssize_t panels, int max_block_rows, linear_block block,
                            const void *call) {
    const Py_ssize_t chunk_rows = (Py_ssize_t)CHUNK_BLOCKS * max_block_rows;
    const BlockWalk walk = {rows, panels, (rows + chunk_rows - 1) / chunk_rows, max_block_rows,
                            rows <= WARM_NEXT_MAX_ROWS, block, call};
    return walk;
}

/* The blocks of chunk ``c`` by panel ``j``: the chunk's rows in equal blocks. */
static inline void walk_chunk_panel(const BlockWalk *w, Py_ssize_t c, Py_ssize_t j) {
    const Py_ssize_t first = c * w->rows / w->chunks, end = (c + 1) * w->rows / w->chunks;
    const Py_ssize_t blocks = (end - first + w->max_block_rows - 1) / w->max_block_rows;
    Py_ssize_t row = first;
    for (Py_ssize_t b = 0; b < blocks; ++b) {
        const Py_ssize_t left = end - row, blocks_left = blocks - b;
        const int size = (int)((left + blocks_left - 1) / blocks_left);
        w->block(w->call, row, size, j, w->warm && b == 1 && j + 1 < w->panels);
        row += size;
    }
}

/* Item ``item`` of a walk's (chunk, panel) pairs, chunk-major: helper_team.h's item. */
static void __attribute__((unused)) walk_item(const void *walk, Py_ssize_t item) {
    const BlockWalk *w = walk;
    walk_chunk_panel(w, item / w->panels, item % w->panels);
}

/* Runs ``block`` over every block of a call: ``rows`` rows by ``panels`` panels of
 * ``panel_width`` outputs over ``k`` inputs, in blocks of at most ``max_block_rows`` rows,
 * on up to ``threads`` threads. Call without the GIL. */
static void for_each_block(Py_ssize_t rows, Py_ssize_t panels, Py_ssize_t panel_width, Py_ssize_t k,
                           int max_block_rows, Py_ssize_t threads, linear_block block, const void *call) {
    if (threads < 1 || rows * panels * panel_width * k < SERIAL_MACS)
        threads = 1;
    const BlockWalk walk = block_walk(rows, panels, max_block_rows, block, call);
#pragma omp parallel for num_threads(threads) schedule(static) collapse(2)
    for (Py_ssize_t c = 0; c < walk.chunks; ++c)
        for (Py_ssize_t j = 0; j < panels; ++j)
            walk_chunk_panel(&walk, c, j);
}

#endif
