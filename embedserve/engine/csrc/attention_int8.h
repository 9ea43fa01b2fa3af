/*
 * int8 products for bf16_attention.c (``quantize``: --dtype int8's layers), on
 * AVX512-VNNI's VPDPBUSD, which multiplies 4 byte pairs per lane where VDPBF16PS
 * multiplies 2 bf16 pairs: the two products of attention take half the instructions.
 *
 * Why these scales (each checked on the XQuAD vectors, docs/scheduler.md): a query row is
 * int8 at its own scale (the scale goes into that row's softmax factor); the keys of a
 * (sequence, head) are first centred on their mean per dim, which leaves each softmax row
 * unchanged (a query's scores all move by one constant) but removes the offset K's dims
 * share, and then take one scale, so the scores stay int32 until the softmax; the
 * probabilities are uint8, round(255 p) with p <= 1 (the row's largest is 255), and P V
 * is divided by their integer sum, so the weights sum to one exactly; V is int8 at one
 * scale per dim over the sequence, applied to P V's sums.
 *
 * The uint8 probabilities are the largest error on real activations (multilingual-e5-small
 * on XQuAD passages): a row whose largest probability is a sink token ([CLS], a full stop)
 * loses its many small ones (17-53 % of a layer's probabilities round to 0), up to 20-28 %
 * of some rows' output. The int8 model's attention outputs there already differ from the
 * bf16 model's by more (up to 86 % of a row, the linears' error carried through the layers
 * before), and the pooled vectors stay within --dtype int8's bars. Keeping P V in bf16
 * (int8 Q K^T alone) saved only ~12 % of a call against ~30 %.
 *
 * VPDPBUSD multiplies uint8 by int8: the keys are stored as int8 + 128 and each query
 * row's scores start from -128 x the sum of its int8 (its ``correction``).
 *
 * Layouts (``padded``, the keys rounded up to a multiple of 64):
 * - keys: per 16-key block, hd / 4 vectors; lane j of vector p holds dims 4p .. 4p + 3 of
 *   key j (uint8);
 * - probabilities: a row of ``padded`` bytes in packed order: byte 16 L + 4 m + e of a
 *   64-key group is key 16 m + 4 L + e (what in-lane packing of four 16-key vectors
 *   gives, so no permute);
 * - values: per position a of the probabilities' quads and 16-dim group g, one vector
 *   whose lane d holds dim 16 g + d of the 4 keys of that quad (int8).
 */
#ifndef EMBEDSERVE_ATTENTION_INT8_H
#define EMBEDSERVE_ATTENTION_INT8_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "vnni_dot.h"

#define LOG2_255 7.9943534368588578f

static inline __m512 bf16_lanes(const uint16_t *at) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)at)), 16));
}

/* The first n of 16 lanes (none for n <= 0). */
static inline __mmask16 lanes_below(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* One bf16 row of hd (32 or 64) values -> int8 at its own scale (largest magnitude ->
 * 127) in ``out``; returns the scale (0 for a zero row), ``correction`` -128 x the sum. */
static inline float quantize_query_int8(const uint16_t *row, int64_t hd, int8_t *out, int32_t *correction) {
    __m512 x[4];
    __m512 largest = _mm512_setzero_ps();
    for (int64_t c = 0; c < hd / 16; ++c) {
        x[c] = bf16_lanes(row + 16 * c);
        largest = _mm512_max_ps(largest, _mm512_abs_ps(x[c]));
    }
    const float top = _mm512_reduce_max_ps(largest);
    const __m512 inverse = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    __m512i total = _mm512_setzero_si512();
    for (int64_t c = 0; c < hd / 16; ++c) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x[c], inverse));
        total = _mm512_add_epi32(total, q);
        _mm_storeu_si128((__m128i *)(out + 16 * c), _mm512_cvtsepi32_epi8(q));
    }
    *correction = -128 * _mm512_reduce_add_epi32(total);
    return top / 127.0f;
}

/* K rows [length, hd] ``row_stride`` elements apart -> ``packed`` (layout above; keys past
 * ``length`` zero); returns the keys' scale. */
