/* Pipeline parallelism as a strategy for the training loop, on one rank of a mesh
 * (mesh.h): its pipeline stage(s), the schedule's executor, and what a step does.
 *
 *   step:  all ranks of the pipeline start together (a barrier on the pp group)
 *          the schedule's op lists run: forwards, backwards, sends, receives
 *          the tied embedding's gradient is summed over the first and last stage
 *          with data parallelism: each stage's gradients summed over the dp group
 *          by dp_grads.h (DDP buckets; ZeRO-1/2: reduce-scattered, each rank updating
 *          its piece, then all-gathered; ZeRO-3: parameters gathered for the step)
 *          AdamW on this rank's stages (on its pieces from ZeRO-1 on)
 *
 * ZeRO-3 here gathers a stage's parameters once per step, before its first micro-batch,
 * and keeps them until the last backward has reduced its gradient: every micro-batch's
 * forward and backward reads them, so gathering per micro-batch would send them 2m
 * times instead of once. Between steps a rank holds shards alone; during a step, the
 * stage's whole parameters and gradient, as ZeRO-1 would. Its dp bytes are then
 * ZeRO-1's: one all-gather and one reduce-scatter of the stage slice per step.
 *
 * The mesh's TP size cuts every stage's blocks Megatron-style (their f and g run on
 * the tp group inside each pass); its DP size gives each pipeline 1/d of the batch. */
#ifndef PIPELINE_H
#define PIPELINE_H

#include "alloc.h"
#include "dp_grads.h"
#include "mesh.h"
#include "parallelize.h"
#include "pp_execute.h"
#include "pp_schedule.h"
#include "pp_stage.h"
#include "train_loop.h"
#include "zero.h"

/* Negative controls for the tests: each leaves out one thing the strategy
 * communicates, and the comparison with the baseline must then fail. */
typedef enum {
    PIPELINE_FAULT_NONE,
    PIPELINE_FAULT_DROP_INPUT_GRAD,   /* the last stage sends zeros as its d(input) */
    PIPELINE_FAULT_SKIP_TIED_REDUCE,  /* the tied embedding's two gradients not summed */
    PIPELINE_FAULT_SKIP_DP_REDUCE,    /* each replica keeps its own gradient */
    PIPELINE_FAULT_DROP_F_BACKWARD,   /* TP: f's backward all-reduce left out */
    PIPELINE_FAULT_SKIP_DP_PARAM_GATHER,   /* ZeRO-1/2: updated pieces not all-gathered */
    PIPELINE_FAULT_DROP_WEIGHT_PASS,  /* split backward: rank 0 skips its first W a step */
    PIPELINE_FAULT_GRADS_OVER_DP_ONLY,     /* CP: gradients summed over dp, not dp x cp */
    PIPELINE_FAULT_SKIP_REPLICATE_REDUCE,  /* HSDP: replicas keep their own sums */
    PIPELINE_FAULT_EXPERT_GRADS_OVER_EP,   /* MoE: experts summed over ep, not expert_dp */
    PIPELINE_FAULT_COMBINE_MISORDER,       /* MoE: the combine's rows in expert order */
    PIPELINE_FAULT_SP_OWN_PARTIAL,    /* SP: g-bar's reduce-scatter keeps its own partial */
    PIPELINE_FAULT_MOE_SKIP_PARAM_GATHER,  /* MoE, ZeRO-1/2: routers' and experts' updated
                                              pieces not all-gathered */
    PIPELINE_FAULT_GRADS_OVER_TP,     /* dp's gradient reduction run over the tp group */
    PIPELINE_FAULT_SP_MOE_SUMMED,     /* SP: the MoE output summed over tp, not sliced */
} pipeline_fault;

typedef struct {
    pp_schedule_kind schedule;
    int micro;                /* micro-batches per step (per pipeline) */
    int chunks;               /* v: model chunks per rank (interleaved), else 1 */
    double stage_seconds;     /* the compute model (pp_execute.h); 0: off */
    int zero_stage;           /* ZeRO across the dp group (dp_grads.h): 0 DDP .. 3 FSDP */
    int sequence_parallel;    /* --sp on the tp group (its stages send T/tp rows) */
    cp_options cp;            /* the cp group's attention (a mesh with cp > 1) */
    parallel_layer_options layers;   /* recomputation, TP's collective matmuls */
    moe_config moe;           /* MoE blocks over the ep group (experts 0: dense) */
    moe_routing_log *moe_log; /* MoE: where world rank 0 writes each step's routing, or
                                 NULL */
    const char *name;         /* the step lines' name; NULL: the trainer's own */
    /* DDP's way on one stage (ddp.h): zero 0's buckets all-reduce during the step's last
     * backward (the micro-batches before it are PyTorch's no_sync), 16-bit gradients
     * rounded into their vector slab by slab (no fp32 step vector), one activation
     * slot (one stage holds one micro-batch at a time), buckets on a group of one too;
     * the caps (0: 1 MiB and 25 MiB) and the wire type (--compress) of the buckets */
    int ddp_buckets;
    size_t first_bucket_bytes, bucket_bytes;
    comm_dtype wire;
    /* ZeRO's own way on one stage (zero.h, chapter 2's trainer): each dp rank's share of
     * the batch (uneven where the ranks do not divide it) in one pass; ZeRO-2 reduces
     * each slab the moment backward finishes it and never holds a whole gradient, ZeRO-3
     * gathers each unit just before it computes (zero.prefetch: the next one meanwhile),
     * ZeRO++'s pieces and FSDP's FP8 gathers (zero.zeropp, the run's fp8); zero_stage
     * as asked on any group, stage 0 as DDP's one bucket after backward */
    int zero_way;
    zero_options zero;
    int bookkeeping_aside;    /* the trainer's own arrays and world rank 0's comparison
                                 copies charged to an account apart, so that the rank's
                                 peak is the model's alone (chapter 3's table) */
    pipeline_fault fault;
} pipeline_options;

