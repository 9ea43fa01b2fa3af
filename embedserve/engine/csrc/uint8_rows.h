/*
 * Rows of bf16 or float32 activations to uint8, as the int8 linears take them
 * (int8_layers.py): q = clamp(round(x * multiplier[c]) + zero_point, 0, qmax), rounding
 * to nearest even as oneDNN does, and a rows' min and max for the dynamic mode. Shared by
 * int8_quantize.c (the pass before oneDNN's matmul) and int8_linear.c (the few-row
 * kernel that quantizes its own input), so both make the same bytes.
 */
#ifndef EMBEDSERVE_UINT8_ROWS_H
#define EMBEDSERVE_UINT8_ROWS_H

#include <float.h>
#include <immintrin.h>
#include <stdint.h>

static inline __m512 load16(const void *x, int bf16, int64_t at, __mmask16 mask) {
    if (bf16) {
        const __m256i raw = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)x + at);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)x + at);
}

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* One row of ``cols`` values; ``multiplier`` float32 [cols], or NULL: ``uniform`` for every
 * column (a row quantized on its own range). */
static inline void quantize_row(const void *x, int bf16, uint8_t *out, int64_t cols, const float *multiplier,
                                float uniform, __m512i zero_point, __m512i high) {
    const __m512i low = _mm512_setzero_si512();
    const __m512 every = _mm512_set1_ps(uniform);
    for (int64_t c = 0; c < cols; c += 16) {
        const __mmask16 mask = tail_mask(cols - c);
        const __m512 factor = multiplier != NULL ? _mm512_maskz_loadu_ps(mask, multiplier + c) : every;
        const __m512 scaled = _mm512_mul_ps(load16(x, bf16, c, mask), factor);
        __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                     zero_point);
        q = _mm512_min_epi32(_mm512_max_epi32(q, low), high);
        _mm_mask_storeu_epi8(out + c, mask, _mm512_cvtepi32_epi8(q));
    }
}

/* Folds one row's values into the running (low, high) vectors. */
static inline void row_range(const void *row, int bf16, int64_t cols, __m512 *low, __m512 *high) {
    for (int64_t c = 0; c < cols; c += 16) {
        const __mmask16 mask = tail_mask(cols - c);
        const __m512 v = load16(row, bf16, c, mask);
        *low = _mm512_mask_min_ps(*low, mask, *low, v);
        *high = _mm512_mask_max_ps(*high, mask, *high, v);
    }
}

#endif
