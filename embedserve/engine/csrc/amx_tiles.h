/*
 * The AMX tile configuration (LDTILECFG's 64-byte operand, palette 1), shared by the
 * kernels that run on tiles (bf16_attention.c; amx_linear.c and int8_linear.c through
 * tile_blocks.h). Each fills it for its own tiles' shapes.
 */
#ifndef EMBEDSERVE_AMX_TILES_H
#define EMBEDSERVE_AMX_TILES_H

#include <stdint.h>

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

#endif
