/* The product of FP8 tensors, emulated: out [M, N] = x [M, K] w [N, K]^T from their
 * codes and scales, as an FP8 tensor core and its fp32 epilogue compute it.
 *
 * Each code's value is exact in fp32, and so is each product of two (at most 8
 * significant bits); the sums over a chunk of the inner dimension run in fp32 (sgemm),
 * and each chunk's partial sums are then multiplied by its inverse scales and added
 * to the fp32 output. With whole-row scales (tensorwise, rowwise, delayed) the chunk
 * is K, one product and one rescale. With 128-wide scales (blockwise) the chunk is
 * 128: the partial sums are promoted to fp32 and rescaled every 128 of the inner
 * dimension, as DeepSeek-V3 does on its CUDA cores (a scale varies along K, so it
 * cannot be applied once at the end). No FP8 unit is involved: this is the arithmetic,
 * for accuracy; its speed says nothing about an FP8 GPU's. */
#ifndef FP8_MATMUL_H
#define FP8_MATMUL_H
#include <stddef.h>

#include "fp8_scaling.h"

/* The inner chunk the product rescales after: the smaller of the two block widths
 * (0 when they do not nest: one must be a multiple of the other). */
int fp8_matmul_chunk(const fp8_matrix *x, const fp8_matrix *w);
/* Floats of workspace fp8_matmul needs for these operands. */
size_t fp8_matmul_workspace(const fp8_matrix *x, const fp8_matrix *w);
/* out [x.rows, w.rows] = x w^T; work: fp8_matmul_workspace floats, the caller's (no
 * allocation here). Returns NULL, or why the operands cannot be multiplied. */
const char *fp8_matmul(float *out, const fp8_matrix *x, const fp8_matrix *w, float *work);

#endif
