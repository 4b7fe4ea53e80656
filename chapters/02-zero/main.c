/* Chapter 2: ZeRO stages 0 (plain DDP), 1, 2 and 3 (FSDP), each compared with the
 * single-device baseline, with memory per rank measured and communication counted.
 *   make chapter2 && ./run 4 [--stage all|0|1|2|3] [--prefetch] [--checkpoint-activations]
 *   ./run 4 --stage 3 --zeropp qwz,hpz,qgz --link-intra nvlink --link-inter ib
 *           --ranks-per-node 2                (ZeRO++'s pieces, any subset: zeropp.h)
 *   ./run 1 --estimate 7.5e9 --world 64 [--gpu-mem 80]     (the formulas, no training) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "cli.h"
#include "compare.h"
#include "estimate.h"
#include "fits.h"
#include "tables.h"
#include "tolerances.h"
#include "fp8_linear.h"
#include "fsdp_fp8.h"
#include "zero_train.h"

static const char *const stage_choices[] = {"all", "0", "1", "2", "3", NULL};

typedef struct {
    run_config cfg;
    const dataset *data;
    const baseline_run *baseline;   /* NULL in processes without world rank 0 */
    zero_options opts;              /* all but the stage */
    int stages[ZERO_STAGES], num_stages;
    /* one per stage run, buffers allocated before the ranks start (world rank 0's) */
    strategy_outcome runs[ZERO_STAGES];
    zero_extra extras[ZERO_STAGES];
    int status;                     /* world rank 0: 1 when a stage missed a tolerance */
} chapter_args;

/* The run's tolerances: with 16-bit gradients, rounding at 16 bits over N ranks. */
static run_tolerances chapter_tolerances(const run_config *cfg, const baseline_run *b) {
    return tolerances_for_grads16(cfg, cfg->comm.ranks, baseline_largest_grad(b));
}

/* ZeRO++ with qwZ or qgZ: quantised on purpose, so held to the loss band of
 * tolerances.h (its step-1 gradients to their block bound in test_zeropp). */
static int zero_run_is_lossy(const strategy_outcome *o) {
    return (zero_extra_of(o)->opts.zeropp & (ZEROPP_QWZ | ZEROPP_QGZ)) != 0;
}

/* The lossy runs' verdict lines; returns 1 when one leaves the band. */
static int print_lossy(const baseline_run *b, const strategy_outcome *runs, int n, int quiet) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (!zero_run_is_lossy(&runs[i])) continue;
        const double f = zeropp_loss_band_fraction(runs[i].loss, b->loss, runs[i].result.steps);
        char name[32];
        zeropp_name(zero_extra_of(&runs[i])->opts.zeropp, name, sizeof name);
        if (!quiet)
            printf("%s: ZeRO++ %s quantises on purpose: its loss within %.0e of the baseline's"
                   " %s, at %.0f%% of that band (step 1's gradient, max |diff| %.2e, is held to"
                   " its block bound by tests/test_zeropp.c)\n", f <= 1 ? "OK" : "FAILED", name,
                   runs[i].result.steps <= ZEROPP_BAND_STEPS ? ZEROPP_LOSS_BAND : ZEROPP_MEAN_BAND,
                   runs[i].result.steps <= ZEROPP_BAND_STEPS ? "at every step" : "on the run's mean",
                   100 * f, runs[i].result.diff_grads);
        failed |= !(f <= 1);
    }
    return failed;
}

/* ZeRO++'s run: what its tables' rows mean, bytes per tier and hpZ's memory next to their
 * formulas (zeropp.h). */
static void print_zeropp(const run_config *cfg, const strategy_outcome *runs, int n) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    const int N = cfg->comm.ranks, K = cfg->comm.ranks_per_node > 0 ? cfg->comm.ranks_per_node : N;
    for (int i = 0; i < n; i++) {
        const int pieces = zero_extra_of(&runs[i])->opts.zeropp;
        if (!pieces) continue;
        char name[32];
        double f[2];
        zeropp_tier_bytes(&s, pieces, 0, N, K, f);
        const double *m = runs[i].result.tier_bytes_per_step;
        printf("\nzero3 ran with ZeRO++ %s (its rows above: quantised blocks on the wire, not the"
               " ring's fp32 theory).\nBytes per step, largest rank: intra-node %.0f (formula"
               " %.0f), inter-node %.0f (formula %.0f)\n", zeropp_name(pieces, name, sizeof name),
               m[0], f[0], m[1], f[1]);
        if (pieces & ZEROPP_HPZ)
            printf("hpZ's secondary shards: %.0f B a rank (formula: 4 x its node-pieces of the"
                   " blocks), in the params column\n", zeropp_hpz_extra_bytes(&s, K));
    }
}

/* Stage 3 under --precision fp8 (any recipe) gathers FP8 weights
 * (fsdp_fp8.h): its bytes next to their formula. */
