#include "tp_linear.h"

#include <stdlib.h>

#include "alloc.h"
#include "ops.h"
#include "ops_mixed.h"

static int group_size(const comm *tp) { return tp ? comm_size(tp) : 1; }

/* ---- f and g ---------------------------------------------------------------------------- */

void megatron_f_backward(comm *tp, precision p, void *grad, size_t n) {
    if (group_size(tp) > 1) comm_allreduce(tp, grad, n, comm_dtype_of(p), COMM_SUM);
}

void megatron_g_forward(comm *tp, precision p, void *x, size_t n) {
    if (group_size(tp) > 1) comm_allreduce(tp, x, n, comm_dtype_of(p), COMM_SUM);
}

/* ---- column-parallel: my outputs ------------------------------------------------------ */

void column_parallel_forward(precision p, void *out_local, const void *inp,
                             const void *w_local, const void *b_local, int N, int IC,
                             int OC_local) {
    /* f forward: the replicated input is used as it is */
    mixed_linear_forward(p, out_local, inp, w_local, b_local, N, IC, OC_local);
}

void column_parallel_backward(comm *tp, precision p, void *dinp, float *dw, float *db,
                              const void *dout_local, const void *inp,
                              const void *w_local, int N, int IC, int OC_local) {
    if (OC_local > 0) {
        mixed_linear_backward(p, dinp, dw, db, dout_local, inp, w_local, N, IC, OC_local);
    } else if (dinp) {
        mixed_vec_zero(p, dinp, (size_t)N * IC);   /* a rank with no outputs adds nothing */
    }
    /* the input fed every rank's outputs: its gradient is the sum of the ranks' parts */
    if (dinp) megatron_f_backward(tp, p, dinp, (size_t)N * IC);
}

void column_parallel_gather(comm *tp, float *out, const float *out_local, int N,
                            int OC_local) {
    const int t = group_size(tp);
    const size_t piece = (size_t)N * OC_local;
    if (t == 1) {
        vec_copy(out, out_local, piece);
        return;
    }
    /* all-gather stacks the ranks' [N, OC_local] blocks; interleave them into rows */
    float *stacked = mem_alloc_on(MEM_DEVICE, MEM_COMM, (size_t)t * piece * sizeof(float));
    comm_allgather(tp, out_local, stacked, (size_t)t * piece, COMM_F32);
    for (int r = 0; r < t; r++)
        for (int n = 0; n < N; n++)
            vec_copy(out + (size_t)n * t * OC_local + (size_t)r * OC_local,
                     stacked + r * piece + (size_t)n * OC_local, (size_t)OC_local);
    mem_free(stacked);
}

/* ---- row-parallel: my inputs ----------------------------------------------------------- */

void row_parallel_forward(comm *tp, precision p, void *out, const void *inp_local,
                          const void *w_local, const void *bias, int N, int IC_local,
                          int OC) {
    /* the bias belongs to the sum, not to a share: rank 0 adds it once */
    const void *my_bias = (!tp || comm_rank(tp) == 0) ? bias : NULL;
    if (IC_local > 0) {
        mixed_linear_forward(p, out, inp_local, w_local, my_bias, N, IC_local, OC);
    } else {
        mixed_vec_zero(p, out, (size_t)N * OC);
        if (my_bias)
            for (int n = 0; n < N; n++)
                mixed_vec_add(p, precision_at(p, out, (size_t)n * OC), my_bias, (size_t)OC);
    }
    megatron_g_forward(tp, p, out, (size_t)N * OC);
}

void row_parallel_backward(precision p, void *dinp_local, float *dw, float *db,
                           const void *dout, const void *inp_local, const void *w_local,
                           int N, int IC_local, int OC) {
    /* g backward: dout arrives whole on every rank, nothing to exchange */
    if (IC_local > 0) {
        mixed_linear_backward(p, dinp_local, dw, db, dout, inp_local, w_local, N, IC_local,
                              OC);
    } else if (db && p == PRECISION_FP32) {
        for (int n = 0; n < N; n++) vec_add(db, (const float *)dout + (size_t)n * OC, (size_t)OC);
    } else if (db) {   /* the column sums of dout alone, in fp32 */
        mixed_linear_backward(p, NULL, NULL, db, dout, NULL, NULL, N, 0, OC);
    }
}
