/* Training on a TP x PP x DP mesh: every rank a pipeline stage's TP slice in one
 * data-parallel replica, composed from the library pieces (mesh.h, pipeline.h, the TP
 * layers inside the model's blocks). What the chapter's tables show, measured, with
 * each collective's bytes next to its formula. */
#ifndef RUN3D_H
#define RUN3D_H

#include "compare.h"
#include "mesh.h"
#include "pipeline.h"
#include "baseline.h"
#include "replica.h"
#include "tolerances.h"

/* Against the baseline, as every chapter: gradients of step 1, loss, parameters. */
#define MESH_TOL_GRADS TOL_GRADS
#define MESH_TOL_LOSS TOL_LOSS
#define MESH_TOL_PARAMS TOL_PARAMS

/* The group kinds whose traffic is counted (pipeline.h): TP all-reduces, PP sends, DP
 * gradient reduction, the tied embedding's all-reduce between first and last stage. */
enum { GROUP_KINDS = PIPELINE_GROUP_KINDS };

/* One rank's measured bytes per step on each kind of group, its formula, its calls. */
typedef struct {
    double bytes[GROUP_KINDS], formula[GROUP_KINDS], calls[GROUP_KINDS];
    double state[3], state_formula[3];   /* params, grads, optimizer bytes held */
    double activations;                  /* peak activation bytes */
} rank_traffic;

typedef struct {
    mesh_shape shape;
    pipeline_options opts;
    run_result result;        /* compared with the baseline when one was given */
    float *loss;
    rank_traffic *ranks;      /* [world], in world rank order */
    double worst_bytes_error; /* largest |measured / formula - 1| over ranks and kinds */
    double tied_drift;
} mesh_outcome;

/* The formulas, for one rank of the mesh: bytes per group kind (pipeline_bytes_formula)
 * and the model state it stores (exposed for the tests). */
void mesh_traffic_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                          const pipeline_options *opts, rank_traffic *t);

/* Launches t x p x d ranks (cfg->comm.ranks must equal it) and trains; the outcome is
 * world rank 0's. Returns launch's status. */
int mesh_run_launch(const run_config *cfg, const dataset *data, mesh_shape shape,
                    const pipeline_options *opts, const baseline_run *baseline,
                    mesh_outcome *out);
void mesh_outcome_free(mesh_outcome *o);
double mesh_worst_fraction_of_tolerance(const run_result *r);

#endif
