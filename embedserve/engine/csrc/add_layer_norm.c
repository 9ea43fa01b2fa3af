/*
 * LayerNorm(y + residual) for bf16 rows in one pass over memory, with AVX-512.
 *
 * Why native: in bf16 a post-norm encoder layer ends twice in a residual add and a
 * LayerNorm, two torch ops that each read and write the [T, hidden] activations;
 * together about 11% of a bf16 step (python -m bench engine_profile). Here each row is
 * added, normalized and written back in place of y while it sits in L1. The sum is
 * kept in float32 (torch's add_ rounds it to bf16 before the norm, so this is the
 * more exact of the two); mean and variance are two-pass in float32, as torch's.
 *
 * Layout: y and residual are [T, hidden] bf16 rows, ``y_stride`` / ``residual_stride``
 * elements apart; weight and bias float32 [hidden]; hidden a multiple of 16.
 * Rows are split between torch's OpenMP team (see bf16_attention.c for why it is
 * torch's); a small call runs on one thread.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#define MAX_HIDDEN 8192
/* Below this many elements a call runs on one thread: waking the team costs more. */
#define SERIAL_ELEMENTS 65536

static inline __m512 load_bf16(const uint16_t *at) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)at)), 16));
}

static void norm_row(uint16_t *y, const uint16_t *residual, const float *weight, const float *bias,
                     int64_t hidden, float eps, float *row) {
    __m512 total = _mm512_setzero_ps();
    for (int64_t d = 0; d < hidden; d += 16) {
        const __m512 x = _mm512_add_ps(load_bf16(y + d), load_bf16(residual + d));
        _mm512_store_ps(row + d, x);
        total = _mm512_add_ps(total, x);
    }
    const float mean = _mm512_reduce_add_ps(total) / (float)hidden;
    const __m512 centre = _mm512_set1_ps(mean);
    __m512 squares = _mm512_setzero_ps();
    for (int64_t d = 0; d < hidden; d += 16) {
        const __m512 c = _mm512_sub_ps(_mm512_load_ps(row + d), centre);
        squares = _mm512_fmadd_ps(c, c, squares);
    }
    const float variance = _mm512_reduce_add_ps(squares) / (float)hidden;
    const __m512 scale = _mm512_set1_ps(1.0f / sqrtf(variance + eps));
    for (int64_t d = 0; d < hidden; d += 16) {
        const __m512 normed = _mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(row + d), centre), scale);
        const __m512 out = _mm512_fmadd_ps(normed, _mm512_loadu_ps(weight + d), _mm512_loadu_ps(bias + d));
        _mm256_storeu_si256((__m256i *)(y + d), (__m256i)_mm512_cvtneps_pbh(out));
    }
}

static PyObject *add_layer_norm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long y, residual, weight, bias;
    Py_ssize_t rows, hidden, y_stride, residual_stride, threads;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKKnnnnfn", &y, &residual, &weight, &bias, &rows, &hidden, &y_stride,
                          &residual_stride, &eps, &threads))
        return NULL;
    if (hidden <= 0 || hidden % 16 != 0 || hidden > MAX_HIDDEN) {
        PyErr_Format(PyExc_ValueError, "hidden must be a positive multiple of 16 up to %d, got %zd",
                     MAX_HIDDEN, hidden);
        return NULL;
    }
    uint16_t *y_rows = (uint16_t *)(uintptr_t)y;
    const uint16_t *residual_rows = (const uint16_t *)(uintptr_t)residual;
    const float *w = (const float *)(uintptr_t)weight, *b = (const float *)(uintptr_t)bias;
    if (threads < 1 || rows * hidden < SERIAL_ELEMENTS) threads = 1;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads)
    {
        float row[MAX_HIDDEN] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (Py_ssize_t r = 0; r < rows; ++r)
            norm_row(y_rows + r * y_stride, residual_rows + r * residual_stride, w, b, hidden, eps, row);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"add_layer_norm", add_layer_norm, METH_VARARGS,
     "add_layer_norm(y, residual, weight, bias, rows, hidden, y_stride, residual_stride, eps, threads): "
     "y = LayerNorm(y + residual) in place; arguments are data pointers and sizes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_add_layer_norm", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__add_layer_norm(void) { return PyModule_Create(&module); }
