/*
 * Activations to uint8 for the int8 linears (engine/int8_quantize.py), with AVX-512.
 *
 * Why native: oneDNN's quantized matmul takes a uint8 source, and torch turns a bf16
 * [T, n] tensor into one in four or more element-wise passes (to float32, scale, round,
 * clamp, narrow); at 32 x 512 tokens those passes cost as much as the matmuls they feed.
 * Here each row is read once and written once: q = clamp(round(x * multiplier[c]) +
 * zero_point, 0, qmax) (qmax 255, or 127 where the CPU's int8 dot products saturate), rounding to nearest even as oneDNN does; ``multiplier`` is
 * float32 [cols], 1 / scale, divided per column by the smoothing factor where the
 * caller smooths (int8_layers.py). ``value_range`` is the dynamic mode's min and max
 * in one read.
 *
 * Layout: x is [rows, cols] bf16 or float32 rows ``stride`` elements apart; out is
 * [rows, cols] uint8, contiguous. Any cols (the tail is masked). Rows are split
 * between torch's OpenMP team (see bf16_attention.c for why it is torch's); a small
 * call runs on one thread.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "uint8_rows.h"

/* Below this many elements a call runs on one thread: waking the team costs more. */
#define SERIAL_ELEMENTS 65536

static PyObject *quantize(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, out, multiplier;
    Py_ssize_t rows, cols, stride, threads;
    int bf16, zero_point, qmax;
    if (!PyArg_ParseTuple(args, "KKnnnpKiin", &x, &out, &rows, &cols, &stride, &bf16, &multiplier, &zero_point,
                          &qmax, &threads))
        return NULL;
    const float *multipliers = (const float *)(uintptr_t)multiplier;
    const char *src = (const char *)(uintptr_t)x;
    uint8_t *dst = (uint8_t *)(uintptr_t)out;
    const int64_t element = bf16 ? 2 : 4;
    const __m512i zp = _mm512_set1_epi32(zero_point), high = _mm512_set1_epi32(qmax);
    if (threads < 1 || rows * cols < SERIAL_ELEMENTS) threads = 1;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads) schedule(static)
    for (Py_ssize_t r = 0; r < rows; ++r)
        quantize_row(src + r * stride * element, bf16, dst + r * cols, cols, multipliers, 0.0f, zp, high);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *value_range(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x;
    Py_ssize_t rows, cols, stride, threads;
    int bf16;
    if (!PyArg_ParseTuple(args, "Knnnpn", &x, &rows, &cols, &stride, &bf16, &threads))
        return NULL;
    const char *src = (const char *)(uintptr_t)x;
    const int64_t element = bf16 ? 2 : 4;
    float lowest = FLT_MAX, highest = -FLT_MAX;
    if (threads < 1 || rows * cols < SERIAL_ELEMENTS) threads = 1;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads) reduction(min : lowest) reduction(max : highest)
    {
        __m512 low = _mm512_set1_ps(FLT_MAX), high = _mm512_set1_ps(-FLT_MAX);
#pragma omp for schedule(static)
        for (Py_ssize_t r = 0; r < rows; ++r) row_range(src + r * stride * element, bf16, cols, &low, &high);
        const float l = _mm512_reduce_min_ps(low), h = _mm512_reduce_max_ps(high);
        lowest = l < lowest ? l : lowest;
        highest = h > highest ? h : highest;
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ff)", lowest, highest);
}

static PyMethodDef methods[] = {
    {"quantize", quantize, METH_VARARGS,
     "quantize(x, out, rows, cols, stride, bf16, multiplier, zero_point, qmax, threads): out = uint8 of x; "
     "arguments are data pointers and sizes."},
    {"value_range", value_range, METH_VARARGS,
     "value_range(x, rows, cols, stride, bf16, threads) -> (min, max) of x."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int8_quantize", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__int8_quantize(void) { return PyModule_Create(&module); }
