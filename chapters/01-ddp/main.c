/* Chapter 1: data parallelism two ways.
 *   DP  - torch.nn.DataParallel: one process, one thread per replica, a global lock
 *         around every op, all traffic through a master replica.
 *   DDP - DistributedDataParallel: one rank per replica, gradients averaged by
 *         bucketed all-reduce that overlaps backward.
 * Both are compared with single-device training on the same global batch.
 *
 *   make chapter1 && ./run 4 [--gil release] [--bucket-mb 1] [--grad-accum 2]
 *                            [--compress bf16|fp16|fp8] [--trace trace.json] */
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "compare.h"
#include "ddp.h"
#include "dp.h"
#include "fits.h"
#include "report.h"
#include "baseline.h"
#include "replica.h"
#include "tolerances.h"

static const char *const compress_names[] = {"none", "bf16", "fp16", "fp8", NULL};
static const comm_dtype compress_types[] = {COMM_F32, COMM_BF16, COMM_F16, COMM_F8E4M3};
static const char *const gil_names[] = {"hold", "release", NULL};
static const char *const strategy_names[] = {"all", "dp", "ddp", NULL};
enum { RUN_ALL, RUN_DP, RUN_DDP };

/* The uncompressed runs are held to tolerances.h's tolerances against the baseline. */

typedef struct {
    double bucket_mb, first_bucket_mb;
    int grad_accum, compress, gil, strategy;
} chapter_flags;

/* The run's tolerances: with 16-bit gradients, rounding at 16 bits of each rank's
 * micro-batch gradients (tolerances_for_grads16, G the baseline's largest). */
static run_tolerances run_tolerances_of(const run_config *cfg, const chapter_flags *f,
                                        const baseline_run *b) {
    return tolerances_for_grads16(cfg, cfg->comm.ranks * f->grad_accum,
                                  baseline_largest_grad(b));
}

static int within_tolerance(const run_tolerances *tol, const run_result *r) {
    if (r->diff_grads > tol->grads) return 0;
    if (r->steps > TOL_STEPS) return 1;
    return r->diff_loss <= tol->loss && r->diff_params <= tol->params;
}

static void print_bytes_table(const run_config *cfg, const dp_extra *dp,
                              const strategy_outcome *ddp, size_t num_params) {
    char a[32], b[32], c[32], d[32], e[32];
    const int N = cfg->comm.ranks;
    const double grad_bytes = (double)num_params * precision_bytes(cfg->grad_precision);
    printf("\nbytes per step (gradients: %s of %s; N = %d)\n", report_bytes(grad_bytes, a),
           precision_name(cfg->grad_precision), N);
    if (dp) {
        double total = dp->params_out_bytes + dp->batch_out_bytes + dp->grads_in_bytes;
        const double weight_bytes = (double)num_params * precision_bytes(cfg->precision);
        printf("  dp   through the master: params out %s + batch out %s + grads in %s = %s"
               "   ((N-1) x (compute weights + gradient bytes) = %s)\n",
               report_bytes(dp->params_out_bytes, a), report_bytes(dp->batch_out_bytes, b),
               report_bytes(dp->grads_in_bytes, c), report_bytes(total, d),
               report_bytes((N - 1) * (weight_bytes + grad_bytes), e));
    }
    if (ddp) {
        const run_result *r = &ddp->result;
        printf("  ddp  every rank sends %s and receives as much"
               "   (2(N-1)/N x %s = %s each way)\n",
               report_bytes(r->bytes_sent_per_step, a),
               ddp_extra_of(ddp)->opts.wire == COMM_F32 ? "gradient bytes"
                                                        : "gradient elements x wire size",
               report_bytes(r->bytes_formula, b));
    }
}

static void print_dp_table(const dp_extra *dp) {
    const double ms = 1e3;
    const double step = dp->replicate_seconds + dp->scatter_seconds + dp->parallel_seconds +
                        dp->gather_seconds + dp->optimizer_seconds;
    printf("\ndp: %d threads in one process, --gil %s; per step on the master's clock\n",
           dp->opts.threads, dp->opts.release_gil ? "release" : "hold");
    printf("  replicate params %.2f ms | scatter batch %.2f ms | forward+backward %.2f ms |"
           " gather grads %.2f ms | AdamW (master only) %.2f ms\n",
           ms * dp->replicate_seconds, ms * dp->scatter_seconds, ms * dp->parallel_seconds,
           ms * dp->gather_seconds, ms * dp->optimizer_seconds);
    printf("  GIL: %.0f acquisitions; held %.2f ms (%.0f%% of forward+backward, one thread at"
           " a time), threads waited for it %.2f ms in all\n",
           dp->gil_acquisitions, ms * dp->gil_held_seconds, 100 * dp->gil_busy_fraction,
           ms * dp->gil_wait_seconds);
    printf("  the master alone (replicate, scatter, gather, AdamW): %.0f%% of the step\n",
           step > 0 ? 100.0 * (step - dp->parallel_seconds) / step : 0.0);
}

