/* Collective matmul (Wang et al. 2022, "Overlap Communication with Dependent
 * Computation via Decomposition"; torchtitan's async TP, Megatron's TP communication
 * overlap): sequence parallelism's all-gather before a column-parallel linear, and its
 * reduce-scatter after a row-parallel one, split into `chunks` pieces so that the
 * product of one piece runs while the next is on the wire.
 *
 * A rank's sequence-parallel rows [B, T/t, C] are R = B T / t rows; chunk k is rows
 * [k R / n, (k+1) R / n) of every rank's part (the same rows on every rank, so every
 * chunk's collective is even). Chunk k's all-gather lands rank-major, [t][R_k, C], in
 * its own region of the gathered buffer; each rank's rows of it are whole runs of
 * positions of one sequence, whose products go straight to their rows of the output.
 *   column:  start gather(0); for k: wait(k), start gather(k+1), product(k)
 *   row:     for k: product(k) into its own region, start reduce-scatter(k); wait all
 * Exposed communication: the first gather (resp. the last reduce-scatter), one chunk of
 * n, when each chunk's product takes at least as long as the next chunk's collective.
 * Each output row is the same dot products as without chunks: the products are
 * equal to the plain layer's to the bit where the GEMM's rows do not depend on how many
 * share a call (16-bit matmuls here), else within TP's tolerances (fp32 sgemm). */
#ifndef TP_OVERLAP_H
#define TP_OVERLAP_H

#include "comm.h"
#include "precision.h"

/* Negative controls: a chunk's product started before its data arrived (its wait after
 * it), or the chunks' order swapped (chunk k's rows computed from chunk n-1-k's data). */
typedef enum {
    TP_OVERLAP_RIGHT,
    TP_OVERLAP_EARLY,                /* forward and backward */
    TP_OVERLAP_SWAPPED,
    TP_OVERLAP_EARLY_BACKWARD,       /* backward alone: forward runs right */
    TP_OVERLAP_SWAPPED_BACKWARD
} tp_overlap_control;

/* What a collective matmul works on: the SP group and sizes, and three [B, T, C] scratch
 * buffers in precision p: the gathered inputs (rank-major chunks), the partial
 * products, and backward's gathered rows put back in sequence order. */
typedef struct tp_overlap {
    comm *tp;
    precision p;
    int t, rank, B, T, C;
    void *gathered, *partial, *sequence;
    int chunks;                   /* 1 .. B T / t */
    tp_overlap_control control;
    /* A compute model (chapter 12's layer timings; 0: off): each chunk's product takes at
     * least its FLOPs / model_flops seconds, so that the ratio of compute to the
     * modelled wire is a chosen GPU's, not a shared CPU's. */
    double model_flops;
} tp_overlap;

/* Holds the calling rank until its product of `flops`, begun at t0, would be done on
 * the compute model (nothing when model_flops is 0). */
void tp_overlap_hold(const tp_overlap *o, double t0, double flops);

/* Why `chunks` chunks are refused (one line), or NULL: at most T / t, a rank's positions
 * of one sequence, so that every batch size splits (the code takes up to B T / t). */
const char *tp_overlap_check(int chunks, int T, int t, char *why, size_t len);

/* out_local[B T, OC_local] = (every rank's inp_rows[B T / t, IC], gathered in sequence
 * order) @ w_local^T + b_local; IC = C. */
void tp_overlap_column_forward(const tp_overlap *o, void *out_local, const void *inp_rows,
                               const void *w_local, const void *b_local, int IC,
                               int OC_local);
/* out_rows[B T / t, OC] = this rank's positions of the sum over ranks of
 * inp_local[B T, IC_local] @ w_local^T (+ bias on tp rank 0); OC = C. */
void tp_overlap_row_forward(const tp_overlap *o, void *out_rows, const void *inp_local,
                            const void *w_local, const void *bias, int IC_local, int OC);

/* ---- backward (Megatron's TP communication overlap; Wang et al. 2022) ------------------
 * Row-parallel: dY's all-gather in chunks, dX's product of chunk k (its rows alone) while
 * chunk k+1 is on the wire; the chunks land in sequence order in `partial` too, and dW,
 * db are one product of every row once the last has arrived. Exposed: the first chunk.
 * Column-parallel: the input's all-gather for dW in chunks, each chunk hidden under dX's
 * product of one chunk of rows (dX needs no gathered data); chunk k's dX reduce-scatter
 * starts once its rows are computed and the gathers of chunk k+1 are queued; dW, db are
 * one product of every row, under the last reduce-scatters. Exposed: none, while a
 * chunk's dX product outlasts a chunk's gather and reduce-scatter, and dW outlasts the
 * last reduce-scatter.
 * Why dW is not a product per chunk as it arrives: that splits the GEMM's sum over rows
 * into one sum per chunk added into dW, which rounds differently (fp32 sums in another
 * order); whole, every number is the plain layer's to the bit in 16 bits. */
/* dinp_local[B T, IC_local] = dY @ w_local, dw += dY^T inp_local, db += column sums of
 * dY, where dY[B T, OC] is every rank's dout_rows[B T / t, OC] gathered (left in
 * `partial`, sequence order); OC = C. dinp_local, dw, db may be NULL. */
void tp_overlap_row_backward(const tp_overlap *o, void *dinp_local, float *dw, float *db,
                             const void *dout_rows, const void *inp_local,
                             const void *w_local, int IC_local, int OC);
/* dinp_rows[B T / t, IC] = this rank's positions of the ranks' summed dout_local @ w_local;
 * dw += dout_local^T inp, db += column sums of dout_local, where inp[B T, IC] is every
 * rank's inp_rows gathered; IC = C. dinp_rows, or dw with db, may be NULL. */
void tp_overlap_column_backward(const tp_overlap *o, void *dinp_rows, float *dw, float *db,
                                const void *dout_local, const void *inp_rows,
                                const void *w_local, int IC, int OC_local);

#endif
