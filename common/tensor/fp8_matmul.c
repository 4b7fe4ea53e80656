/* The emulated FP8 product, chunk by chunk of the inner dimension (fp8_matmul.h). */
#include "fp8_matmul.h"

#include <cblas.h>
#include <string.h>

int fp8_matmul_chunk(const fp8_matrix *x, const fp8_matrix *w) {
    const int a = x->block_cols < x->cols ? x->block_cols : x->cols;
    const int b = w->block_cols < w->cols ? w->block_cols : w->cols;
    const int small = a < b ? a : b, large = a < b ? b : a;
    if (small < 1) return 0;   /* an empty inner dimension: nothing to chunk */
    return large % small == 0 || large == x->cols ? small : 0;
}

size_t fp8_matmul_workspace(const fp8_matrix *x, const fp8_matrix *w) {
    const size_t chunk = (size_t)fp8_matmul_chunk(x, w);
    const size_t M = (size_t)x->rows, N = (size_t)w->rows;
    return (M + N) * chunk + M * N + N;
}

/* Columns [k0, k0 + kc) of q's codes decoded (unscaled) into out [rows, kc]. */
static void decode_chunk(const fp8_matrix *q, const float table[256], int k0, int kc,
                         float *out) {
    for (int i = 0; i < q->rows; i++) {
        const uint8_t *codes = q->codes + (size_t)i * (size_t)q->cols + (size_t)k0;
        float *o = out + (size_t)i * (size_t)kc;
        for (int k = 0; k < kc; k++) o[k] = table[codes[k]];
    }
}

/* The scale of row i's block holding column k. */
static float scale_at(const fp8_matrix *q, int i, int k) {
    const int grid_cols = (q->cols + q->block_cols - 1) / q->block_cols;
    return q->scales[(size_t)(i / q->block_rows) * (size_t)grid_cols + (size_t)(k / q->block_cols)];
}

static const char *check_operands(const fp8_matrix *x, const fp8_matrix *w) {
    if (x->cols != w->cols) return "x and w differ in the inner dimension";
    if (fp8_matmul_chunk(x, w) == 0) return "the operands' block widths do not nest";
    return NULL;
}

const char *fp8_matmul(float *out, const fp8_matrix *x, const fp8_matrix *w, float *work) {
    const char *why = check_operands(x, w);
    if (why) return why;
    const int M = x->rows, N = w->rows, K = x->cols, chunk = fp8_matmul_chunk(x, w);
    float tx[256], tw[256];
    fp8_decode_table(x->format, tx);
    fp8_decode_table(w->format, tw);
    float *xc = work, *wc = xc + (size_t)M * (size_t)chunk;
    float *partial = wc + (size_t)N * (size_t)chunk, *rw = partial + (size_t)M * (size_t)N;
    memset(out, 0, (size_t)M * (size_t)N * sizeof(float));
    for (int k0 = 0; k0 < K; k0 += chunk) {
        const int kc = K - k0 < chunk ? K - k0 : chunk;
        decode_chunk(x, tx, k0, kc, xc);
        decode_chunk(w, tw, k0, kc, wc);
        /* partial [M, N] = xc [M, kc] wc [N, kc]^T: the codes' products summed in fp32 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, kc, 1.0f, xc, kc, wc, kc,
                    0.0f, partial, N);
        /* promotion: this chunk's sums rescaled and added to the fp32 output */
        for (int j = 0; j < N; j++) rw[j] = 1.0f / scale_at(w, j, k0);
        for (int i = 0; i < M; i++) {
            const float rx = 1.0f / scale_at(x, i, k0);
            float *o = out + (size_t)i * (size_t)N;
            const float *p = partial + (size_t)i * (size_t)N;
            for (int j = 0; j < N; j++) o[j] += p[j] * rx * rw[j];
        }
    }
    return NULL;
}