static void print_ddp_table(const strategy_outcome *o, const chapter_flags *f) {
    const run_result *r = &o->result;
    const ddp_extra *ddp = ddp_extra_of(o);
    const double ms = 1e3 / (r->timed_steps > 0 ? r->timed_steps : 1);
    char size[32];
    printf("\nddp: %d bucket%s (caps: first %.3g MiB, others %.3g MiB) in launch order:",
           ddp->num_buckets, ddp->num_buckets == 1 ? "" : "s", f->first_bucket_mb,
           f->bucket_mb);
    for (int i = 0; i < ddp->num_buckets; i++)
        printf(" %s", report_bytes((double)ddp->bucket_numel[i] * sizeof(float), size));
    printf("; --grad-accum %d; --compress %s; %llu all-reduce calls per step\n",
           ddp->opts.grad_accum, compress_names[f->compress],
           (unsigned long long)ddp->allreduce_calls);
    printf("  all-reduce in flight %.2f ms/step, of it hidden under backward %.2f ms;"
           " blocked waiting %.2f ms/step\n",
           ms * ddp->async_seconds, ms * r->hidden_seconds, ms * r->comm_seconds);
    printf("  replicas identical at the end: max |params(rank r) - params(rank 0)| = %.1e\n",
           ddp->replica_max_diff);
}

static char *json_extra(const dp_extra *dp, const strategy_outcome *ddp_run,
                        const chapter_flags *f) {
    const ddp_extra *ddp = ddp_run ? ddp_extra_of(ddp_run) : NULL;
    size_t cap = 4096 + (ddp ? 32 * (size_t)ddp->num_buckets : 0), n = 0;
    char *s = malloc(cap);
    s[0] = 0;
    if (dp) {
        n += snprintf(s + n, cap - n,
            "\"dp\": {\"threads\": %d, \"gil\": \"%s\", \"phase_ms\": {\"replicate\": %.4f, "
            "\"scatter\": %.4f, \"forward_backward\": %.4f, \"gather\": %.4f, \"optimizer\": "
            "%.4f}, \"gil_wait_ms\": %.4f, \"gil_held_ms\": %.4f, \"gil_busy_fraction\": "
            "%.3f, \"master_bytes_per_step\": {\"params_out\": %.0f, \"batch_out\": %.0f, "
            "\"grads_in\": %.0f}}",
            dp->opts.threads, dp->opts.release_gil ? "release" : "hold",
            1e3 * dp->replicate_seconds, 1e3 * dp->scatter_seconds, 1e3 * dp->parallel_seconds,
            1e3 * dp->gather_seconds, 1e3 * dp->optimizer_seconds, 1e3 * dp->gil_wait_seconds,
            1e3 * dp->gil_held_seconds, dp->gil_busy_fraction, dp->params_out_bytes,
            dp->batch_out_bytes, dp->grads_in_bytes);
    }
    if (ddp) {
        const int steps = ddp_run->result.timed_steps > 0 ? ddp_run->result.timed_steps : 1;
        n += snprintf(s + n, cap - n,
            "%s\"ddp\": {\"bucket_mb\": %g, \"first_bucket_mb\": %g, \"grad_accum\": %d, "
            "\"compress\": \"%s\", \"allreduce_calls_per_step\": %llu, "
            "\"comm_async_ms_per_step\": %.4f, \"comm_hidden_ms_per_step\": %.4f, "
            "\"replica_max_diff\": %g, \"bucket_bytes\": [",
            dp ? ", " : "", f->bucket_mb, f->first_bucket_mb, ddp->opts.grad_accum,
            compress_names[f->compress],
            (unsigned long long)ddp->allreduce_calls, 1e3 * ddp->async_seconds / steps,
            1e3 * ddp_run->result.hidden_seconds / steps, ddp->replica_max_diff);
        for (int i = 0; i < ddp->num_buckets; i++)
            n += snprintf(s + n, cap - n, "%s%zu", i ? ", " : "",
                          ddp->bucket_numel[i] * sizeof(float));
        snprintf(s + n, cap - n, "]}");
    }
    return s;
}

