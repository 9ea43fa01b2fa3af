/*
 * 2^t for t <= 0 on AVX-512, shared by the native kernels that need an exponential
 * (bf16_attention.c's softmax, bf16_linear.c's GELU epilogues).
 */
#ifndef EMBEDSERVE_AVX512_EXP_H
#define EMBEDSERVE_AVX512_EXP_H

#include <immintrin.h>

/* A result below 2^-126 comes out 0 or subnormal (0 in bf16 either way). */
static inline __m512 exp2_nonpositive(__m512 t) {
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);                     /* in [-0.5, 0.5] */
    /* Taylor terms of 2^f to f^5: relative error <= (0.5 ln 2)^6 / 720 = 2.4e-6. One
     * term fewer (4.2e-5) measurably moved the bf16 roundings of the attention
     * probabilities away from torch's (tests/test_engine_bf16_attention.py). */
    __m512 p = _mm512_set1_ps(1.3333558e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
