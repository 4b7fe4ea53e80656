/* Part 6b: the relative error of one product in FP8 against fp32, per scaling recipe, on
 * this model's real activations (fc2's input in its last block, after fp32 training on
 * the chapter's text) and on the same activations with outlier channels. */
#include "mixed.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "device.h"
#include "fp8_linear.h"
#include "fp8_matmul.h"
#include "precision.h"
#include "replica.h"

const fp8_error_row fp8_error_rows[FP8_ERROR_ROWS] = {
    {"bf16 (both operands)", 1, 0, 0},
    {"e4m3 delayed", 0, FP8_E4M3, FP8_DELAYED},
    {"e4m3 tensorwise", 0, FP8_E4M3, FP8_TENSORWISE},
    {"e4m3 rowwise", 0, FP8_E4M3, FP8_ROWWISE},
    {"e4m3 blockwise", 0, FP8_E4M3, FP8_BLOCKWISE},
    {"e5m2 tensorwise", 0, FP8_E5M2, FP8_TENSORWISE},
};
const double fp8_outlier_factors[FP8_ERROR_CASES] = {1, 100, 1e4, 1e5};

static double relative_diff(const float *y, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : 0;
}

static void sgemm_xwt(float *y, const float *x, const float *w, int M, int N, int K) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void fp8_reference(float *y, const float *x, const float *w, int M, int N, int K) {
    sgemm_xwt(y, x, w, M, N, K);
}

double fp8_product_error(const fp8_matrix *qx, const fp8_matrix *qw, const float *ref) {
    const size_t n = (size_t)qx->rows * (size_t)qw->rows;
    float *y = malloc(n * sizeof(float));
    float *work = malloc(fp8_matmul_workspace(qx, qw) * sizeof(float));
    if (!y || !work || fp8_matmul(y, qx, qw, work)) abort();
    const double e = relative_diff(y, ref, n);
    free(work);
    free(y);
    return e;
}

/* Both operands rounded to bf16, the product in fp32: the 16-bit reference. */
static void bf16_product(float *y, const float *x, const float *w, int M, int N, int K) {
    const size_t nx = (size_t)M * K, nw = (size_t)N * K;
    uint16_t *h = malloc((nx > nw ? nx : nw) * sizeof(uint16_t));
    float *xr = malloc(nx * sizeof(float)), *wr = malloc(nw * sizeof(float));
    if (!h || !xr || !wr) abort();
    precision_f32_to_bf16(h, x, nx);
    precision_bf16_to_f32(xr, h, nx);
    precision_f32_to_bf16(h, w, nw);
    precision_bf16_to_f32(wr, h, nw);
    sgemm_xwt(y, xr, wr, M, N, K);
    free(h);
    free(xr);
    free(wr);
}

/* An operand in its recipe's blocks; delayed scaling reads the history (the weight's
 * history is its own amax: the weights barely move from step to step). */
static fp8_matrix quantized(const fp8_error_row *row, fp8_role role, const float *v, int rows,
                            int cols, const float *history) {
    int br, bc;
    fp8_recipe_blocks((fp8_recipe)row->recipe, role, rows, cols, &br, &bc);
    fp8_matrix q = fp8_matrix_make((fp8_format)row->format, rows, cols, br, bc);
    if (row->recipe != FP8_DELAYED) {
        fp8_quantize(&q, v);
        return q;
    }
    fp8_delayed d;
    if (fp8_delayed_init(&d, FP8_HISTORY, 0)) abort();
    float amax;
    fp8_block_amax(v, rows, cols, rows, cols, &amax);
    for (int i = 0; i < FP8_HISTORY; i++) fp8_delayed_record(&d, history ? history[i] : amax);
    fp8_quantize_delayed(&q, v, &d);
    fp8_delayed_free(&d);
    return q;
}

