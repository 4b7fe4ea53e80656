/* Chapter 1's DDP on Open MPI processes (run under mpirun -np 1..4, CK_FORK=no): the
 * same comparisons with the single-device baseline as the threads suite, the baseline
 * trained in world rank 0's process, which judges (check_expect) while every process
 * waits for its verdict (check_agree). Tests that need two ranks are skipped, with a
 * SKIP line, at other world sizes; the others fit any world (batch 12 splits over 1,
 * 2, 3 and 4 ranks).
 *
 * Tolerances as in test_chapter1.c: gradients after step 1: 1e-6; loss: 1e-5;
 * parameters after 5 AdamW steps: 1e-4. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "compare.h"
#include "strategy_runs.h"
#include "baseline.h"
#include "replica.h"
#include "check_run.h"
#include "fp8_linear.h"
#include "tolerances.h"

static const double tol_grads = 1e-6, tol_loss = 1e-5, tol_params = 1e-4;

static run_config tiny_config(int batch, int steps) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 2, .dim = 16};
    cfg.batch = batch;
    cfg.steps = steps;
    cfg.quiet = 1;
    return cfg;
}

/* Every process runs this; only world rank 0's process gets the results. */
static ddp_result *run_ddp(const run_config *cfg, const dataset *data, ddp_options opts) {
    return launch_ddp(cfg, data, opts, NULL);
}

static void print_diffs(const char *what, const run_result *r) {
    printf("%-40s max |diff| vs baseline: loss %.2e  grads %.2e  params %.2e\n", what,
           r->diff_loss, r->diff_grads, r->diff_params);
    fflush(stdout);
}

START_TEST(ddp_on_mpi_ranks_matches_baseline) {
    const int N = check_world_size();
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = process_hosts_rank0() ? baseline_train(&cfg, data) : NULL;
    ddp_result *job = run_ddp(&cfg, data, ddp_options_default());
    check_verdict v = {0};
    if (base) {
        strategy_outcome_compare(&job->run, base);
        char label[64];
        snprintf(label, sizeof label, "ddp, %d MPI rank%s:", N, N > 1 ? "s" : "");
        print_diffs(label, &job->run.result);
        printf("  bytes sent per rank per step %.0f, 2(N-1)/N x gradient bytes %.0f;"
               " replicas differ by %.1e\n", job->run.result.bytes_sent_per_step,
               job->run.result.bytes_formula, job->x.replica_max_diff);
        check_expect(&v, job->run.result.diff_grads <= tol_grads);
        check_expect(&v, job->run.result.diff_loss <= tol_loss);
        check_expect(&v, job->run.result.diff_params <= tol_params);
        check_expect(&v, job->x.replica_max_diff == 0.0);
        if (N > 1)
            check_expect(&v, fabs(job->run.result.bytes_sent_per_step / job->run.result.bytes_formula - 1) < 0.01);
        baseline_free(base);
    }
    ddp_result_free(job);
    dataset_free(data);
    check_agree(&v);
}
END_TEST

/* Without the all-reduce the ranks' gradients are partial: the comparison must fail. */
START_TEST(ddp_on_mpi_without_allreduce_fails_the_comparison) {
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = process_hosts_rank0() ? baseline_train(&cfg, data) : NULL;
    ddp_options opts = ddp_options_default();
    opts.allreduce = 0;
    ddp_result *job = run_ddp(&cfg, data, opts);
    check_verdict v = {0};
    if (base) {
        strategy_outcome_compare(&job->run, base);
        print_diffs("negative control, no all-reduce:", &job->run.result);
        check_expect(&v, job->run.result.diff_grads > 100 * tol_grads);
        check_expect(&v, job->x.replica_max_diff > 0);
        baseline_free(base);
    }
    ddp_result_free(job);
    dataset_free(data);
    check_agree(&v);
}
END_TEST

