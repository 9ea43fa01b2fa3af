/*
 * y = x @ W.T + b in bf16 with AVX512-BF16 (VDPBF16PS), f32 accumulation, for CPUs
 * with AVX512-BF16 but no AMX.
 *
 * Why native: there oneDNN's bf16 matmul runs a short query's few dozen rows at
 * 45-65 % of the VDPBF16PS rate and splits them between threads poorly (~220 GFLOP/s
 * on two Zen 4 cores at 32 rows against a 456 peak); this kernel, by the same plan as
 * avx2_linear.c, runs 1.4-2x faster there and level or ahead at 512 rows
 * (bench native_linears). It also keeps no state per row count. Each panel of 32 output
 * columns is computed for a chunk of rows while its weights sit in L1, a block of up
 * to 12 rows at a time in 24 accumulators: per pair of input columns, two weight
 * vectors (16 columns x one bf16 pair each) meet a broadcast pair of each row.
 *
 * Layout: x is [rows, K] bf16 with rows ``x_stride`` elements apart (even, 4-byte
 * aligned rows); ``panels`` is the weight [N, K] repacked as [N / 32][K / 2][32][2]
 * (bf16_linear.py: pack_panels); bias float32 [N]; y is [rows, N] bf16 contiguous.
 * The activation (none, GELU with erf or tanh, ReLU) is applied to the f32 sum, and
 * each output rounded to nearest even once, as oneDNN's fused epilogues do (applying it
 * after the rounding measurably doubled the error of a GELU's output). linear_blocks.h,
 * shared with avx2_linear.c, splits a call between threads. In a call of few rows a
 * chunk's second block also pulls the next panel toward L2 (``warming_block``), so that
 * the next first block does not wait on memory: a one-sentence query's step 14-18 %
 * faster on Zen 4.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <stdint.h>

#include "bf16_activations.h"
#include "helper_team.h"
#include "linear_blocks.h"
#include "panel_linear_args.h"

#define PANEL 32
#define MAX_BLOCK_ROWS 12
/* linear()'s ``threads`` that asks for this thread and the module's helper (helper_team.h)
 * instead of torch's OpenMP team: a replica's short steps (small_steps.py). */
#define HELPER_TEAM 0
/* Pairs of k a panel's weights are prefetched ahead (4 KB), both cache lines of each pair.
 * A short query's step streams the model's weights from memory one block per panel, and
 * the lines in flight set its pace: with one line of each pair 2 KB ahead (the other left
 * to the hardware prefetcher), the 48 linears of a 1 x 6 step on e5-small's shapes took
 * 1.21-1.60 ms back to back and 1.84-2.13 ms after 50 ms idle on Zen 5; with both lines
 * 4 KB ahead 0.99-1.15 and 1.60-1.69 ms; 512- and 4,096-row calls level. */
#define PREFETCH_AHEAD 32

static inline __m512bh broadcast_pair(const uint16_t *at) { return (__m512bh)_mm512_set1_epi32(*(const int32_t *)at); }

/* One block of R rows by one panel: the accumulators start at the bias. The WARM
 * variant also pulls the next panel toward L2 (linear_blocks.h); a variant of its own,
 * so that the plain loop stays as it was (a run-time test in it cost 32 x 512 steps ~8 %). */