static size_t mib_to_bytes(double mib) {
    double bytes = mib * (1 << 20);
    return bytes >= (double)SIZE_MAX ? SIZE_MAX : bytes < 1 ? 1 : (size_t)bytes;
}

/* A batch of at least one sequence per rank and micro-step must itself be a valid
 * --batch, or the advice "use --batch N" would name a value the parser refuses. */
static void check_accumulation_fits(int ranks, int grad_accum) {
    const double smallest_batch = (double)ranks * grad_accum;
    if (smallest_batch > 1e9)
        cli_fail("--ranks %d x --grad-accum %d = %.0f sequences a step at least: more than"
                 " the largest --batch 1000000000; use fewer ranks or micro-steps", ranks,
                 grad_accum, smallest_batch);
}

/* DP and DDP (NULL: not run) against the baseline: the table and the tolerances' verdict,
 * or the JSON; returns whether every checked run is within them. */
static int compare_and_report(const run_config *cfg, const chapter_flags *f,
                              const baseline_run *baseline, strategy_outcome *dp,
                              strategy_outcome *ddp) {
    const comm_dtype wire = compress_types[f->compress];
    const ddp_extra *x = ddp ? ddp_extra_of(ddp) : NULL;
    const char *backend = x && x->backend ? x->backend : "none";
    run_result rows[3];
    int n = 0;
    rows[n++] = baseline->result;
    int ok = 1;
    const run_tolerances tol = run_tolerances_of(cfg, f, baseline);
    if (dp) {
        strategy_outcome_compare(dp, baseline);
        ok &= within_tolerance(&tol, &dp->result);
        rows[n++] = dp->result;
    }
    if (ddp) {
        strategy_outcome_compare(ddp, baseline);
        if (wire == COMM_F32) ok &= within_tolerance(&tol, &ddp->result);
        rows[n++] = ddp->result;
    }
    const dp_extra *dp_shown = dp ? dp->extra : NULL;
    const strategy_outcome *ddp_shown = ddp;
    const int N = cfg->comm.ranks;
    if (cfg->json) {
        char *extra = json_extra(dp_shown, ddp_shown, f);
        report_json(cfg, "01-ddp", N, backend, rows, n, extra);
        free(extra);
    } else {
        report_table(cfg, rows, n);
        print_bytes_table(cfg, dp_shown, ddp_shown, baseline->num_params);
        if (dp_shown) print_dp_table(dp_shown);
        if (ddp_shown) print_ddp_table(ddp_shown, f);
        const char *why = cfg->precision == PRECISION_FP32 ? "fp32, sums in another order"
                          : cfg->fp8 ? "fp8 linears in a bf16 run, tolerances.h's 16-bit ones"
                          : cfg->grad_precision != PRECISION_FP32
                              ? "16-bit gradients, tolerances_for_grads16"
                              : "16 bits, tolerances.h";
        if (cfg->steps <= TOL_STEPS)
            printf("\ntolerances (%s): grads %.1e, loss %.0e, params %.1e -> %s", why,
                   tol.grads, tol.loss, tol.params, ok ? "all within" : "EXCEEDED");
        else
            printf("\ntolerance (%s): grads of step 1 %.0e -> %s; loss and params are checked"
                   " over at most %d steps (AdamW lets rounding differences grow)", why,
                   tol.grads, ok ? "within" : "EXCEEDED", TOL_STEPS);
        printf("%s\n",
               ddp_shown && wire != COMM_F32 ? " (compressed DDP: its error is the"
               " cost of the wire type, not checked)" : "");
    }
    return ok;
}

/* FP8: DataParallel's threads share no amax reduction (fp8_linear.h's is a group's), so
 * FP8 trains on DDP alone; 16-bit gradients travel as they are (no compression on top). */
