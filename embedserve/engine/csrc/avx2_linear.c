/*
 * y = x @ W.T + b in float32 with AVX2 and FMA, for CPUs without AVX-512.
 *
 * Why native: on such a CPU oneDNN's float32 matmul runs a short query's few dozen
 * rows at about half of the FMA units' rate (~55-70 GFLOP/s at 20 rows on the
 * project's 2-core AMD host; this kernel ~100), and a step of any size builds and
 * caches a oneDNN primitive per row count (the reason for cpu_shapes.py's buckets).
 * From ~128 rows up the two run level (bench native_linears). Each panel of 16 output
 * columns is computed for a chunk of rows while its weights sit in L1, a block of
 * up to 6 rows at a time in 12 accumulators (the register blocking of BLIS's
 * Haswell kernel); a chunk's rows stay in L2 while every panel passes over them
 * (linear_blocks.h, shared with bf16_linear.c, splits a call between threads). In a call
 * of few rows a chunk's second block also pulls the next panel toward L2 (``warming_block``).
 *
 * Layout: x is [rows, K] with rows ``x_stride`` floats apart; ``panels`` is the
 * weight [N, K] repacked as [N / 16][K][16] (avx2_linear.py: pack_panels); bias
 * float32 [N]; y is [rows, N] contiguous.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <stdint.h>

#include "linear_blocks.h"

#define PANEL 16
#define MAX_BLOCK_ROWS 6
/* Steps of k a panel's weights are prefetched ahead (2 KB): at a short query's few rows
 * each panel is read from memory once and its use is short, so the hardware prefetcher
 * alone leaves the FMA units waiting (8-64 rows: +5-15 %, bench native_linears; 8 ahead
 * measured slower, 64 the same). A prefetch past the last panel never faults. */
#define PREFETCH_AHEAD 32

/* One block of R rows by one panel: the accumulators start at the bias. The WARM
 * variant also pulls the next panel toward L2 (linear_blocks.h), one line per k; a
 * variant of its own, as in bf16_linear.c, so that the plain loop stays as it was. */
#define ROW_BLOCK(R, NAME, WARM)                                                              \
    static void NAME##R(const float *x, int64_t x_stride, const float *panel,                \
                        const float *bias, float *y, int64_t n, int64_t k_total) {           \
        const float *warm = panel + k_total * PANEL; /* the next panel */                     \
        (void)warm;                                                                           \
        __m256 lo[R], hi[R];                                                                  \
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                 \
            lo[r] = _mm256_loadu_ps(bias);                                                    \
            hi[r] = _mm256_loadu_ps(bias + 8);                                                \
        }                                                                                     \
        for (int64_t k = 0; k < k_total; k++) {                                               \
            _mm_prefetch((const char *)(panel + (k + PREFETCH_AHEAD) * PANEL), _MM_HINT_T0);   \
            if (WARM)                                                                         \
                _mm_prefetch((const char *)(warm + k * PANEL), _MM_HINT_T1);                  \
            const __m256 w_lo = _mm256_loadu_ps(panel + k * PANEL);                           \
            const __m256 w_hi = _mm256_loadu_ps(panel + k * PANEL + 8);                       \
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                             \
                const __m256 v = _mm256_broadcast_ss(x + r * x_stride + k);                  \
                lo[r] = _mm256_fmadd_ps(v, w_lo, lo[r]);                                      \
                hi[r] = _mm256_fmadd_ps(v, w_hi, hi[r]);                                      \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                 \
            _mm256_storeu_ps(y + r * n, lo[r]);                                               \
            _mm256_storeu_ps(y + r * n + 8, hi[r]);                                           \
        }                                                                                     \
    }

FOR_1_TO_6(BOTH_VARIANTS)

typedef void (*row_block)(const float *, int64_t, const float *, const float *, float *, int64_t, int64_t);
static const row_block BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, FOR_1_TO_6(PLAIN_ENTRY)};
static const row_block WARMING_BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, FOR_1_TO_6(WARMING_ENTRY)};

/* One call's operands, as for_each_block hands them to run_block. */
typedef struct {
    const float *x;
    Py_ssize_t x_stride;
    const float *panels, *bias;
    float *y;
    Py_ssize_t n, k;
} Call;

static void run_block(const void *opaque, Py_ssize_t row, int size, Py_ssize_t panel, int warm_next) {
    const Call *c = opaque;
    const float *weights = c->panels + panel * c->k * PANEL;
    (warm_next ? WARMING_BLOCKS : BLOCKS)[size](c->x + row * c->x_stride, c->x_stride, weights,
                                                c->bias + panel * PANEL, c->y + row * c->n + panel * PANEL,
                                                c->n, c->k);
}

static PyObject *avx2_linear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, panels, bias, y;
    Py_ssize_t rows, n, k, x_stride, threads;
    if (!PyArg_ParseTuple(args, "KKKKnnnnn", &x, &panels, &bias, &y, &rows, &n, &k, &x_stride, &threads))
        return NULL;
    if (rows < 0 || k <= 0 || n <= 0 || n % PANEL != 0 || x_stride < k) {
        PyErr_Format(PyExc_ValueError,
                     "need rows >= 0, k > 0, n a positive multiple of %d and x_stride >= k; got "
                     "rows %zd, n %zd, k %zd, x_stride %zd", PANEL, rows, n, k, x_stride);
        return NULL;
    }
    const Call call = {(const float *)(uintptr_t)x, x_stride, (const float *)(uintptr_t)panels,
                       (const float *)(uintptr_t)bias, (float *)(uintptr_t)y, n, k};
    Py_BEGIN_ALLOW_THREADS
    for_each_block(rows, n / PANEL, PANEL, k, MAX_BLOCK_ROWS, threads, run_block, &call);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", avx2_linear, METH_VARARGS,
     "linear(x, panels, bias, y, rows, n, k, x_stride, threads): y = x @ W.T + bias; "
     "arguments are data pointers and sizes, W packed as [n / 16][k][16]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avx2_linear", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__avx2_linear(void) { return PyModule_Create(&module); }