/* --precision fp8 (fp8_linear.h) on MPI processes: blockwise scales per token, and
 * tensorwise all-reduces its activation amax over the processes, so DDP equals the FP8
 * baseline within tolerances.h's mixed-precision tolerances (tolerances_for) with both;
 * tensorwise with each process's own amax (not all-reduced) must exceed them on 2 or
 * more ranks (the control). tensorwise in the hybrid format (E5M2 output gradients in the
 * backward, their amax all-reduced too) equals its own baseline the same way. Every
 * process sets the recipe and format, as cli_parse does in each. */
START_TEST(fp8_ddp_on_mpi_ranks_matches_the_fp8_baseline) {
    const int N = check_world_size();
    dataset *data = dataset_builtin();
    check_verdict v = {0};
    /* blockwise, tensorwise, tensorwise hybrid, the control */
    for (int r = 0; r < (N > 1 ? 4 : 3); r++) {
        const fp8_recipe recipe = r ? FP8_TENSORWISE : FP8_BLOCKWISE;
        const int control = r == 3;
        fp8_linear_format(r == 2 ? FP8_FORMAT_HYBRID : FP8_FORMAT_E4M3);
        fp8_linear_use(&recipe);
        fp8_linear_test_local_amax(control);
        run_config cfg = tiny_config(12, 3);
        cfg.precision = PRECISION_BF16;
        baseline_run *base = process_hosts_rank0() ? baseline_train(&cfg, data) : NULL;
        cfg.comm.ranks = N;
        ddp_result *job = run_ddp(&cfg, data, ddp_options_default());
        if (base) {
            strategy_outcome_compare(&job->run, base);
            char label[64];
            snprintf(label, sizeof label, "fp8 %s%s ddp, %d MPI rank%s:", fp8_recipe_name(recipe),
                     control ? " (own amax)" : r == 2 ? " hybrid" : "", N, N > 1 ? "s" : "");
            print_diffs(label, &job->run.result);
            const double worst = run_worst_fraction_of(&job->run.result, tolerances_for(&cfg));
            check_expect(&v, control ? worst > 1 : worst <= 1);
            baseline_free(base);
        }
        ddp_result_free(job);
    }
    fp8_linear_test_local_amax(0);
    fp8_linear_format(FP8_FORMAT_E4M3);
    fp8_linear_use(NULL);
    dataset_free(data);
    check_agree(&v);
}
END_TEST

/* Two ranks: accumulation equals the larger batch, and every bucket size gives
 * bit-identical results (one addition per element whatever the bucket bounds). */
START_TEST(ddp_on_2_mpi_ranks_accumulation_and_buckets) {
    run_config cfg = tiny_config(8, 3);
    cfg.model.dim = 128;   /* slabs of ~0.8 MB: a 1 MiB cap makes several buckets */
    cfg.model.heads = 4;
    cfg.model.layers = 4;
    dataset *data = dataset_builtin();
    baseline_run *base = process_hosts_rank0() ? baseline_train(&cfg, data) : NULL;
    const struct { size_t first, cap; int accum; const char *name; } cases[] = {
        {1u << 20, 1u << 20, 1, "1 MiB"},
        {1u << 20, 25u << 20, 1, "25 MiB (first 1 MiB)"},
        {(size_t)-1, (size_t)-1, 1, "one bucket"},
        {1u << 20, 1u << 20, 2, "1 MiB, 2 micro-steps of 2 per rank"}};
    float *reference = NULL;   /* parameters with 1 MiB buckets */
    check_verdict v = {0};
    for (int c = 0; c < 4; c++) {
        ddp_options opts = ddp_options_default();
        opts.first_bucket_bytes = cases[c].first;
        opts.bucket_bytes = cases[c].cap;
        opts.grad_accum = cases[c].accum;
        ddp_result *job = run_ddp(&cfg, data, opts);
        if (base) {
            strategy_outcome_compare(&job->run, base);
            char label[80];
            snprintf(label, sizeof label, "2 MPI ranks, %s (%d buckets):", cases[c].name,
                     job->x.num_buckets);
            print_diffs(label, &job->run.result);
            check_expect(&v, job->run.result.diff_grads <= tol_grads);
            check_expect(&v, job->run.result.diff_loss <= tol_loss);
            check_expect(&v, job->run.result.diff_params <= tol_params);
            check_expect(&v, job->x.allreduce_calls == (uint64_t)job->x.num_buckets);
            if (c == 0) {
                reference = job->run.final_params;
                job->run.final_params = NULL;
            } else if (cases[c].accum == 1) {
                double d = max_abs_diff(job->run.final_params, reference, base->num_params);
                printf("  vs 1 MiB buckets: params differ by %.1e (must be 0)\n", d);
                check_expect(&v, d == 0);
            }
        }
        ddp_result_free(job);
    }
    free(reference);
    baseline_free(base);
    dataset_free(data);
    check_agree(&v);
}
END_TEST

