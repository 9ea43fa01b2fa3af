/*
 * VPDPBUSD, shared by the kernels that multiply int8 on AVX512-VNNI (int8_linear.c, and
 * bf16_attention.c's int8 products in attention_int8.h).
 */
#ifndef EMBEDSERVE_VNNI_DOT_H
#define EMBEDSERVE_VNNI_DOT_H

#include <immintrin.h>

/* acc += a (uint8) . b (int8) by quads, as _mm512_dpbusd_epi32, in inline assembly: with
 * the intrinsic GCC 12 kept blocks of 8 or more rows' accumulators in copies, storing
 * each to the stack after every product (a 12-row block of int8_linear.c: 24 stores and
 * 48 moves per quad), which made 12- to 64-row calls no faster than bf16_linear.c. */
static inline __attribute__((always_inline)) __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

#endif
