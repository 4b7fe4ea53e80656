/* Megatron sequence parallelism (Korthikanti et al. 2022) on the tensor-parallel group.
 *
 * TP leaves the LayerNorms and the residual stream replicated: every rank holds all
 * B x T tokens there. SP splits that region along the sequence instead: rank r of t
 * holds positions [r T/t, (r+1) T/t) of every sequence, rows [B, T/t, C]. The tensor-
 * parallel region in between still needs every token, so two operators join them:
 *   g      all-gather along the sequence before a column-parallel linear;
 *          its backward: reduce-scatter of the input gradient
 *   g-bar  reduce-scatter along the sequence after a row-parallel linear (the sum of
 *          the ranks' partial products, each rank keeping its positions);
 *          its backward: all-gather of the output gradient
 * They replace TP's all-reduces (f backward, g forward): a ring all-reduce IS a
 * reduce-scatter followed by an all-gather, so the wire carries the same bytes.
 *
 * The column-parallel layers keep their input as the paper does, split (the LayerNorm
 * output, 1/t of it), and all-gather it again in backward for their weight gradient
 * (Korthikanti et al. 2022, section 4.2.2): one all-gather more per column-parallel
 * layer, the price of keeping 1/t of the activations.
 *
 * The LayerNorms' weight gradients are partial sums (each rank saw 1/t of the tokens):
 * they are summed over the group (tp_sequence_sum_grads), as Megatron-LM does. */
#ifndef TP_SEQUENCE_H
#define TP_SEQUENCE_H
#include <stddef.h>

#include "comm.h"
#include "model.h"
#include "precision.h"

typedef struct tp_sequence tp_sequence;

/* The state of SP for model shape s on group tp, micro-batches [B, T, C] in precision
 * p: scratch for the gathered rows. As this model runs it SP needs tp > 1 dividing T
 * and a whole model (programs refuse anything else before a rank starts:
 * tp_sequence_check). copy_not_reduce: negative control, g-bar copies this rank's rows
 * of its own partial sum instead of reduce-scattering. */
tp_sequence *tp_sequence_create(const gpt_shape *s, comm *tp, precision p, int B, int T,
                                int copy_not_reduce);
void tp_sequence_free(tp_sequence *sp);
/* g before a column-parallel linear and g-bar after a row-parallel one, forward and
 * backward, as collective matmuls in `chunks` chunks (tp_overlap.h; control: its
 * negative controls); chunks 0: as above. */
void tp_sequence_set_overlap(tp_sequence *sp, int chunks, int control);
/* The collective matmuls' settings, for a caller that sets their compute model. */
struct tp_overlap *tp_sequence_overlap(tp_sequence *sp);
/* Rows (tokens) a rank holds in the sequence-parallel region: B T / t, or N without SP
 * (sp NULL). First position of this rank's part of each sequence, and its length. */
int tp_sequence_rows(const tp_sequence *sp, int N);
int tp_sequence_first_position(const tp_sequence *sp);
int tp_sequence_length(const tp_sequence *sp, int T);

/* g: out[B, T, C] = every rank's local[B, T/t, C], positions in order. */
void tp_sequence_all_gather(tp_sequence *sp, void *out, const void *local);
/* g-bar: local[B, T/t, C] = this rank's positions of the sum over ranks of full[B, T, C]. */
void tp_sequence_reduce_scatter(tp_sequence *sp, void *local, const void *full);
/* Into the sequence-parallel region: this rank's positions of full[B, T, C], summed over
 * the ranks when each holds a partial sum (g-bar: the vocab-parallel embedding, and the
 * vocab-parallel head's input gradient), else taken as they are (every rank holds the
 * same numbers: the embedding and head of a vocabulary held whole, in 16 bits). */
void tp_sequence_split(tp_sequence *sp, void *local, const void *full, int summed);
/* A [B, T, C] buffer of the sp's for a row-parallel output's partial sums or a
 * column-parallel input's gradient (one at a time). */
void *tp_sequence_scratch(tp_sequence *sp);
/* LayerNorm backward on the rows this rank holds (mixed_layernorm_backward's
 * arguments; dweight_bias: [2 C], the weight's gradient then the bias's). With SP the
 * rows are 1/t of the tokens, so this rank's share of the two gradients is summed over
 * the group before it is added (micro-batches accumulate as without SP). */
void tp_sequence_layernorm_backward(tp_sequence *sp, precision p, void *dinp,
                                    float *dweight_bias, const void *dout, const void *inp,
                                    const void *weight, const float *mean, const float *rstd,
                                    int rows, int C);

/* ---- the linear layers at the region's edges (rows: whole sequences, N = B T) ------ */
/* Column-parallel with its input split along the sequence: gathered (g), then
 * out_local[N, OC_local] = inp @ W_local^T + b_local. Without SP (sp NULL): plain
 * column_parallel_forward. */
void tp_sequence_column_forward(tp_sequence *sp, precision p, void *out_local,
                                const void *inp_rows, const void *w_local,
                                const void *b_local, int N, int IC, int OC_local);
/* Its backward: the input gathered again for dW; dinp_rows[N/t, IC] = this rank's
 * positions of the ranks' summed input gradients (g backward: reduce-scatter). Without
 * SP: column_parallel_backward over group f (NULL: no all-reduce). */
void tp_sequence_column_backward(tp_sequence *sp, comm *f, precision p, void *dinp_rows,
                                 float *dw, float *db, const void *dout_local,
                                 const void *inp_rows, const void *w_local, int N, int IC,
                                 int OC_local);
/* Row-parallel: out_rows[N/t, OC] = this rank's positions of the sum of the ranks'
 * partial products (g-bar), the bias counted once (tp rank 0's). Without SP: plain
 * row_parallel_forward over tp. */
void tp_sequence_row_forward(tp_sequence *sp, comm *tp, precision p, void *out_rows,
                             const void *inp_local, const void *w_local, const void *bias,
                             int N, int IC_local, int OC);
/* Its backward: dout gathered (g-bar backward), then row_parallel_backward. */
void tp_sequence_row_backward(tp_sequence *sp, precision p, void *dinp_local, float *dw,
                              float *db, const void *dout_rows, const void *inp_local,
                              const void *w_local, int N, int IC_local, int OC);

#endif
