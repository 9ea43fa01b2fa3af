/*
 * The activations a bf16 linear's epilogue applies to its float32 sums, before the one
 * rounding to bf16 (none, GELU with erf or tanh, ReLU), as oneDNN's fused epilogues
 * compute them; shared by bf16_linear.c and amx_linear.c.
 */
#ifndef EMBEDSERVE_BF16_ACTIVATIONS_H
#define EMBEDSERVE_BF16_ACTIVATIONS_H

#include <immintrin.h>

#include "avx512_exp.h"

enum { ACTIVATION_NONE, ACTIVATION_GELU_ERF, ACTIVATION_GELU_TANH, ACTIVATION_RELU, ACTIVATIONS };

#define LOG2_E 1.4426950408889634f

/* erf(z) for z >= 0: Abramowitz & Stegun 7.1.26, absolute error <= 1.5e-7. */
static inline __m512 erf_nonnegative(__m512 z) {
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), z,
                                                                        _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    p = _mm512_mul_ps(p, t);
    const __m512 gauss = exp2_nonpositive(_mm512_mul_ps(_mm512_mul_ps(z, z), _mm512_set1_ps(-LOG2_E)));
    return _mm512_fnmadd_ps(p, gauss, _mm512_set1_ps(1.0f));
}

/* x * (1 + s) / 2 with s = sign(x) * g(|x|): the GELUs' shared form. */
static inline __m512 half_x_one_plus(__m512 x, __m512 magnitude_part) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512 s = _mm512_mask_sub_ps(magnitude_part, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), zero,
                                        magnitude_part);
    return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), _mm512_add_ps(_mm512_set1_ps(1.0f), s));
}

static inline __m512 activate(__m512 x, int activation) {
    switch (activation) {
    case ACTIVATION_GELU_ERF: {   /* x (1 + erf(x / sqrt 2)) / 2 */
        const __m512 z = _mm512_abs_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
        return half_x_one_plus(x, erf_nonnegative(z));
    }
    case ACTIVATION_GELU_TANH: {  /* x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2 */
        const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                       _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(x, x), x),
                                                       _mm512_set1_ps(0.044715f), x));
        /* tanh(|u|) = (1 - e) / (1 + e), e = exp(-2 |u|) <= 1; u has the sign of x */
        const __m512 e = exp2_nonpositive(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-2.0f * LOG2_E)));
        const __m512 one = _mm512_set1_ps(1.0f);
        return half_x_one_plus(x, _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e)));
    }
    case ACTIVATION_RELU:
        return _mm512_max_ps(x, _mm512_setzero_ps());
    default:
        return x;
    }
}

#endif