static void print_fp8_gather(const run_config *cfg, const strategy_outcome *runs, int n) {
    fp8_recipe recipe;
    if (!cfg->fp8 || !fp8_linear_active(&recipe) || !fp8_linear_takes_given_weights()) return;
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    for (int i = 0; i < n; i++) {
        if (zero_extra_of(&runs[i])->opts.stage != 3) continue;
        double f[2];
        fsdp_fp8_gather_bytes(&s, recipe, runs[i].world_size, f);
        printf("\nzero3 in fp8 (%s) gathers the blocks' linears in forward as E4M3 codes with the"
               " whole weights'\nscales (backward's gathers stay bf16): all-gather %.0f B a step"
               " (formula %.0f), its all-reduces\n(the blocks' weight amaxes, LayerNorms and biases)"
               " %.0f B (formula %.0f)\n",
               fp8_recipe_name(recipe), runs[i].comm_bytes[COMM_KIND_ALLGATHER], f[0],
               runs[i].comm_bytes[COMM_KIND_ALLREDUCE], f[1]);
    }
}

/* The worst stage against the tolerances, over the checked differences or all three. */
static double worst_stage(const run_tolerances tol, const strategy_outcome *runs, int n,
                          int all_three, const char **name) {
    double worst = 0;
    *name = "-";
    for (int i = 0; i < n; i++) {
        if (zero_run_is_lossy(&runs[i])) continue;   /* held to the loss band instead */
        double f = zero_worst_fraction_of_tolerance(&runs[i].result, &tol, all_three);
        if (f >= worst) {
            worst = f;
            *name = runs[i].result.strategy;
        }
    }
    return worst;
}

static void print_verdict(const run_config *cfg, const run_tolerances tol,
                          const strategy_outcome *runs, int n) {
    const char *name, *name_all;
    const double worst = worst_stage(tol, runs, n, 0, &name);
    const double worst_all = worst_stage(tol, runs, n, 1, &name_all);
    printf("\n%s: every stage against the baseline (%s%s tolerances: gradients of step 1 %.1e,"
           " loss %.0e, parameters %.1e)\n", worst <= 1 ? "OK" : "FAILED",
           cfg->fp8 ? "fp8 (bf16 with FP8 linears)" : precision_name(cfg->precision),
           cfg->grad_precision != PRECISION_FP32 ? ", 16-bit gradients" : "", tol.grads,
           tol.loss, tol.params);
    if (worst_all <= 1)
        printf("    all within; worst: %s at %.0f%% of its tolerance\n", name_all,
               100 * worst_all);
    else if (cfg->steps <= TOL_STEPS)
        printf("    EXCEEDED: %s at %.0f%% of its tolerance\n", name_all, 100 * worst_all);
    else
        printf("    gradients within (worst: %s at %.0f%%); after %d steps loss or parameters"
               " differ by more\n    (%s at %.0f%%): AdamW lets rounding differences grow"
               " where a gradient is near 0, so\n    they are checked in runs of at most %d"
               " steps (--steps %d)\n", name, 100 * worst, cfg->steps, name_all,
               100 * worst_all, TOL_STEPS, TOL_STEPS);
}

static int rank_main(comm *world, void *argument) {
    chapter_args *a = argument;
    const int is_root = comm_rank(world) == 0;
    strategy_outcome local[ZERO_STAGES], *runs = a->runs;   /* world rank 0's */
    for (int i = 0; i < a->num_stages; i++) {
        zero_options opts = a->opts;
        opts.stage = a->stages[i];
        if (opts.stage != 3) opts.zeropp = 0;   /* stage 0 runs first for the savings */
        strategy_outcome *o = strategy_outcome_for_rank(world, &a->runs[i], &local[i]);
        zero_train(world, &a->cfg, a->data, &opts, o);
        if (is_root)
            compare_to_baseline(&o->result, a->baseline, o->loss, o->first_grads,
                                o->final_params);
    }
    if (is_root) {
        const run_tolerances tol = chapter_tolerances(&a->cfg, a->baseline);
        run_result rows[ZERO_STAGES + 1];
        rows[0] = a->baseline->result;
        for (int i = 0; i < a->num_stages; i++) rows[i + 1] = runs[i].result;
        const char *backend = comm_backend_name(world);
        if (a->cfg.json) {
            char *extra = tables_json(&a->cfg, runs, a->num_stages);
            report_json(&a->cfg, "02-zero", comm_size(world), backend, rows,
                        a->num_stages + 1, extra);
            free(extra);
        } else {
            report_table(&a->cfg, rows, a->num_stages + 1);
            print_memory_table(&a->cfg, runs, a->num_stages);
            print_comm_table(&a->cfg, backend, comm_bytes_are_modelled(world), runs,
                             a->num_stages);
            print_zeropp(&a->cfg, runs, a->num_stages);
            print_fp8_gather(&a->cfg, runs, a->num_stages);
            print_verdict(&a->cfg, tol, runs, a->num_stages);
        }
        for (int i = 0; i < a->num_stages; i++)
            if (worst_stage(tol, &runs[i], 1, 0, &(const char *){0}) > 1) a->status = 1;
        if (print_lossy(a->baseline, runs, a->num_stages, a->cfg.json)) a->status = 1;
    }
    return 0;
}

