/*
 * y = activation(x @ W.T + b) in bf16 on AMX tiles, for calls of few rows (a short
 * query's step), f32 accumulation.
 *
 * Why native: oneDNN's AMX matmul costs ~40 us a call at 1-16 rows whatever the weight
 * (48 calls of one layer's weights, hot in L2, take as long as 48 distinct ones: the
 * time is the call, not the arithmetic or the memory), so the linears of a 6-token
 * step of multilingual-e5-small take ~1.7-2.7 ms; here ~0.85-1.6, about the time their
 * 42 MB of weights take to stream (bench native_linears). A call is one OpenMP region
 * over blocks of 64 output columns: per 32 input columns, one A tile (the rows) meets
 * four B tiles (the weights' bf16 pairs), four C tiles of float32 sums; the epilogue
 * adds the bias, applies the activation and rounds each output once to bf16, as
 * oneDNN's fused epilogues do (bf16_activations.h).
 *
 * Layout: x is [rows, K] bf16 with rows ``x_stride`` elements apart; ``panels`` is the
 * weight [N, K] repacked as bf16_linear.c reads it, [N / 32][K / 2][32][2]
 * (bf16_linear.py: pack_panels): a panel's pair row is 128 bytes, its first 64 the B
 * tile row of columns 0-15, its last 64 that of columns 16-31. K a multiple of 32, N a
 * multiple of 32; bias float32 [N]; y [rows, N] bf16 contiguous. Rows go in blocks of
 * 16 (a tile's height), the last one shorter; each thread configures its tiles once per
 * row-block height. The caller has had Linux grant the process the AMX tile state
 * (bf16_attention.py does, at import).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16_activations.h"
#include "panel_linear_args.h"
#include "tile_blocks.h"

#define PANEL 32          /* output columns per panel (pack_panels) */
#define K_STEP 32         /* input columns per tile product: 16 bf16 pairs */
/* Below this many multiply-adds a call runs on one thread: waking the team costs more. */
#define SERIAL_MACS 65536

typedef struct {
    const uint16_t *x;
    Py_ssize_t x_stride;
    const uint16_t *panels;
    const float *bias;
    uint16_t *y;
    Py_ssize_t rows, n, k;
    int activation;
} Call;

/* Rows [row, row + height) by the block of columns [column, column + 64) (or + 32 at
 * the end of an N that is an odd number of panels). */
static void run_block(const void *opaque, int64_t row, int height, int64_t column) {
    const Call *c = opaque;
    const int two = column + TILE_BLOCK_COLUMNS <= c->n;
    const uint16_t *first = c->panels + (column / PANEL) * c->k * PANEL;
    const uint16_t *second = first + c->k * PANEL;
    const uint16_t *x = c->x + row * c->x_stride;
    const Py_ssize_t x_bytes = c->x_stride * 2;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(2);
        _tile_zero(3);
        for (Py_ssize_t k0 = 0; k0 < c->k; k0 += K_STEP) {
            const Py_ssize_t pair_row = (k0 / 2) * 2 * PANEL;   /* elements */
            _tile_loadd(4, x + k0, x_bytes);
            _tile_loadd(5, first + pair_row, 2 * PANEL * 2);
            _tile_loadd(6, first + pair_row + PANEL, 2 * PANEL * 2);
            _tile_loadd(7, second + pair_row, 2 * PANEL * 2);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, second + pair_row + PANEL, 2 * PANEL * 2);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 4, 5);
        }
    } else {
        for (Py_ssize_t k0 = 0; k0 < c->k; k0 += K_STEP) {
            const Py_ssize_t pair_row = (k0 / 2) * 2 * PANEL;
            _tile_loadd(4, x + k0, x_bytes);
            _tile_loadd(5, first + pair_row, 2 * PANEL * 2);
            _tile_loadd(6, first + pair_row + PANEL, 2 * PANEL * 2);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
        }
    }
    float sums[TILE_ROWS * TILE_BLOCK_COLUMNS] __attribute__((aligned(64)));
    const int vectors = two ? 4 : 2;
    store_sums(sums, two);
    for (int r = 0; r < height; ++r) {
        uint16_t *out = c->y + (row + r) * c->n + column;
        for (int v = 0; v < vectors; ++v) {
            const __m512 sum = _mm512_add_ps(_mm512_load_ps(sums + r * TILE_BLOCK_COLUMNS + 16 * v),
                                             _mm512_loadu_ps(c->bias + column + 16 * v));
            _mm256_storeu_si256((__m256i *)(out + 16 * v),
                                (__m256i)_mm512_cvtneps_pbh(activate(sum, c->activation)));
        }
    }
}

static PyObject *amx_linear(PyObject *self, PyObject *args) {
    (void)self;
    LinearArgs a;
    if (!parse_linear_args(args, &a)) return NULL;
    if (a.rows < 0 || a.k <= 0 || a.k % K_STEP != 0 || a.n <= 0 || a.n % PANEL != 0 || a.x_stride < a.k) {
        PyErr_Format(PyExc_ValueError,
                     "need rows >= 0, k a positive multiple of %d, n a positive multiple of %d and "
                     "x_stride >= k; got rows %zd, n %zd, k %zd, x_stride %zd", K_STEP, PANEL, a.rows, a.n, a.k,
                     a.x_stride);
        return NULL;
    }
    if (a.rows == 0) Py_RETURN_NONE;
    const int threads = (a.threads < 1 || a.rows * a.n * a.k < SERIAL_MACS) ? 1 : (int)a.threads;
    const Call call = {(const uint16_t *)(uintptr_t)a.x, a.x_stride, (const uint16_t *)(uintptr_t)a.panels,
                       (const float *)(uintptr_t)a.bias, (uint16_t *)(uintptr_t)a.y, a.rows, a.n, a.k,
                       a.activation};
    Py_BEGIN_ALLOW_THREADS
    for_each_tile_block(&call, a.rows, a.n, threads, run_block);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", amx_linear, METH_VARARGS,
     "linear(x, panels, bias, y, rows, n, k, x_stride, threads, activation): y = activation(x @ W.T + bias) "
     "in bf16 on AMX tiles; arguments are data pointers and sizes, W packed as [n / 32][k / 2][32][2], "
     "k a multiple of 32; activation 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_amx_linear", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__amx_linear(void) { return PyModule_Create(&module); }
