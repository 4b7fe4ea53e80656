/* What the planner plans: a GPT's shape and the mesh that trains it, the counts that
 * follow from them (parameters, micro-batches, layers per stage), and Korthikanti's
 * activations of one layer, which the memory (plan_memory.h), context parallelism
 * (plan_cp.h) and this model's own count (activation_memory.h) all build on.
 *
 * Sources (formulas re-derived here, numbers checked in tests/test_chapter6.c):
 *   parameters   Narayanan et al. 2021 (arXiv:2104.04473) eq. 2:
 *                P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
 *   activations  Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4, Table 2: bytes
 *                per layer for s tokens, b sequences, h hidden, a heads, t-way TP:
 *                  none                        s b h (34 + 5 a s / h)
 *                  tensor parallel             s b h (10 + 24/t + 5 a s / (h t))
 *                  + sequence parallel         s b h (34/t + 5 a s / (h t))
 *                  + selective recomputation   drops the 5 a s / (h t) term
 *                  full recomputation          2 s b h (the layer input; / t with SP)
 *                (its elements are 16-bit; fp32 activations take twice the bytes)
 * Shapes: l layers, h hidden, a heads, V vocabulary, s sequence length (tokens). */
#ifndef PLAN_MESH_H
#define PLAN_MESH_H

#include "cp_attention_kind.h"

typedef struct {
    int layers, hidden, heads, vocab, seq;
} plan_model;

typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } plan_recompute;

/* When ZeRO-3 gathers the weights, FSDP's reshard_after_forward in the planner's words:
 *   PLAN_GATHER_PER_PASS  each layer's weights all-gathered in forward and again in
 *                         backward, every micro-batch, and freed after each use (FSDP's
 *                         default); a GPU holds one gathered layer and one layer's
 *                         gradient beyond its shards
 *   PLAN_GATHER_PER_STEP  the stage's weights all-gathered once a step and held through
 *                         its micro-batches, the gradient summed whole in fp32 over them
 *                         and reduce-scattered once (chapter 11's mesh, as PyTorch's
 *                         pipeline schedules run FSDP: no reshard between micro-batches);
 *                         a GPU holds the stage's gathered weights and its fp32 gradient
 *                         beyond its shards, the fp32 gradient also where the gradients
 *                         are sharded (ZeRO-2) or kept in 16 bits */
typedef enum { PLAN_GATHER_PER_PASS, PLAN_GATHER_PER_STEP } plan_zero3_gather;

/* Whose activations the planner counts:
 *   PLAN_ACTS_KORTHIKANTI  Korthikanti's count per layer (with dropout), the head on a
 *                          one-stage pipeline (plan_activations_per_gpu)
 *   PLAN_ACTS_THIS_MODEL   what this course's GPT allocates (activation_memory.h): its
 *                          layers' count (no dropout, fp32 LayerNorm statistics), and
 *                          what Korthikanti leaves aside: per micro-batch in flight the
 *                          stage's output, the gradient it receives and the token ids,
 *                          and once the backward's buffers of one layer
 *                          (plan_this_model_activations) */
typedef enum { PLAN_ACTS_KORTHIKANTI, PLAN_ACTS_THIS_MODEL } plan_activation_count;

/* Whose tensor-parallel rank the planner counts (what differs is at tp > 1):
 *   PLAN_TP_PAPER       Narayanan's and Megatron's: a layer's 12 h^2 + 13 h split t ways,
 *                       the first stage's embedding V h / t and positions s h, and 4
 *                       all-reduces of b s h activations a layer and micro-batch
 *   PLAN_TP_THIS_MODEL  this course's trainer (plan_this_model_params_per_gpu,
 *                       plan_this_model_tp_bytes): the row-parallel biases (proj, fc2)
 *                       and the LayerNorms kept whole, a layer 12 h^2 / t + 7 h / t + 6 h;
 *                       ceil(V / t) rows of the vocab-parallel embedding; the final
 *                       LayerNorm and the head's copy of the tied weight on the last
 *                       stage; on the tp group also the vocab-parallel embedding's and
 *                       head's all-reduces and the loss's numbers, and with SP the
 *                       backward's regathered inputs and LayerNorm-gradient all-reduces */
typedef enum { PLAN_TP_PAPER, PLAN_TP_THIS_MODEL } plan_tp_count;
extern const char *const plan_recompute_names[];   /* "none", "selective", "full" */

