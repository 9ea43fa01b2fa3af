/*
 * Bidirectional attention over the sequences of a packed bf16 batch, on AMX tiles or,
 * on CPUs with AVX512-BF16 but no AMX, on VDPBF16PS.
 *
 * Why native: in bf16 on CPU the dense layers run on oneDNN's AMX or AVX512-BF16
 * kernels, but attention at head size 32 or 64 spends most of its time in the softmax
 * (about 2 cycles a score in torch's flash kernel; BENCHMARKS.md, "bf16 profile"). Here
 * a block of 16 queries gets its scores for the whole sequence from bf16 products (f32,
 * kept in a per-thread buffer), one AVX-512 pass turns them into exponentials
 * (a degree-5 polynomial for 2^f: relative error <= 2.4e-6, well below the 2e-3 of
 * rounding to bf16) and their row sums, and a second round of products
 * multiplies the bf16 probabilities by V. No online rescaling is needed: a whole row of scores fits the
 * buffer (16 x 8192 f32 is 512 KiB). The math matches torch's flash kernel: f32
 * scores and sums, probabilities rounded to bf16 for the second product, the output
 * divided by the f32 row sum and rounded to bf16.
 *
 * The two instruction paths share everything but the products: K and V are packed
 * once per (sequence, head) into the layout of AMX's B tiles, which is also what
 * VDPBF16PS wants as its vector operand (16 lanes of one bf16 pair each), with the
 * other operand a broadcast pair of the query (or of the probabilities).
 *
 * Layout: q, k, v are [T, heads, head_dim] bf16 rows, ``q_stride`` / ``k_stride`` /
 * ``v_stride`` elements apart (views of the fused QKV projection, or tensors of their
 * own), heads contiguous within a row; the output is
 * [T, heads, head_dim] rows ``out_stride`` elements apart. Sequence s covers rows
 * starts[s] .. starts[s] + lengths[s]. head_dim is 32 or 64.
 *
 * With ``bias`` (MPNet's relative position bias), each score is scaled and the bias for
 * its distance added before the softmax, as torch's SDPA adds an additive mask:
 * scale * q.k + bias[head][key - query]. ``bias`` is f32 [heads][2 * reach + 1], the
 * entry for distance d (key index minus query index within a sequence) at d + reach;
 * ``reach`` is at least the longest sequence's length - 1. Entries are finite: -1e30
 * masks a key out (ModernBERT's windows), its exponential 0; -inf would make it NaN.
 *
 * With ``quantize`` (--dtype int8's layers, on CPUs with AVX512-VNNI), the two products
 * run in int8 on VPDPBUSD instead for sequences of QUANTIZE_MIN_LENGTH tokens or more: the
 * same blocks of 16 queries, with int8 keys and values, int32 scores and uint8
 * probabilities (attention_int8.h says how each is scaled). On 32 x 512 (head_dim 32, one
 * thread, Zen 5) a call takes ~0.7x the VDPBF16PS path's time.
 *
 * Work items are (sequence, head) pairs, split between threads by their cost
 * (``item_cost``: ceil(L / 16) query blocks x L keys), one share per OpenMP thread (torch's team:
 * ``run_shares``). On the AMX path each thread configures its own tiles (tile state is
 * per thread) and releases them after its share.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "amx_tiles.h"
#include "attention_int8.h"
#include "avx512_exp.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define ROWS 16          /* queries per block, rows of every tile */
#define TILE_BYTES 64    /* bytes per tile row: 32 bf16 or 16 f32 */
#define KEY_CHUNK 32     /* keys per P x V tile product */
#define KEY_PAD 64       /* keys are padded to a multiple of this: four 16-key score blocks */
#define MAX_THREADS 64
#define MAX_ROW_STRIDE (1 << 26)   /* 15 rows of it, in bytes, fit a gather's int32 offsets */
/* With ``quantize``, sequences shorter than this keep the bf16 products: int8's packing and
 * per-row quantization cost about what its products save at 16 tokens (1.04x the time,
 * 0.92x at 32, 0.66x at 512; one thread, Zen 5), and a short query's whole step ran ~3 %
 * slower. A sequence's path depends on its own length only, so its bits do not depend on
 * the batch around it. */
#define QUANTIZE_MIN_LENGTH 32

