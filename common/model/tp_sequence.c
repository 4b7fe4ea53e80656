/* Megatron sequence parallelism: the g and g-bar operators and the linear layers at the
 * edges of the sequence-parallel region (tp_sequence.h).
 *
 * Rows are held [B, T, C] (whole sequences) in the tensor-parallel region and
 * [B, T/t, C] (this rank's positions of each sequence) in the sequence-parallel one.
 * The collectives move rank-major pieces, [t][B, T/t, C]; `stacked` holds that order
 * and two copies turn it into sequence order and back. */
#include "tp_sequence.h"

#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "ops.h"
#include "ops_mixed.h"
#include "tp_linear.h"
#include "tp_overlap.h"

struct tp_sequence {
    comm *tp;
    precision p;
    int t, rank, B, T, C;
    int copy_not_reduce;
    void *stacked;    /* [t][B, T/t, C]: what the collectives send and receive */
    void *gathered;   /* [B, T, C]: a column-parallel layer's gathered input */
    void *partial;    /* [B, T, C]: partial sums, or a gathered output gradient */
    float *grad_part; /* [2 C]: a LayerNorm's weight and bias gradients on my rows */
    tp_overlap overlap;   /* chunks > 0: the edges as collective matmuls */
};

tp_overlap *tp_sequence_overlap(tp_sequence *sp) { return &sp->overlap; }

void tp_sequence_set_overlap(tp_sequence *sp, int chunks, int control) {
    sp->overlap = (tp_overlap){.tp = sp->tp, .p = sp->p, .t = sp->t, .rank = sp->rank,
                               .B = sp->B, .T = sp->T, .C = sp->C, .gathered = sp->gathered,
                               .partial = sp->partial, .sequence = sp->stacked,
                               .chunks = chunks,
                               .control = (tp_overlap_control)control,
                               .model_flops = sp->overlap.model_flops};
}

tp_sequence *tp_sequence_create(const gpt_shape *s, comm *tp, precision p, int B, int T,
                                int copy_not_reduce) {
    if (!tp || s->tp_size < 2 || T % s->tp_size) {
        fprintf(stderr, "error: sequence parallelism needs tp > 1 dividing T %d\n", T);
        abort();
    }
    const int C = s->cfg.dim;
    tp_sequence *sp = mem_alloc(MEM_OTHER, sizeof *sp);
    const size_t full = (size_t)B * T * C * precision_bytes(p);
    *sp = (tp_sequence){.tp = tp, .p = p, .t = comm_size(tp), .rank = comm_rank(tp), .B = B,
                        .T = T, .C = C, .copy_not_reduce = copy_not_reduce};
    /* scratch shared by every layer: activations, but none of them kept */
    sp->stacked = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, full);
    sp->gathered = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, full);
    sp->partial = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, full);
    sp->grad_part = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, 2 * (size_t)C * sizeof(float));
    return sp;
}

void tp_sequence_free(tp_sequence *sp) {
    if (!sp) return;
    mem_free(sp->stacked);
    mem_free(sp->gathered);
    mem_free(sp->partial);
    mem_free(sp->grad_part);
    mem_free(sp);
}

int tp_sequence_rows(const tp_sequence *sp, int N) { return sp ? N / sp->t : N; }
int tp_sequence_first_position(const tp_sequence *sp) {
    return sp ? sp->rank * (sp->T / sp->t) : 0;
}
int tp_sequence_length(const tp_sequence *sp, int T) { return sp ? T / sp->t : T; }
void *tp_sequence_scratch(tp_sequence *sp) { return sp->partial; }

/* Copies between sequence order [B, T, C] and rank-major order [t][B, T/t, C]. */
typedef enum { TO_RANK_MAJOR, TO_SEQUENCE } reorder_direction;

static void reorder(const tp_sequence *sp, void *sequence, void *rank_major,
                    reorder_direction dir) {
    const size_t Tl = (size_t)sp->T / sp->t, C = sp->C, piece = (size_t)sp->B * Tl * C;
    for (size_t r = 0; r < (size_t)sp->t; r++)
        for (size_t b = 0; b < (size_t)sp->B; b++) {
            void *in_sequence = precision_at(sp->p, sequence, (b * sp->T + r * Tl) * C);
            void *in_ranks = precision_at(sp->p, rank_major, r * piece + b * Tl * C);
            if (dir == TO_RANK_MAJOR) mixed_vec_copy(sp->p, in_ranks, in_sequence, Tl * C);
            else mixed_vec_copy(sp->p, in_sequence, in_ranks, Tl * C);
        }
}

void tp_sequence_all_gather(tp_sequence *sp, void *out, const void *local) {
    const size_t n = (size_t)sp->B * sp->T * sp->C;
    comm_allgather(sp->tp, local, sp->stacked, n, comm_dtype_of(sp->p));
    reorder(sp, out, sp->stacked, TO_SEQUENCE);
}

void tp_sequence_reduce_scatter(tp_sequence *sp, void *local, const void *full) {
    const size_t n = (size_t)sp->B * sp->T * sp->C, piece = n / sp->t;
    reorder(sp, (void *)full, sp->stacked, TO_RANK_MAJOR);
    if (sp->copy_not_reduce)   /* negative control: my own partial, never summed */
        mixed_vec_copy(sp->p, local, precision_at(sp->p, sp->stacked, sp->rank * piece), piece);
    else
        comm_reduce_scatter(sp->tp, sp->stacked, local, n, comm_dtype_of(sp->p), COMM_SUM);
}

