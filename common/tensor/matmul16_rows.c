/* Whether a row of a 16-bit product keeps its bits whatever rows share its call and
 * wherever they sit (matmul16.h): probed once per precision on this CPU's kernels. */
#include "matmul16.h"

#include <stdlib.h>
#include <string.h>

/* The probe's product: C[128, 96] from K = 40, as test_matmul16's row splits. */
enum { PROBE_M = 128, PROBE_N = 96, PROBE_K = 40, PROBE_SPLITS = 3, PROBE_SHIFT = 32 };

/* Pieces of 128 rows: a single row and an odd rest, sequences of 8 rows, and pieces of
 * 16 rows or more at offsets that are not multiples of 16. */
static const int probe_splits[PROBE_SPLITS][5] = {
    {1, 15, 112}, {8, 8, 16, 96}, {16, 16, 17, 79}};

typedef struct {
    precision p;
    int ta, tb, variant;    /* variant 0: C overwritten, 1: added onto (beta 1), 2: 16-bit */
    const uint16_t *a, *b;  /* the operands, A [128, 40] (or [40, 128]) and B */
    uint16_t *a_at, *b_at;  /* copies placed `shift` elements on: another alignment */
    float *c_at;
    uint16_t *c16_at;
} probe_case;

/* Rows [r0, r0 + m) of the product into c (or c16), computed from copies of A, B and C
 * placed `shift` elements past their buffers' starts. */
static void probe_rows(const probe_case *k, int r0, int m, int shift, float *c,
                       uint16_t *c16) {
    const int lda = k->ta ? PROBE_M : PROBE_K, ldb = k->tb ? PROBE_K : PROBE_N;
    const size_t first = (size_t)r0 * PROBE_N, n = (size_t)m * PROBE_N;
    uint16_t *a = k->a_at + shift, *b = k->b_at + shift;
    memcpy(a, k->a, (size_t)PROBE_M * PROBE_K * sizeof *a);
    memcpy(b, k->b, (size_t)PROBE_N * PROBE_K * sizeof *b);
    const uint16_t *rows = a + (k->ta ? (size_t)r0 : (size_t)r0 * lda);
    if (k->variant == 2) {
        uint16_t *out = k->c16_at + shift;
        matmul16_out16(k->p, k->ta, k->tb, m, PROBE_N, PROBE_K, rows, lda, b, ldb, NULL,
                       out, PROBE_N);
        memcpy(c16 + first, out, n * sizeof *out);
        return;
    }
    float *out = k->c_at + shift;
    memcpy(out, c + first, n * sizeof *out);   /* beta 1 adds onto what C holds */
    matmul16(k->p, k->ta, k->tb, m, PROBE_N, PROBE_K, rows, lda, b, ldb, (float)k->variant,
             out, PROBE_N);
    memcpy(c + first, out, n * sizeof *out);
}

/* Whether every split, each piece at its own alignment, gives every row the whole
 * call's bits. C starts from the same values each time. */
static int probe_holds(const probe_case *k, float *whole, float *pieces, uint16_t *whole16,
                       uint16_t *pieces16) {
    const size_t nc = (size_t)PROBE_M * PROBE_N;
    for (size_t i = 0; i < nc; i++) whole[i] = 0.25f * (float)(i % 7);
    probe_rows(k, 0, PROBE_M, 0, whole, whole16);
    for (int s = 0; s < PROBE_SPLITS; s++) {
        for (size_t i = 0; i < nc; i++) pieces[i] = 0.25f * (float)(i % 7);
        for (int i = 0, r0 = 0; r0 < PROBE_M; r0 += probe_splits[s][i++])
            probe_rows(k, r0, probe_splits[s][i], 1 + 7 * i, pieces, pieces16);
        const int same = k->variant == 2 ? memcmp(whole16, pieces16, nc * 2) == 0
                                         : memcmp(whole, pieces, nc * sizeof(float)) == 0;
        if (!same) return 0;
    }
    return 1;
}

static void *probe_buffer(size_t bytes) {
    void *x = calloc(1, bytes);
    if (!x) abort();
    return x;
}

static int probe(precision p) {
    const size_t na = (size_t)PROBE_M * PROBE_K, nb = (size_t)PROBE_N * PROBE_K;
    const size_t nc = (size_t)PROBE_M * PROBE_N;
    float *x = probe_buffer((na + nb) * sizeof *x);
    unsigned h = 12345u;   /* values in [-1, 1): sums whose order shows in their bits */
    for (size_t i = 0; i < na + nb; i++) {
        h = h * 1664525u + 1013904223u;
        x[i] = (float)(h >> 8) / (float)(1u << 23) - 1.0f;
    }
    uint16_t *a = probe_buffer(na * 2), *b = probe_buffer(nb * 2);
    precision_to16(p, a, x, na);
    precision_to16(p, b, x + na, nb);
    probe_case k = {.p = p, .a = a, .b = b, .a_at = probe_buffer((na + PROBE_SHIFT) * 2),
                    .b_at = probe_buffer((nb + PROBE_SHIFT) * 2),
                    .c_at = probe_buffer((nc + PROBE_SHIFT) * sizeof(float)),
                    .c16_at = probe_buffer((nc + PROBE_SHIFT) * 2)};
    float *whole = probe_buffer(nc * sizeof *whole), *pieces = probe_buffer(nc * sizeof *pieces);
    uint16_t *whole16 = probe_buffer(nc * 2), *pieces16 = probe_buffer(nc * 2);
    int holds = 1;
    for (int t = 0; t < 4 && holds; t++)
        for (int variant = 0; variant < 3 && holds; variant++) {
            k.ta = t & 1, k.tb = t >> 1, k.variant = variant;
            holds = probe_holds(&k, whole, pieces, whole16, pieces16);
        }
    free(x), free(a), free(b), free(k.a_at), free(k.b_at), free(k.c_at), free(k.c16_at);
    free(whole), free(pieces), free(whole16), free(pieces16);
    return holds;
}

int matmul16_rows_invariant(precision p) {
    static int known[2] = {-1, -1};   /* bf16, fp16: -1 not probed yet */
    const int k = p == PRECISION_FP16;
    int v = __atomic_load_n(&known[k], __ATOMIC_ACQUIRE);
    if (v < 0) {   /* two threads may both probe: they find the same */
        v = probe(p);
        __atomic_store_n(&known[k], v, __ATOMIC_RELEASE);
    }
    return v;
}
