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
 * Haswell kernel); a chunk's rows stay in L2 while every panel passes over them.
 *
 * Layout: x is [rows, K] with rows ``x_stride`` floats apart; ``panels`` is the
 * weight [N, K] repacked as [N / 16][K][16] (avx2_linear.py: pack_panels); bias
 * float32 [N]; y is [rows, N] contiguous. (chunk, panel) pairs are split between
 * torch's OpenMP team (see bf16_attention.c for why it is torch's).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define PANEL 16
#define MAX_BLOCK_ROWS 6
/* Blocks per chunk of rows: 48 rows of up to 4,096 floats (786 KB) stay in a 1 MB L2;
 * measured against 4, 16 and 32 blocks at 256 and 512 rows. */
#define CHUNK_BLOCKS 8
/* Below this many multiply-adds a call runs on one thread: waking the team costs more. */
#define SERIAL_MACS 65536
/* Steps of k a panel's weights are prefetched ahead (2 KB): at a short query's few rows
 * each panel is read from memory once and its use is short, so the hardware prefetcher
 * alone leaves the FMA units waiting (8-64 rows: +5-15 %, bench native_linears; 8 ahead
 * measured slower, 64 the same). A prefetch past the last panel never faults. */
#define PREFETCH_AHEAD 32

/* One block of R rows by one panel: the accumulators start at the bias. */
#define ROW_BLOCK(R)                                                                          \
    static void block##R(const float *x, int64_t x_stride, const float *panel,               \
                         const float *bias, float *y, int64_t n, int64_t k_total) {          \
        __m256 lo[R], hi[R];                                                                  \
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                 \
            lo[r] = _mm256_loadu_ps(bias);                                                    \
            hi[r] = _mm256_loadu_ps(bias + 8);                                                \
        }                                                                                     \
        for (int64_t k = 0; k < k_total; k++) {                                               \
            _mm_prefetch((const char *)(panel + (k + PREFETCH_AHEAD) * PANEL), _MM_HINT_T0);   \
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

ROW_BLOCK(1)
ROW_BLOCK(2)
ROW_BLOCK(3)
ROW_BLOCK(4)
ROW_BLOCK(5)
ROW_BLOCK(6)

typedef void (*row_block)(const float *, int64_t, const float *, const float *, float *, int64_t, int64_t);
static const row_block BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, block1, block2, block3, block4, block5, block6};

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
    const float *x_rows = (const float *)(uintptr_t)x, *w = (const float *)(uintptr_t)panels;
    const float *b = (const float *)(uintptr_t)bias;
    float *out = (float *)(uintptr_t)y;
    const Py_ssize_t panel_count = n / PANEL;
    if (threads < 1 || rows * n * k < SERIAL_MACS) threads = 1;
    /* Rows go in chunks that stay in L2 while every panel passes over them, of equal size
     * (64 rows: 32 and 32, not 48 and 16), so that the team's shares of the pairs are too. */
    const Py_ssize_t chunk_rows = CHUNK_BLOCKS * MAX_BLOCK_ROWS;
    const Py_ssize_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(threads) schedule(static) collapse(2)
    for (Py_ssize_t c = 0; c < chunks; ++c)
        for (Py_ssize_t j = 0; j < panel_count; ++j) {
            const float *panel = w + j * k * PANEL;
            const Py_ssize_t first = c * rows / chunks, end = (c + 1) * rows / chunks;
            /* The chunk's rows in equal blocks (20 rows: 5, 5, 5, 5, not 6, 6, 6, 2). */
            const Py_ssize_t blocks = (end - first + MAX_BLOCK_ROWS - 1) / MAX_BLOCK_ROWS;
            Py_ssize_t row = first;
            for (Py_ssize_t block = 0; block < blocks; ++block) {
                const Py_ssize_t left = end - row, blocks_left = blocks - block;
                const int size = (int)((left + blocks_left - 1) / blocks_left);
                BLOCKS[size](x_rows + row * x_stride, x_stride, panel, b + j * PANEL, out + row * n + j * PANEL,
                             n, k);
                row += size;
            }
        }
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