#define ROW_BLOCK(R, NAME, WARM)                                                                  \
    static void NAME##R(const uint16_t *x, int64_t x_stride, const uint16_t *panel, const float *bias, \
                        uint16_t *y, int64_t n, int64_t k_total, int activation) {                 \
        const uint16_t *warm = panel + k_total * PANEL; /* the next panel */                       \
        (void)warm;                                                                                \
        __m512 lo[R], hi[R];                                                                       \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                     \
            lo[r] = _mm512_loadu_ps(bias);                                                         \
            hi[r] = _mm512_loadu_ps(bias + 16);                                                    \
        }                                                                                          \
        for (int64_t kp = 0; kp < k_total / 2; kp++) {                                             \
            _mm_prefetch((const char *)(panel + (kp + PREFETCH_AHEAD) * 2 * PANEL), _MM_HINT_T0);  \
            _mm_prefetch((const char *)(panel + (kp + PREFETCH_AHEAD) * 2 * PANEL + PANEL), _MM_HINT_T0); \
            if (WARM) {                                                                            \
                _mm_prefetch((const char *)(warm + kp * 2 * PANEL), _MM_HINT_T1);                  \
                _mm_prefetch((const char *)(warm + kp * 2 * PANEL + PANEL), _MM_HINT_T1);          \
            }                                                                                      \
            const __m512bh w_lo = (__m512bh)_mm512_load_si512(panel + kp * 2 * PANEL);            \
            const __m512bh w_hi = (__m512bh)_mm512_load_si512(panel + kp * 2 * PANEL + PANEL);    \
            _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                 \
                const __m512bh a = broadcast_pair(x + r * x_stride + 2 * kp);                      \
                lo[r] = _mm512_dpbf16_ps(lo[r], a, w_lo);                                          \
                hi[r] = _mm512_dpbf16_ps(hi[r], a, w_hi);                                          \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 12") for (int r = 0; r < R; r++) {                                     \
            _mm256_storeu_si256((__m256i *)(y + r * n),                                            \
                                (__m256i)_mm512_cvtneps_pbh(activate(lo[r], activation)));         \
            _mm256_storeu_si256((__m256i *)(y + r * n + 16),                                       \
                                (__m256i)_mm512_cvtneps_pbh(activate(hi[r], activation)));         \
        }                                                                                          \
    }

FOR_1_TO_12(BOTH_VARIANTS)

typedef void (*row_block)(const uint16_t *, int64_t, const uint16_t *, const float *, uint16_t *, int64_t,
                          int64_t, int);
static const row_block BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, FOR_1_TO_12(PLAIN_ENTRY)};
static const row_block WARMING_BLOCKS[MAX_BLOCK_ROWS + 1] = {NULL, FOR_1_TO_12(WARMING_ENTRY)};

/* One call's operands, as for_each_block hands them to run_block. */
typedef struct {
    const uint16_t *x;
    Py_ssize_t x_stride;
    const uint16_t *panels;
    const float *bias;
    uint16_t *y;
    Py_ssize_t n, k;
    int activation;
} Call;

static void run_block(const void *opaque, Py_ssize_t row, int size, Py_ssize_t panel, int warm_next) {
    const Call *c = opaque;
    const uint16_t *weights = c->panels + panel * c->k * PANEL;
    (warm_next ? WARMING_BLOCKS : BLOCKS)[size](c->x + row * c->x_stride, c->x_stride, weights,
                                                c->bias + panel * PANEL, c->y + row * c->n + panel * PANEL,
                                                c->n, c->k, c->activation);
}

static PyObject *bf16_linear(PyObject *self, PyObject *args) {
    (void)self;
    LinearArgs a;
    if (!parse_linear_args(args, &a)) return NULL;
    if (a.rows < 0 || a.k <= 0 || a.k % 2 != 0 || a.n <= 0 || a.n % PANEL != 0 || a.x_stride < a.k
        || a.x_stride % 2 != 0 || a.x % 4 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "need rows >= 0, k > 0 even, n a positive multiple of %d, x_stride >= k even and x "
                     "4-byte aligned; got rows %zd, n %zd, k %zd, x_stride %zd", PANEL, a.rows, a.n, a.k,
                     a.x_stride);
        return NULL;
    }
    const Call call = {(const uint16_t *)(uintptr_t)a.x, a.x_stride, (const uint16_t *)(uintptr_t)a.panels,
                       (const float *)(uintptr_t)a.bias, (uint16_t *)(uintptr_t)a.y, a.n, a.k, a.activation};
    Py_BEGIN_ALLOW_THREADS
    if (a.threads == HELPER_TEAM) {
        const BlockWalk walk = block_walk(a.rows, a.n / PANEL, MAX_BLOCK_ROWS, run_block, &call);
        team_run(walk_item, &walk, walk.chunks * walk.panels);
    } else {
        for_each_block(a.rows, a.n / PANEL, PANEL, a.k, MAX_BLOCK_ROWS, a.threads, run_block, &call);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", bf16_linear, METH_VARARGS,
     "linear(x, panels, bias, y, rows, n, k, x_stride, threads, activation): y = activation(x @ W.T + bias) "
     "in bf16; arguments are data pointers and sizes, W packed as [n / 32][k / 2][32][2]; threads 0: this thread "
     "and the module's helper thread, else up to that many of torch's OpenMP team; activation 0 none, "
     "1 GELU (erf), 2 GELU (tanh), 3 ReLU."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bf16_linear", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

/* The module's helper team is lent to the other native linears (int8_linear.c) in a
 * capsule holding ``team_run`` (team_call.h): one helper per process, since two helpers
 * that each poll after their calls would take turns on the caller's second core. */
PyMODINIT_FUNC PyInit__bf16_linear(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *team = PyCapsule_New((void *)team_run, TEAM_CAPSULE, NULL);
    if (team == NULL || PyModule_AddObject(m, "team_run", team) < 0) {
        Py_XDECREF(team);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
