/* Chapter 6: the course's "how to choose" as a planner. The formulas live in
 * common/plan/plan_memory.h and plan_time.h; this chapter lays out the strategies,
 * searches the 3D meshes, walks the decision tree and prints what it found. */
#ifndef PLANNER_H
#define PLANNER_H

#include <stddef.h>

#include "plan_memory.h"
#include "plan_moe.h"
#include "plan_restart.h"
#include "plan_time.h"
#include "precision.h"

/* What the checkpoint section is given: one GPU's MTBF, and the save time or the write
 * bandwidth it follows from. */
typedef struct {
    double gpu_mtbf_hours;       /* one GPU's (a job's MTBF x its GPUs when given so) */
    int mtbf_given;              /* 0: Llama 3's rate; 1: --gpu-mtbf-hours; 2: the job's,
                                    --mtbf-hours */
    double save_bandwidth;       /* bytes/s each GPU writes its share of a checkpoint at */
    double save_seconds;         /* > 0: as given, else 12 P / (GPUs x save_bandwidth) */
    double restart_seconds;      /* >= 0: as given, else the load: the save's time again */
} plan_failure_inputs;

/* What to plan for. */
typedef struct {
    plan_model model;
    plan_cluster cluster;
    double gpu_bytes;            /* memory of one GPU */
    int micro_batch, global_batch;
    int recompute;               /* -1: the lightest that fits; else a plan_recompute */
    plan_mesh mesh;              /* an explicit mesh to evaluate too; tp = 0: none */
    precision dtype;             /* what it trains in: bf16 or fp16 (main's default), or
                                    fp32; set it, 0 is fp32 */
    plan_zero3_gather gather;    /* how every mesh's ZeRO-3 gathers (0: per pass, FSDP's;
                                    --predict-chapters: per step, chapter 11's) */
    plan_activation_count activations;   /* whose activations (0: Korthikanti's;
                                            --predict-chapters: this model's) */
    plan_tp_count tp_count;      /* whose TP rank (0: the papers'; --predict-chapters:
                                    this model's) */
    int fp8;                     /* bf16 with FP8 linears (--precision fp8): ZeRO-3 gathers
                                    1-byte weights plus scales; flops at the FP8 peak */
    const char *model_name;      /* --model's preset, or NULL */
    plan_moe moe;                /* experts 0: a dense model */
    int ep;                      /* expert-parallel size, out of the mesh's dp (MoE) */
    plan_failure_inputs failures;
} plan_request;

/* The planner's bytes for a precision: bf16 and fp16 the ZeRO paper's 2 + 2 + 12 with
 * 2-byte activations (PLAN_MIXED_ADAM), fp32 4 + 4 + 8 with 4-byte ones. */
plan_precision plan_precision_of(precision dtype);
/* The request's: plan_precision_of its dtype, the gathered weights FP8's with fp8. */
plan_precision plan_precision_for(const plan_request *r);
/* One line: the precision and what it holds, e.g. "precision bf16: 2 + 2 + 12 ..." */
const char *plan_precision_line(const plan_request *r, char *line, size_t size);

/* One strategy on the request's cluster. */
typedef struct {
    char name[16];               /* ddp, zero1, zero2, zero3, tp, pp, hsdp, 3d, mesh */
    plan_mesh mesh;
    int feasible;                /* dp x micro-batch divides the global batch */
    plan_bytes memory;           /* per GPU, the GPU that holds the most */
    int fits;
    plan_step step;
} plan_row;

#define PLAN_MAX_ROWS 9

/* A mesh with the request's batch and recomputation (-1: the lightest that fits). */
plan_row plan_evaluate(const plan_request *r, const char *name, plan_mesh mesh);
/* The fastest fitting mesh of every tp (powers of 2 inside a node, dividing the heads),
 * pp, ZeRO stage (at most 1 with a pipeline) and, for ZeRO-3, HSDP shard group (powers
 * of 2 dividing dp); cp only when nothing fits without it; 0 when none fits. */
int plan_best_mesh(const plan_request *r, plan_row *best);
/* DDP, ZeRO-1/2/3 and TP, PP over all GPUs, HSDP (ZeRO-3 in the fewest whole nodes that
 * fit it, on more than one node), the best 3D mesh, and the explicit mesh when there is
 * one. Returns the number of rows. */
int plan_strategies(const plan_request *r, plan_row rows[PLAN_MAX_ROWS]);
const plan_row *plan_find_row(const plan_row *rows, int n, const char *name);

/* The decision tree, walked with the numbers. */
#define PLAN_MAX_STEPS 8
typedef struct {
    char steps[PLAN_MAX_STEPS][512];
    int num_steps;
    int found;                   /* 0: nothing fits this cluster */
    char strategy[80];           /* "DDP", "ZeRO-1", "FSDP (ZeRO-3)", "HSDP ...", "TP + PP + DP" */
    plan_row choice;
} plan_decision;
void plan_decide(const plan_request *r, const plan_row *rows, int n, plan_decision *d);

/* Printing (plan_report.c). */
void plan_print(const plan_request *r, const plan_row *rows, int n,
                const plan_decision *d, double tokens, int max_params);
void plan_print_json(const plan_request *r, const plan_row *rows, int n,
                     const plan_decision *d, double tokens, int max_params);
/* --max-params without a model: the largest model per ZeRO stage alone (r's GPUs,
 * memory and mesh), as a table or JSON. */
void plan_print_max_params(const plan_request *r, int json);

/* A mixture of experts (moe.c): the MoE on the request's mesh against a dense model of
 * its active size, as text or as one JSON object. */
void moe_print(const plan_request *r, int json);
/* Expert parallelism searched: every ep of the request's mesh (a divisor of the experts
 * and dp), with its memory per GPU at the lightest recomputation that fits and its
 * all-to-all, which leaves the node once tp x ep GPUs do not fit one. */
typedef struct {
    int ep;
    plan_recompute recompute;
    double total_bytes;
    int fits;
    double alltoall_bytes, alltoall_seconds;   /* per GPU per iteration */
    comm_link link;
} plan_ep_option;
#define PLAN_MAX_EP_OPTIONS 64
int plan_ep_options(const plan_request *r, plan_ep_option *out, int max);
/* The search's choice, an index into o (-1: none fits): of those that fit with the
 * lightest recomputation any needs (recomputing costs a forward pass), the least
 * all-to-all. */
int plan_best_ep(const plan_ep_option *o, int n);

/* Checkpoints and failures (failures.c): the job's MTBF, the save time, Young's
 * interval and what failures cost, for the request's model (an MoE's total
 * parameters). */
plan_failures plan_failures_of(const plan_request *r);
void failures_print(const plan_request *r);
/* ,\n "checkpoint": {...}: keys to append to an open JSON object */
void failures_print_json(const plan_request *r);

/* --course: the course text's claims checked by arithmetic (course.c). */
void course_print(void);

#endif
