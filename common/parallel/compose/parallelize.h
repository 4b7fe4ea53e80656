/* One rank's parallel setup, from the mesh (mesh.h) and the run: what its model is
 * made with and which groups its gradients are reduced over, for every dimension at
 * once, as torchtitan's parallelize applies TP, CP and FSDP to one model.
 *
 *   tp   the model's Megatron slice on the tp group (model.h), --sp: its LayerNorms
 *        and residual stream on T/tp positions (sequence parallelism)
 *   cp   every sequence cut into the cp ranks' spans (cp_split.h); the model's
 *        attention core the CP group's (ring or Ulysses, cp_attention_hook.h)
 *   dp   the dense gradients summed over dp x cp (a token's gradient is a gradient,
 *        wherever its chunk sat), by one dp_grads.h piece: ZeRO 1-3 shard over
 *        dp_shard x cp, as Megatron shards the dense optimizer over dp with cp folded
 *        in; with replicas (dp_replicate > 1, HSDP) each reduced piece is then
 *        all-reduced across them. ZeRO 0 all-reduces over dp x cp at once.
 *   pp   the stages (pipeline.h), which the caller cuts.
 *   ep   MoE (moe.experts > 0): the model's MLP hook is an MoE layer whose experts are
 *        split over the ep group (E / ep a rank, tokens exchanged by all-to-alls), its
 *        routers dense and its experts summed over expert_dp (moe_params.h), ZeRO 1-3
 *        sharding the routers as the dense parameters and the experts over expert_dp; the
 *        routing counts the global micro-batch over dp x cp (routing, capacity and the
 *        auxiliary loss a micro-batch's, as Megatron-core: moe.h). In every pipeline
 *        stage (each runs its own MoE blocks, several micro-batches in flight), with CP
 *        (no dropping: capacity factor 0: parallelize_check says why) and with SP (the
 *        TP group's rows all-gathered before the layer, each rank's taken after it: the
 *        model's hook, model.h). The dense model's MoE blocks hold no MLP weights
 *        (parallel_model_shape). */
#ifndef PARALLELIZE_H
#define PARALLELIZE_H
#include <stddef.h>

#include "cp_attention.h"
#include "cp_attention_hook.h"
#include "mesh.h"
#include "model.h"
#include "moe_params.h"
#include "run_config.h"

/* How the layers run beyond their split (model.h): recomputation and TP's collective
 * matmuls. */
typedef struct {
    int recompute_attention;      /* selective recomputation */
    int checkpoint_activations;   /* full recomputation: block inputs kept alone */
    int tp_overlap_chunks;        /* with SP: collective matmuls in this many chunks */
    int tp_overlap_control;       /* tp_overlap.h's negative controls */
} parallel_layer_options;

/* What the run asks beyond the mesh's sizes. */
typedef struct {
    int zero;                 /* 0 (DDP) .. 3 (FSDP): over dp_shard x cp */
    int sequence_parallel;    /* --sp: Megatron SP on the tp group */
    cp_options cp;            /* how the cp ranks' attention crosses the chunks */
    int micro;                /* micro-batches per step (pipeline); 0: 1 */
    parallel_layer_options layers;
    int split_backward;       /* the schedule runs B and W apart (zero-bubble, DualPipe) */
    int grads_over_dp_only;   /* negative control: dense gradients summed over dp alone,
                                 not dp x cp */
    int grads_over_tp;        /* negative control: dense gradients summed over the tp
                                 group (the wrong one) */
    moe_config moe;           /* experts 0: a dense model */
    int expert_grads_over_ep; /* negative control: expert gradients summed over the ep
                                 group, not expert_dp */
    int combine_misorder;     /* negative control: the MoE combine's rows in expert order
                                 (moe_layer_options) */
    int moe_skip_param_gather;   /* negative control: ZeRO-1/2's updated router and expert
                                    pieces not all-gathered */
} parallel_options;

typedef struct {
    gpt_model_options model;  /* precision, tp, SP, CP's attention and positions */
    position_span span;       /* this rank's positions of each sequence (cp > 1) */
    int rows;                 /* rows of a sequence on this rank: ctx / cp */
    cp_attention *attention;  /* cp > 1, else NULL */
    cp_attention_hook *hook;
    comm *grads;              /* dp_grads' group: dp x cp (ZeRO 0) or dp_shard x cp */
    comm *replicate;          /* HSDP's replicas (ZeRO 1-3), else NULL */
    int zero;                 /* what dp_grads runs: 0 where dp x cp is one rank */
    moe_params *moe;          /* MoE: the routers, this rank's experts, the layer; else NULL */
    comm *experts_group;      /* where the experts' gradients are summed (expert_dp) */
    comm *moe_world;          /* MoE with CP: the routing's dp x cp ranks, apart from the
                                 gradients' (else NULL: the dp group serves) */
} parallel_rank;

/* Why cfg's model cannot be trained on this mesh this way (the mesh's sizes and
 * splits, CP's chunks and heads, SP, the batch, and what the model itself refuses,
 * with its reason): one line in why, returned; NULL when it can. Needs no ranks. */
const char *parallelize_check(const run_config *cfg, const mesh_shape *shape, int world,
                              const parallel_options *o, char *why, size_t why_len);

/* This rank's setup on m (collective over nothing; the CP attention keeps m->cp, the
 * MoE layer m->ep and m->dp_cp). B: sequences a micro-batch holds on this rank. p must stay where it is while the
 * model lives (model.positions points into it). */
void parallelize(parallel_rank *p, const mesh *m, const run_config *cfg,
                 const parallel_options *o, int B);
void parallel_rank_free(parallel_rank *p);

/* The model's shape on TP rank tp_rank of tp (the vocabulary split with TP), all its
 * layers; with MoE (moe->experts > 0) its MoE blocks hold no MLP weights, which the
 * layer's experts replace (gpt_shape_drop_moe_mlps). */
gpt_shape parallel_model_shape(const run_config *cfg, int tp, int tp_rank,
                               const moe_config *moe);

/* The dp_grads group's size and this rank's place in it, and the replicas', for a rank
 * of the mesh (the formulas: no communicators). */
void parallel_grads_groups(const mesh_shape *shape, int rank, int zero, int *group,
                           int *group_rank, int *replicas);

#endif