/* --zeropp: its pieces, or one line and exit 2 (stage: -1 for all). */
static int take_zeropp(run_config *cfg, const char *text, int stage, int prefetch) {
    if (!text) return 0;
    char err[300];
    int pieces;
    if (zeropp_parse(text, &pieces, err, sizeof err)) cli_fail("%s", err);
    if (cfg->comm.ranks_per_node > 0 && launch_mpi_world_size() > 0)
        cli_fail("--zeropp %s with --ranks-per-node: the two tiers of links are modelled on"
                 " the threads backend (run it without mpirun)", text);
    if (zeropp_check(pieces, stage, cfg->precision, cfg->grad_precision, prefetch,
                     cfg->comm.ranks, cfg->comm.ranks_per_node, err, sizeof err))
        cli_fail("%s", err);
    cli_cpu_only(cfg, "ZeRO++'s block codecs read");
    return pieces;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = TOL_STEPS;   /* so that loss and parameters are checked too */
    cfg.fp8_training = 1;   /* bf16 with FP8 linears (fp8_linear.h); the all-gather stays bf16 */
    int stage_choice = 0, prefetch = 0, checkpoint = 0, world = 0;
    const char *zeropp_text = NULL;
    double estimate = -1, gpu_mem = -1;
    const cli_option options[] = {
        {"stage", OPT_CHOICE, &stage_choice, "ZeRO stage to run", stage_choices, 0},
        {"prefetch", OPT_FLAG, &prefetch,
         "stage 3: all-gather the next block while this one computes", NULL, 0},
        {"zeropp", OPT_STRING, &zeropp_text,
         "stage 3: ZeRO++'s pieces, any of qwz,hpz,qgz (comma-separated)", NULL, 0},
        {"checkpoint-activations", OPT_FLAG, &checkpoint,
         "keep only block inputs in forward, recompute in backward", NULL, 0},
        {"estimate", OPT_FLOAT, &estimate,
         "print model-state memory per device for this many parameters; no training",
         NULL, 1},
        {"world", OPT_INT, &world, "devices for --estimate", NULL, 1},
        {"gpu-mem", OPT_FLOAT, &gpu_mem, "GB per device for --estimate (default 80)", NULL,
         1e-3},
        {0},
    };
    cli_parse(argc, argv, &cfg, options, argv[0],
              "ZeRO stages 0-3 (stage 3 = FSDP): memory per rank and communication, each"
              " compared with single-device training.");

    if (estimate < 0 && (world > 0 || gpu_mem > 0))
        cli_fail("--%s needs --estimate PARAMS (e.g. --estimate 7.5e9 --world 64)",
                 world > 0 ? "world" : "gpu-mem");
    if (estimate >= 0) {
        cli_check_at_most("estimate", estimate, 1e15, "a million billion parameters");
        cli_check_at_most("gpu-mem", gpu_mem, 1e6, "a petabyte a device");
        if (world == 0) cli_fail("--estimate %g needs --world N (e.g. --world 64)", estimate);
        if (zeropp_text)
            cli_fail("--zeropp %s with --estimate: the estimate trains nothing", zeropp_text);
        /* under mpirun every process gets here; one table is enough */
        if (process_hosts_rank0()) estimate_print(estimate, world, gpu_mem > 0 ? gpu_mem : 80.0);
        return 0;
    }
    const int ranks = cfg.comm.ranks;
    const int pieces = take_zeropp(&cfg, zeropp_text, stage_choice - 1, prefetch);
    if (cfg.batch < ranks)
        cli_fail("--batch %d gives %d ranks fewer than one sequence each; use --batch %d"
                 " or more, or fewer ranks", cfg.batch, ranks, ranks);
    fits_check_or_exit(&cfg, 1.0);   /* stage 0 (DDP) runs first: a replica per rank */

    chapter_args a = {.cfg = cfg,
                      .opts = {.prefetch = prefetch, .checkpoint_activations = checkpoint,
                               .zeropp = pieces}};
    if (stage_choice == 0) {
        for (int s = 0; s < ZERO_STAGES; s++) a.stages[a.num_stages++] = s;
    } else {
        /* the savings column compares with stage 0, so it always runs first */
        a.stages[a.num_stages++] = 0;
        if (stage_choice - 1 != 0) a.stages[a.num_stages++] = stage_choice - 1;
    }
    dataset *data = dataset_from_config(&cfg);
    a.data = data;
    baseline_run *baseline = NULL;
    if (process_hosts_rank0()) {
        report_header(&cfg, "ZeRO stages 1-3 and FSDP vs single-device training", ranks, 1);
        baseline = baseline_reference(&cfg, data);
    }
    a.baseline = baseline;
    for (int i = 0; i < a.num_stages; i++) {
        a.runs[i].extra = &a.extras[i];
        strategy_outcome_alloc(&a.runs[i], &cfg);
    }
    int status = launch(&cfg.comm, rank_main, &a);
    for (int i = 0; i < a.num_stages; i++) strategy_outcome_free(&a.runs[i]);
    baseline_free(baseline);
    dataset_free(data);
    return status ? status : a.status;
}
