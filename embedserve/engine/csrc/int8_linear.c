/*
 * y = activation(x @ W.T + b) for the int8 linears (int8_layers.py) in calls of few rows
 * (a short query's step), with AVX512-VNNI (VPDPBUSD: uint8 x int8, int32 sums) and a
 * bf16 output.
 *
 * Why native: oneDNN's quantized matmul costs tens of microseconds a call whatever its
 * size, and the separate quantization pass before it as much again, so a 6-token step
 * with int8 linears took ~2.5x a bf16 one although its weights are half the bytes.
 * Here one call quantizes its bf16 input (uint8_rows.h: the same bytes int8_quantize.c
 * makes for oneDNN) and runs the same integer products as oneDNN, by the plan of
 * bf16_linear.c: each panel of 32 output columns for a block of up to 12 rows while its
 * weights sit in L1; per quad of input columns, two weight vectors (16 columns x 4
 * int8 each) meet a broadcast quad of each row's uint8.
 *
 * Arithmetic (oneDNN's, for a uint8 source with a zero point and int8 weights with one
 * scale per output column): the int32 sum s[n] = sum_k xq[k] w[k, n] is exact; then
 * y[n] = activation(float(s[n] - zero_point * colsum[n]) * (x_scale * w_scale[n]) + bias[n]),
 * rounded once to bf16 (bf16_activations.h). Static mode takes the input's scale, zero
 * point and per-column multiplier (1 / scale over the smoothing factors) from the
 * caller; dynamic mode measures the input's min and max first and derives them as
 * int8_quantize.affine_params does (in double, half to even); per-row mode does so for
 * each row apart (the feed-forward's second linear, int8_layers.py: its input, the GELU
 * output, loses too much at one scale for a whole step), which oneDNN's matmul cannot
 * take, so such a linear runs here at every size.
 *
 * With ``amx`` (the caller's choice: a CPU with AMX-INT8, tile state granted, enough
 * rows) and K a multiple of 64, the products run on AMX tiles instead (TDPBUSD), by the
 * plan of amx_linear.c: blocks of 64 output columns, per 64 input columns one A tile
 * (the rows' uint8) meets four B tiles (the panels' quad rows), four C tiles of int32
 * sums; the same sums, the same epilogue.
 *
 * Layout: x is [rows, K] bf16 rows ``x_stride`` elements apart; ``panels`` the int8
 * weight [N, K] repacked as [N / 32][K / 4][32][4] (int8_linear.py: pack_panels), a quad
 * row 128 bytes (columns 0-15, then 16-31: a B tile's row each); colsum int32 [N];
 * w_scale, bias float32 [N]; y [rows, N] bf16 contiguous. K a multiple of 4, N of 32.
 * linear_blocks.h (or the tile loop) splits a call between torch's OpenMP team.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_activations.h"
#include "linear_blocks.h"
#include "team_call.h"
#include "tile_blocks.h"
#include "uint8_rows.h"
#include "vnni_dot.h"

#define PANEL 32
#define QUAD_BYTES (4 * PANEL)   /* one quad of k for a panel's 32 columns */
#define MAX_BLOCK_ROWS 12
/* Quads of k a panel's weights are prefetched ahead (4 KB), as in bf16_linear.c (2 KB:
 * 48 linears of a 6-row step 1.07x slower back to back, 1.09x after 50 ms idle, on Zen 5). */
#define PREFETCH_AHEAD 32
/* Below this many elements the input is quantized on one thread. */
#define SERIAL_ELEMENTS 65536
#define TILE_K 64               /* input columns per tile product: 16 quads */
/* Calls whose quantized input is at least this many bytes quantize each chunk of rows just
 * before its products (quantize_and_run_chunks); smaller ones keep one pass first, whose
 * copy stays in L3 (and a short query's call is split between threads by (chunk, panel)
 * pairs). Per-row 1,536 -> 384 calls, 2 threads, Zen 5: 16,384 rows (25 MB) 0.75x the
 * pass first, 8,192 0.83x, 4,096 0.89-1.03x, 2,048 1.04x. */
