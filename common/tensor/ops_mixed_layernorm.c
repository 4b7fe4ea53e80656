/* Layer norm in 16 bits (ops_mixed.h): rows widened to fp32 a chunk at a time, the fp32
 * CPU op's arithmetic on them, the outputs rounded once, as in ops_mixed.c. */
#include "ops_mixed.h"

#include "device.h"
#include "ops.h"
#include "ops_cpu.h"
#include "ops_mixed_internal.h"
#include "ops_mixed_table.h"

/* Bytes of n elements of p, and of n fp32 values, for the traffic an op reports. */
static double bytes_of(precision p, double n) { return n * (double)precision_bytes(p); }
#define F32(n) (4.0 * (double)(n))

/* ---- layer norm ------------------------------------------------------------------ */

void mixed_layernorm_forward(precision p, void *out, float *mean, float *rstd,
                             const void *inp, const void *weight, const void *bias, int N,
                             int C) {
    if (p == PRECISION_FP32) {
        layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
        return;
    }
    const int w = mixed_begin(OP_LAYERNORM,
                              bytes_of(p, 2.0 * N * C) + F32(2.0 * N));
    MIXED_ON_GPU(w, OP_LAYERNORM, layernorm_forward, p, out, mean, rstd, inp, weight, bias, N, C);
    const int rows = mixed_chunk_rows((size_t)C);
    const size_t chunk = (size_t)rows * C;
    float *wgt = mixed_scratch(2 * (size_t)C + 2 * chunk), *b = wgt + C, *x = b + C;
    float *y = x + chunk;
    precision_from16(p, wgt, weight, (size_t)C);
    precision_from16(p, b, bias, (size_t)C);
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int nn = N - n0 < rows ? N - n0 : rows;
        const size_t at = (size_t)n0 * C, len = (size_t)nn * C;
        precision_from16(p, x, precision_at(p, inp, at), len);
        cpu_layernorm_forward(y, mean + n0, rstd + n0, x, wgt, b, nn, C);
        precision_to16(p, precision_at(p, out, at), y, len);
    }
    mixed_end(w, OP_LAYERNORM);
}

/* Rows widened a chunk at a time (in cache, not three whole fp32 copies), their dbias and
 * dweight terms summed in doubles across chunks in row order: the sums, and so the bits,
 * of cpu_layernorm_backward on the whole widened rows (test_ops_mixed checks them). */
static void layernorm_backward_chunked(precision p, void *dinp, float *dweight, float *dbias,
                                       const void *dout, const void *inp, const void *weight,
                                       const float *mean, const float *rstd, int N, int C) {
    const int rows = mixed_chunk_rows((size_t)C);
    const size_t chunk = (size_t)rows * C;
    float *wgt = mixed_scratch((size_t)C + 3 * chunk), *dx = wgt + C, *dy = dx + chunk;
    float *x = dy + chunk;
    double sum_b[CPU_LAYERNORM_SUM_MAX_C], sum_w[CPU_LAYERNORM_SUM_MAX_C];
    for (int c = 0; c < C; c++) sum_b[c] = sum_w[c] = 0.0;
    precision_from16(p, wgt, weight, (size_t)C);
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int nn = N - n0 < rows ? N - n0 : rows;
        const size_t at = (size_t)n0 * C, len = (size_t)nn * C;
        precision_from16(p, dx, precision_at(p, dinp, at), len);   /* dinp accumulates */
        precision_from16(p, dy, precision_at(p, dout, at), len);
        precision_from16(p, x, precision_at(p, inp, at), len);
        cpu_layernorm_backward_rows(dx, dy, x, wgt, mean + n0, rstd + n0, nn, C, sum_b,
                                    sum_w);
        precision_to16(p, precision_at(p, dinp, at), dx, len);
    }
    for (int c = 0; c < C; c++) {
        dbias[c] += (float)sum_b[c];
        dweight[c] += (float)sum_w[c];
    }
}

void mixed_layernorm_backward(precision p, void *dinp, float *dweight, float *dbias,
                              const void *dout, const void *inp, const void *weight,
                              const float *mean, const float *rstd, int N, int C) {
    if (p == PRECISION_FP32) {
        layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
        return;
    }
    const int w = mixed_begin(OP_LAYERNORM,
                              bytes_of(p, 4.0 * N * C) + F32(4.0 * C));
    MIXED_ON_GPU(w, OP_LAYERNORM, layernorm_backward, p, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    if (C <= CPU_LAYERNORM_SUM_MAX_C) {
        layernorm_backward_chunked(p, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                   C);
        mixed_end(w, OP_LAYERNORM);
        return;
    }
    /* wider rows: dweight and dbias summed over rows widened all at once */
    const size_t n = (size_t)N * C;
    float *wgt = mixed_scratch((size_t)C + 3 * n), *dx = wgt + C, *dy = dx + n, *x = dy + n;
    precision_from16(p, wgt, weight, (size_t)C);
    precision_from16(p, dx, dinp, n);   /* dinp accumulates: widened, added in fp32, rounded once */
    precision_from16(p, dy, dout, n);
    precision_from16(p, x, inp, n);
    cpu_layernorm_backward(dx, dweight, dbias, dy, x, wgt, mean, rstd, N, C);
    precision_to16(p, dinp, dx, n);
    mixed_end(w, OP_LAYERNORM);
}