void tp_sequence_split(tp_sequence *sp, void *local, const void *full, int summed) {
    if (summed) {
        tp_sequence_reduce_scatter(sp, local, full);
        return;
    }
    const size_t Tl = (size_t)sp->T / sp->t, C = sp->C;
    for (size_t b = 0; b < (size_t)sp->B; b++)   /* my positions of each sequence */
        mixed_vec_copy(sp->p, precision_at(sp->p, local, b * Tl * C),
                       precision_at(sp->p, full, (b * sp->T + sp->rank * Tl) * C), Tl * C);
}

void tp_sequence_layernorm_backward(tp_sequence *sp, precision p, void *dinp,
                                    float *dweight_bias, const void *dout, const void *inp,
                                    const void *weight, const float *mean, const float *rstd,
                                    int rows, int C) {
    if (!sp) {
        mixed_layernorm_backward(p, dinp, dweight_bias, dweight_bias + C, dout, inp, weight,
                                 mean, rstd, rows, C);
        return;
    }
    float *part = sp->grad_part;   /* my rows' share alone, then everyone's */
    vec_zero(part, 2 * (size_t)C);
    mixed_layernorm_backward(p, dinp, part, part + C, dout, inp, weight, mean, rstd, rows, C);
    comm_allreduce(sp->tp, part, 2 * (size_t)C, COMM_F32, COMM_SUM);
    vec_add(dweight_bias, part, 2 * (size_t)C);
}

/* ---- the linear layers at the region's edges ---------------------------------------- */

void tp_sequence_column_forward(tp_sequence *sp, precision p, void *out_local,
                                const void *inp_rows, const void *w_local,
                                const void *b_local, int N, int IC, int OC_local) {
    const void *inp = inp_rows;
    if (sp && sp->overlap.chunks > 0 && IC == sp->C) {   /* g as a collective matmul */
        tp_overlap_column_forward(&sp->overlap, out_local, inp_rows, w_local, b_local, IC,
                                  OC_local);
        return;
    }
    if (sp) {   /* g: every position of the sequence, for my output columns */
        tp_sequence_all_gather(sp, sp->gathered, inp_rows);
        inp = sp->gathered;
    }
    column_parallel_forward(p, out_local, inp, w_local, b_local, N, IC, OC_local);
}

void tp_sequence_column_backward(tp_sequence *sp, comm *f, precision p, void *dinp_rows,
                                 float *dw, float *db, const void *dout_local,
                                 const void *inp_rows, const void *w_local, int N, int IC,
                                 int OC_local) {
    if (!sp) {
        column_parallel_backward(f, p, dinp_rows, dw, db, dout_local, inp_rows, w_local, N,
                                 IC, OC_local);
        return;
    }
    if (sp->overlap.chunks > 0 && IC == sp->C && !sp->copy_not_reduce) {
        tp_overlap_column_backward(&sp->overlap, dinp_rows, dw, db, dout_local, inp_rows,
                                   w_local, IC, OC_local);
        return;
    }
    /* the input was kept split: gathered again for dW = dout^T inp (section 4.2.2); a
     * split backward's input half (dw NULL) needs no input, its weight half gathers */
    if (dw) tp_sequence_all_gather(sp, sp->gathered, inp_rows);
    void *dinp = dinp_rows ? sp->partial : NULL;   /* my part of every position's sum */
    column_parallel_backward(NULL, p, dinp, dw, db, dout_local, sp->gathered, w_local, N, IC,
                             OC_local);
    if (dinp_rows) tp_sequence_reduce_scatter(sp, dinp_rows, dinp);   /* g backward */
}

void tp_sequence_row_forward(tp_sequence *sp, comm *tp, precision p, void *out_rows,
                             const void *inp_local, const void *w_local, const void *bias,
                             int N, int IC_local, int OC) {
    if (!sp) {
        row_parallel_forward(tp, p, out_rows, inp_local, w_local, bias, N, IC_local, OC);
        return;
    }
    if (sp->overlap.chunks > 0 && OC == sp->C && !sp->copy_not_reduce) {
        tp_overlap_row_forward(&sp->overlap, out_rows, inp_local, w_local, bias, IC_local, OC);
        return;
    }
    /* my partial product of every position, the bias in rank 0's (counted once) */
    mixed_linear_forward(p, sp->partial, inp_local, w_local, sp->rank == 0 ? bias : NULL, N,
                         IC_local, OC);
    tp_sequence_reduce_scatter(sp, out_rows, sp->partial);   /* g-bar */
}

void tp_sequence_row_backward(tp_sequence *sp, precision p, void *dinp_local, float *dw,
                              float *db, const void *dout_rows, const void *inp_local,
                              const void *w_local, int N, int IC_local, int OC) {
    const void *dout = dout_rows;
    if (sp && sp->overlap.chunks > 0 && OC == sp->C) {   /* g-bar backward, in chunks */
        tp_overlap_row_backward(&sp->overlap, dinp_local, dw, db, dout_rows, inp_local,
                                w_local, IC_local, OC);
        return;
    }
    if (sp) {   /* g-bar backward: every position's output gradient */
        tp_sequence_all_gather(sp, sp->partial, dout_rows);
        dout = sp->partial;
    }
    row_parallel_backward(p, dinp_local, dw, db, dout, inp_local, w_local, N, IC_local, OC);
}