static inline float pack_keys_int8(const uint16_t *k, int64_t row_stride, int64_t length, int64_t padded,
                                   int64_t hd, uint8_t *packed) {
    const int64_t quads = hd / 4, parts = hd / 16;
    __m512 mean[4], largest = _mm512_setzero_ps();
    for (int64_t c = 0; c < parts; ++c) mean[c] = _mm512_setzero_ps();
    for (int64_t key = 0; key < length; ++key)
        for (int64_t c = 0; c < parts; ++c) mean[c] = _mm512_add_ps(mean[c], bf16_lanes(k + key * row_stride + 16 * c));
    for (int64_t c = 0; c < parts; ++c) mean[c] = _mm512_mul_ps(mean[c], _mm512_set1_ps(1.0f / (float)length));
    for (int64_t key = 0; key < length; ++key)
        for (int64_t c = 0; c < parts; ++c)
            largest = _mm512_max_ps(largest, _mm512_abs_ps(_mm512_sub_ps(bf16_lanes(k + key * row_stride + 16 * c),
                                                                         mean[c])));
    const float top = _mm512_reduce_max_ps(largest);
    const __m512 inverse = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
    int8_t rows[16 * 64] __attribute__((aligned(64)));   /* one block's keys, row by row */
    const __m512i lanes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32((int)hd));
    const __m512i offset = _mm512_set1_epi8((char)0x80);
    for (int64_t block = 0; block < padded / 16; ++block) {
        for (int64_t j = 0; j < 16; ++j) {
            const int64_t key = block * 16 + j;
            for (int64_t c = 0; c < parts; ++c)
                _mm_store_si128((__m128i *)(rows + j * hd + 16 * c), key < length
                    ? _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(
                          _mm512_sub_ps(bf16_lanes(k + key * row_stride + 16 * c), mean[c]), inverse)))
                    : _mm_set1_epi8((char)0x80));   /* uint8 0 once offset */
        }
        uint8_t *vectors = packed + block * quads * 64;
        for (int64_t p = 0; p < quads; ++p)
            _mm512_store_si512(vectors + p * 64, _mm512_xor_si512(_mm512_i32gather_epi32(lanes, rows + 4 * p, 1), offset));
    }
    return top / 127.0f;
}

/* V rows [length, hd] -> ``packed`` (layout above; keys past ``length`` zero) and
 * ``scales`` [hd], each dim's scale. */
static inline void pack_values_int8(const uint16_t *v, int64_t row_stride, int64_t length, int64_t padded,
                                    int64_t hd, int8_t *packed, float *scales) {
    const int64_t groups = hd / 16;
    __m512 largest[4], inverse[4];
    for (int64_t g = 0; g < groups; ++g) largest[g] = _mm512_setzero_ps();
    for (int64_t key = 0; key < length; ++key)
        for (int64_t g = 0; g < groups; ++g)
            largest[g] = _mm512_max_ps(largest[g], _mm512_abs_ps(bf16_lanes(v + key * row_stride + 16 * g)));
    for (int64_t g = 0; g < groups; ++g) {
        _mm512_storeu_ps(scales + 16 * g, _mm512_mul_ps(largest[g], _mm512_set1_ps(1.0f / 127.0f)));
        const __mmask16 nonzero = _mm512_cmp_ps_mask(largest[g], _mm512_setzero_ps(), _CMP_GT_OQ);
        inverse[g] = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0f), largest[g]);
    }
    const __m512i byte = _mm512_set1_epi32(0xff);
    for (int64_t at = 0; at < padded / 4; ++at) {
        /* position 4 L + m of a group of 16 quads holds the keys' quad 4 m + L */
        const int64_t local = at % 16, quad = at - local + 4 * (local % 4) + local / 4;
        for (int64_t g = 0; g < groups; ++g) {
            __m512i lane = _mm512_setzero_si512();
            for (int64_t e = 0; e < 4 && quad * 4 + e < length; ++e) {
                const __m512 x = bf16_lanes(v + (quad * 4 + e) * row_stride + 16 * g);
                const __m512i q = _mm512_and_si512(_mm512_cvtps_epi32(_mm512_mul_ps(x, inverse[g])), byte);
                lane = _mm512_or_si512(lane, _mm512_slli_epi32(q, (unsigned)(8 * e)));
            }
            _mm512_store_si512(packed + (at * groups + g) * 64, lane);
        }
    }
}

/* 2^t to a relative 7.5e-5, enough for a probability rounded to 8 bits: a degree-3
 * polynomial fitted to 2^f on [0, 1) (least maximum relative error), f = t - floor(t)
 * from one VREDUCEPS, and SCALEF's own floor(t) for the power (2 instructions fewer
 * than avx512_exp.h's rounding, subtraction and degree 5). */
static inline __m512 exp2_coarse(__m512 t) {
    const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(7.8024350e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2606741e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9583344e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9992520e-1f));
    return _mm512_scalef_ps(p, t);
}

/* A row of int32 scores whose largest among the first ``length`` is ``row_max`` ->
 * ``probs``, round(255 exp(scale * (s - row_max))) in packed order, zero past ``length``;
 * returns their sum. 255 x is 2^(t + log2 255): a shift, not a multiply. */