/* A mesh and the batch it trains. global_batch = dp x micro_batch x micro-batches.
 * GPUs = tp x cp x pp x dp (cp 0 counts as 1: no context parallelism). */
typedef struct {
    int tp, pp, dp;
    int zero_stage;             /* 0 (plain data parallel) .. 3 (FSDP), over dp */
    int micro_batch;            /* b: sequences per micro-batch */
    int global_batch;           /* B: sequences per iteration */
    plan_recompute recompute;
    int sequence_parallel;      /* Megatron SP along with TP (tp > 1) */
    int cp;                     /* context parallel: each rank holds s / cp of a sequence */
    cp_attention_kind cp_attention;   /* how cp crosses the chunks (plan_cp.h) */
    int dp_shard;               /* HSDP (ZeRO-3 only): the model states are sharded over
                                   dp_shard of the dp ranks (x cp) and replicated over the
                                   dp / dp_shard replicas; 0: sharded over all dp */
    plan_zero3_gather gather;   /* ZeRO-3's gathers (and the working buffers they and
                                   ZeRO-2 hold); 0: per pass, FSDP's */
    plan_activation_count activations;   /* 0: Korthikanti's */
    plan_tp_count tp_count;              /* 0: the papers' */
} plan_mesh;

/* The ranks ZeRO shards over (dp_shard, or dp), and the replicas that hold the same shard
 * (dp / dp_shard: HSDP's all-reduce group; 1 without HSDP). */
int plan_dp_shard_size(const plan_mesh *mesh);
int plan_dp_replicas(const plan_mesh *mesh);

/* cp, or 1 when the mesh has no context parallelism (cp 0). */
int plan_cp_size(const plan_mesh *mesh);

/* Narayanan eq. 2: parameters of the shape (embedding V h and positions s h
 * included, the LM head tied to the embedding). */
double plan_params(const plan_model *m);
/* One transformer layer: 12 h^2 weights + 13 h biases and LayerNorm gains. */
double plan_layer_params(int hidden);
/* A shape for a parameter count: head size 128, h / l = 128 (GPT-3 175B's aspect:
 * 12288 / 96), h rounded to a multiple of 1024 so that 8-way TP divides the heads,
 * then l chosen so that eq. 2 comes closest to P. */
plan_model plan_shape_for_params(double params, int vocab, int seq);

/* Micro-batches per pipeline per iteration: B / (dp b); 0 when dp b does not divide B. */
int plan_micro_batches(const plan_mesh *mesh);
/* The micro-batches a stage holds at once under 1F1B: pp, at most the micro-batches. */
int plan_micro_batches_in_flight(const plan_mesh *mesh);
/* Layers the largest pipeline stage holds: ceil(l / pp). */
int plan_layers_per_stage(const plan_model *m, int pp);
/* Parameters on one GPU of the first stage, which holds the most: its layers split
 * tp ways, plus the embedding (V h split tp ways, positions s h whole). */
double plan_params_per_gpu(const plan_model *m, int tp, int pp);
/* This model's (PLAN_TP_THIS_MODEL): a layer on one of tp ranks, 12 h^2 / t + 7 h / t +
 * 6 h (the column-parallel QKV and fc split with their biases, the row-parallel proj and
 * fc2 split without theirs, both LayerNorms whole); and the parameters of the stage that
 * holds the most (stages split as chapter 11's, floor(k l / pp)): the first with its
 * layers, ceil(V / t) h embedding rows and s h positions, the last with its layers, the
 * final LayerNorm 2 h and (pp > 1) its copy of the tied weight. */
double plan_this_model_layer_params(int hidden, int tp);
double plan_this_model_params_per_gpu(const plan_model *m, int tp, int pp);
/* The mesh's count: plan_params_per_gpu or this model's (mesh->tp_count). */
double plan_mesh_params_per_gpu(const plan_model *m, const plan_mesh *mesh);
/* One layer's parameters on a GPU by the mesh's count. */
double plan_mesh_layer_params(const plan_model *m, const plan_mesh *mesh);
/* Layers of stage k of pp as chapter 11 splits them: [k l / pp, (k + 1) l / pp). */
int plan_stage_layers(const plan_model *m, int pp, int stage);

/* Korthikanti's activation bytes of one layer for one micro-batch of b sequences. */
double plan_layer_activations(const plan_model *m, int micro_batch, int tp, int sp,
                              plan_recompute recompute);

#endif
