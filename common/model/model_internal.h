/* Inside the model (model.c, model_instance.c): its activations in micro-batch slots and
 * the instance that holds them. Not for use outside common/model/. */
#ifndef MODEL_INTERNAL_H
#define MODEL_INTERNAL_H
#include <stddef.h>

#include "model.h"
#include "tp_sequence.h"

/* Activations and their gradients are held in the model's precision (void *: elements
 * of m->p); LayerNorm statistics and the per-token losses are fp32 in every precision
 * (float *). */
typedef struct {
    void *ln1, *qkv, *att, *atty;
    float *ln1_mean, *ln1_rstd;
    void *x_mid;       /* residual stream after attention */
    void *ln2;
    float *ln2_mean, *ln2_rstd;
    void *dgelu;       /* fc's output, replaced by GELU's derivative there (gelu_forward) */
    void *fch_gelu;    /* GELU's output, fc2's input; both NULL where a hook replaces the
                          block's MLP (model_mlp_replaced) */
    void *ln2_whole;   /* SP with a replaced MLP: ln2 of the TP group's rows [N, C], the
                          hook's input, kept for its backward (NULL otherwise) */
} block_acts;

/* What a block's weight gradients need from its backward when they are computed
 * later (gpt_backward_weights): the output gradient of each of its four linears. */
typedef struct {
    void *d_fc2_out, *d_fch, *d_proj_out, *d_qkv;
} block_douts;

/* One micro-batch's activations on this stage. */
typedef struct {
    int *tokens, *targets;   /* on the device */
    void **x;                /* x[i]: input of the stage's block i; x[n]: its output */
    block_acts *acts;        /* one per block (none when checkpointing: see below) */
    void *lnf, *logits;      /* last stage only */
    float *lnf_mean, *lnf_rstd, *losses;
    void *d_out;             /* d(output) received from the next stage */
    void *d_in;              /* d(input), to send to the previous stage (first stage
                                with split backward: what the embedding's W needs) */
    block_douts *douts;      /* split backward only: per block, allocated on first use */
} micro_slot;

struct gpt_model {
    gpt_shape shape;
    gpt_model_options opts;
    precision p;             /* opts.precision */
    int B, T;
    int max_slots;
    micro_slot *slots;       /* [max_slots]; a slot's x is NULL until its first use */
    micro_slot *slot;        /* the current one */
    block_acts *recompute;   /* checkpointing: one block's activations, rebuilt in backward */
    int *host_batch;         /* host staging for tokens and targets: 2 x B*T */
    /* backward scratch, shared by all blocks and slots */
    void *dx;                /* gradient of the residual stream, walked back in place */
    void *d_ln, *d_atty, *d_qkv, *d_att;
    void *d_fch, *d_fch_gelu;   /* NULL where a hook replaces every MLP of the stage */
    tp_sequence *sp;         /* sequence parallelism; NULL without */
    void *hook_rows[2];      /* SP with a replaced MLP: its whole output [N, C] (forward),
                                or d out and d ln2 gathered / whole (backward) */
    void *att_again;         /* selective recomputation: one block's probabilities */
    float *logits32;         /* a 16-bit vocab-parallel head's fp32 logits [N, vocab_local] */
};

/* Whether the options' MLP hook replaces block `layer`'s MLP (an MoE layer). */
int model_mlp_replaced(const gpt_model *m, int layer);
/* Tokens a rank holds in the LayerNorm / residual region: B T, or B T / tp with SP. */
size_t model_rows_held(const gpt_model *m);
/* n activations in the model's precision (on the device, tagged activations) */
void *model_alloc_acts(const gpt_model *m, size_t n);

#endif
