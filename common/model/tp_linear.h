/* Tensor parallelism as a property of the layer: the split linear layers a
 * Megatron-LM transformer is built from, and its two conjugate operators. The model's
 * block (common/model.c) calls these; with a NULL or one-rank group they are the plain
 * layer.
 *
 * Rows are N tokens; a weight is [out, in] (row-major, as linear_forward takes it).
 *   column-parallel  each rank holds some OUTPUT rows of W: its outputs in full
 *   row-parallel     each rank holds some INPUT columns of W: a partial sum of every
 *                    output, added up by an all-reduce
 * A column-parallel layer followed by a row-parallel one needs nothing in between: the
 * first leaves every rank with whole heads (or hidden units), which is exactly the
 * input slice the second wants.
 *
 * Precision p (ops_mixed.h): activations and weights (void *) hold elements of p, and
 * so do the all-reduces (a 16-bit run moves 16-bit activations, as Megatron-LM does in
 * bf16); weight and bias gradients (float *) are fp32. */
#ifndef TP_LINEAR_H
#define TP_LINEAR_H
#include <stddef.h>

#include "comm.h"
#include "precision.h"

/* ---- Megatron's conjugate operators ----------------------------------------------- */
/* f sits where a replicated activation enters a column-parallel layer: identity in
 * forward, all-reduce (sum) of the input gradient in backward.
 * g sits where a row-parallel layer's partial sums leave: all-reduce in forward,
 * identity in backward. A NULL or size-1 group makes both the identity. */
void megatron_f_backward(comm *tp, precision p, void *grad, size_t n);
void megatron_g_forward(comm *tp, precision p, void *x, size_t n);

/* ---- linear layers split over the tp group (rows: N, weights [out, in]) ----------- */
/* Column-parallel: this rank holds OC_local output rows of W (and their bias).
 * out_local[N, OC_local] = inp @ W_local^T + b_local; inp is replicated (f forward). */
void column_parallel_forward(precision p, void *out_local, const void *inp,
                             const void *w_local, const void *b_local, int N, int IC,
                             int OC_local);
/* dw, db accumulate this rank's slice; dinp[N, IC] is the full input gradient: the
 * partial dout_local @ W_local of every rank, summed (f backward). Any of dinp, dw,
 * db may be NULL: not computed (no all-reduce without dinp). */
void column_parallel_backward(comm *tp, precision p, void *dinp, float *dw, float *db,
                              const void *dout_local, const void *inp,
                              const void *w_local, int N, int IC, int OC_local);
/* out[N, OC] from column-parallel slices: all-gather, then put the columns in order
 * (fp32). */
void column_parallel_gather(comm *tp, float *out, const float *out_local, int N,
                            int OC_local);

/* Row-parallel: this rank holds IC_local input columns of W and the matching slice of
 * the input. out[N, OC] = sum over ranks of inp_local @ W_local^T (g forward), plus
 * the bias, which tp rank 0 alone adds so that the sum counts it once. */
void row_parallel_forward(comm *tp, precision p, void *out, const void *inp_local,
                          const void *w_local, const void *bias, int N, int IC_local,
                          int OC);
/* dinp_local = dout @ W_local: no communication (g backward is the identity). Any of
 * dinp_local, dw, db may be NULL: not computed. */
void row_parallel_backward(precision p, void *dinp_local, float *dw, float *db,
                           const void *dout, const void *inp_local, const void *w_local,
                           int N, int IC_local, int OC);

#endif
