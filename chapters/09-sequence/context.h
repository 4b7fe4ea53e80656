/* Chapter 9's context-parallel part: each rank holds a chunk of every sequence, and
 * attention, the one op that needs the other chunks, crosses them by ring attention
 * (contiguous and balanced chunks) or by Ulysses' all-to-alls. Measured through the
 * library (cp_train.h): the three runs against the single-device baseline, each rank's
 * attention work under the causal mask, bytes per rank per layer next to their
 * formulas (and Megatron-SP's for the same sequence), and a long sequence's activation
 * bytes per rank against one device's.
 *
 * The chapter's main wires it as:
 *     context_flags f = {0};
 *     cli_option opts[] = {..., CONTEXT_CLI_OPTIONS(f), ..., {0}};
 *     cli_parse(...);
 *     context_check_flags(&cfg, ranks, &f, alone); (exits 2 with one line if bad)
 *     context_report r = {.flags = f};
 *     context_launches(&cfg, data, &r);            (every process of an mpirun)
 *     if (process_hosts_rank0()) context_print(&r) or context_json(stdout, &r),
 *                                 and context_passed(&r) for the exit status;
 *     context_report_free(&r);
 * and in a mode without context parallelism refuses the flags:
 *     context_refuse_flags("--part sp");  */
#ifndef CONTEXT_H
#define CONTEXT_H
#include <stdio.h>

#include "cli.h"
#include "cp_train.h"
#include "data.h"
#include "run_config.h"
#include "tolerances.h"

/* The flags: --cp N (0: every rank; the rest data parallel), --cp-attention
 * both|ring|ulysses, --cp-split both|contiguous|balanced (ring only). */
typedef struct {
    int cp;
    int attention;   /* 0 both, 1 ring, 2 ulysses (CONTEXT_CLI_OPTIONS' choices) */
    int split;       /* 0 both, 1 contiguous, 2 balanced */
} context_flags;
extern const char *const context_attention_choices[];   /* "both", "ring", "ulysses" */
extern const char *const context_split_choices[];       /* "both", "contiguous", "balanced" */
#define CONTEXT_CLI_OPTIONS(f)                                                              \
    {"cp", OPT_INT, &(f).cp, "context-parallel size (default: every rank)", NULL, 1},     \
    {"cp-attention", OPT_CHOICE, &(f).attention, "both|ring|ulysses", context_attention_choices, \
     0},                                                                                  \
    {"cp-split", OPT_CHOICE, &(f).split, "both|contiguous|balanced (ring)",               \
     context_split_choices, 0}
/* Before any rank starts: cli_fail (one line, exit 2) where the sizes do not fit; with
 * alone (the program runs this part alone) also --device cuda, which this part ignores
 * (its runs compute on the CPU). */
void context_check_flags(const run_config *cfg, int ranks, const context_flags *f,
                         int alone);
/* A mode of the chapter that runs no context parallelism refuses the three flags. */
void context_refuse_flags(const char *mode);

enum { CONTEXT_RUNS = 3 };   /* ring contiguous, ring balanced, Ulysses */
typedef struct {
    int ran;
    char skipped[200];   /* why it did not run, when the sizes do not fit it ("" else) */
    cp_options opts;
    run_result result;   /* against the baseline; loss points into `loss` */
    float *loss;
    cp_extra extra;
} context_run;

typedef struct {
    context_flags flags;   /* in: what to run (set before context_launches) */
    int world, cp, dp, B, T, C, H, L;
    precision precision, grad_precision;   /* the runs' and their gradients' */
    run_tolerances tol;                    /* the runs' bounds against the baseline */
    run_result baseline;
    float *baseline_loss;
    context_run runs[CONTEXT_RUNS];
    /* Megatron-SP's bytes per rank per layer for the same sequence on t = cp ranks */
    double sp_bytes_per_layer;
    /* the long sequence: one device's activation bytes, and each rank's with CP */
    int long_ctx, long_layers, long_ran[CONTEXT_RUNS];
    double long_baseline_activations, long_activations[CONTEXT_RUNS];
    double long_diff_loss[CONTEXT_RUNS], long_tol_loss;
} context_report;

/* Collective: every process of an mpirun calls it. Its runs and their baseline compute
 * in cfg's precision (and gradients) on the CPU whatever cfg's device (the CP kernels
 * are CPU code). A run whose sizes do
 * not fit (the flags were not checked, e.g. in a run of every part) is skipped and says
 * why. Returns 0, or launch's status. */
int context_launches(const run_config *cfg, const dataset *data, context_report *r);
/* Whether every run that ran holds the part's claims: loss, gradients and parameters
 * within the tolerances, bytes per layer equal to the formula, the balanced split's work
 * even (world rank 0's process). */
int context_passed(const context_report *r);
void context_print(const context_report *r);
/* Keys of the top-level object: "context": {...} (docs/json.md). */
void context_json(FILE *o, const context_report *r);
void context_report_free(context_report *r);

#endif