typedef struct {
    const uint16_t *q, *k, *v;
    uint16_t *out;
    int64_t q_stride, k_stride, v_stride, out_stride;
    int64_t heads, head_dim;
    const int64_t *starts, *lengths;
    int64_t max_length;
    float scale;
    int tiles;   /* 1: AMX tiles; 0: VDPBF16PS */
    const float *bias;   /* NULL: none; else [heads][2 * bias_reach + 1] */
    int64_t bias_reach;
    int quantize;   /* 1: int8 products on VPDPBUSD (attention_int8.h) from QUANTIZE_MIN_LENGTH; no bias */
} Problem;

typedef struct {
    const Problem *problem;
    int64_t first_item, end_item;   /* items are sequence * heads + head */
    int failed;
} Share;

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* Work of one (sequence, head) item, in scores: its query blocks x its keys. */
static double item_cost(int64_t length) { return (double)round_up(length, ROWS) * (double)length; }

static void configure_tiles(void) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette_id = 1;
    for (int t = 0; t < 8; ++t) {
        config.rows[t] = ROWS;
        config.colsb[t] = TILE_BYTES;
    }
    _tile_loadconfig(&config);
}

/* K rows [length, head_dim] -> B tiles for Q K^T: per 16-key block and 32-dim chunk,
 * a 16 x 16 tile of dim pairs (4 bytes) transposed so that row p holds pair p of
 * keys 0..15 (one gather per row). Keys past ``length`` are zero. */
static void pack_keys(const uint16_t *k, int64_t row_stride, int64_t length, int64_t padded,
                      int64_t head_dim, uint32_t *packed) {
    const int64_t chunks = head_dim / 32;
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)(row_stride * 2)));
    for (int64_t block = 0; block < padded / ROWS; ++block) {
        const int64_t first = block * ROWS;
        const int64_t present = length - first >= ROWS ? ROWS : (length > first ? length - first : 0);
        const __mmask16 keys = (__mmask16)((1u << present) - 1);
        for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            uint32_t *tile = packed + (block * chunks + chunk) * ROWS * 16;
            const uint16_t *base = k + first * row_stride + chunk * 32;
            for (int64_t p = 0; p < 16; ++p) {
                const __m512i pair = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), keys, rows,
                                                                 base + 2 * p, 1);
                _mm512_store_si512(tile + p * 16, pair);
            }
        }
    }
}

/* V rows [length, head_dim] -> B tiles for P V: per 32-key chunk and 16-dim group,
 * row r interleaves keys 2r and 2r + 1 dim by dim. Keys past ``length`` are zero. */
static void pack_values(const uint16_t *v, int64_t row_stride, int64_t length, int64_t padded,
                        int64_t head_dim, uint16_t *packed) {
    const int64_t groups = head_dim / 16;
    /* even key's dim d -> slot 2d, odd key's dim d -> slot 2d + 1 (indices >= 32: the odd row) */
    __m512i interleave[2];
    uint16_t index[2][32];
    for (int half = 0; half < 2; ++half)
        for (int d = 0; d < 16; ++d) {
            index[half][2 * d] = (uint16_t)(half * 16 + d);
            index[half][2 * d + 1] = (uint16_t)(32 + half * 16 + d);
        }
    interleave[0] = _mm512_loadu_si512(index[0]);
    interleave[1] = _mm512_loadu_si512(index[1]);
    for (int64_t chunk = 0; chunk < padded / KEY_CHUNK; ++chunk) {
        for (int64_t r = 0; r < ROWS; ++r) {
            const int64_t key = chunk * KEY_CHUNK + 2 * r;
            for (int64_t part = 0; part < head_dim / 32; ++part) {
                const __m512i even = key < length
                    ? _mm512_loadu_si512(v + key * row_stride + part * 32) : _mm512_setzero_si512();
                const __m512i odd = key + 1 < length
                    ? _mm512_loadu_si512(v + (key + 1) * row_stride + part * 32) : _mm512_setzero_si512();
                for (int half = 0; half < 2; ++half) {
                    const int64_t group = part * 2 + half;
                    uint16_t *tile = packed + (chunk * groups + group) * ROWS * 32;
                    _mm512_store_si512(tile + r * 32, _mm512_permutex2var_epi16(even, interleave[half], odd));
                }
            }
        }
    }
}

static inline __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* One row of scores, whose largest among the first ``length`` is ``row_max`` ->
 * bf16 exp(scale * (s - row_max)) in ``probs`` (zero past ``length`` up to ``padded``,
 * a multiple of 32); returns the f32 sum of the exponentials. */