static inline int32_t softmax_row_uint8(const int32_t *scores, int32_t row_max, int64_t length, int64_t padded,
                                        float scale, uint8_t *probs) {
    const __m512 factor = _mm512_set1_ps(scale * 1.4426950408889634f);
    const __m512 shift = _mm512_set1_ps((float)row_max * scale * 1.4426950408889634f - LOG2_255);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t j = 0; j < padded; j += 64) {
        __m512i p[4];
        for (int m = 0; m < 4; ++m) {
            const __m512 t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(scores + j + 16 * m)), factor, shift);
            p[m] = _mm512_cvtps_epi32(exp2_coarse(t));
            if (j + 16 * m + 16 > length) p[m] = _mm512_maskz_mov_epi32(lanes_below(length - j - 16 * m), p[m]);
            sum = _mm512_add_epi32(sum, p[m]);
        }
        _mm512_store_si512(probs + j, _mm512_packus_epi16(_mm512_packs_epi32(p[0], p[1]),
                                                          _mm512_packs_epi32(p[2], p[3])));
    }
    return _mm512_reduce_add_epi32(sum);
}

/* Scores of ``rows`` int8 queries (``queries``: rows hd bytes apart; ``rows`` a multiple of
 * 4, rows past the real ones zero) against the packed keys, into ``scores`` (rows
 * ``padded`` int32 apart); ``highest[i]`` gets row i's largest among the first ``length``
 * keys, lane by lane. A register block is 4 queries x 64 keys (16 accumulators). */
static inline void scores_int8(const uint8_t *keys, const int8_t *queries, const int32_t *corrections, int64_t hd,
                               int64_t length, int64_t padded, int64_t rows, int32_t *scores, __m512i *highest) {
    const int64_t quads = hd / 4, block_bytes = quads * 64;
    const uint32_t *query_quads = (const uint32_t *)queries;
    for (int64_t column = 0; column < padded; column += 64) {
        const uint8_t *block = keys + (column / 16) * block_bytes;
        const __mmask16 mask[4] = {lanes_below(length - column), lanes_below(length - column - 16),
                                   lanes_below(length - column - 32), lanes_below(length - column - 48)};
        for (int64_t i0 = 0; i0 < rows; i0 += 4) {
            __m512i acc[4][4];
            for (int r = 0; r < 4; ++r) {
                const __m512i start = _mm512_set1_epi32(corrections[i0 + r]);
                for (int b = 0; b < 4; ++b) acc[r][b] = start;
            }
            const uint32_t *query = query_quads + i0 * quads;
            for (int64_t p = 0; p < quads; ++p) {
                __m512i key[4];
                for (int b = 0; b < 4; ++b) key[b] = _mm512_load_si512(block + b * block_bytes + p * 64);
                for (int r = 0; r < 4; ++r) {
                    const __m512i q = _mm512_set1_epi32((int)query[r * quads + p]);
                    for (int b = 0; b < 4; ++b) acc[r][b] = dpbusd(acc[r][b], key[b], q);
                }
            }
            for (int r = 0; r < 4; ++r) {
                int32_t *row = scores + (i0 + r) * padded + column;
                for (int b = 0; b < 4; ++b) {
                    _mm512_store_si512(row + b * 16, acc[r][b]);
                    highest[i0 + r] = _mm512_mask_max_epi32(highest[i0 + r], mask[b], highest[i0 + r], acc[r][b]);
                }
            }
        }
    }
}

/* P V: int32 sums of probability rows [i0, i0 + R) (``probs``: rows ``padded`` bytes
 * apart) against the packed values, for ``groups`` 16-dim groups (R x groups = 16
 * accumulators), into ``context`` (rows groups x 16 int32 apart). */
static inline __attribute__((always_inline)) void context_int8(const uint8_t *probs, const int8_t *values,
                                                               int64_t padded, int64_t i0, const int R,
                                                               const int groups, int32_t *context) {
    const int64_t quads = padded / 4;
    const uint32_t *prob_quads = (const uint32_t *)probs;
    __m512i acc[16];
    for (int a = 0; a < R * groups; ++a) acc[a] = _mm512_setzero_si512();
    for (int64_t at = 0; at < quads; ++at) {
        __m512i value[4];
        for (int g = 0; g < groups; ++g) value[g] = _mm512_load_si512(values + (at * groups + g) * 64);
        for (int r = 0; r < R; ++r) {
            const __m512i p = _mm512_set1_epi32((int)prob_quads[(i0 + r) * quads + at]);
            for (int g = 0; g < groups; ++g) acc[r * groups + g] = dpbusd(acc[r * groups + g], p, value[g]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < groups; ++g)
            _mm512_store_si512(context + (i0 + r) * groups * 16 + g * 16, acc[r * groups + g]);
}

#endif
