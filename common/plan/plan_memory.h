/* The planner's memory arithmetic: bytes per GPU of a GPT trained on a mesh of
 * tp x pp x dp GPUs, without training it.
 *
 * Sources (formulas re-derived here, numbers checked in tests/test_chapter6.c):
 *   parameters   Narayanan et al. 2021 (arXiv:2104.04473) eq. 2:
 *                P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
 *   model states Rajbhandari et al. 2019, ZeRO (arXiv:1910.02054) sec. 3.1 and 5:
 *                mixed-precision Adam keeps 2 (fp16 params) + 2 (fp16 grads) + K = 12
 *                (fp32 master, m, v) bytes per parameter; stage 1 shards K, stage 2 the
 *                gradients too, stage 3 everything, over the dp ranks; fp32 Adam keeps
 *                4 + 4 + 8 (plan_precision below)
 *   activations  Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4, Table 2: bytes
 *                per layer for s tokens, b sequences, h hidden, a heads, t-way TP:
 *                  none                        s b h (34 + 5 a s / h)
 *                  tensor parallel             s b h (10 + 24/t + 5 a s / (h t))
 *                  + sequence parallel         s b h (34/t + 5 a s / (h t))
 *                  + selective recomputation   drops the 5 a s / (h t) term
 *                  full recomputation          2 s b h (the layer input; / t with SP)
 *                (its elements are 16-bit; fp32 activations take twice the bytes)
 * Shapes: l layers, h hidden, a heads, V vocabulary, s sequence length (tokens).
 * GB in this project means 1e9 bytes. */
#ifndef PLAN_MEMORY_H
#define PLAN_MEMORY_H

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
} plan_mesh;

/* The ranks ZeRO shards over (dp_shard, or dp), and the replicas that hold the same shard
 * (dp / dp_shard: HSDP's all-reduce group; 1 without HSDP). */
int plan_dp_shard_size(const plan_mesh *mesh);
int plan_dp_replicas(const plan_mesh *mesh);

/* Bytes per parameter of each model state, and per activation element (what backward
 * keeps and what TP and the pipeline send). */
typedef struct {
    double params, grads, optimizer;
    double activation;
    /* ZeRO-3's gathered weights, held and sent: bytes a parameter (0: params'; FP8 linears
     * gather 1 byte plus their scales, PLAN_FP8_GATHERED) */
    double gathered;
} plan_precision;
/* FP8's gathered weights: a byte and the 4-byte scale of each 128 x 128 block shared
 * (DeepSeek-V3's weight blocks, as chapter 8 part e counts them) */
#define PLAN_FP8_GATHERED (1.0 + 4.0 / (128.0 * 128.0))
/* gathered, or params where it is 0 */
double plan_gathered_bytes(plan_precision p);
/* 2 + 2 + 12, 2 B activations: the ZeRO paper's mixed-precision Adam (K = 12: fp32
 * master, m, v), with 16-bit gradients as DeepSpeed keeps them */
extern const plan_precision PLAN_MIXED_ADAM;
/* 2 + 4 + 12, 2 B activations: fp32 gradients (Megatron-LM's bf16, and this project's
 * own --precision bf16|fp16 training) */
extern const plan_precision PLAN_MIXED_FP32_GRADS;
/* 4 + 4 + 8, 4 B activations: fp32 training (this project's default) */
extern const plan_precision PLAN_FP32_ADAM;

typedef struct {
    double params, grads, optimizer, activations;
} plan_bytes;
static inline double plan_total(plan_bytes b) {
    return b.params + b.grads + b.optimizer + b.activations;
}

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
/* Layers the largest pipeline stage holds: ceil(l / pp). */
int plan_layers_per_stage(const plan_model *m, int pp);
/* Parameters on one GPU of the first stage, which holds the most: its layers split
 * tp ways, plus the embedding (V h split tp ways, positions s h whole). */
double plan_params_per_gpu(const plan_model *m, int tp, int pp);

/* Korthikanti's activation bytes of one layer for one micro-batch of b sequences. */
double plan_layer_activations(const plan_model *m, int micro_batch, int tp, int sp,
                              plan_recompute recompute);
/* Activations on the GPU that holds the most (first stage of the pipeline), with
 * Korthikanti's 2-byte elements:
 *   layers per stage x layer activations x micro-batches in flight
 *   (1F1B: min(pp, m) on the first stage, as Korthikanti's sec. 4.2.3 counts),
 *   + with full recomputation, one layer recomputed in full during its backward,
 *   + on a one-stage pipeline, the head: the final LayerNorm's input 2 s b h and the
 *     fp32 logits of the loss 4 s b V / t (ours; Korthikanti leaves them aside). */
double plan_activations_per_gpu(const plan_model *m, const plan_mesh *mesh);
/* The same with elements of precision.activation bytes (fp32: twice the 16-bit count);
 * the logits stay fp32 in every precision. */
double plan_activations_in(const plan_model *m, const plan_mesh *mesh,
                           plan_precision precision);

/* The ZeRO paper's model states of P parameters on one of dp ranks (its Figure 1 and
 * Table 1): params, grads and optimizer state, each sharded from its stage on. This
 * is the function chapter 2's estimator (chapters/02-zero/estimate.c) computes too. */
plan_bytes plan_states_bytes(double params, int zero_stage, int dp, plan_precision precision);
/* Model states on one GPU at their peak in a step: the paper's sharding over dp, plus
 * the working buffers of the mesh's gather (plan_zero3_gather): per pass, ZeRO-2/3 hold
 * one layer's full gradient before it is reduce-scattered and ZeRO-3 one layer's
 * gathered parameters; per step, ZeRO-3 the stage's gathered parameters and a fp32
 * gradient of the whole stage where the gradients are sharded or 16-bit. */
plan_bytes plan_model_states(const plan_model *m, const plan_mesh *mesh,
                             plan_precision precision);
/* Everything on one GPU: model states and activations (plan_activations_in). */
plan_bytes plan_memory_per_gpu(const plan_model *m, const plan_mesh *mesh,
                               plan_precision precision);

/* The ZeRO paper's largest model (its Table 2): model states only, no working
 * buffers, on dp data-parallel ranks each holding 1/mp of the model (model
 * parallelism mp), gpu_bytes each. */
double plan_max_params(int zero_stage, double gpu_bytes, int dp, int mp,
                       plan_precision precision);

#endif