static float softmax_row(const float *scores, float row_max, int64_t length, int64_t padded, float scale,
                         uint16_t *probs) {
    const __m512 factor = _mm512_set1_ps(scale * 1.4426950408889634f);   /* scale / ln 2 */
    const __m512 shift = _mm512_set1_ps(row_max * scale * 1.4426950408889634f);
    __m512 sum_low = _mm512_setzero_ps(), sum_high = _mm512_setzero_ps();
    for (int64_t j = 0; j < padded; j += 32) {
        __m512 low, high_half;
        if (j + 32 <= length) {
            low = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(scores + j), factor, shift));
            high_half = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(scores + j + 16), factor, shift));
        } else {
            const __mmask16 lo = first_lanes(length - j), hi = first_lanes(length - j - 16);
            low = _mm512_maskz_mov_ps(lo, exp2_nonpositive(
                _mm512_fmsub_ps(_mm512_maskz_loadu_ps(lo, scores + j), factor, shift)));
            high_half = _mm512_maskz_mov_ps(hi, exp2_nonpositive(
                _mm512_fmsub_ps(_mm512_maskz_loadu_ps(hi, scores + j + 16), factor, shift)));
        }
        sum_low = _mm512_add_ps(sum_low, low);
        sum_high = _mm512_add_ps(sum_high, high_half);
        _mm512_storeu_si512(probs + j, (__m512i)_mm512_cvtne2ps_pbh(high_half, low));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum_low, sum_high));
}

/* One row of scores -> scale * score + its distance's bias (``bias``: the entry for key
 * 0, so key j's is bias[j]), in place for the first ``length``; returns their largest. */
static float add_bias_row(float *scores, const float *bias, int64_t length, float scale) {
    const __m512 factor = _mm512_set1_ps(scale);
    __m512 highest = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < length; j += 16) {
        const __mmask16 lanes = first_lanes(length - j);
        const __m512 biased = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, scores + j), factor,
                                              _mm512_maskz_loadu_ps(lanes, bias + j));
        _mm512_mask_storeu_ps(scores + j, lanes, biased);
        highest = _mm512_mask_max_ps(highest, lanes, highest, biased);
    }
    return _mm512_reduce_max_ps(highest);
}

typedef struct {
    uint32_t *keys;     /* packed K tiles */
    uint16_t *values;   /* packed V tiles */
    float *scores;      /* ROWS x padded */
    uint16_t *probs;    /* ROWS x padded */
    uint16_t *queries;  /* ROWS x head_dim */
    float *context;     /* 2 x ROWS x head_dim: two partial sums at head_dim 32 */
    float *value_scales;   /* head_dim: int8 products' per-dim V scales */
} Scratch;

/* AMX: scores of the 16 queries in s->queries against every key, into s->scores
 * (row i: query i); ``highest[i]`` gets row i's largest score among the real keys. */
