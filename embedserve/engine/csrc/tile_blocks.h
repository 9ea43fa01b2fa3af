/*
 * How the linears on AMX tiles (amx_linear.c: bf16, int8_linear.c: int8) walk a call:
 * the tiles' shapes and which (rows, columns) block each thread gets. The kernels differ
 * only in their tile products, the operands' layouts and the epilogue.
 *
 * Tiles 0-3: C (rows x 16 sums of 32 bits); 4: A (rows x 64 bytes: 32 bf16 or 64 int8 of
 * the input); 5-7: B (16 rows of 64 bytes: a panel's bf16 pairs or int8 quads for 16
 * columns). A block is up to 16 rows by 64 output columns (two panels, four C tiles).
 */
#ifndef EMBEDSERVE_TILE_BLOCKS_H
#define EMBEDSERVE_TILE_BLOCKS_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "amx_tiles.h"

#define TILE_ROWS 16
#define TILE_BLOCK_COLUMNS 64

/* The tiles above, A and C ``rows`` high. */
static inline void configure_linear_tiles(int rows) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette_id = 1;
    for (int t = 0; t < 5; ++t) {
        config.rows[t] = (uint8_t)rows;
        config.colsb[t] = 64;
    }
    for (int t = 5; t < 8; ++t) {
        config.rows[t] = TILE_ROWS;
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}

/* A block's C tiles into ``sums`` (TILE_ROWS rows of 64 sums of 32 bits, 64-byte aligned);
 * tiles 2 and 3 only where the block is two panels wide. */
static inline void store_sums(void *sums, int two) {
    char *at = sums;
    _tile_stored(0, at, TILE_BLOCK_COLUMNS * 4);
    _tile_stored(1, at + 64, TILE_BLOCK_COLUMNS * 4);
    if (two) {
        _tile_stored(2, at + 128, TILE_BLOCK_COLUMNS * 4);
        _tile_stored(3, at + 192, TILE_BLOCK_COLUMNS * 4);
    }
}

/* One block of a call: rows [row, row + height) by columns [column, column + 64). */
typedef void (*tile_block)(const void *call, int64_t row, int height, int64_t column);

/* Every block of a call of ``rows`` rows and ``n`` output columns, on up to ``threads`` of
 * torch's OpenMP team (the one whose threads oneDNN's AMX kernels already run on). Row
 * blocks outer, so that a thread configures its tiles once per height; the column blocks
 * of each split between threads. Call without the GIL. */
static inline void for_each_tile_block(const void *call, int64_t rows, int64_t n, int threads, tile_block block) {
    const int64_t blocks = (n + TILE_BLOCK_COLUMNS - 1) / TILE_BLOCK_COLUMNS;
#pragma omp parallel num_threads(threads)
    {
        int configured = 0;
        for (int64_t row = 0; row < rows; row += TILE_ROWS) {
            const int height = (int)(rows - row < TILE_ROWS ? rows - row : TILE_ROWS);
            if (height != configured) {
                configure_linear_tiles(height);
                configured = height;
            }
#pragma omp for schedule(static) nowait
            for (int64_t b = 0; b < blocks; ++b) block(call, row, height, b * TILE_BLOCK_COLUMNS);
        }
        if (configured) _tile_release();
    }
}

#endif
