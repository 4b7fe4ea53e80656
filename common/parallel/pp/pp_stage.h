/* One pipeline stage on one rank: the blocks it holds (parameters, gradients and
 * AdamW state for them alone), its model with a slot per micro-batch in flight, and
 * the point-to-point traffic with its neighbours.
 *
 * Stages are virtual: with v model chunks per rank (interleaved schedules) the
 * pipeline has v x p stages, and virtual stage k runs on rank k % p of the pipeline
 * group (chunk k / p of that rank). Without interleaving, v = 1 and stage = rank. In a
 * V (zb-v, vshape) the two chunks of rank r are stages r and 2p-1-r.
 *
 *   forward of micro-batch i on stage k:   recv x from stage k-1 (unless k = 0),
 *                                          blocks, send x to stage k+1 (unless last)
 *   backward:                              recv dx from stage k+1 (unless last),
 *                                          blocks in reverse, send dx to stage k-1
 *
 * The first and the last stage both hold the tied token embedding; after the last
 * backward of a step, pp_stage_reduce_tied_grads sums its two gradients over the
 * embedding group, so both copies take the same optimizer step. */
#ifndef PP_STAGE_H
#define PP_STAGE_H

#include "comm.h"
#include "data.h"
#include "model.h"
#include "baseline.h"
#include "replica.h"

typedef struct {
    int stage, stages;     /* virtual stage and how many (v x p) */
    gpt_shape shape;       /* this stage's blocks (and TP slice) */
    replica rep;           /* the stage's parameters, gradients, AdamW moments */
    int owns_state;        /* rep's vectors are the stage's own (else a view) */
    gpt_model *model;      /* activations: one slot per micro-batch in flight */
    comm *pp;              /* pipeline group: virtual stage k is rank k % size */
    int micro_batch, T;    /* sequences per micro-batch, tokens per sequence */
    size_t boundary_numel; /* one micro-batch's activations: micro_batch x T x dim
                              (x 1/tp with sequence parallelism) */
    precision precision;   /* of the model: its boundary tensors travel in it */
    int drop_input_grad;   /* negative control: sends zeros instead of d(input) */
    int vshape;            /* the chunks are placed in a V (pp_schedule.h) */
    /* A CP rank (model_opts' positions set): its model holds the span's rows of each
     * sequence (T of them), read from whole sequences of T_whole tokens staged here. */
    const position_span *span;
    int T_whole;
    int *whole_batch;      /* host: tokens and targets of micro_batch whole sequences */
} pp_stage;

/* Makes virtual stage `stage` of `stages` over the pipeline group pp: blocks split as
 * gpt_shape_split_stages does, from `whole` (the model, possibly a TP slice). T: the
 * sequence's tokens (with model_opts' positions, a CP span: the model holds its rows).
 * max_in_flight: micro-batch slots to allow. model_opts may be NULL. owns_state: rep is the
 * stage's own replica (parameters, gradients, AdamW moments; in mixed precision AdamW's
 * pass writes its compute weights, replica_compute_params rounds them before the first
 * step); 0: rep holds the shape alone, and its owner (the pipeline's dp_grads.h) points
 * rep.compute (what forward and backward read), rep.params (the fp32 masters, where whole)
 * and rep.grads at the step's whole vectors. */
void pp_stage_init(pp_stage *st, comm *pp, const gpt_shape *whole, int stage, int stages,
                   int micro_batch, int T, int max_in_flight, uint64_t seed,
                   const gpt_model_options *model_opts, int owns_state);
void pp_stage_free(pp_stage *st);

int pp_stage_is_first(const pp_stage *st);
int pp_stage_is_last(const pp_stage *st);
int pp_stage_rank_of(const pp_stage *st, int stage);   /* rank in pp of a virtual stage */

/* The pieces a schedule is made of, on micro-batch slot `slot`. */
void pp_recv_input(pp_stage *st, int slot);
/* into a buffer of boundary_numel elements of the stage's precision */
void pp_recv_input_into(pp_stage *st, void *x);
/* One boundary buffer's bytes: boundary_numel elements of the stage's precision. */
size_t pp_boundary_bytes(const pp_stage *st);
void pp_send_output(pp_stage *st, int slot);
void pp_recv_output_grad(pp_stage *st, int slot);
/* d(input) from dx (the model's gpt_stage_input_grad, or a copy kept for later). */
void pp_send_input_grad(pp_stage *st, const void *dx);
/* Forward of the micro-batch made of sequences [first, first + micro_batch) of step
 * `step`'s global batch (the first stage reads the tokens, the last the targets).
 * Returns the micro-batch's mean loss on the last stage, 0 elsewhere. */
float pp_forward(pp_stage *st, int slot, const dataset *data, const run_config *cfg,
                 int step, int first);
/* Backward of the micro-batch in `slot`; gradients accumulate in st->rep.grads (or,
 * where that is NULL, rep.grads16: each slab rounded into them as it is done). */
void pp_backward(pp_stage *st, int slot, float dloss, gpt_slab_ready_fn on_slab_ready,
                 void *ctx);

/* Sums the tied weight's gradient over the embedding group, the first and the last
 * stage of this pipeline (mesh.h makes it; no-op for NULL). */
void pp_stage_reduce_tied_grads(pp_stage *st, comm *embedding);

/* For checking (collective over pp): the whole model's vector (parameters or
 * gradients, as `which` picks) assembled on the host of every rank from the stages'
 * slabs. `chunks` are this rank's v stages. HEAD copies are left out (the first
 * stage's embedding is the value); returns the largest difference between a HEAD copy
 * and that value, the tied weight's drift. */
typedef enum { PP_PARAMS, PP_GRADS } pp_vector;
double pp_gather_whole(comm *pp, pp_stage *chunks, int v, pp_vector which, float *whole);

#endif