static void scores_tiles(const Scratch *s, int64_t hd, int64_t length, int64_t padded, __m512 *highest) {
    const int64_t chunks = hd / 32, key_blocks = padded / ROWS, score_stride = padded * 4;
    /* four key blocks at a time (independent tile products overlap): tmm1 (and tmm3)
     * hold the queries, tmm0 / 4 / 6 / 7 the blocks' scores, tmm2 / 3 / 5 their packed keys. */
    _tile_loadd(1, s->queries, hd * 2);
    const uint32_t *keys = s->keys;
    float *scores = s->scores;
/* Tile numbers must be immediates, hence macros: tile C = queries (tmm1) x the key
 * tile loaded into B from ``at``; MORE adds the second 32 dims (tmm3 x tmm5). */
#define SCORES(C, B, at) do { _tile_zero(C); _tile_loadd(B, at, TILE_BYTES); _tile_dpbf16ps(C, 1, B); } while (0)
#define MORE(C, at) do { _tile_loadd(5, at, TILE_BYTES); _tile_dpbf16ps(C, 3, 5); } while (0)
    if (chunks == 2) _tile_loadd(3, s->queries + 32, hd * 2);
    /* Each row's running max is taken right after its 64 scores are stored, while
     * the next tile products run (a separate pass would wait on the stores). */
    for (int64_t block = 0; block < key_blocks; block += 4, keys += 1024 * chunks, scores += 4 * ROWS) {
        if (chunks == 1) {
            SCORES(0, 2, keys);
            SCORES(4, 3, keys + 256);
            SCORES(6, 5, keys + 512);
            SCORES(7, 2, keys + 768);
        } else {
            SCORES(0, 2, keys);
            MORE(0, keys + 256);
            SCORES(4, 2, keys + 512);
            MORE(4, keys + 768);
            SCORES(6, 2, keys + 1024);
            MORE(6, keys + 1280);
            SCORES(7, 2, keys + 1536);
            MORE(7, keys + 1792);
        }
        _tile_stored(0, scores, score_stride);
        _tile_stored(4, scores + ROWS, score_stride);
        _tile_stored(6, scores + 2 * ROWS, score_stride);
        _tile_stored(7, scores + 3 * ROWS, score_stride);
        const int64_t column = block * ROWS;
        const __mmask16 m0 = first_lanes(length - column), m1 = first_lanes(length - column - 16),
                        m2 = first_lanes(length - column - 32), m3 = first_lanes(length - column - 48);
        for (int64_t i = 0; i < ROWS; ++i) {
            const float *row = scores + i * padded;
            const __m512 a = _mm512_mask_max_ps(highest[i], m0, highest[i], _mm512_maskz_loadu_ps(m0, row));
            const __m512 b = _mm512_mask_max_ps(a, m1, a, _mm512_maskz_loadu_ps(m1, row + 16));
            const __m512 c = _mm512_mask_max_ps(b, m2, b, _mm512_maskz_loadu_ps(m2, row + 32));
            highest[i] = _mm512_mask_max_ps(c, m3, c, _mm512_maskz_loadu_ps(m3, row + 48));
        }
    }
#undef SCORES
#undef MORE
}

/* AMX: s->context (16 x head_dim f32) = probabilities x V, 32 keys (tmm1) at a time;
 * tmm2 / 3 / 5 hold packed values. head_dim 32: tmm0 and tmm4 take even chunks, tmm6
 * and tmm7 odd ones (two independent chains of accumulation; one would wait on each
 * product's latency), summed at the end. head_dim 64: tmm0 / 4 / 6 / 7 take 16 dims each. */
static void context_tiles(const Scratch *s, int64_t hd, int64_t padded) {
    const int64_t chunks = hd / 32, prob_stride = padded * 2, context_stride = hd * 4;
    _tile_zero(0);
    _tile_zero(4);
    _tile_zero(6);
    _tile_zero(7);
    const uint16_t *values = s->values;
    if (chunks == 1) {
        for (int64_t key = 0; key < padded; key += 2 * KEY_CHUNK, values += 2048) {
            _tile_loadd(1, s->probs + key, prob_stride);
            _tile_loadd(2, values, TILE_BYTES);
            _tile_loadd(3, values + 512, TILE_BYTES);
            _tile_dpbf16ps(0, 1, 2);
            _tile_dpbf16ps(4, 1, 3);
            _tile_loadd(1, s->probs + key + KEY_CHUNK, prob_stride);
            _tile_loadd(5, values + 1024, TILE_BYTES);
            _tile_loadd(2, values + 1536, TILE_BYTES);
            _tile_dpbf16ps(6, 1, 5);
            _tile_dpbf16ps(7, 1, 2);
        }
        float *odd = s->context + ROWS * hd;
        _tile_stored(0, s->context, context_stride);
        _tile_stored(4, s->context + 16, context_stride);
        _tile_stored(6, odd, context_stride);
        _tile_stored(7, odd + 16, context_stride);
        for (int64_t i = 0; i < ROWS * hd; i += 16)
            _mm512_store_ps(s->context + i, _mm512_add_ps(_mm512_load_ps(s->context + i),
                                                          _mm512_load_ps(odd + i)));
    } else {
        for (int64_t key = 0; key < padded; key += KEY_CHUNK, values += 2048) {
            _tile_loadd(1, s->probs + key, prob_stride);
            _tile_loadd(2, values, TILE_BYTES);
            _tile_loadd(3, values + 512, TILE_BYTES);
            _tile_dpbf16ps(0, 1, 2);
            _tile_dpbf16ps(4, 1, 3);
            _tile_loadd(5, values + 1024, TILE_BYTES);
            _tile_loadd(2, values + 1536, TILE_BYTES);
            _tile_dpbf16ps(6, 1, 5);
            _tile_dpbf16ps(7, 1, 2);
        }
        _tile_stored(0, s->context, context_stride);
        _tile_stored(4, s->context + 16, context_stride);
        _tile_stored(6, s->context + 32, context_stride);
        _tile_stored(7, s->context + 48, context_stride);
    }
}

