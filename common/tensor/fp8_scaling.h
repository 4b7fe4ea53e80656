/* Scaling recipes of FP8 training: how a tensor is fitted to the format's grid.
 *
 * A matrix [rows, cols] is held as FP8 codes and one fp32 scale per block of
 * block_rows x block_cols: code = encode(x * scale), x ~ decode(code) / scale. The scale
 * maps the block's largest magnitude (its amax) onto the format's max, so the block
 * uses the grid's top instead of saturating or falling into the subnormals:
 * scale = max / amax / 2^margin. The recipes differ in the block and in whose amax:
 *
 *   tensorwise  the whole tensor, this step's amax (torchao's "tensorwise" current
 *               scaling)
 *   rowwise     one scale a row, along the inner dimension: a token's row of the
 *               activations, an output channel's row of the weight (torchao "rowwise")
 *   blockwise   activations per 1 x 128 tile (128 channels of one token), weights per
 *               128 x 128 block (DeepSeek-V3); the product applies the scales to
 *               partial sums every 128 of the inner dimension (fp8_matmul.h)
 *   delayed     the whole tensor, scaled from the largest amax of the last `length`
 *               steps (Transformer Engine): the scale is known before the tensor is, at
 *               the price of saturating when the amax jumps past the history
 *
 * Activations are x [M, K] and weights w [N, K] of out = x w^T: blocks run along K. */
#ifndef FP8_SCALING_H
#define FP8_SCALING_H
#include <stddef.h>
#include <stdint.h>

#include "fp8.h"

typedef enum {
    FP8_DELAYED, FP8_TENSORWISE, FP8_ROWWISE, FP8_BLOCKWISE, FP8_RECIPES
} fp8_recipe;
/* FP8_GRADIENT: an output gradient dY [N, OC] in backward (hybrid: E5M2), blocked as an
 * activation (a token's row or 1 x 128 tiles of it) */
typedef enum { FP8_ACTIVATION, FP8_WEIGHT, FP8_GRADIENT } fp8_role;
#define FP8_BLOCK 128   /* DeepSeek-V3's tile and block side */

const char *fp8_recipe_name(fp8_recipe r);   /* "delayed", "tensorwise", ... */
int fp8_recipe_parse(const char *name, fp8_recipe *out);   /* -1 when unknown */

typedef struct {
    fp8_format format;
    int rows, cols, block_rows, block_cols;
    uint8_t *codes;   /* [rows * cols] */
    float *scales;    /* [block_grid_rows * block_grid_cols], row-major */
} fp8_matrix;

/* The blocks of a recipe for a [rows, cols] tensor in a role: the whole tensor
 * (tensorwise, delayed), 1 x cols (rowwise), 1 x 128 or 128 x 128 (blockwise). */
void fp8_recipe_blocks(fp8_recipe r, fp8_role role, int rows, int cols, int *block_rows,
                       int *block_cols);
/* Scales a [rows, cols] matrix has in blocks of br x bc (the last ones may be partial). */
size_t fp8_scale_count(int rows, int cols, int br, int bc);
/* A matrix's storage (codes and scales, malloc'd); fp8_matrix_free releases it. */
fp8_matrix fp8_matrix_make(fp8_format f, int rows, int cols, int br, int bc);
void fp8_matrix_free(fp8_matrix *q);
/* Bytes it holds: a byte a code and 4 a scale. */
size_t fp8_matrix_bytes(const fp8_matrix *q);

/* max / amax / 2^margin; 1 when amax is 0 or not finite (a NaN then stays a NaN). */
float fp8_scale_for(fp8_format f, float amax, int margin);
/* Largest |x| of each block of x [rows, cols], into amax[fp8_scale_count]. */
void fp8_block_amax(const float *x, int rows, int cols, int br, int bc, float *amax);
/* Current scaling: each block's scale from its own amax, then its codes. */
void fp8_quantize(fp8_matrix *q, const float *x);
/* The codes of x with q's scales as they are (delayed scaling sets them first). */
void fp8_quantize_with_scales(fp8_matrix *q, const float *x);
/* out [rows, cols] = decode(code) / scale. */
void fp8_dequantize(const fp8_matrix *q, float *out);

/* Delayed scaling: the amax of the last `length` steps of one tensor (training's default
 * length: --fp8-amax-history). */
#define FP8_DEFAULT_HISTORY 16
typedef struct {
    int length, margin;
    int recorded;       /* amaxes recorded so far */
    float *history;     /* [length], a ring */
} fp8_delayed;
/* Returns NULL, or why the length or margin cannot be used. */
const char *fp8_delayed_init(fp8_delayed *d, int length, int margin);
void fp8_delayed_free(fp8_delayed *d);
/* The scale for this step: from the history's largest amax; before any step is
 * recorded, from this step's own (current_amax), as a first step has nothing else. */
float fp8_delayed_scale(const fp8_delayed *d, fp8_format f, float current_amax);
void fp8_delayed_record(fp8_delayed *d, float amax);
/* One step of delayed scaling on a whole tensor q (one block): scale from the history,
 * codes, then this step's amax recorded. Returns the amax. */
float fp8_quantize_delayed(fp8_matrix *q, const float *x, fp8_delayed *d);

#endif
