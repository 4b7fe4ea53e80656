/* FP8 scaling recipes: block amaxes, scales, codes, and the delayed recipe's history
 * (fp8_scaling.h). */
#include "fp8_scaling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const recipe_names[FP8_RECIPES] = {"delayed", "tensorwise", "rowwise",
                                                      "blockwise"};

const char *fp8_recipe_name(fp8_recipe r) {
    return (unsigned)r < FP8_RECIPES ? recipe_names[r] : "?";
}

int fp8_recipe_parse(const char *name, fp8_recipe *out) {
    for (int r = 0; r < FP8_RECIPES; r++)
        if (name && strcmp(name, recipe_names[r]) == 0) {
            *out = (fp8_recipe)r;
            return 0;
        }
    return -1;
}

void fp8_recipe_blocks(fp8_recipe r, fp8_role role, int rows, int cols, int *block_rows,
                       int *block_cols) {
    *block_rows = rows;
    *block_cols = cols;
    if (r == FP8_ROWWISE) *block_rows = 1;
    if (r == FP8_BLOCKWISE) {
        *block_rows = role == FP8_WEIGHT ? FP8_BLOCK : 1;
        *block_cols = FP8_BLOCK;
    }
}

static int blocks_along(int n, int b) { return (n + b - 1) / b; }

size_t fp8_scale_count(int rows, int cols, int br, int bc) {
    return (size_t)blocks_along(rows, br) * (size_t)blocks_along(cols, bc);
}

fp8_matrix fp8_matrix_make(fp8_format f, int rows, int cols, int br, int bc) {
    fp8_matrix q = {f, rows, cols, br, bc, NULL, NULL};
    q.codes = malloc((size_t)rows * (size_t)cols);
    q.scales = malloc(fp8_scale_count(rows, cols, br, bc) * sizeof(float));
    if (!q.codes || !q.scales) abort();
    return q;
}

void fp8_matrix_free(fp8_matrix *q) {
    free(q->codes);
    free(q->scales);
    q->codes = NULL;
    q->scales = NULL;
}

size_t fp8_matrix_bytes(const fp8_matrix *q) {
    return (size_t)q->rows * (size_t)q->cols +
           fp8_scale_count(q->rows, q->cols, q->block_rows, q->block_cols) * sizeof(float);
}

float fp8_scale_for(fp8_format f, float amax, int margin) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    const float scale = ldexpf(fp8_info(f)->max / amax, -margin);
    return scale < 0x1p126f ? scale : 0x1p126f;   /* a tiny amax: finite, as 1/scale is */
}

void fp8_block_amax(const float *x, int rows, int cols, int br, int bc, float *amax) {
    const int grid_cols = blocks_along(cols, bc);
    memset(amax, 0, fp8_scale_count(rows, cols, br, bc) * sizeof(float));
    for (int i = 0; i < rows; i++) {
        float *row_amax = amax + (size_t)(i / br) * (size_t)grid_cols;
        const float *xi = x + (size_t)i * (size_t)cols;
        for (int j = 0; j < cols; j++) {
            const float a = fabsf(xi[j]);
            /* a NaN is kept: the block's scale is then 1 and the NaN stays a NaN */
            if (a > row_amax[j / bc] || isnan(a)) row_amax[j / bc] = a;
        }
    }
}

void fp8_quantize(fp8_matrix *q, const float *x) {
    const size_t n = fp8_scale_count(q->rows, q->cols, q->block_rows, q->block_cols);
    fp8_block_amax(x, q->rows, q->cols, q->block_rows, q->block_cols, q->scales);
    for (size_t b = 0; b < n; b++) q->scales[b] = fp8_scale_for(q->format, q->scales[b], 0);
    fp8_quantize_with_scales(q, x);
}

/* A row's codes, block by block along it: the scale multiplies before the rounding. */
void fp8_quantize_with_scales(fp8_matrix *q, const float *x) {
    const int grid_cols = blocks_along(q->cols, q->block_cols);
    for (int i = 0; i < q->rows; i++) {
        const float *scales = q->scales + (size_t)(i / q->block_rows) * (size_t)grid_cols;
        const size_t row = (size_t)i * (size_t)q->cols;
        for (int j = 0; j < q->cols; j += q->block_cols) {
            const int n = q->cols - j < q->block_cols ? q->cols - j : q->block_cols;
            fp8_encode_scaled(q->format, q->codes + row + (size_t)j, x + row + (size_t)j,
                              (size_t)n, scales[j / q->block_cols]);
        }
    }
}

void fp8_dequantize(const fp8_matrix *q, float *out) {
    float table[256];
    fp8_decode_table(q->format, table);
    const int grid_cols = blocks_along(q->cols, q->block_cols);
    for (int i = 0; i < q->rows; i++) {
        const float *scales = q->scales + (size_t)(i / q->block_rows) * (size_t)grid_cols;
        const size_t row = (size_t)i * (size_t)q->cols;
        for (int j = 0; j < q->cols; j++)
            out[row + (size_t)j] = table[q->codes[row + (size_t)j]] / scales[j / q->block_cols];
    }
}

const char *fp8_delayed_init(fp8_delayed *d, int length, int margin) {
    memset(d, 0, sizeof *d);
    if (length < 1 || length > 1024) return "the amax history holds 1 to 1024 steps";
    if (margin < 0 || margin > 32) return "the margin is 0 to 32 (powers of 2)";
    d->history = calloc((size_t)length, sizeof(float));
    if (!d->history) abort();
    d->length = length;
    d->margin = margin;
    return NULL;
}

void fp8_delayed_free(fp8_delayed *d) {
    free(d->history);
    d->history = NULL;
}

float fp8_delayed_scale(const fp8_delayed *d, fp8_format f, float current_amax) {
    if (d->recorded == 0) return fp8_scale_for(f, current_amax, d->margin);
    const int n = d->recorded < d->length ? d->recorded : d->length;
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, d->history[i]);
    return fp8_scale_for(f, amax, d->margin);
}

void fp8_delayed_record(fp8_delayed *d, float amax) {
    d->history[d->recorded % d->length] = amax;
    d->recorded++;
}

float fp8_quantize_delayed(fp8_matrix *q, const float *x, fp8_delayed *d) {
    float amax;
    fp8_block_amax(x, q->rows, q->cols, q->rows, q->cols, &amax);
    const float scale = fp8_delayed_scale(d, q->format, amax);
    const size_t n = fp8_scale_count(q->rows, q->cols, q->block_rows, q->block_cols);
    for (size_t b = 0; b < n; b++) q->scales[b] = scale;   /* one block, as made for it */
    fp8_quantize_with_scales(q, x);
    fp8_delayed_record(d, amax);
    return amax;
}