#define FUSED_MIN_BYTES (8 << 20)

/* linear()'s ``threads`` that asks for this thread and bf16_linear.c's helper thread (a
 * replica's short steps, as there), on VPDPBUSD; one thread where that module is absent. */
#define HELPER_TEAM 0

/* bf16_linear.c's ``team_run`` (helper_team.h), from its capsule at import; NULL without it. */
static team_runner shared_team_run;

/* How a call's input becomes uint8 (linear()'s ``quantization``). */
enum { QUANTIZE_STATIC, QUANTIZE_DYNAMIC, QUANTIZE_PER_ROW, QUANTIZATIONS };

/* One call's operands, as for_each_block hands them to run_block. */
typedef struct {
    const uint8_t *x;           /* the quantized input, [rows, k] contiguous */
    const int8_t *panels;
    const int32_t *compensation; /* zero_point * colsum, [n] (one scale for the input) */
    const float *scale;          /* x_scale * w_scale, [n] (likewise) */
    const int32_t *row_zero_point; /* per row ([rows]), or NULL: one for the input */
    const float *row_scale;
    const int32_t *colsum;
    const float *w_scale;
    const float *bias;
    uint16_t *y;
    Py_ssize_t n, k;
    int activation;
} Call;

static inline __m512 output16(__m512i sum, const Call *c, Py_ssize_t row, Py_ssize_t column) {
    __m512i compensation;
    __m512 scale;
    if (c->row_scale != NULL) {   /* the row's own scale and zero point, as the call's are below */
        compensation = _mm512_mullo_epi32(_mm512_set1_epi32(c->row_zero_point[row]),
                                          _mm512_loadu_si512(c->colsum + column));
        scale = _mm512_mul_ps(_mm512_set1_ps(c->row_scale[row]), _mm512_loadu_ps(c->w_scale + column));
    } else {
        compensation = _mm512_loadu_si512(c->compensation + column);
        scale = _mm512_loadu_ps(c->scale + column);
    }
    const __m512 value = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, compensation));
    return activate(_mm512_fmadd_ps(value, scale, _mm512_loadu_ps(c->bias + column)), c->activation);
}

/* One block of R rows by one panel. The WARM variant also pulls the next panel toward L2
 * (linear_blocks.h). */
#define ROW_BLOCK(R, NAME, WARM)                                                                   \
    static void NAME##R(const Call *c, Py_ssize_t row, Py_ssize_t panel_index) {                    \
        const int8_t *panel = c->panels + panel_index * c->k * PANEL;                               \
        const int8_t *warm = panel + c->k * PANEL; /* the next panel */                             \
        (void)warm;                                                                                 \
        const uint8_t *x = c->x + row * c->k;                                                       \
        __m512i lo[R], hi[R];                                                                       \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                      \
            lo[r] = _mm512_setzero_si512();                                                         \
            hi[r] = _mm512_setzero_si512();                                                         \
        }                                                                                           \
        for (Py_ssize_t kq = 0; kq < c->k / 4; kq++) {                                              \
            _mm_prefetch((const char *)(panel + (kq + PREFETCH_AHEAD) * QUAD_BYTES), _MM_HINT_T0);  \
            _mm_prefetch((const char *)(panel + (kq + PREFETCH_AHEAD) * QUAD_BYTES + 64), _MM_HINT_T0); \
            if (WARM) {                                                                             \
                _mm_prefetch((const char *)(warm + kq * QUAD_BYTES), _MM_HINT_T1);                  \
                _mm_prefetch((const char *)(warm + kq * QUAD_BYTES + 64), _MM_HINT_T1);             \
            }                                                                                       \
            const __m512i w_lo = _mm512_load_si512(panel + kq * QUAD_BYTES);                        \
            const __m512i w_hi = _mm512_load_si512(panel + kq * QUAD_BYTES + 64);                   \
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                  \
                int32_t quad;                                                                       \
                memcpy(&quad, x + r * c->k + 4 * kq, 4);                                            \
                const __m512i a = _mm512_set1_epi32(quad);                                          \
                lo[r] = dpbusd(lo[r], a, w_lo);                                                  \
                hi[r] = dpbusd(hi[r], a, w_hi);                                                  \
            }                                                                                       \
        }                                                                                           \
        const Py_ssize_t column = panel_index * PANEL;                                              \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                      \
            uint16_t *out = c->y + (row + r) * c->n + column;                                       \
            _mm256_storeu_si256((__m256i *)out,                                                     \
                                (__m256i)_mm512_cvtneps_pbh(output16(lo[r], c, row + r, column)));  \
            _mm256_storeu_si256((__m256i *)(out + 16),                                              \
                                (__m256i)_mm512_cvtneps_pbh(output16(hi[r], c, row + r, column + 16))); \
        }                                                                                           \
    }

