/* What the MoE layer's files share (moe.c, moe_route.c, moe_exchange.c, moe_experts.c):
 * not for callers. */
#ifndef MOE_INTERNAL_H
#define MOE_INTERNAL_H
#include <stddef.h>

#include "moe.h"

/* One MoE block's routing and activations, kept from its forward to its backward.
 * A pair a = n k + j is token n's j-th choice. */
typedef struct {
    const float *ln2;      /* the block's input [N, C] (the model's activation) */
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
    /* global-batch statistics of the last forward */
    double *load;          /* [E] pairs routed, before dropping */
    double *first;         /* [E] tokens whose first choice it is */
    double *prob_sum;      /* [E] router probability summed over tokens */
    double dropped, aux;
} moe_block_state;

struct moe_layer {
    moe_shape s;
    moe_layer_options opts;
    int N;                 /* tokens a micro-batch on this rank */
    size_t max_rows;       /* rows a rank's experts may receive: EP x N x k */
    const float *routers, *experts;
    float *router_grads, *expert_grads;
    float dloss;
    double capacity, remote_rows, exchanged_rows;   /* rows: this step's, every block */
    moe_block_state *blocks;   /* [moe_layers] */
    /* scratch shared by the blocks */
    float *send, *recv, *rows, *d_rows, *d_h;
    float *dgate, *dprobs, *d_ln2_router;
    size_t *send_rows, *recv_rows;      /* [EP] per peer */
    size_t *send_offsets, *recv_offsets;
    double *gathered;      /* [(2 + world) x E] statistics scratch */
    gpt_mlp_hook hook;
};

/* moe_route.c: router, top-k, capacity and the global statistics; and the router's
 * backward (gates, the auxiliary loss, softmax, the linear). */
void moe_route(moe_layer *m, moe_block_state *b, int moe_layer, const float *ln2);
void moe_route_backward(moe_layer *m, moe_block_state *b, int moe_layer, float *d_ln2);

/* moe_exchange.c: the rows of the sent order to the experts' ranks and back. */
/* Learns recv_per_source from send_per_expert (an all-to-all of El counts a peer). */
void moe_exchange_plan(moe_layer *m, moe_block_state *b);
/* Dispatch: send [sent, C] (sent order) -> rows [rows_local, C] (expert order). */
void moe_dispatch(moe_layer *m, moe_block_state *b, const float *send, float *rows);
/* Combine: rows [rows_local, C] (expert order) -> out [sent, C] (sent order). */
void moe_combine(moe_layer *m, moe_block_state *b, const float *rows, float *out);

/* moe_experts.c: this rank's experts on their rows (expert order). */
void moe_experts_forward(moe_layer *m, moe_block_state *b, int moe_layer, float *y_rows);
void moe_experts_backward(moe_layer *m, moe_block_state *b, int moe_layer,
                          const float *dy_rows, float *dx_rows);

#endif