/* 32 bits at ``at`` (one bf16 pair) in every lane. */
static inline __m512bh broadcast_pair(const uint32_t *at) { return (__m512bh)_mm512_set1_epi32((int)*at); }

/* VDPBF16PS: as scores_tiles, for the first ``rows`` queries (rounded up to 4). A
 * register block is 4 queries x 64 keys (16 accumulators): per bf16 pair of dims, 4
 * packed key vectors and 4 query broadcasts feed 16 products. */
static void scores_dot(const Scratch *s, int64_t hd, int64_t length, int64_t padded, int64_t rows,
                       __m512 *highest) {
    const int64_t chunks = hd / 32, pairs = hd / 2, block_step = chunks * 256;
    const uint32_t *queries = (const uint32_t *)s->queries;
    for (int64_t column = 0; column < padded; column += 4 * ROWS) {
        const uint32_t *keys = s->keys + (column / ROWS) * block_step;
        const __mmask16 mask[4] = {first_lanes(length - column), first_lanes(length - column - 16),
                                   first_lanes(length - column - 32), first_lanes(length - column - 48)};
        for (int64_t i0 = 0; i0 < rows; i0 += 4) {
            __m512 acc[4][4];
            for (int r = 0; r < 4; ++r)
                for (int b = 0; b < 4; ++b) acc[r][b] = _mm512_setzero_ps();
            const uint32_t *query = queries + i0 * pairs;
            for (int64_t p = 0; p < pairs; ++p) {
                const uint32_t *pair = keys + (p / 16) * 256 + (p % 16) * 16;
                __m512bh key[4];
                for (int b = 0; b < 4; ++b) key[b] = (__m512bh)_mm512_load_si512(pair + b * block_step);
                for (int r = 0; r < 4; ++r) {
                    const __m512bh q = broadcast_pair(query + r * pairs + p);
                    for (int b = 0; b < 4; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], q, key[b]);
                }
            }
            for (int r = 0; r < 4; ++r) {
                float *row = s->scores + (i0 + r) * padded + column;
                for (int b = 0; b < 4; ++b) {
                    _mm512_store_ps(row + b * 16, acc[r][b]);
                    highest[i0 + r] = _mm512_mask_max_ps(highest[i0 + r], mask[b], highest[i0 + r], acc[r][b]);
                }
            }
        }
    }
}

/* VDPBF16PS: s->context rows [i0, i0 + R) = their probabilities x V, for ``groups``
 * groups of 16 dims (R x groups = 16 accumulators). Per pair of keys, each group's
 * packed value vector meets a broadcast pair of each row's probabilities. */