FOR_1_TO_12(BOTH_VARIANTS)

typedef void (*row_block)(const Call *, Py_ssize_t, Py_ssize_t);
static const row_block BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, FOR_1_TO_12(PLAIN_ENTRY)};
static const row_block WARMING_BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, FOR_1_TO_12(WARMING_ENTRY)};

static void run_block(const void *opaque, Py_ssize_t row, int size, Py_ssize_t panel, int warm_next) {
    (warm_next ? WARMING_BLOCKS : BLOCKS)[size]((const Call *)opaque, row, panel);
}

/* Rows [row, row + height) by the columns [column, column + 64) (+ 32 at the end of an N
 * that is an odd number of panels), on tiles. */
static void run_tile_block(const void *opaque, int64_t row, int height, int64_t column) {
    const Call *c = opaque;
    const int two = column + TILE_BLOCK_COLUMNS <= c->n;
    const int8_t *first = c->panels + (column / PANEL) * c->k * PANEL;
    const int8_t *second = first + c->k * PANEL;
    const uint8_t *x = c->x + row * c->k;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(2);
        _tile_zero(3);
        for (Py_ssize_t k0 = 0; k0 < c->k; k0 += TILE_K) {
            const Py_ssize_t quad_row = (k0 / 4) * QUAD_BYTES;
            _tile_loadd(4, x + k0, c->k);
            _tile_loadd(5, first + quad_row, QUAD_BYTES);
            _tile_loadd(6, first + quad_row + 64, QUAD_BYTES);
            _tile_loadd(7, second + quad_row, QUAD_BYTES);
            _tile_dpbusd(0, 4, 5);
            _tile_dpbusd(1, 4, 6);
            _tile_loadd(5, second + quad_row + 64, QUAD_BYTES);
            _tile_dpbusd(2, 4, 7);
            _tile_dpbusd(3, 4, 5);
        }
    } else {
        for (Py_ssize_t k0 = 0; k0 < c->k; k0 += TILE_K) {
            const Py_ssize_t quad_row = (k0 / 4) * QUAD_BYTES;
            _tile_loadd(4, x + k0, c->k);
            _tile_loadd(5, first + quad_row, QUAD_BYTES);
            _tile_loadd(6, first + quad_row + 64, QUAD_BYTES);
            _tile_dpbusd(0, 4, 5);
            _tile_dpbusd(1, 4, 6);
        }
    }
    int32_t sums[TILE_ROWS * TILE_BLOCK_COLUMNS] __attribute__((aligned(64)));
    const int vectors = two ? 4 : 2;
    store_sums(sums, two);
    for (int r = 0; r < height; ++r) {
        uint16_t *out = c->y + (row + r) * c->n + column;
        for (int v = 0; v < vectors; ++v) {
            const __m512i sum = _mm512_load_si512(sums + r * TILE_BLOCK_COLUMNS + 16 * v);
            _mm256_storeu_si256((__m256i *)(out + 16 * v),
                                (__m256i)_mm512_cvtneps_pbh(output16(sum, c, row + r, column + 16 * v)));
        }
    }
}

