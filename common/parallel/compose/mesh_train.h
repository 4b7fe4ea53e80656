/* Training on a mesh (mesh.h): every rank a pipeline stage's TP slice (with --sp) of
 * its CP chunk of every sequence in one data-parallel replica (ZeRO 0-3 over dp_shard x
 * cp, HSDP across replicas), composed by parallelize.h and pipeline.h. The outcome's extra (strategy_outcome.h) holds
 * every rank's measured bytes per group kind next to its formula, and its model state
 * next to the ZeRO paper's. */
#ifndef MESH_TRAIN_H
#define MESH_TRAIN_H

#include "baseline.h"
#include "mesh.h"
#include "pipeline.h"
#include "strategy_outcome.h"
#include "tolerances.h"

/* Against the baseline, as every chapter: gradients of step 1, loss, parameters. */
#define MESH_TOL_GRADS TOL_GRADS
#define MESH_TOL_LOSS TOL_LOSS
#define MESH_TOL_PARAMS TOL_PARAMS

/* One rank's measured bytes per step on each kind of group (pipeline.h: TP
 * all-reduces, PP sends, DP gradient reduction, the tied embedding's all-reduce, CP's
 * attention, HSDP's replicas), its formula, its calls. */
typedef struct {
    double bytes[PIPELINE_ALL_KINDS], formula[PIPELINE_ALL_KINDS];
    double calls[PIPELINE_ALL_KINDS];
    double state[3], state_formula[3];   /* params, grads, optimizer bytes held */
    double state_peak[3];   /* the same tags' peaks in the timed steps: ZeRO-3's gathered
                               stage and ZeRO-2/3's whole gradient of a step on top */
    double activations;                  /* peak activation bytes */
    /* MoE: the ep group's all-to-all bytes per timed step, measured and from the
     * routing this rank saw (rows sent to other ranks x C x 4 B, plus the El counts a
     * peer each MoE block), which must be equal; 0 without MoE */
    double alltoall, alltoall_routed;
    double remote_fraction;   /* MoE: of the rows this rank dispatched, the share that
                                 left it (timed steps) */
} mesh_rank_traffic;

/* The outcome's extra for 3D (strategy_outcome.extra): mesh_launch allocates `ranks`
 * before the ranks start, world rank 0 fills it; mesh_extra_free. */
typedef struct {
    mesh_shape shape;
    pipeline_options opts;
    mesh_rank_traffic *ranks; /* [world], in world rank order */
    double worst_bytes_error; /* largest |measured / formula - 1| over ranks and kinds */
    double alltoall_mismatch; /* MoE: largest |all-to-all bytes - the routing's|, a rank */
    /* MoE: the routers and every expert (moe_params_whole), step 1's gradients and the
     * final parameters, on world rank 0; NULL for a dense model */
    float *moe_first_grads, *moe_final_params;
    size_t moe_num_params;
    moe_routing_log moe_log;  /* MoE: every step's routing (moe_params.h), world rank 0 */
    double tied_drift;
} mesh_extra;
static inline const mesh_extra *mesh_extra_of(const strategy_outcome *o) { return o->extra; }
void mesh_extra_free(mesh_extra *x);

/* The formulas, for one rank of the mesh: bytes per group kind (pipeline_bytes_formula)
 * and the model state it stores (exposed for the tests). */
void mesh_traffic_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                          const pipeline_options *opts, mesh_rank_traffic *t);

/* Launches the mesh's ranks (cfg->comm.ranks must equal it; parallelize_check first)
 * and trains; rank0_out->extra,
 * when set, is a mesh_extra. Returns launch's status. */
int mesh_launch(const run_config *cfg, const dataset *data, mesh_shape shape,
                const pipeline_options *opts, strategy_outcome *rank0_out);
/* The same trainer on one rank of this process (every group of one, nothing
 * exchanged): the single-device run of the model opts describes, the MoE model's too,
 * in cfg's precision. rank0_out->extra, when set, is a mesh_extra (its MoE vectors). */
int mesh_train_one_device(const run_config *cfg, const dataset *data,
                          const pipeline_options *opts, strategy_outcome *rank0_out);
/* A one-device outcome as the baseline the mesh's is compared with (borrowed vectors). */
baseline_run mesh_outcome_as_baseline(const strategy_outcome *o);
double mesh_worst_fraction_of_tolerance(const run_result *r);
/* The bounds a mesh's run is held to against baseline b in any precision: TP's
 * (tp_run_tolerances), with 16-bit gradients (tolerances_with_grads16) the dp x cp
 * ranks' partial gradients each rounded once, with MoE (moe: NULL or experts 0 for a
 * dense model) its experts' rows where 16-bit products are widened
 * (tolerances_with_moe_rows) and in fp32 past TOL_STEPS steps its routing's flips
 * (tolerances_with_moe_routing: the loss not held, t.loss 0). */
run_tolerances mesh_run_tolerances(const run_config *cfg, mesh_shape shape,
                                   const moe_config *moe, const baseline_run *b);
/* Past TOL_STEPS steps in 16 bits the loss is held within twice one device's own
 * distance from fp32 (mixed_loss_tolerance): the one-device run of loss16 (the dense
 * baseline, or with opts' MoE the MoE model) trained again in fp32, quietly. Returns
 * that bound, 0 where MIXED_TOL_LOSS alone holds (fp32, or TOL_STEPS steps or fewer),
 * -1 when the fp32 run failed. On world rank 0, outside any launch. */
double mesh_loss_bound_from_fp32(const run_config *cfg, const dataset *data,
                                 const pipeline_options *opts, const float *loss16);

#endif