static inline __attribute__((always_inline)) void context_rows(const Scratch *s, int64_t padded, int64_t i0,
                                                               const int R, const int groups) {
    const int64_t key_pairs = padded / 2, hd = groups * 16;
    const uint32_t *probs = (const uint32_t *)s->probs;
    __m512 acc[16];
    for (int a = 0; a < R * groups; ++a) acc[a] = _mm512_setzero_ps();
    for (int64_t kp = 0; kp < key_pairs; ++kp) {
        const uint16_t *values = s->values + (kp / 16) * groups * 512 + (kp % 16) * 32;
        __m512bh value[4];
        for (int g = 0; g < groups; ++g) value[g] = (__m512bh)_mm512_load_si512(values + g * 512);
        for (int r = 0; r < R; ++r) {
            const __m512bh p = broadcast_pair(probs + (i0 + r) * key_pairs + kp);
            for (int g = 0; g < groups; ++g) acc[r * groups + g] = _mm512_dpbf16_ps(acc[r * groups + g], p, value[g]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < groups; ++g) _mm512_store_ps(s->context + (i0 + r) * hd + g * 16, acc[r * groups + g]);
}

/* VDPBF16PS: as context_tiles, for the first ``rows`` queries (rounded up to a block). */
static void context_dot(const Scratch *s, int64_t hd, int64_t padded, int64_t rows) {
    if (hd == 32)
        for (int64_t i0 = 0; i0 < rows; i0 += 8) context_rows(s, padded, i0, 8, 2);
    else
        for (int64_t i0 = 0; i0 < rows; i0 += 4) context_rows(s, padded, i0, 4, 4);
}

/* One (sequence, head) item's rows: its head's first q, k, v and output elements. */
typedef struct {
    int64_t head, length, padded;
    const uint16_t *q, *k, *v;
    uint16_t *out;
} Item;

static Item item_rows(const Problem *pr, int64_t item) {
    const int64_t sequence = item / pr->heads, head = item % pr->heads, hd = pr->head_dim;
    const int64_t length = pr->lengths[sequence], first = pr->starts[sequence];
    return (Item){head, length, round_up(length, KEY_PAD), pr->q + first * pr->q_stride + head * hd,
                  pr->k + first * pr->k_stride + head * hd, pr->v + first * pr->v_stride + head * hd,
                  pr->out + first * pr->out_stride + head * hd};
}

static void attend_item(const Problem *pr, const Scratch *s, int64_t item) {
    const Item it = item_rows(pr, item);
    if (it.length <= 0) return;
    const int64_t hd = pr->head_dim, head = it.head, length = it.length, padded = it.padded;
    const uint16_t *q = it.q, *k = it.k, *v = it.v;
    uint16_t *out = it.out;
    pack_keys(k, pr->k_stride, length, padded, hd, s->keys);
    pack_values(v, pr->v_stride, length, padded, hd, s->values);

    for (int64_t row0 = 0; row0 < length; row0 += ROWS) {
        const int64_t rows = length - row0 < ROWS ? length - row0 : ROWS;
        for (int64_t i = 0; i < ROWS; ++i)
            for (int64_t d = 0; d < hd; d += 32)
                _mm512_store_si512(s->queries + i * hd + d, i < rows
                    ? _mm512_loadu_si512(q + (row0 + i) * pr->q_stride + d) : _mm512_setzero_si512());
        __m512 highest[ROWS];
        for (int64_t i = 0; i < ROWS; ++i) highest[i] = _mm512_set1_ps(-INFINITY);
        if (pr->tiles)
            scores_tiles(s, hd, length, padded, highest);
        else
            scores_dot(s, hd, length, padded, rows, highest);
        float sums[ROWS];
        for (int64_t i = 0; i < ROWS; ++i) {
            float *row = s->scores + i * padded;
            if (i >= rows) {
                memset(s->probs + i * padded, 0, padded * 2);
                sums[i] = 1.0f;
            } else if (pr->bias) {   /* the row is scaled here: the softmax's scale is 1 */
                const float *bias = pr->bias + head * (2 * pr->bias_reach + 1) + pr->bias_reach - (row0 + i);
                sums[i] = softmax_row(row, add_bias_row(row, bias, length, pr->scale), length, padded, 1.0f,
                                      s->probs + i * padded);
            } else {
                sums[i] = softmax_row(row, _mm512_reduce_max_ps(highest[i]), length, padded, pr->scale,
                                      s->probs + i * padded);
            }
        }
        if (pr->tiles)
            context_tiles(s, hd, padded);
        else
            context_dot(s, hd, padded, rows);
        for (int64_t i = 0; i < rows; ++i) {
            const __m512 inverse = _mm512_set1_ps(1.0f / sums[i]);
            uint16_t *target = out + (row0 + i) * pr->out_stride;
            for (int64_t d = 0; d < hd; d += 16) {
                const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s->context + i * hd + d), inverse);
                _mm256_storeu_si256((__m256i *)(target + d), (__m256i)_mm512_cvtneps_pbh(x));
            }
        }
    }
}

/* attend_item with int8 products (attention_int8.h): the same blocks of 16 queries, the
 * buffers holding int8 keys and values, int32 scores and uint8 probabilities. */