/* The input's scale and zero point from its range, as int8_quantize.affine_params. */
static void affine_params(float lowest, float highest, int qmax, double *scale, int *zero_point) {
    const double low = lowest < 0.0f ? (double)lowest : 0.0, high = highest > 0.0f ? (double)highest : 0.0;
    *scale = high > low ? (high - low) / qmax : 1.0;
    double zp = nearbyint(-low / *scale);       /* the default rounding mode: half to even */
    zp = zp < 0.0 ? 0.0 : (zp > qmax ? (double)qmax : zp);
    *zero_point = (int)zp;
}

static void input_range(const uint16_t *x, Py_ssize_t rows, Py_ssize_t k, Py_ssize_t x_stride, float *lowest,
                        float *highest) {
    __m512 low = _mm512_set1_ps(FLT_MAX), high = _mm512_set1_ps(-FLT_MAX);
    for (Py_ssize_t r = 0; r < rows; ++r) row_range(x + r * x_stride, 1, k, &low, &high);
    *lowest = _mm512_reduce_min_ps(low);
    *highest = _mm512_reduce_max_ps(high);
}

/* How a call's rows become uint8: the input, where they go, and the mode's parameters. */
typedef struct {
    const uint16_t *x;
    Py_ssize_t x_stride, k;
    uint8_t *xq;
    const float *multiplier;     /* static and dynamic: per column */
    __m512i zero_point, high;
    int qmax, per_row;
    int32_t *row_zero_point;     /* per row: written here */
    float *row_scale;
} Quantize;

/* Rows [first, end) of the input into ``xq``. */
static void quantize_rows(const Quantize *q, Py_ssize_t first, Py_ssize_t end) {
    for (Py_ssize_t r = first; r < end; ++r) {
        const uint16_t *row = q->x + r * q->x_stride;
        if (q->per_row) {   /* the row's own range, as the dynamic mode takes the call's */
            float lowest, highest;
            double own_scale;
            int own_zero_point;
            input_range(row, 1, q->k, q->x_stride, &lowest, &highest);
            affine_params(lowest, highest, q->qmax, &own_scale, &own_zero_point);
            q->row_scale[r] = (float)own_scale;
            q->row_zero_point[r] = own_zero_point;
            quantize_row(row, 1, q->xq + r * q->k, q->k, NULL, (float)(1.0 / own_scale),
                         _mm512_set1_epi32(own_zero_point), q->high);
        } else {
            quantize_row(row, 1, q->xq + r * q->k, q->k, q->multiplier, 0.0f, q->zero_point, q->high);
        }
    }
}

/* A large call on torch's team: each thread quantizes a chunk of rows (linear_blocks.h)
 * and at once runs every panel over it, while those rows sit in its L2, rather than one
 * pass over the whole input first (a 16,384 x 1,536 input: 50 MB read, 25 MB written and
 * read again from memory). */
static void quantize_and_run_chunks(const Quantize *q, const BlockWalk *walk, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (Py_ssize_t c = 0; c < walk->chunks; ++c) {
        quantize_rows(q, c * walk->rows / walk->chunks, (c + 1) * walk->rows / walk->chunks);
        for (Py_ssize_t j = 0; j < walk->panels; ++j)
            walk_chunk_panel(walk, c, j);
    }
}

typedef struct {
    unsigned long long x, multiplier, panels, colsum, w_scale, bias, y;
    Py_ssize_t rows, n, k, x_stride, threads;
    double x_scale;
    int zero_point, qmax, quantization, activation, amx;
} Int8LinearArgs;

