/* The planner's memory arithmetic: bytes per GPU of a GPT trained on a mesh of
 * tp x pp x dp GPUs, without training it (its shapes and Korthikanti's per-layer
 * activations: plan_mesh.h).
 *
 * Sources (formulas re-derived here, numbers checked in tests/test_chapter6.c):
 *   model states Rajbhandari et al. 2019, ZeRO (arXiv:1910.02054) sec. 3.1 and 5:
 *                mixed-precision Adam keeps 2 (fp16 params) + 2 (fp16 grads) + K = 12
 *                (fp32 master, m, v) bytes per parameter; stage 1 shards K, stage 2 the
 *                gradients too, stage 3 everything, over the dp ranks; fp32 Adam keeps
 *                4 + 4 + 8 (plan_precision below)
 * Shapes: l layers, h hidden, a heads, V vocabulary, s sequence length (tokens).
 * GB in this project means 1e9 bytes. */
#ifndef PLAN_MEMORY_H
#define PLAN_MEMORY_H

#include "plan_mesh.h"

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
/* The states of `params` parameters ZeRO-sharded over `shards` ranks at their peak in a
 * step: plan_states_bytes plus the mesh's gather's working buffers (`layer`: the largest
 * layer's parameters, per pass; per step the stage's `params`). */
plan_bytes plan_states_at_peak(const plan_mesh *mesh, double params, double layer, int shards,
                               plan_precision precision);
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