static void attend_item_int8(const Problem *pr, const Scratch *s, int64_t item) {
    const Item it = item_rows(pr, item);
    if (it.length <= 0) return;
    const int64_t hd = pr->head_dim, length = it.length, padded = it.padded;
    const uint16_t *q = it.q;
    uint16_t *out = it.out;
    uint8_t *keys = (uint8_t *)s->keys, *probs = (uint8_t *)s->probs;
    int8_t *values = (int8_t *)s->values, *queries = (int8_t *)s->queries;
    int32_t *scores = (int32_t *)s->scores, *context = (int32_t *)s->context;
    const float key_scale = pack_keys_int8(it.k, pr->k_stride, length, padded, hd, keys);
    pack_values_int8(it.v, pr->v_stride, length, padded, hd, values, s->value_scales);

    for (int64_t row0 = 0; row0 < length; row0 += ROWS) {
        const int64_t rows = length - row0 < ROWS ? length - row0 : ROWS;
        float query_scales[ROWS];
        int32_t corrections[ROWS];
        __m512i highest[ROWS];
        for (int64_t i = 0; i < ROWS; ++i) {
            highest[i] = _mm512_set1_epi32(INT32_MIN);
            if (i < rows) {
                query_scales[i] = quantize_query_int8(q + (row0 + i) * pr->q_stride, hd, queries + i * hd,
                                                      &corrections[i]);
            } else {
                query_scales[i] = 0.0f;
                corrections[i] = 0;
                memset(queries + i * hd, 0, (size_t)hd);
            }
        }
        scores_int8(keys, queries, corrections, hd, length, padded, round_up(rows, 4), scores, highest);
        float sums[ROWS];
        for (int64_t i = 0; i < ROWS; ++i) {
            if (i < rows) {
                sums[i] = (float)softmax_row_uint8(scores + i * padded, _mm512_reduce_max_epi32(highest[i]), length,
                                                   padded, pr->scale * query_scales[i] * key_scale, probs + i * padded);
            } else {
                memset(probs + i * padded, 0, (size_t)padded);
                sums[i] = 1.0f;
            }
        }
        if (hd == 32)
            for (int64_t i0 = 0; i0 < rows; i0 += 8) context_int8(probs, values, padded, i0, 8, 2, context);
        else
            for (int64_t i0 = 0; i0 < rows; i0 += 4) context_int8(probs, values, padded, i0, 4, 4, context);
        for (int64_t i = 0; i < rows; ++i) {
            const __m512 inverse = _mm512_set1_ps(1.0f / sums[i]);
            uint16_t *target = out + (row0 + i) * pr->out_stride;
            for (int64_t d = 0; d < hd; d += 16) {
                const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(context + i * hd + d));
                const __m512 x = _mm512_mul_ps(_mm512_mul_ps(sum, _mm512_loadu_ps(s->value_scales + d)), inverse);
                _mm256_storeu_si256((__m256i *)(target + d), (__m256i)_mm512_cvtneps_pbh(x));
            }
        }
    }
}

static void run_share(Share *share) {
    const Problem *pr = share->problem;
    const int64_t hd = pr->head_dim, padded = round_up(pr->max_length, KEY_PAD);
    Scratch s;
    s.keys = aligned_alloc(64, (size_t)(padded * hd * 2));
    s.values = aligned_alloc(64, (size_t)(padded * hd * 2));
    s.scores = aligned_alloc(64, (size_t)(ROWS * padded * 4));
    s.probs = aligned_alloc(64, (size_t)(ROWS * padded * 2));
    s.queries = aligned_alloc(64, (size_t)(ROWS * hd * 2));
    s.context = aligned_alloc(64, (size_t)(2 * ROWS * hd * 4));
    s.value_scales = aligned_alloc(64, (size_t)(hd * 4));
    if (!s.keys || !s.values || !s.scores || !s.probs || !s.queries || !s.context || !s.value_scales) {
        share->failed = 1;
    } else {
        if (pr->tiles) configure_tiles();
        for (int64_t item = share->first_item; item < share->end_item; ++item)
            (pr->quantize && pr->lengths[item / pr->heads] >= QUANTIZE_MIN_LENGTH ? attend_item_int8
                                                                                  : attend_item)(pr, &s, item);
        if (pr->tiles) _tile_release();
    }
    free(s.keys);
    free(s.values);
    free(s.scores);
    free(s.probs);
    free(s.queries);
    free(s.context);
    free(s.value_scales);
}

/* Runs the shares on OpenMP threads. Built with -fopenmp, this module needs
 * libgomp.so.1, the soname of the libgomp torch ships and has already loaded, so the
 * threads are torch's own team (the one oneDNN's matmuls run on, whose tile state
 * Linux has already allocated): no second pool competing for the same cores. */
static void run_shares(Share *shares, int count) {
#pragma omp parallel num_threads(count)
    {
        const int team = omp_get_num_threads();
        for (int t = omp_get_thread_num(); t < count; t += team) run_share(&shares[t]);
    }
}