static int parse(PyObject *args, Int8LinearArgs *a) {
    if (!PyArg_ParseTuple(args, "KKdiiiKKKKKnnnnnip", &a->x, &a->multiplier, &a->x_scale, &a->zero_point,
                          &a->qmax, &a->quantization, &a->panels, &a->colsum, &a->w_scale, &a->bias, &a->y, &a->rows,
                          &a->n, &a->k, &a->x_stride, &a->threads, &a->activation, &a->amx))
        return 0;
    if (a->rows < 0 || a->k <= 0 || a->k % 4 != 0 || a->n <= 0 || a->n % PANEL != 0 || a->x_stride < a->k
        || a->qmax < 1 || a->qmax > 255 || a->zero_point < 0 || a->zero_point > a->qmax) {
        PyErr_Format(PyExc_ValueError,
                     "need rows >= 0, k a positive multiple of 4, n a positive multiple of %d, x_stride >= k and "
                     "0 <= zero_point <= qmax <= 255; got rows %zd, n %zd, k %zd, x_stride %zd, zero point %d, "
                     "qmax %d", PANEL, a->rows, a->n, a->k, a->x_stride, a->zero_point, a->qmax);
        return 0;
    }
    if (a->quantization < 0 || a->quantization >= QUANTIZATIONS) {
        PyErr_Format(PyExc_ValueError, "quantization must be 0 to %d, got %d", QUANTIZATIONS - 1, a->quantization);
        return 0;
    }
    if (a->activation < 0 || a->activation >= ACTIVATIONS) {
        PyErr_Format(PyExc_ValueError, "activation must be 0 to %d, got %d", ACTIVATIONS - 1, a->activation);
        return 0;
    }
    return 1;
}