typedef struct {
    const run_config *cfg;
    const mesh *mesh;
    pipeline_options opts;
    parallel_rank par;        /* the model's options and the gradients' groups */
    pp_schedule *schedule;
    pp_stage *chunks;         /* [v] */
    pp_executor exec;
    dp_grads *dp;             /* [v]: each stage's state, reduction and AdamW over dp */
    comm *metrics;            /* the bubble's own numbers, apart from the pp traffic */
    float *first_grads;       /* step 1's gradients, whole model, on world rank 0 */
    float *moe_first_grads;   /* MoE: step 1's routers and experts (moe_params_whole), on
                                 world rank 0; else NULL */
    double *busy, *finish;    /* [steps]: this rank's compute and finish, per step */
    mem_stats aside;          /* bookkeeping_aside's account */
    zero_rank zero;           /* zero_way: the stage run ZeRO's way */
    int first, count;         /* zero_way: this rank's sequences of every global batch */
} pipeline_rank;

/* Collective over world (the mesh's). */
void pipeline_rank_init(pipeline_rank *r, comm *world, const mesh *m, const run_config *cfg,
                        const dataset *data, const pipeline_options *opts);
void pipeline_rank_free(pipeline_rank *r);
/* The step for train_loop: name, e.g. "pp-1f1b". */
train_strategy pipeline_strategy(pipeline_rank *r);
/* "pp-naive", "pp-gpipe", "pp-1f1b", "pp-interleaved", "pp-zb-h1". */
const char *pipeline_strategy_name(pp_schedule_kind kind);

/* What the run measured, for the tables: after it, collective over the mesh's pp
 * group; every rank gets the pipeline's numbers. Arrays have one entry per stage
 * (pipeline rank). */
typedef struct {
    double bubble_fraction;      /* idle over total rank-time, timed steps */
    double bubble_over_ideal;    /* idle over busy */
    double *busy_ms, *idle_ms;   /* per step */
    double *peak_activations;    /* bytes, the accounting allocator's peak */
    int *in_flight;              /* the most micro-batch passes held at once (all chunks) */
    double *bytes_sent;          /* per step on the pp group: activations and gradients */
    double overrun_ms;           /* compute model: passes longer than modelled, per step */
} pipeline_measures;

void pipeline_measures_alloc(pipeline_measures *pm, int stages);
void pipeline_measures_free(pipeline_measures *pm);
/* Arrays NULL (a rank that keeps no tables): the scalars alone. */
void pipeline_measure(pipeline_rank *r, pipeline_measures *pm);

/* The groups a pipeline rank of a mesh talks on, and the bytes it sends on each per
 * step by the textbook formulas (Narayanan et al. 2021), for rank `me` of the mesh:
 *   tp         per block and micro-batch 2 all-reduces forward and 2 backward of b s h
 *              (+ the vocab-parallel embedding, the head's f, the loss's 3 b s numbers)
 *   pp         b s h per micro-batch and boundary, activations forward, gradients back
 *   dp         the stage slice's P floats, 2 (d-1)/d P x 4 B at every ZeRO stage: DDP's
 *              all-reduce, or ZeRO-1/2's reduce-scatter and all-gather, or ZeRO-3's
 *              all-gather (once per step) and reduce-scatter
 *   embedding  the tied embedding's gradient between the first and last stage
 * and, on a mesh with them (parallelize.h): tp and pp on a CP rank's T/cp rows,
 *   dp         over dp x cp (ZeRO: dp_shard x cp), the ring of that many ranks
 *   cp         the attention's K/V blocks or all-to-alls (cp_attention_bytes_formula)
 *   dp_replicate  HSDP: each reduced piece all-reduced across the replicas
 * and with MoE the routers' fp32 gradient all-reduced on dp and dp_replicate at ZeRO 0,
 * from ZeRO 1 on reduce-scattered on dp's shard group and all-gathered (ZeRO-3: at the
 * step's start), its piece all-reduced across the replicas; the experts' the same way
 * on expert_dp; the all-to-alls on ep are counted apart (mesh_train.h), from the
 * routing. */
typedef enum {
    PIPELINE_TP, PIPELINE_PP, PIPELINE_DP, PIPELINE_EMBEDDING, PIPELINE_GROUP_KINDS,
    PIPELINE_CP = PIPELINE_GROUP_KINDS, PIPELINE_DP_REPLICATE, PIPELINE_EXPERT_DP,
    PIPELINE_ALL_KINDS
} pipeline_group_kind;
const char *pipeline_group_kind_name(pipeline_group_kind kind);
void pipeline_bytes_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                            const pipeline_options *opts, double bytes[PIPELINE_ALL_KINDS]);
/* parallelize's options for a pipeline's run. */
parallel_options pipeline_parallel_options(const pipeline_options *opts);

/* MoE: the routers and every expert (moe_params_whole's layout), parameters or (grads)
 * gradients, into out on whoever gives it; with stages each block is the copy of the
 * stage that runs it. Collective over the ep group and the pipeline's ranks (on its
 * metrics group, apart from the step's traffic). */
void pipeline_moe_whole(pipeline_rank *r, int grads, float *out);

/* Collective over world: the whole model's parameters on world rank 0's host
 * (`whole`: gpt_num_params of the unsplit model; NULL elsewhere). Returns the largest
 * difference between the tied weight's two copies. */
double pipeline_gather_params(pipeline_rank *r, float *whole);

#endif
