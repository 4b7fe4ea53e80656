/* The planner's mixture of experts: parameters, FLOPs, memory per GPU under expert
 * parallelism and the all-to-all bytes of a GPT whose MLPs are experts.
 *
 * An MoE layer is a dense layer (plan_layer_params: 12 h^2 + 13 h) whose MLP
 * (8 h^2 + 5 h: W1 h x 4h, b1, W2 4h x h, b2) is replaced by a router (h x E, no bias)
 * and E experts, each an MLP of hidden size f: 2 h f + f + h parameters. Every token
 * visits k of the E experts (top-k routing), so it computes with the k it visits:
 *     total  = P_dense + L_moe (h E + E expert - MLP)
 *     active = P_dense + L_moe (h E + k expert - MLP)
 * with P_dense = plan_params (Narayanan eq. 2) and L_moe the MoE layers: every layer,
 * or every other one (GShard, Switch: layers 2, 4, ...).
 *
 * Expert parallelism (EP): the E experts of a layer are spread over ep ranks, E / ep
 * each; ep ranks are carved out of the dp data-parallel ranks (Megatron-Core's and
 * DeepSpeed's placement), so the dense part is replicated over dp and an expert over
 * dp / ep ranks, and ZeRO shards each over its own replicas. Experts are split tp ways
 * like the dense MLP they replace (Megatron-Core's default expert tensor parallelism).
 * Shapes: l layers, h hidden, s sequence, b micro-batch, E experts, k top-k, f expert
 * MLP size. Routing is taken as uniform and the capacity factor as 1 (no token dropped);
 * the router's s b E probabilities are left out of the activations (E << h). This course's
 * own MoE model, as chapter 11 trains it, is counted in plan_moe_this_model.h. */
#ifndef PLAN_MOE_H
#define PLAN_MOE_H

#include "plan_memory.h"

typedef struct {
    int experts;          /* E; 0: a dense model */
    int top_k;            /* k: experts each token visits */
    int every;            /* 1: every layer is an MoE layer; 2: every other layer */
    double expert_ffn;    /* f: hidden size of one expert's MLP (a dense GPT's is 4h) */
    double capacity_factor;   /* this model's count (plan_moe_this_model.h): an expert
                                 takes ceil(c tokens k / E) pairs; 0: no dropping */
} plan_moe;

/* The dense MLP an MoE layer replaces: 8 h^2 + 5 h. */
double plan_mlp_params(int hidden);
/* One expert: 2 h f + f + h. */
double plan_expert_params(int hidden, double expert_ffn);
/* MoE layers among the first `layers` layers: all of them, or every other one
 * (floor(layers / 2): layers 2, 4, ... counted from 1). */
int plan_moe_layers_in(int layers, const plan_moe *moe);
double plan_moe_total_params(const plan_model *m, const plan_moe *moe);
double plan_moe_active_params(const plan_model *m, const plan_moe *moe);

/* FLOPs of one token's forward pass, Narayanan's count (GEMMs, 2 per multiply-add):
 * per layer 8 h^2 (attention's projections) + 4 s h (scores and their use on the
 * values), then a dense MLP's 16 h^2 or the router's 2 h E + k experts' 4 h f; plus
 * the logits' 2 h V. Training (forward and backward, no recomputation) is 3 times it,
 * which for a dense model is plan_flops_per_iteration(m, 1, RECOMPUTE_NONE) / s. */
double plan_moe_forward_flops_per_token(const plan_model *m, const plan_moe *moe);

/* Bytes one rank sends in the all-to-alls of one MoE layer, per token it holds:
 *     2 (dispatch, combine) x 2 (forward, backward) x k h bytes x (ep - 1) / ep
 * Forward, dispatch: the token's h activations go to each of its k experts; combine:
 * the k expert outputs come back. Backward runs both the other way: the gradients of
 * the k outputs go out to the experts, the gradients of the k inputs come back. Under
 * uniform routing an expert sits on another rank with probability (ep - 1) / ep (E / ep
 * experts a rank), and only those bytes leave the rank. */
double plan_moe_alltoall_bytes_per_token(const plan_moe *moe, int hidden, double element_bytes,
                                         int ep);

/* Parameters on one GPU of the first pipeline stage (it holds the most: its layers and
 * the embedding): the dense part (attention and LayerNorms split tp ways, the router
 * whole, the embedding as plan_params_per_gpu) and its E / ep experts of each of its MoE
 * layers, split tp ways. */
double plan_moe_dense_params_per_gpu(const plan_model *m, const plan_moe *moe, int tp, int pp);
double plan_moe_expert_params_per_gpu(const plan_model *m, const plan_moe *moe, int tp, int pp,
                                      int ep);

/* Model states and activations on that GPU: the dense part's states ZeRO-sharded over dp,
 * the experts' over dp / ep; ZeRO-2/3's working buffers of one layer (dense part and its
 * experts); activations as plan_activations_in with each MoE layer's MLP share (Korthikanti:
 * input 2 s b h, dropout mask s b h, GELU input and output 2 x 2 s b f; TP splits the f
 * terms, sequence parallelism all of them) taken k times, once per expert a token visits.
 * ep must divide dp and the experts. */
plan_bytes plan_moe_memory_per_gpu(const plan_model *m, const plan_moe *moe,
                                   const plan_mesh *mesh, int ep, plan_precision precision);

#endif