static PyObject *attend(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long q, k, v, out, starts, lengths, bias = 0;
    Py_ssize_t q_stride, k_stride, v_stride, out_stride, heads, head_dim, sequences, threads, bias_reach = 0;
    float scale;
    int tiles, quantize = 0;
    if (!PyArg_ParseTuple(args, "KKKKnnnnnnKKnfnp|Knp", &q, &k, &v, &out, &q_stride, &k_stride, &v_stride,
                          &out_stride, &heads,
                          &head_dim, &starts, &lengths, &sequences, &scale, &threads, &tiles, &bias, &bias_reach,
                          &quantize))
        return NULL;
    if (quantize && bias) {
        PyErr_SetString(PyExc_ValueError, "int8 products take no bias");
        return NULL;
    }
    if (head_dim != 32 && head_dim != 64) {
        PyErr_Format(PyExc_ValueError, "head_dim must be 32 or 64, got %zd", head_dim);
        return NULL;
    }
    /* pack_keys gathers 16 rows with 32-bit byte offsets */
    if (k_stride <= 0 || k_stride > MAX_ROW_STRIDE) {
        PyErr_Format(PyExc_ValueError, "k rows must be 1 to %d elements apart, got %zd", MAX_ROW_STRIDE, k_stride);
        return NULL;
    }
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    const int64_t *lens = (const int64_t *)(uintptr_t)lengths;
    Problem pr = {(const uint16_t *)(uintptr_t)q, (const uint16_t *)(uintptr_t)k,
                  (const uint16_t *)(uintptr_t)v, (uint16_t *)(uintptr_t)out, q_stride, k_stride, v_stride, out_stride,
                  heads, head_dim, (const int64_t *)(uintptr_t)starts, lens, 0, scale, tiles,
                  (const float *)(uintptr_t)bias, bias_reach, quantize};
    double total = 0.0;
    for (Py_ssize_t s = 0; s < sequences; ++s) {
        if (lens[s] > pr.max_length) pr.max_length = lens[s];
        total += item_cost(lens[s]) * (double)heads;
    }
    if (pr.bias && pr.bias_reach < pr.max_length - 1) {
        PyErr_Format(PyExc_ValueError, "a bias reaching %zd tokens is too short for a sequence of %lld",
                     bias_reach, (long long)pr.max_length);
        return NULL;
    }
    const int64_t items = (int64_t)sequences * heads;
    if (items == 0 || pr.max_length == 0) Py_RETURN_NONE;
    /* Waking a team thread costs about as much as this many scores: smaller calls use fewer. */
    const double least_per_thread = 131072.0;
    if (total / (double)threads < least_per_thread) threads = (Py_ssize_t)(total / least_per_thread) + 1;
    Share shares[MAX_THREADS];
    int64_t count = 0, item = 0;
    double done = 0.0;
    for (int64_t t = 0; t < threads && item < items; ++t) {
        const double goal = total * (double)(t + 1) / (double)threads;
        shares[count] = (Share){&pr, item, item, 0};
        while (item < items && (done < goal || shares[count].end_item == shares[count].first_item
                                || t == threads - 1)) {
            done += item_cost(lens[item / heads]);
            shares[count].end_item = ++item;
        }
        ++count;
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    run_shares(shares, (int)count);
    for (int64_t t = 0; t < count; ++t) failed |= shares[t].failed;
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *request_tiles(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    /* Linux hands out the AMX tile state only to processes that ask for it. */
    return PyBool_FromLong(syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0);
}

static PyMethodDef methods[] = {
    {"attend", attend, METH_VARARGS,
     "attend(q, k, v, out, q_stride, k_stride, v_stride, out_stride, heads, head_dim, starts, lengths, sequences, "
     "scale, threads, tiles[, bias, bias_reach, quantize]): bidirectional attention per sequence; arguments are "
     "data pointers and sizes; tiles: AMX (the caller has the tile state) or VDPBF16PS; bias: f32 [heads, 2 * "
     "bias_reach + 1] added by distance (key - query) after scaling, 0 for none; quantize: int8 products on "
     "VPDPBUSD for sequences of QUANTIZE_MIN_LENGTH tokens or more (the CPU must have AVX512-VNNI), no bias."},
    {"request_tiles", request_tiles, METH_NOARGS,
     "Ask Linux for the AMX tile state; True if this process may use it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_bf16_attention", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__bf16_attention(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "QUANTIZE_MIN_LENGTH", QUANTIZE_MIN_LENGTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
