/* A mixture-of-experts MLP (Switch Transformer, GShard, Mixtral): in an MoE block the
 * MLP is E experts, each an MLP of the model's shape (C -> 4C -> GELU -> C), and a
 * router that sends every token to k of them.
 *
 *   logits = ln2 @ router^T             [N, E]   (no bias)
 *   p      = softmax(logits)            [N, E]
 *   top-k  the k largest p, ties to the lowest expert index, so every strategy routes
 *          the same tokens the same way
 *   gates  k = 1: g = p_e (Switch); k = 2: g_j = p_j / (p_1 + p_2), renormalised over
 *          the two chosen as Mixtral (and GShard) do
 *   out[n] = sum_j g_nj expert_{e_nj}(ln2[n])
 *
 * Capacity (capacity factor c > 0): each expert takes at most ceil(c x tokens x k / E)
 * of the global batch's (token, choice) pairs, first come first served in token order
 * (token n's choices before token n+1's); a pair beyond it is dropped: its expert
 * output is zero and the block's residual carries the token alone. c = 0: no dropping.
 * Counting over the global batch (every rank's tokens in world-rank order) makes the
 * same pairs drop on one device and on any EP x DP mesh.
 *
 * The auxiliary load-balancing loss (Switch eq. 4, GShard): aux = a E sum_e f_e P_e,
 * f_e the fraction of tokens whose first choice is e, P_e the mean router probability
 * of e, both over the global batch; a = --aux-loss. Its gradient flows through P only.
 *
 * Micro-batches (gradient accumulation), as Megatron-core: the "global batch" above is
 * the global micro-batch (every data-parallel rank's micro-batch of one index): routing,
 * capacity and the auxiliary loss are each micro-batch's, and the step's auxiliary loss
 * is the mean of its micro-batches' as the main loss is. One device accumulating the
 * same micro-batches is the reference; with a = 0 and no capacity that equals the whole
 * batch at once (the routing is per token then).
 *
 * Expert parallelism: the E experts are split over an EP group, E / EP consecutive
 * experts a rank; tokens go to their experts and come back with all-to-alls
 * (moe_exchange.c). With an EP group of one the same code runs without communication:
 * that is the single-device MoE.
 *
 * Precision: in the model's bf16 or fp16 (the hook's p) the router works in fp32 on the
 * widened input (logits, softmax, top-k, gates, the auxiliary loss: Megatron-core's
 * fp32 router), the experts' products multiply 16-bit rows by a 16-bit copy of the
 * experts (rounded from the fp32 masters at each micro-batch's first MoE block) and
 * sum in fp32, each expert output rounded once, as the model's own 16-bit MLP; the gated
 * sum is fp32, rounded once into the block. Rows travel (and wait for their backward)
 * in fp32, their values 16-bit ones.
 *
 * Tensor parallelism: the experts are replicated over the TP group. The block's input
 * is replicated there (TP without SP), so every TP rank routes the same tokens and
 * computes the same MoE, whole: its output needs no all-reduce, and the routers' and
 * experts' gradients come out equal on every TP rank (summing them over TP would count
 * them tp times). opts.world and opts.ep are then groups of one TP index (the ranks of
 * distinct tokens). Megatron-core instead splits each expert over its own expert
 * tensor-parallel group (expert TP, --expert-tensor-parallel-size, carved from the
 * ranks apart from attention's TP): column- and row-parallel like the dense MLP, with the
 * tokens all-gathered to it and reduce-scattered back, which saves the experts' memory
 * and compute tp times over where this pays them in full on each TP rank.
 *
 * Parameters live outside the model's slabs, in two vectors per rank: the routers of
 * every MoE block (dense: replicated like the rest of the model) and this rank's
 * experts of every MoE block. The model's shape made with gpt_shape_drop_moe_mlps
 * (cfg.every) holds no MLP weights in its MoE blocks, moe_dense_mlp_numel fewer than the
 * dense model's (the mesh trainer's: parallel_model_shape, parallelize.h); a dense shape
 * would keep them unused (gradient zero, but memory, bytes and weight decay). */
#ifndef MOE_H
#define MOE_H
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "model.h"

typedef struct {
    int experts;             /* E (0: no MoE) */
    int top_k;               /* 1 or 2 */
    int every;               /* MoE in blocks l with l % every == every - 1: 1 all, 2 odd */
    double capacity_factor;  /* 0: no dropping */
    float aux_coef;          /* the auxiliary loss's coefficient (0.01 in Switch) */
} moe_config;

/* What a rank holds: the model's shape and its slice of the experts. */
typedef struct {
    moe_config cfg;
    int dim, hidden;          /* C and the expert's hidden width 4C */
    int layers, moe_layers;   /* the model's blocks, and how many of them are MoE */
    int ep_size, ep_rank;
    int experts_local, expert_begin;   /* E / EP, from ep_rank x E / EP */
} moe_shape;

/* Checks E, k, every and the capacity factor (and that ep_size divides E); one line in
 * err on failure. */
