/* A mesh rank's mixture-of-experts state (moe.h), beside its dense model's dp_grads:
 * the MoE layer on the mesh's EP group, the routers of every MoE block and this rank's
 * experts, each an fp32 vector with its gradient and AdamW's moments (in 16 bits too:
 * the layer rounds its own 16-bit copy of the experts from these masters).
 *
 *   routers  dense parameters: summed over the dense gradients' group, dp x cp (with
 *            ZeRO: the shard group, then across the replicas, which is the same sum)
 *   experts  summed over expert_dp, the ranks that hold the same experts (mesh.h);
 *            with TP the experts are replicated over the tp group and their gradients
 *            are equal there: never summed over it (moe.h)
 *
 * ZeRO (zero_rule.h) shards each vector over its own group, as Megatron's distributed
 * optimizer shards experts over the expert-data-parallel group: the routers with the
 * dense parameters' rule (over dp_shard x cp, each reduced piece then all-reduced
 * across HSDP's replicas), the experts over the whole expert_dp group (no replicas: it
 * is already the ranks that hold the same experts). A rank owns one comm_shard piece
 * of each vector:
 *
 *   zero  params  grads  Adam    after backward           after AdamW
 *   0     whole   whole  whole   all-reduce               -
 *   1     whole   whole  piece   reduce-scatter           all-gather params
 *   2     whole   piece  piece   reduce-scatter           all-gather params
 *   3     piece   piece  piece   reduce-scatter           - (gathered at step begin)
 *
 * At zero 2-3 the whole gradient lives from step begin to the reduction, at zero 3 the
 * whole parameters too (gathered then, freed after the reduction); the layer is bound
 * to them for the step. A vector on a group of one rank is never sharded. In 16 bits the
 * layer keeps its own whole 16-bit copy of the experts, rounded from these masters. */
#ifndef MOE_PARAMS_H
#define MOE_PARAMS_H
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "grad_vector.h"
#include "moe.h"
#include "ops.h"

typedef struct {
    float *params, *grads, *adam_m, *adam_v;   /* at rest: whole or the piece, as zero says */
    size_t n;                 /* elements of the whole vector */
    comm *group, *replicate;  /* its gradient's sum: over group, then across replicate */
    int zero;                 /* 0 .. 3 (0 on a group of one rank) */
    size_t piece_at, piece_len;          /* this rank's comm_shard piece of the n */
    float *step_params, *step_grads;     /* zero 3 / zero 2-3: a step's whole vectors */
    int skip_gather;          /* negative control: zero 1-2's all-gather left out */
} moe_vector;

/* Where a run's routing goes, step by step (a caller's host buffers, written by world
 * rank 0 alone): the auxiliary loss, the pairs routed to each expert and those dropped. */
typedef struct {
    int steps;
    double *aux;              /* [steps] */
    double *load;             /* [steps][moe_layers][E] */
    double *dropped;          /* [steps][moe_layers] */
} moe_routing_log;

typedef struct {
    moe_shape shape;          /* this rank's experts: E / ep of them */
    moe_layer *layer;
    moe_vector routers, experts;
    comm *dense, *replicate;  /* the routers' groups: dp x cp or its shards and replicas */
    comm *expert_dp;          /* the experts' */
    int adam_step;
    double remote_rows;       /* rows sent to other EP ranks since the warm-up */
    double exchanged_rows;    /* rows dispatched, to any EP rank, since the warm-up */
    moe_routing_log *log;     /* NULL, or where moe_params_record writes */
} moe_params;

typedef struct {
    comm *world;       /* the ranks of distinct tokens, in global-batch order (dp x cp of
                          one TP index and stage), or NULL */
    comm *ep;          /* NULL or one rank: EP 1 */
    comm *dense, *replicate, *expert_dp;
    int ep_size, ep_rank;
    int tokens;        /* a micro-batch's tokens on this rank */
    int zero;          /* ZeRO's stage for both vectors, each on its own group */
    int test_combine_misorder;   /* negative control (moe_layer_options) */
    int test_skip_param_gather;  /* negative control: zero 1-2's updated pieces kept apart */
} moe_params_groups;

void moe_params_init(moe_params *p, const moe_config *cfg, const gpt_config *model,
                     const moe_params_groups *g, uint64_t seed);
void moe_params_free(moe_params *p);
/* The start of a step: gradients zeroed, the coming backward's d(loss) (moe.h). */
void moe_params_step_begin(moe_params *p, float dloss);
/* After backward: the routers over the dense group (and the replicas), the experts over
 * the expert_dp group they were given. */
void moe_params_reduce(moe_params *p);
/* After moe_params_reduce: step's routing into the log (when there is one). */
void moe_params_record(moe_params *p, int step);
void moe_params_adamw(moe_params *p, const adamw_config *a);
/* Elements of the whole MoE part: the routers, then every expert of every MoE block
 * (block by block, expert by expert), as chapter 10's outcome lays them out. */
size_t moe_params_whole_numel(const moe_params *p);
/* Collective over ep (NULL: EP 1): the whole part's parameters (grads 0) or gradients
 * into out, which only the ep group's rank 0 gives (NULL elsewhere). */
void moe_params_whole(const moe_params *p, comm *ep, int grads, float *out);
/* The two gradient vectors AdamW reads (whole or the piece), for the loss scale;
 * returns 2. */
int moe_params_grad_vectors(moe_params *p, grad_vector *vectors);

/* The ZeRO stage a vector runs at on a group of `group` ranks: none on one rank. */
static inline int moe_vector_zero(int zero, int group) { return group > 1 ? zero : 0; }
/* Bytes a vector of n fp32 elements holds at rest on rank `rank` of `group`, by tag
 * (params, grads, optimizer: m and v), as moe_params_init allocates them. */
void moe_vector_state_bytes(size_t n, int zero, int group, int rank, double bytes[3]);

#endif