/* Compressed gradients through Open MPI's reductions (user ops on 16- and 8-bit words,
 * widened to fp32 per hop): the bytes and error bounds of test_chapter1.c. The error
 * bound: one rounding of each rank's value and of each partial sum, a few units in the
 * last place of the largest gradient. Bytes are modelled: with one rank none move. */
START_TEST(compression_on_mpi_ranks_sends_fewer_bytes_with_bounded_error) {
    const int N = check_world_size();
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = process_hosts_rank0() ? baseline_train(&cfg, data) : NULL;
    double largest = 0;
    for (size_t i = 0; base && i < base->num_params; i++)
        largest = fmax(largest, fabs(base->first_grads[i]));
    const struct { comm_dtype wire; const char *name; int bytes; double rel_error; } types[] = {
        {COMM_BF16, "bf16", 2, 0x1p-6}, {COMM_F16, "fp16", 2, 0x1p-9},
        {COMM_F8E4M3, "fp8 e4m3", 1, 0x1p-2}};
    ddp_result *full = run_ddp(&cfg, data, ddp_options_default());
    check_verdict v = {0};
    for (int t = 0; t < 3; t++) {
        ddp_options opts = ddp_options_default();
        opts.wire = types[t].wire;
        ddp_result *job = run_ddp(&cfg, data, opts);
        if (base) {
            strategy_outcome_compare(&job->run, base);
            double ratio = N > 1 ? job->run.result.bytes_sent_per_step / full->run.result.bytes_sent_per_step : 0;
            printf("compress %-8s %d MPI ranks: bytes %.5f of fp32's; grads error %.2e = %.2e x"
                   " max|g| (bound %.1e); loss error %.2e\n", types[t].name, N, ratio,
                   job->run.result.diff_grads, job->run.result.diff_grads / largest, types[t].rel_error,
                   job->run.result.diff_loss);
            /* the fp16 / fp8 scale agreement adds a few bytes per bucket; modelled bytes
             * are whole, 2(N-1)/N x B rounded down per call (a byte in ~10^5 below) */
            if (N > 1)
                check_expect(&v, ratio >= types[t].bytes / 4.0 - 1e-4 &&
                                 ratio < types[t].bytes / 4.0 + 0.01);
            check_expect(&v, job->run.result.diff_grads <= types[t].rel_error * largest);
            check_expect(&v, job->run.result.diff_grads > 0);   /* compression really happened */
            check_expect(&v, job->run.result.diff_loss < 0.02);
        }
        ddp_result_free(job);
    }
    ddp_result_free(full);
    baseline_free(base);
    dataset_free(data);
    check_agree(&v);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter1-mpi");
    TCase *tc = tcase_create("ddp-mpi");
    const int N = check_world_size();
    tcase_add_test(tc, ddp_on_mpi_ranks_matches_baseline);
    check_add_test_where(tc, ddp_on_mpi_without_allreduce_fails_the_comparison, N >= 2,
                         "needs 2 or more ranks (one rank has nothing to all-reduce)");
    tcase_add_test(tc, compression_on_mpi_ranks_sends_fewer_bytes_with_bounded_error);
    tcase_add_test(tc, fp8_ddp_on_mpi_ranks_matches_the_fp8_baseline);
    check_add_test_where(tc, ddp_on_2_mpi_ranks_accumulation_and_buckets, N == 2,
                         "runs with -np 2 only (batch 8 and 2 micro-steps are sized for 2 ranks)");
    suite_add_tcase(s, tc);
    return check_run(s, 1);
}