int moe_config_check(const moe_config *cfg, int layers, int ep_size, char *err,
                     size_t err_len);
moe_shape moe_shape_make(const moe_config *cfg, const gpt_config *model, int ep_size,
                         int ep_rank);
int moe_is_moe_layer(const moe_shape *s, int layer);
int moe_layer_index(const moe_shape *s, int layer);   /* among MoE blocks, or -1 */

/* Sizes in elements. An expert: fc_w [H, C], fc_b [H], fc2_w [C, H], fc2_b [C]. */
size_t moe_expert_numel(const moe_shape *s);
size_t moe_router_numel(const moe_shape *s);          /* all MoE blocks: layers x E x C */
size_t moe_local_experts_numel(const moe_shape *s);   /* this rank's, all MoE blocks */
/* The dense MLP weights the MoE blocks leave unused in the model's slabs. */
size_t moe_dense_mlp_numel(const moe_shape *s);
/* The whole MoE model's parameters (embedding, attention, routers, every expert) and
 * those one token uses (k experts instead of E). */
double moe_total_params(const moe_shape *s, const gpt_config *model);
double moe_active_params(const moe_shape *s, const gpt_config *model);

/* Pointers into an expert vector (parameters or gradients): MoE block i's local expert j. */
typedef struct { float *fc_w, *fc_b, *fc2_w, *fc2_b; } moe_expert_tensors;
moe_expert_tensors moe_expert_view(const moe_shape *s, float *experts, int moe_layer, int j);
float *moe_router_of(const moe_shape *s, float *routers, int moe_layer);   /* [E, C] */

/* Initial values: routers N(0, 0.02), expert fc N(0, 0.02), fc2 N(0, 0.02 / sqrt(2L)),
 * biases 0, each a function of (seed, tensor, global expert, index), so an EP rank's
 * experts start as the same experts of one device. */
void moe_init_routers(const moe_shape *s, uint64_t seed, float *routers);
void moe_init_local_experts(const moe_shape *s, uint64_t seed, float *experts);

/* ---- the layer at run time ---------------------------------------------------------- */

typedef struct moe_layer moe_layer;

typedef struct {
    comm *world;   /* every rank of the run, in global-batch order (NULL: one device) */
    comm *ep;      /* the expert-parallel group (NULL: EP 1) */
    int test_combine_misorder;   /* negative control: the combine's rows come back reversed */
} moe_layer_options;

/* For micro-batches of N tokens a rank. */
moe_layer *moe_layer_create(const moe_shape *s, int N, const moe_layer_options *opts);
void moe_layer_free(moe_layer *m);
/* The parameter and gradient vectors that forward and backward use (routers: all MoE
 * blocks'; experts: this rank's). Gradients accumulate. */
void moe_layer_bind(moe_layer *m, const float *routers, const float *experts,
                    float *router_grads, float *expert_grads);
/* d(objective)/d(one token's loss) of the coming backward (what the model's head is
 * given): the auxiliary loss's gradient is scaled by it x the global micro-batch's
 * tokens, so that with m micro-batches (dloss 1 / (m x their tokens)) the objective
 * holds the mean of their auxiliary losses, as the main loss is their mean. */
void moe_layer_set_dloss(moe_layer *m, float dloss);
/* A step starts: its statistics (below) and rows sent count from zero; in 16 bits the
 * experts' compute copy is rounded again at the step's first MoE block. */
void moe_layer_step_begin(moe_layer *m);

/* The model's hook (gpt_model_options.mlp): out [N, C] = MoE(ln2 [N, C]), and its
 * backward, d_ln2 [N, C] (overwritten) from d_out [N, C]. Each micro-batch slot of the
 * model keeps its own routing and activations a block (allocated at the slot's first
 * use), so that several micro-batches may be in flight (1F1B, interleaved). */
const gpt_mlp_hook *moe_layer_hook(moe_layer *m);

/* What the step's forwards measured since moe_layer_step_begin (or the layer's
 * creation), per MoE block i: each micro-batch's numbers are those of the global
 * micro-batch (every rank's micro-batch of the same index, collective numbers). */
/* sum over the MoE blocks the step ran (a pipeline stage's own) of the mean over its
 * micro-batches of a x E sum f P */
double moe_layer_aux_loss(const moe_layer *m);
/* (token, choice) pairs routed to each expert, before dropping [E], over the step's
 * micro-batches */
const double *moe_layer_expert_load(const moe_layer *m, int moe_layer);
double moe_layer_dropped(const moe_layer *m, int moe_layer);   /* pairs dropped */
double moe_layer_capacity(const moe_layer *m);    /* per expert of a micro-batch (0: none) */
/* Rows this rank sent to other EP ranks in the step, every MoE block, all four
 * all-to-alls (dispatch and combine, forward and backward). */
double moe_layer_remote_rows(const moe_layer *m);
/* ... and the rows of the same exchanges wherever they went (to itself too). */
double moe_layer_exchanged_rows(const moe_layer *m);

#endif