static void check_precision_flags(const run_config *cfg, const chapter_flags *f) {
    if (cfg->fp8 && f->strategy != RUN_DDP)
        cli_fail("--precision fp8: DataParallel trains in fp32, bf16 and fp16 (its threads"
                 " share no FP8 amax reduction); add --strategy ddp");
    if (cfg->grad_precision != PRECISION_FP32 && compress_types[f->compress] != COMM_F32)
        cli_fail("--compress %s: DDP's wire type for fp32 gradients; --grad-dtype %s reduces"
                 " 16-bit gradients as they are (valid: --compress none)",
                 compress_names[f->compress], precision_name(cfg->grad_precision));
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.steps = 5;   /* a few seconds on a laptop; --steps for more */
    cfg.fp8_training = 1;   /* DDP: bf16 with FP8 linears (fp8_linear.h) */
    chapter_flags f = {.bucket_mb = 25.0, .first_bucket_mb = 1.0, .grad_accum = 1};
    const cli_option options[] = {
        {"bucket-mb", OPT_FLOAT, &f.bucket_mb,
         "DDP gradient bucket cap in MiB (PyTorch: 25)", NULL, 1e-6},
        {"first-bucket-mb", OPT_FLOAT, &f.first_bucket_mb,
         "cap of DDP's first bucket in MiB (PyTorch: 1)", NULL, 1e-6},
        {"grad-accum", OPT_INT, &f.grad_accum, "DDP micro-steps per optimizer step", NULL, 1},
        {"compress", OPT_CHOICE, &f.compress, "DDP gradient type on the wire",
         compress_names, 0},
        {"gil", OPT_CHOICE, &f.gil, "DP: kernels hold the lock, or release it", gil_names, 0},
        {"strategy", OPT_CHOICE, &f.strategy, "which to run besides the baseline",
         strategy_names, 0},
        {0},
    };
    cli_parse(argc, argv, &cfg, options, argv[0],
              "DataParallel (threads + a GIL) against DistributedDataParallel (ranks +"
              " bucketed all-reduce), each compared with single-device training.");
    check_precision_flags(&cfg, &f);
    check_accumulation_fits(cfg.comm.ranks, f.grad_accum);
    cli_check_batch(cfg.batch, cfg.comm.ranks, f.grad_accum);   /* DP needs it too */
    fits_check_or_exit(&cfg, 1.0);   /* DDP: a whole replica per rank */
    const int N = cfg.comm.ranks;
    const int rank0_here = process_hosts_rank0();
    dataset *data = dataset_from_config(&cfg);

    const char *title = "Chapter 1: DataParallel (one process, a GIL) vs "
                        "DistributedDataParallel (one rank per replica)";
    /* With DDP, world rank 0 prints the header once it knows the backend that runs (a
     * GPU build may pick NCCL); DataParallel alone launches no ranks. */
    if (rank0_here && f.strategy == RUN_DP) report_header(&cfg, title, N, 0);

    /* DDP first: under mpirun the other processes then leave, and the baseline and DP
     * below run in world rank 0's process without them polling the cores (or timing
     * out while waiting). */
    ddp_options opts = ddp_options_default();
    opts.bucket_bytes = mib_to_bytes(f.bucket_mb);
    opts.first_bucket_bytes = mib_to_bytes(f.first_bucket_mb);
    opts.grad_accum = f.grad_accum;
    opts.wire = compress_types[f.compress];
    opts.header_title = title;
    ddp_extra ddp_x = {0};
    dp_extra dp_x = {0};
    strategy_outcome ddp = {.extra = &ddp_x}, dp = {.extra = &dp_x};
    int status = 0;
    if (f.strategy != RUN_DP) status = ddp_launch(&cfg, data, &opts, &ddp);
    if (!rank0_here || status != 0) {   /* other MPI processes: their part is done; a
                                            failed DDP run has nothing to compare */
        strategy_outcome_free(&ddp);
        ddp_extra_free(&ddp_x);
        dataset_free(data);
        return status;
    }
    baseline_run *baseline = baseline_reference(&cfg, data);

    /* DataParallel is one process by nature: it runs here, after DDP has finished, with
     * N threads of its own (under MPI: in world rank 0's process). */
    const int run_dp = f.strategy != RUN_DDP, run_ddp = f.strategy != RUN_DP;
    if (run_dp) {
        if (!cfg.json && !cfg.quiet)
            printf("dp: %d threads in this one process%s\n", N,
                   launch_mpi_world_size() > 0 ? " (world rank 0's; DP does not use MPI)" : "");
        strategy_outcome_alloc(&dp, &cfg);
        dp_train(&cfg, data, &(dp_options){.threads = N, .release_gil = f.gil == 1}, &dp);
    }

    const int ok = compare_and_report(&cfg, &f, baseline, run_dp ? &dp : NULL,
                                      run_ddp ? &ddp : NULL);
    strategy_outcome_free(&dp);
    strategy_outcome_free(&ddp);
    ddp_extra_free(&ddp_x);
    baseline_free(baseline);
    dataset_free(data);
    if (status != 0) return status;
    return ok ? 0 : 1;
}
