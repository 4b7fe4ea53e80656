/* Chapter 10's parts: expert parallelism against one device and what its all-to-alls
 * carry (ep), where the tokens go (routing), and what an MoE model costs against a
 * dense one (cost). Every part trains through the library's mesh trainer
 * (common/parallel/compose/mesh_train.h: MoE on an EP x DP mesh, or on one rank), whose model
 * takes the MoE layer of common/model/moe.h; the chapter owns no training code.
 *
 * Under mpirun every process calls ep_launches (the collective runs); routing_local
 * and cost_local train on world rank 0's process alone, and only that process prints. */
#ifndef MOE_CHAPTER_H
#define MOE_CHAPTER_H
#include <stdio.h>

#include "data.h"
#include "mesh_train.h"
#include "moe.h"
#include "run_config.h"

/* ---- part ep: one device, EP over every rank, EP x DP ---------------------------------- */
#define EP_RUNS 3
typedef struct {
    int count;                     /* runs made: 1 on one rank, 2 or 3 */
    mesh_shape mesh[EP_RUNS];      /* [0] is one device: ep 1, dp 1 */
    run_result result[EP_RUNS];    /* their loss: the report's own copy (loss below) */
    float *loss[EP_RUNS];          /* [steps] per run, freed by ep_report_free */
    double alltoall[EP_RUNS], routed[EP_RUNS], uniform[EP_RUNS], mismatch[EP_RUNS];
    double remote_fraction[EP_RUNS];
    double dropped;                /* pairs dropped over the one-device run */
    double pairs;                  /* pairs routed over it */
    double worst_fraction;         /* largest difference / its tolerance, every EP run */
    run_tolerances tol;            /* mesh_run_tolerances (every run's dp is the ranks), the
                                      loss's past TOL_STEPS steps in 16 bits from fp32 */
    double loss_from_fp32;         /* that loss bound where it is the larger; 0: none */
} ep_report;

int ep_launches(const run_config *cfg, const dataset *data, const moe_config *moe,
                ep_report *r);
void ep_report_free(ep_report *r);
/* Every EP run within the tolerances of one device, and its bytes its routing's. */
int ep_report_agrees(const ep_report *r);
void ep_print(const ep_report *r, const moe_config *moe);
void ep_json(FILE *o, const ep_report *r);

/* ---- part routing: tokens per expert, dropping, the auxiliary loss --------------------- */
#define ROUTING_FACTORS 3   /* capacity factors 1.0, 1.25, 2.0 */
typedef struct {
    int experts, curve_steps;
    double aux_coef;                 /* the curve's with the loss (the flag's, or 0.01) */
    double *imbalance[2];            /* [curve_steps] max / mean, aux 0 and aux_coef */
    double *histogram[2];            /* [experts] the last step's pairs per expert */
    double factors[ROUTING_FACTORS], capacity[ROUTING_FACTORS];
    double dropped_share[ROUTING_FACTORS];   /* of the pairs, over the steps */
    double imbalance_at_factor[ROUTING_FACTORS];
} routing_report;

void routing_local(const run_config *cfg, const dataset *data, const moe_config *moe,
                   int curve_steps, routing_report *r);
void routing_print(const routing_report *r);
void routing_json(FILE *o, const routing_report *r);
int routing_write_svg(const char *path, const routing_report *r);
void routing_free(routing_report *r);
/* max / mean of a block's pairs per expert: 1 is perfect balance, E is one expert */
double routing_imbalance(const double *load, int experts);

/* ---- part cost: active against total parameters ---------------------------------------- */
typedef struct {
    double total[3], active[3], flops_per_token[3];   /* dense, MoE, dense of MoE's active */
    double counted_total;       /* the MoE run's vectors less the unused dense MLPs */
    double expert_share;        /* of the MoE's parameters, in experts */
    double state_per_rank[2];   /* model state bytes a rank holds (bytes_per_param):
                                   EP 1, EP = ranks of part ep's mesh */
    double bytes_per_param;     /* compute weights, gradients, Adam (and fp32 masters) */
    precision p, gp;            /* the run's --precision and --grad-dtype */
    int ep;
} cost_report;

void cost_local(const run_config *cfg, const moe_config *moe, int ep_size, cost_report *r);
void cost_print(const cost_report *r, const moe_config *moe);
void cost_json(FILE *o, const cost_report *r);

/* The chapter's model: 2 layers of the default width, 10 steps; see config.c. */
void moe_chapter_defaults(run_config *cfg);
/* The mesh trainer's options for the chapter's MoE runs: one stage, one micro-batch,
 * ZeRO 0; `name` the step lines'. */
pipeline_options moe_chapter_pipeline(const moe_config *moe, const char *name);
/* The MoE model trained on one rank of this process, `steps` steps: its
 * routing in x->moe_log. Non-zero when the run failed; x is the caller's to free
 * (mesh_extra_free), as the outcome o (strategy_outcome_free). */
int moe_chapter_one_device(const run_config *cfg, const dataset *data, const moe_config *moe,
                           int steps, strategy_outcome *o, mesh_extra *x);
/* The largest EP size of the mesh run: divides the ranks and the experts, below the
 * ranks when it can (so that DP > 1), 1 at the least. */
int moe_chapter_mesh_ep(int ranks, int experts);
/* Where the chapter computes: the CPU, as its routing reads the activations on the
 * host. A GPU that --device auto found (cfg's device cuda, asked not "cuda") is set
 * aside for the CPU; --device cuda itself (asked "cuda") gets the refusal, one line,
 * returned. NULL when the run goes ahead. */
const char *moe_chapter_device(run_config *cfg, const char *asked);

#endif