static PyObject *int8_linear(PyObject *self, PyObject *args) {
    (void)self;
    Int8LinearArgs a;
    if (!parse(args, &a)) return NULL;
    if (a.rows == 0) Py_RETURN_NONE;
    const uint16_t *x = (const uint16_t *)(uintptr_t)a.x;
    const int32_t *colsum = (const int32_t *)(uintptr_t)a.colsum;
    const float *w_scale = (const float *)(uintptr_t)a.w_scale;
    /* the quantized rows, then (dynamic) the multiplier, then per column the
     * compensation and combined scale, then (per row) each row's scale and zero point */
    const size_t x_bytes = ((size_t)(a.rows * a.k) + 63) & ~(size_t)63;
    const size_t bytes = x_bytes + sizeof(float) * (size_t)a.k + (sizeof(int32_t) + sizeof(float)) * (size_t)a.n
                         + (sizeof(int32_t) + sizeof(float)) * (size_t)a.rows;
    char *buffer = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (buffer == NULL) return PyErr_NoMemory();
    uint8_t *xq = (uint8_t *)buffer;
    float *multiplier = (float *)(buffer + x_bytes);
    int32_t *compensation = (int32_t *)(multiplier + a.k);
    float *scale = (float *)(compensation + a.n);
    int32_t *row_zero_point = (int32_t *)(scale + a.n);
    float *row_scale = (float *)(row_zero_point + a.rows);
    const int per_row = a.quantization == QUANTIZE_PER_ROW;
    Py_BEGIN_ALLOW_THREADS
    double x_scale = a.x_scale;
    int zero_point = a.zero_point;
    const float *row_multiplier = (const float *)(uintptr_t)a.multiplier;
    if (a.quantization == QUANTIZE_DYNAMIC) {
        float lowest, highest;
        input_range(x, a.rows, a.k, a.x_stride, &lowest, &highest);
        affine_params(lowest, highest, a.qmax, &x_scale, &zero_point);
        const float inverse = (float)(1.0 / x_scale);
        for (Py_ssize_t c = 0; c < a.k; ++c) multiplier[c] = inverse;
        row_multiplier = multiplier;
    }
    const Quantize quantize = {x, a.x_stride, a.k, xq, row_multiplier, _mm512_set1_epi32(zero_point),
                               _mm512_set1_epi32(a.qmax), a.qmax, per_row, row_zero_point, row_scale};
    const float x_scale32 = (float)x_scale;
    for (Py_ssize_t c = 0; c < a.n; ++c) {
        compensation[c] = zero_point * colsum[c];
        scale[c] = x_scale32 * w_scale[c];
    }
    const Call call = {xq, (const int8_t *)(uintptr_t)a.panels, compensation, scale,
                       per_row ? row_zero_point : NULL, per_row ? row_scale : NULL, colsum, w_scale,
                       (const float *)(uintptr_t)a.bias, (uint16_t *)(uintptr_t)a.y, a.n, a.k, a.activation};
    const BlockWalk walk = block_walk(a.rows, a.n / PANEL, MAX_BLOCK_ROWS, run_block, &call);
    const int tiles = a.amx && a.k % TILE_K == 0, helped = a.threads == HELPER_TEAM && shared_team_run != NULL;
    if (!tiles && !helped && a.threads >= 1 && a.rows * a.k >= FUSED_MIN_BYTES) {
        quantize_and_run_chunks(&quantize, &walk, (int)a.threads);
    } else {
        const int quantize_threads = (a.threads < 1 || a.rows * a.k < SERIAL_ELEMENTS) ? 1 : (int)a.threads;
#pragma omp parallel for num_threads(quantize_threads) schedule(static)
        for (Py_ssize_t r = 0; r < a.rows; ++r)
            quantize_rows(&quantize, r, r + 1);
        if (tiles) {
            const int threads = (a.threads < 1 || a.rows * a.n * a.k < SERIAL_MACS) ? 1 : (int)a.threads;
            for_each_tile_block(&call, a.rows, a.n, threads, run_tile_block);
        } else if (helped) {
            shared_team_run(walk_item, &walk, walk.chunks * walk.panels);
        } else {
            for_each_block(a.rows, a.n / PANEL, PANEL, a.k, MAX_BLOCK_ROWS, a.threads, run_block, &call);
        }
    }
    Py_END_ALLOW_THREADS
    free(buffer);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", int8_linear, METH_VARARGS,
     "linear(x, multiplier, x_scale, zero_point, qmax, quantization, panels, colsum, w_scale, bias, y, rows, n, k, "
     "x_stride, threads, activation, amx): y = activation(dequantized(uint8(x) @ W.T) + bias) in bf16; arguments "
     "are data pointers and sizes, x bf16, W int8 packed as [n / 32][k / 4][32][4]; quantization 0 static "
     "(multiplier, x_scale, zero_point), 1 dynamic (the input's range), 2 per row (each row's range; y's rows the "
     "same as each row's call in mode 1); threads 0: this thread and "
     "bf16_linear's helper thread (where shares_helper; not on tiles), else up to that many of torch's OpenMP "
     "team; activation 0 none, 1 GELU "
     "(erf), 2 GELU (tanh), 3 ReLU; amx: on AMX tiles where k is a multiple of 64 (the caller has been granted "
     "the tile state)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int8_linear", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

/* bf16_linear.c's team_run, or NULL where that module is not built (HELPER_TEAM calls then
 * run on one thread). PyCapsule_Import would not import a submodule, so this does. */
static team_runner borrowed_team(void) {
    PyObject *module = PyImport_ImportModule(TEAM_MODULE);
    PyObject *capsule = module == NULL ? NULL : PyObject_GetAttrString(module, "team_run");
    team_runner run = capsule == NULL ? NULL : (team_runner)PyCapsule_GetPointer(capsule, TEAM_CAPSULE);
    Py_XDECREF(capsule);
    Py_XDECREF(module);
    if (run == NULL)
        PyErr_Clear();
    return run;
}

PyMODINIT_FUNC PyInit__int8_linear(void) {
    shared_team_run = borrowed_team();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "shares_helper", shared_team_run != NULL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
