/* The planner's time arithmetic: FLOPs of an iteration, the collectives of a mesh on
 * an alpha-beta model of the links, the pipeline bubble, and the step time they add
 * up to.
 *
 * FLOPs: Narayanan et al. 2021 (arXiv:2104.04473) eq. 3 counts the GEMMs of one
 * iteration of B sequences of s tokens, with full recomputation (a second forward):
 *     F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
 * i.e. 24 B s l h^2 (1 + s/(6h)) per pass through the layers (forward 1, backward 2,
 * recomputation 1) plus 6 B s h V for the logits (forward and backward, never
 * recomputed). Without recomputation the layers take 3 passes (72 instead of 96);
 * selective recomputation repeats only the attention core, 4 B s^2 h per layer.
 *
 * Links: latency alpha and bandwidth beta, the communicator's figures (comm_link in
 * common/comm.h): NVLink 900 GB/s and 2 us, InfiniBand 50 GB/s and 5 us, Ethernet
 * 3.125 GB/s and 30 us. A ring of n ranks moving `bytes` per rank takes
 *     all-reduce                 2 (n-1) alpha + 2 (n-1)/n bytes / beta
 *     reduce-scatter, all-gather   (n-1) alpha +   (n-1)/n bytes / beta
 * A group whose ranks all sit in one node of gpus_per_node GPUs uses NVLink, any
 * other the slower link between nodes. Ranks are placed as Megatron does (tp
 * fastest, then dp, then pp), so a TP group of at most a node stays inside it. */
#ifndef PLAN_TIME_H
#define PLAN_TIME_H

#include "comm.h"
#include "plan_memory.h"

typedef struct {
    double bandwidth;   /* bytes per second */
    double latency;     /* seconds per message */
} plan_link;

/* The communicator's figures; LINK_NONE is an infinitely fast wire (0 s). */
plan_link plan_link_of(comm_link link);
double plan_link_seconds(plan_link link, double bytes);   /* one message */
double plan_allreduce_seconds(plan_link link, int ranks, double bytes);
double plan_gather_seconds(plan_link link, int ranks, double bytes);   /* or scatter */
/* The threads backend's other all-reduces (comm_threads.c) on the same model, where
 * each copy a rank makes costs alpha + bytes / beta on its own wire:
 *   naive: rank 0 adds the N-1 others' buffers one after the other, then all N-1
 *          copy the sum at once:                          N (alpha + bytes / beta)
 *          (with one port at the root the copies back queue too: 2 (N-1) of them)
 *   recursive doubling: log2 P rounds of the whole buffer, P = 2^floor(log2 N), and
 *          two more (fold in, copy back) when N is not a power of two:
 *                                   (log2 P + 2 [N != P]) (alpha + bytes / beta)
 * Latency terms: ring 2(N-1), doubling about log2 N; bandwidth terms: ring 2(N-1)/N,
 * doubling log2 N x bytes: doubling wins small messages, the ring large ones. */
double plan_allreduce_naive_seconds(plan_link link, int ranks, double bytes);
double plan_allreduce_doubling_seconds(plan_link link, int ranks, double bytes);
/* Messages one rank sends in sequence in recursive doubling (the factor above). */
int plan_doubling_rounds(int ranks);
/* A link slowed down `scale` times (the communicator's --link-scale). */
plan_link plan_link_scaled(plan_link link, double scale);

/* Eq. 3 generalised to the recomputation mode (see above). */
double plan_flops_per_iteration(const plan_model *m, int global_batch,
                                plan_recompute recompute);

typedef struct {
    int gpus, gpus_per_node;
    comm_link between_nodes;     /* inside a node: NVLink */
    double flops_per_gpu;        /* achieved FLOP/s of one GPU on the model's GEMMs */
} plan_cluster;

/* A GPU's peak is quoted for 16-bit tensor-core GEMMs; fp32 GEMMs without tensor cores
 * run at a fraction of it. NVIDIA's H100 SXM datasheet: FP32 67 TFLOPS, BF16/FP16
 * tensor core 1979 TFLOPS with sparsity, 989 dense; A100's 19.5 / 312 is close (1/16).
 * (TF32 tensor cores, which fp32 training may allow, run at half the 16-bit rate.) */
#define PLAN_FP32_PEAK_FRACTION (67.0 / 989.0)

/* One iteration on one GPU, in seconds. Communication is counted as not overlapped
 * with compute (an upper bound; overlap can hide the data-parallel part). */
typedef struct {
    double compute;     /* F / (gpus x flops_per_gpu) */
    double bubble;      /* compute x (pp - 1) / m, 1F1B or GPipe */
    double tp_comm;     /* 4 all-reduces of b s h activations per layer and micro-batch
                           (6 with full recomputation); with SP the same bytes as
                           all-gather + reduce-scatter; PLAN_TP_THIS_MODEL: their
                           latencies and its bytes (plan_bytes_sent's tp) */
    double pp_comm;     /* per micro-batch, activation out and gradient back: b s h / t
                           activations each (Megatron's scatter/gather) */
    double dp_comm;     /* ZeRO 0-2: one all-reduce of the gradients per iteration;
                           ZeRO-3: all-gather of the weights in forward and backward and
                           a reduce-scatter of the gradients, per micro-batch (or one
                           each a step: plan_zero3_gather); one
                           message per layer; over dp x cp ranks (HSDP: over its
                           shard group x cp, then the gradient shards all-reduced
                           across the replicas once per iteration) */
    double cp_comm;     /* context parallel: K/V blocks (ring) or all-to-alls (Ulysses) per
                           layer and micro-batch (plan_cp.h) */
    double total;
} plan_step;

/* Every message in the precision's bytes per element: activations (TP, PP) in
 * precision.activation, weights (ZeRO-3's all-gathers) in precision.params, gradients
 * in precision.grads. */
plan_step plan_step_time(const plan_model *m, const plan_mesh *mesh,
                         const plan_cluster *cluster, plan_precision precision);
/* The bytes behind plan_step's messages, sent per iteration by the GPU of each group
 * that sends the most (a ring collective of n ranks sends (n-1)/n of its buffer per
 * pass): tp 4 (6) all-reduces a layer and micro-batch (PLAN_TP_THIS_MODEL: also the
 * vocab-parallel embedding's and head's and the loss's numbers, and SP's regathers and
 * LayerNorm gradients, on the stage that sends the most; plan_step's tp_comm sends the
 * same bytes); pp a micro-batch's activation
 * forward and its gradient back (a middle stage sends both, a two-stage pipeline's
 * ranks one each); dp and dp_replicate as dp_comm counts them; cp plan_cp.h's chunks.
 * What --predict-chapters holds against chapter 11's measured bytes per group. */
typedef struct {
    double tp, pp, dp, dp_replicate, cp;
    double expert_dp;   /* MoE: the experts' gradients (plan_moe_this_model.h); 0 dense */
} plan_group_bytes;
/* dp and dp_replicate of plan_bytes_sent for `params` parameters reduced over `shards`
 * ranks and `replicas` (ZeRO-3: gathered and reduce-scattered as the mesh's gather). */
void plan_dp_bytes(const plan_mesh *mesh, double params, plan_precision precision, int shards,
                   int replicas, double *dp, double *dp_replicate);
plan_group_bytes plan_bytes_sent(const plan_model *m, const plan_mesh *mesh,
                                 plan_precision precision);
/* Narayanan's end-to-end estimate: iterations of `tokens` x F / (gpus x flops). */
double plan_training_seconds_at(const plan_model *m, int global_batch,
                                plan_recompute recompute, double tokens, int gpus,
                                double flops_per_gpu);

#endif
