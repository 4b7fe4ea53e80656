/* What the MoE layer's files share (moe.c, moe_route.c, moe_exchange.c, moe_experts.c):
 * not for callers. */
#ifndef MOE_INTERNAL_H
#define MOE_INTERNAL_H
#include <stddef.h>

#include "moe.h"
#include "precision.h"

/* One MoE block's routing and activations for one micro-batch slot, kept from its
 * forward to its backward. A pair a = n k + j is token n's j-th choice. */
typedef struct {
    const void *ln2;       /* the block's input [N, C] (the model's activation, of p) */
    float *probs;          /* [N, E] router softmax */
    int *expert;           /* [N k] the chosen expert of each pair */
    float *gate;           /* [N k] */
    int *pos;              /* [N k] the pair's row in the sent order, -1 when dropped */
    int *order;            /* [sent] kept pairs sorted by expert, then by pair */
    int sent;              /* kept pairs */
    size_t *send_per_expert;     /* [E] kept pairs for each expert */
    size_t *recv_per_source;     /* [EP x El] rows from EP rank s for local expert j */
    size_t rows_local;           /* rows this rank's experts process */
    float *y;              /* [N k, C] the experts' outputs, in sent order */
    float *x_in;           /* [rows, C] this rank's experts' inputs, expert by expert */
    float *h_act;          /* [rows, H] fc's output, then GELU's derivative */
    float *h_gelu;         /* [rows, H] GELU's output */
    /* the global micro-batch's statistics (every rank's micro-batch of this slot) */
    double *load;          /* [E] pairs routed, before dropping */
    double *first;         /* [E] tokens whose first choice it is */
    double *prob_sum;      /* [E] router probability summed over tokens */
    double dropped, aux;
} moe_block_state;

/* One MoE block's statistics summed over the step's micro-batches (a pipeline stage
 * runs its own MoE blocks alone: runs 0 for the others'). */
typedef struct {
    double *load;          /* [E] pairs routed, before dropping */
    double dropped, aux;   /* aux: summed; the step's is aux / runs */
    int runs;              /* micro-batches forwarded */
} moe_block_step;

struct moe_layer {
    moe_shape s;
    moe_layer_options opts;
    int N;                 /* tokens a micro-batch on this rank */
    precision p;           /* of the hook's last call: the model's */
    size_t max_rows;       /* rows a rank's experts may receive: EP x N x k */
    const float *routers, *experts;
    float *router_grads, *expert_grads;
    float dloss;
    double capacity, remote_rows, exchanged_rows;   /* rows: this step's, every block */
    moe_block_state *blocks;   /* [slots x moe_layers]: slot k's block i at k L + i */
    int slots;             /* micro-batch slots allocated (as the model's, on first use) */
    moe_block_step *steps;     /* [moe_layers] */
    int experts16_fresh;   /* 16 bits: experts16 holds this step's experts, rounded
                              (cleared at every step's start) */
    /* scratch shared by the blocks */
    float *send, *recv, *rows, *d_rows, *d_h;
    float *dgate, *dprobs, *d_ln2_router;
    size_t *send_rows, *recv_rows;      /* [EP] per peer */
    size_t *send_offsets, *recv_offsets;
    double *gathered;      /* [(2 + world) x E] statistics scratch */
    /* 16 bits (moe_mixed.c), allocated at the first 16-bit call */
    void *experts16;       /* this rank's experts rounded: the products' weights */
    float *ln2_32, *io32;  /* [N, C]: the input widened; the output or d out in fp32 */
    void *x16, *y16, *h16; /* [max_rows, C], [max_rows, C], [max_rows, H] in p */
    gpt_mlp_hook hook;
};

/* moe_route.c: router, top-k, capacity and the global statistics; and the router's
 * backward (gates, the auxiliary loss, softmax, the linear). */
/* ln2: the block's input in fp32 (the model's, or its widening) */
void moe_route(moe_layer *m, moe_block_state *b, int moe_layer, const float *ln2);
void moe_route_backward(moe_layer *m, moe_block_state *b, int moe_layer, const float *ln2,
                        float *d_ln2);

/* moe_exchange.c: the rows of the sent order to the experts' ranks and back. */
/* Learns recv_per_source from send_per_expert (an all-to-all of El counts a peer). */
void moe_exchange_plan(moe_layer *m, moe_block_state *b);
/* Dispatch: send [sent, C] (sent order) -> rows [rows_local, C] (expert order). */
void moe_dispatch(moe_layer *m, moe_block_state *b, const float *send, float *rows);
/* Combine: rows [rows_local, C] (expert order) -> out [sent, C] (sent order). */
void moe_combine(moe_layer *m, moe_block_state *b, const float *rows, float *out);

/* moe_experts.c: this rank's experts on their rows (expert order); in 16 bits
 * (m->p) their products multiply 16-bit rows by the 16-bit experts and sum in fp32
 * (mixed_linear_*), the rows travelling and kept in fp32 between them. */
void moe_experts_forward(moe_layer *m, moe_block_state *b, int moe_layer, float *y_rows);
void moe_experts_backward(moe_layer *m, moe_block_state *b, int moe_layer,
                          const float *dy_rows, float *dx_rows);

#endif

/* moe_mixed.c: the 16-bit layer's buffers and conversions. */
void moe_mixed_ensure(moe_layer *m);            /* allocates them at the first 16-bit call */
void moe_mixed_free(moe_layer *m);
void moe_mixed_round_experts(moe_layer *m);     /* experts16 = the fp32 experts, rounded */
/* An expert's tensor inside experts16: the element offset of t in the fp32 vector. */
const void *moe_mixed_weight(const moe_layer *m, const float *t);
