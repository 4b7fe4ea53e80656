/* Training the MoE model (moe.h): on one device (the chapter's baseline) or on an EP x
 * DP mesh (mesh.h: its expert layout), through the one training loop.
 *
 *   every step, every rank:
 *       forward on its share of the global batch; each MoE block routes its tokens,
 *         dispatches them to their experts' EP ranks, runs its own experts on what it
 *         received and combines the outputs back (moe.h)
 *       backward: the same exchanges carry the gradients the other way
 *       dense gradients (attention, embeddings, routers): all-reduce over every rank
 *       expert gradients: all-reduce over expert_dp, the ranks that hold those experts
 *       AdamW on what the rank holds
 *
 * The routing is the one device's (ties to the lower expert, capacity counted over the
 * global batch in token order), so the numbers are the single-device run's up to the
 * order of float sums. */
#ifndef EP_TRAIN_H
#define EP_TRAIN_H
#include <stddef.h>

#include "baseline.h"
#include "data.h"
#include "mesh.h"
#include "moe.h"
#include "report.h"
#include "run_config.h"
#include "tolerances.h"

/* Against the single-device MoE run, as every chapter against its baseline. */
#define EP_TOL_GRADS TOL_GRADS
#define EP_TOL_LOSS TOL_LOSS
#define EP_TOL_PARAMS TOL_PARAMS

typedef struct {
    moe_config moe;
    mesh_shape mesh;                   /* tp 1, pp 1, dp the ranks, ep of them (expert-DP
                                          dp / ep); one device with ep_train_single */
    int test_combine_misorder;         /* negative control (moe_layer_options) */
    int test_expert_grads_over_ep;     /* negative control: expert gradients reduced over
                                          the EP group, not over expert_dp */
} ep_options;

/* What a run produced; the caller's host buffers, written by world rank 0. Vectors are
 * the whole MoE model in one layout: the dense model's | the routers | every expert of
 * every MoE block (block by block, expert by expert). */
typedef struct {
    run_result result;
    moe_shape shape;           /* the whole model's (EP 1) */
    size_t num_params;         /* of the vectors below */
    float *loss;               /* [steps] cross-entropy + aux, global-batch mean */
    float *first_grads, *final_params;
    double *aux;               /* [steps] the auxiliary loss */
    double *load;              /* [steps][moe_layers][E] pairs routed to each expert */
    double *dropped;           /* [steps][moe_layers] pairs dropped */
    /* the EP group's traffic per timed step, largest rank: measured, and from the
     * routing that rank saw (4 exchanges x rows sent to other ranks x C x 4 B, plus the
     * El counts a peer each MoE block); equal exactly on every rank, or the worst
     * |measured - routed| */
    double alltoall_bytes, alltoall_routed_bytes, alltoall_worst_mismatch;
    /* the textbook figure under uniform routing, no dropping: 4 exchanges x N k C 4 B
     * x (EP - 1) / EP a MoE block, N this rank's tokens */
    double alltoall_uniform_bytes;
    double remote_fraction;    /* of the rows exchanged, the share that left the rank */
} ep_outcome;

void ep_outcome_alloc(ep_outcome *o, const run_config *cfg, const moe_config *moe);
void ep_outcome_free(ep_outcome *o);
/* The outcome as the baseline that compare_to_baseline reads (borrowed vectors). */
baseline_run ep_outcome_as_baseline(const ep_outcome *o);

/* One device, on the calling thread (no communicator): the chapter's baseline. */
void ep_train_single(const run_config *cfg, const dataset *data, const ep_options *opts,
                     ep_outcome *out);
/* cfg->comm.ranks = opts->mesh.dp ranks; returns launch's status. */
int ep_launch(const run_config *cfg, const dataset *data, const ep_options *opts,
              ep_outcome *out);

#endif
