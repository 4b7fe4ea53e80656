/* Chapter 9's parts: Megatron sequence parallelism next to plain TP (sp) and the
 * activation bytes per layer of six configurations next to Korthikanti et al. 2022
 * re-derived for this model (memory). Each part measures through the library
 * (tp_launch, gpt_model, activation_memory.h) and formats; it owns no training code.
 *
 * Under mpirun every process calls the *_launches functions (collective); only the
 * process of world rank 0 holds the results and prints them. */
#ifndef SEQUENCE_H
#define SEQUENCE_H
#include <stdio.h>

#include "activation_memory.h"
#include "baseline.h"
#include "data.h"
#include "run_config.h"
#include "tp_train.h"

/* ---- part sp: TP against TP + SP --------------------------------------------------- */
enum { SP_RUN_TP, SP_RUN_SP, SP_RUNS };
typedef struct {
    int tp, dp;
    plan_recompute recompute;        /* --recompute, both runs */
    run_result baseline;             /* its row */
    run_result run[SP_RUNS];         /* compared with the baseline */
    tp_extra extra[SP_RUNS];
    double worst[SP_RUNS];           /* largest difference / its tolerance */
    run_tolerances tolerances;
    precision precision;
    double bytes_added;              /* SP's additions by the formula: */
    double bytes_gathered_again, bytes_layernorm_grads;   /* ... all-gathers, all-reduces */
    double activations_per_layer[SP_RUNS];   /* the formula's, for the batch per group */
    float *losses[SP_RUNS + 1];      /* the rows' loss curves (baseline, tp, tp+sp) */
} sp_report;

/* The largest TP size that divides the heads, the ranks and ctx (1: none). */
int sp_largest_tp(const run_config *cfg);
int sp_launches(const run_config *cfg, const dataset *data, int tp, plan_recompute recompute,
                sp_report *r);
/* SP's reduce-scatter + all-gather bytes less its gathers again, minus TP's all-reduce
 * bytes of activations: 0 when a ring all-reduce is a reduce-scatter + an all-gather. */
double sp_allreduce_identity_error(const sp_report *r);
int sp_passed(const sp_report *r);
void sp_free(sp_report *r);
void sp_print(const run_config *cfg, const sp_report *r);
void sp_json(FILE *o, const sp_report *r);

/* ---- part memory: six configurations -------------------------------------------------- */
#define MEMORY_SETUPS 6   /* none, TP, TP + SP, TP + selective, TP + SP + selective, full */
typedef struct {
    int tp, B;
    gpt_config model;
    precision precision;   /* of the activations (LayerNorm statistics: fp32) */
    activation_setup setup[MEMORY_SETUPS];
    /* bytes per layer per rank: measured (allocator, 2 layers less 1), re-derived,
     * and the paper's 16-bit-with-dropout Table 2 */
    double measured[MEMORY_SETUPS], derived[MEMORY_SETUPS], paper[MEMORY_SETUPS];
} memory_report;

extern const char *const memory_setup_names[MEMORY_SETUPS];
/* The six setups at TP size tp: none and full recomputation on one rank, the rest on tp. */
void memory_setups(int tp, activation_setup out[MEMORY_SETUPS]);
/* Activation bytes one rank's model of shape setup c holds at its peak over one
 * forward and backward of B sequences, for `layers` blocks of cfg's model (tp: the
 * group, NULL for tp 1). Collective over tp. */
double memory_peak_activations(comm *tp, const run_config *cfg, activation_setup c, int B,
                               int layers);
int memory_launches(const run_config *cfg, int tp, memory_report *r);
int memory_passed(const memory_report *r);
void memory_print(const memory_report *r);
void memory_json(FILE *o, const memory_report *r);
int memory_write_svg(const char *path, const memory_report *r);

#endif