void fp8_product_errors(const float *x, const float *w, int M, int N, int K,
                        const float history[FP8_HISTORY], double error[FP8_ERROR_ROWS]) {
    float *ref = malloc((size_t)M * N * sizeof(float)), *y = malloc((size_t)M * N * sizeof(float));
    if (!ref || !y) abort();
    sgemm_xwt(ref, x, w, M, N, K);
    for (int r = 0; r < FP8_ERROR_ROWS; r++) {
        const fp8_error_row *row = &fp8_error_rows[r];
        if (row->bf16) {
            bf16_product(y, x, w, M, N, K);
            error[r] = relative_diff(y, ref, (size_t)M * N);
        } else {
            fp8_matrix qx = quantized(row, FP8_ACTIVATION, x, M, K, history);
            fp8_matrix qw = quantized(row, FP8_WEIGHT, w, N, K, NULL);
            error[r] = fp8_product_error(&qx, &qw, ref);
            fp8_matrix_free(&qx);
            fp8_matrix_free(&qw);
        }
    }
    free(ref);
    free(y);
}

static float amax_of(const float *x, size_t n) {
    float a = 0;
    for (size_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

void fp8_activations_at(const fp8_source *src, int step, float *x) {
    const run_config *cfg = src->cfg;
    load_batch(src->model, src->data, cfg, step, 0, cfg->batch);
    gpt_forward(src->model, src->params);
    const size_t n = (size_t)cfg->batch * cfg->model.ctx * src->K;
    memcpy(x, gpt_block_linear_input(src->model, cfg->model.layers - 1, GPT_FC2_INPUT),
           n * sizeof(float));
}

/* The amax each case's activations had in the FP8_HISTORY batches before the one
 * measured (the delayed recipe's history), and that batch's x, into x. */
static void history_and_batch(const fp8_source *src, float *x, int M, int K,
                              float history[FP8_ERROR_CASES][FP8_HISTORY]) {
    const size_t n = (size_t)M * K;
    float *scratch = malloc(n * sizeof(float));
    if (!scratch) abort();
    for (int s = 0; s < FP8_HISTORY; s++) {
        fp8_activations_at(src, FP8_TRAIN_STEPS + s, x);
        for (int c = 0; c < FP8_ERROR_CASES; c++) {
            memcpy(scratch, x, n * sizeof(float));
            fp8_outliers_apply(scratch, NULL, M, 0, K, fp8_outlier_factors[c]);
            history[c][s] = amax_of(scratch, n);
        }
    }
    fp8_activations_at(src, FP8_TRAIN_STEPS + FP8_HISTORY, x);
    free(scratch);
}

static void measure_cases(const float *x, const float *w, int M, int N, int K,
                          float history[FP8_ERROR_CASES][FP8_HISTORY], fp8_report *r) {
    const size_t nx = (size_t)M * K, nw = (size_t)N * K;
    float *xc = malloc(nx * sizeof(float)), *wc = malloc(nw * sizeof(float));
    if (!xc || !wc) abort();
    for (int c = 0; c < FP8_ERROR_CASES; c++) {
        memcpy(xc, x, nx * sizeof(float));
        memcpy(wc, w, nw * sizeof(float));
        fp8_outliers_apply(xc, wc, M, N, K, fp8_outlier_factors[c]);
        double e[FP8_ERROR_ROWS];
        fp8_product_errors(xc, wc, M, N, K, history[c], e);
        for (int row = 0; row < FP8_ERROR_ROWS; row++) r->error[row][c] = e[row];
    }
    free(xc);
    free(wc);
}

void fp8_measure_errors(const fp8_source *src, const float *w, fp8_report *r) {
    float *x = malloc((size_t)r->M * r->K * sizeof(float));
    if (!x) abort();
    float history[FP8_ERROR_CASES][FP8_HISTORY];
    history_and_batch(src, x, r->M, r->K, history);
    r->amax = amax_of(x, (size_t)r->M * r->K);
    double sq = 0;
    for (size_t i = 0; i < (size_t)r->M * r->K; i++) sq += (double)x[i] * x[i];
    r->rms = sqrt(sq / ((double)r->M * r->K));
    measure_cases(x, w, r->M, r->N, r->K, history, r);
    free(x);
}
