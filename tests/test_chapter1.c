/* Chapter 1 against the single-device baseline: DDP on 1-4 thread ranks and DP on 2 and
 * 4 threads give the baseline's gradients (compared directly, after one step), loss and
 * parameters; switching the all-reduce off breaks that (negative control);
 * accumulation, bucket sizes and compression behave as the chapter says; a batch that
 * does not split is refused with exit status 2; DataParallel in bf16 and fp16, with
 * fp32 and 16-bit gradients, matches the baseline in the same precision.
 *
 * Tolerances (fp32, the same sums in another order): gradients after step 1: 1e-6
 * absolute (they are at most ~1e-1); loss per step: 1e-5; parameters after 5 AdamW steps:
 * 1e-4 (AdamW divides by sqrt(v), which carries small gradient differences into the
 * update). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compare.h"
#include "strategy_runs.h"
#include "grad_buckets.h"
#include "dp.h"
#include "ddp.h"
#include "baseline.h"
#include "replica.h"
#include "check_run.h"
#include "cli_checks.h"

static const double tol_grads = 1e-6, tol_loss = 1e-5, tol_params = 1e-4;

/* A model small enough for the sanitizer builds; batch 12 splits over 1, 2, 3, 4. */
static run_config tiny_config(int batch, int steps) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 2, .dim = 16};
    cfg.batch = batch;
    cfg.steps = steps;
    cfg.quiet = 1;
    return cfg;
}

static ddp_result *run_ddp(const run_config *cfg, const dataset *data, int ranks,
                           ddp_options opts) {
    run_config on_ranks = *cfg;
    on_ranks.comm.ranks = ranks;
    return launch_ddp(&on_ranks, data, opts, NULL);
}

/* A DataParallel run's outcome and its extra, as for DDP. */
typedef struct {
    strategy_outcome o;
    dp_extra x;
} dp_result;

static dp_result *run_dp(const run_config *cfg, const dataset *data, const dp_options *opts) {
    dp_result *dp = calloc(1, sizeof *dp);
    dp->o.extra = &dp->x;
    strategy_outcome_alloc(&dp->o, cfg);
    dp_train(cfg, data, opts, &dp->o);
    return dp;
}

static void dp_result_free(dp_result *dp) {
    strategy_outcome_free(&dp->o);
    free(dp);
}

static void print_diffs(const char *what, const run_result *r) {
    printf("%-36s max |diff| vs baseline: loss %.2e  grads %.2e  params %.2e\n", what,
           r->diff_loss, r->diff_grads, r->diff_params);
}

static void assert_matches_baseline(const run_result *r) {
    ck_assert_msg(r->diff_grads <= tol_grads, "grads differ by %g (tol %g)", r->diff_grads,
                  tol_grads);
    ck_assert_msg(r->diff_loss <= tol_loss, "loss differs by %g (tol %g)", r->diff_loss, tol_loss);
    ck_assert_msg(r->diff_params <= tol_params, "params differ by %g (tol %g)", r->diff_params,
                  tol_params);
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* ---- DDP and DP against the baseline ------------------------------------------------- */

START_TEST(ddp_matches_baseline_on_1_to_4_ranks) {
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    for (int ranks = 1; ranks <= 4; ranks++) {
        ddp_result *job = run_ddp(&cfg, data, ranks, ddp_options_default());
        strategy_outcome_compare(&job->run, base);
        char label[64];
        snprintf(label, sizeof label, "ddp, %d thread rank%s:", ranks, ranks > 1 ? "s" : "");
        print_diffs(label, &job->run.result);
        assert_matches_baseline(&job->run.result);
        ck_assert_msg(job->x.replica_max_diff == 0.0, "replicas diverged by %g", job->x.replica_max_diff);
        ddp_result_free(job);
    }
    baseline_free(base);
    dataset_free(data);
}
END_TEST

START_TEST(dp_matches_baseline_with_2_and_4_threads) {
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    for (int threads = 2; threads <= 4; threads += 2) {
        for (int release = 0; release <= 1; release++) {
            dp_options opts = {.threads = threads, .release_gil = release};
            dp_result *dp = run_dp(&cfg, data, &opts);
            strategy_outcome_compare(&dp->o, base);
            char label[64];
            snprintf(label, sizeof label, "dp, %d threads, --gil %s:", threads,
                     release ? "release" : "hold");
            print_diffs(label, &dp->o.result);
            assert_matches_baseline(&dp->o.result);
            /* the master's link: params out and grads in, (N-1) x the model each */
            ck_assert_double_eq(dp->x.params_out_bytes, (threads - 1) * 4.0 * base->num_params);
            ck_assert_double_eq(dp->x.grads_in_bytes, (threads - 1) * 4.0 * base->num_params);
            ck_assert(dp->x.gil_acquisitions > 0);
            dp_result_free(dp);
        }
    }
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* One replica runs the baseline's ops in the baseline's order: nothing may differ. */
START_TEST(dp_with_one_thread_is_the_baseline_bit_for_bit) {
    run_config cfg = tiny_config(4, 3);
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    dp_result *dp = run_dp(&cfg, data, &(dp_options){.threads = 1});
    strategy_outcome_compare(&dp->o, base);
    print_diffs("dp, 1 thread (must be exactly 0):", &dp->o.result);
    ck_assert(dp->o.result.diff_grads == 0 && dp->o.result.diff_loss == 0 &&
              dp->o.result.diff_params == 0);
    dp_result_free(dp);
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* Without the all-reduce each rank steps on its own half of the gradient: the
 * comparison must catch it, and the replicas drift apart. */
START_TEST(ddp_without_allreduce_fails_the_comparison) {
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    ddp_options opts = ddp_options_default();
    opts.allreduce = 0;
    ddp_result *job = run_ddp(&cfg, data, 2, opts);
    strategy_outcome_compare(&job->run, base);
    print_diffs("negative control, no all-reduce:", &job->run.result);
    printf("  replicas after 5 steps differ by %.2e; bytes sent per step %.0f\n",
           job->x.replica_max_diff, job->run.result.bytes_sent_per_step);
    ck_assert_msg(job->run.result.diff_grads > 100 * tol_grads,
                  "no all-reduce, yet grads within %g", job->run.result.diff_grads);
    ck_assert(job->run.result.diff_params > tol_params);
    ck_assert(job->x.replica_max_diff > 0);
    ck_assert(job->run.result.bytes_sent_per_step == 0);
    ddp_result_free(job);
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* ---- accumulation ----------------------------------------------------------------------- */

/* K micro-steps of B sequences = one step of K x B; and only one all-reduce per bucket
 * per step, on the last micro-step. */
START_TEST(accumulation_equals_a_larger_batch) {
    run_config cfg = tiny_config(8, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);   /* one step of 8 sequences */
    const int cases[][2] = {{1, 4}, {2, 2}, {2, 4}};   /* ranks, K */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddp_options opts = ddp_options_default();
        opts.grad_accum = cases[i][1];
        ddp_result *job = run_ddp(&cfg, data, cases[i][0], opts);
        strategy_outcome_compare(&job->run, base);
        char label[80];
        snprintf(label, sizeof label, "%d rank(s) x %d micro-steps of %d:", cases[i][0],
                 cases[i][1], cfg.batch / cases[i][0] / cases[i][1]);
        print_diffs(label, &job->run.result);
        assert_matches_baseline(&job->run.result);
        ck_assert_uint_eq(job->x.allreduce_calls, (uint64_t)job->x.num_buckets);
        ddp_result_free(job);
    }
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* ---- buckets ---------------------------------------------------------------------------- */

/* Slabs of ~0.8 MB (dim 128): a 1 MiB cap makes several buckets, 25 MiB one. */
static run_config bucket_config(void) {
    run_config cfg = tiny_config(4, 3);
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 4, .heads = 4, .dim = 128};
    return cfg;
}

/* Bucket caps: PyTorch's defaults (first 1 MiB, then 25 MiB), 1 MiB for all, one bucket
 * for everything, and one per slab. */
typedef struct {
    size_t first, cap;
    int buckets;   /* expected for bucket_config() */
    const char *name;
} bucket_case;
static const bucket_case bucket_cases[] = {
    {1u << 20, 1u << 20, 3, "1 MiB"},
    {1u << 20, 25u << 20, 2, "25 MiB (first 1 MiB)"},
    {(size_t)-1, (size_t)-1, 1, "one bucket"},
    {1, 1, 6, "one per slab"}};
enum { NUM_BUCKET_CASES = sizeof bucket_cases / sizeof bucket_cases[0] };

START_TEST(bucket_plan_follows_backward_order_and_cap) {
    run_config cfg = bucket_config();
    gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    for (int c = 0; c < NUM_BUCKET_CASES; c++) {
        const bucket_case *bc = &bucket_cases[c];
        grad_buckets *b = grad_buckets_create(NULL, &s, NULL, bc->first, bc->cap, COMM_F32);
        ck_assert_int_eq(grad_buckets_count(b), bc->buckets);
        int next_last = gpt_num_slabs(&s) - 1;
        size_t total = 0;
        for (int i = 0; i < grad_buckets_count(b); i++) {
            int first, last;
            grad_buckets_slabs(b, i, &first, &last);
            ck_assert_int_eq(last, next_last);   /* from the last slab down, no gaps */
            next_last = first - 1;
            /* closed on reaching the cap: without its first (last-added) slab it was below */
            size_t cap = i == 0 ? bc->first : bc->cap;
            size_t before_last_added = grad_buckets_numel(b, i) - gpt_slab_numel(&s, first);
            ck_assert(before_last_added * 4 < cap);
            if (i < grad_buckets_count(b) - 1) ck_assert(grad_buckets_numel(b, i) * 4 >= cap);
            total += grad_buckets_numel(b, i);
        }
        ck_assert_int_eq(next_last, -1);
        ck_assert_uint_eq(total, gpt_num_params(&s));
        grad_buckets_free(b);
    }
}
END_TEST

/* With 2 ranks every element is one addition a + b, whatever the bucket bounds, so
 * the results must be bit-identical across bucket sizes. */
START_TEST(bucket_sizes_give_the_same_result) {
    run_config cfg = bucket_config();
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    ddp_result *first = NULL;
    for (int c = 0; c < NUM_BUCKET_CASES; c++) {
        ddp_options opts = ddp_options_default();
        opts.first_bucket_bytes = bucket_cases[c].first;
        opts.bucket_bytes = bucket_cases[c].cap;
        ddp_result *job = run_ddp(&cfg, data, 2, opts);
        strategy_outcome_compare(&job->run, base);
        char label[64];
        snprintf(label, sizeof label, "buckets %s (%d):", bucket_cases[c].name, job->x.num_buckets);
        print_diffs(label, &job->run.result);
        assert_matches_baseline(&job->run.result);
        /* in flight = hidden under backward + blocked in the waits, never more */
        ck_assert(job->run.result.hidden_seconds <= job->x.async_seconds * 1.0001 + 1e-9);
        ck_assert(job->x.async_seconds <=
                  (job->run.result.hidden_seconds + job->run.result.comm_seconds) * 1.0001 + 1e-9);
        if (c == 0) {
            first = job;
            continue;
        }
        double dg = max_abs_diff(job->run.first_grads, first->run.first_grads, base->num_params);
        double dp = max_abs_diff(job->run.final_params, first->run.final_params, base->num_params);
        printf("  vs 1 MiB buckets: grads %.1e, params %.1e (must be 0)\n", dg, dp);
        ck_assert(dg == 0 && dp == 0);
        ddp_result_free(job);
    }
    ddp_result_free(first);
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* ---- bytes ------------------------------------------------------------------------------ */

/* Every rank sends 2(N-1)/N x the gradient bytes, measured from the copies made. */
START_TEST(ddp_sends_2_n_minus_1_over_n_gradient_bytes) {
    run_config cfg = tiny_config(12, 3);
    dataset *data = dataset_builtin();
    for (int ranks = 2; ranks <= 4; ranks++) {
        ddp_result *job = run_ddp(&cfg, data, ranks, ddp_options_default());
        double ratio = job->run.result.bytes_sent_per_step / job->run.result.bytes_formula;
        printf("ddp %d ranks: sent %.0f bytes per rank per step, formula %.0f (ratio %.4f)\n",
               ranks, job->run.result.bytes_sent_per_step, job->run.result.bytes_formula, ratio);
        ck_assert(fabs(ratio - 1.0) < 0.01);
        ddp_result_free(job);
    }
    dataset_free(data);
}
END_TEST

/* ---- compression ------------------------------------------------------------------------ */

/* Each wire type sends its share of the bytes, and its error stays within what its
 * mantissa allows: one rounding of each rank's value and one of each partial sum, so a
 * few units in the last place of the largest gradient. */
START_TEST(compression_sends_fewer_bytes_with_bounded_error) {
    run_config cfg = tiny_config(12, 5);
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    const double largest = max_abs(base->first_grads, base->num_params);
    const struct { comm_dtype wire; const char *name; int bytes; double rel_error; } types[] = {
        {COMM_BF16, "bf16", 2, 0x1p-6}, {COMM_F16, "fp16", 2, 0x1p-9},
        {COMM_F8E4M3, "fp8 e4m3", 1, 0x1p-2}};
    ddp_result *full = run_ddp(&cfg, data, 2, ddp_options_default());
    for (int t = 0; t < 3; t++) {
        ddp_options opts = ddp_options_default();
        opts.wire = types[t].wire;
        ddp_result *job = run_ddp(&cfg, data, 2, opts);
        strategy_outcome_compare(&job->run, base);
        double ratio = job->run.result.bytes_sent_per_step / full->run.result.bytes_sent_per_step;
        printf("compress %-8s bytes %.3f of fp32's; grads error %.2e = %.2e x max|g| (bound "
               "%.1e); loss error %.2e\n", types[t].name, ratio, job->run.result.diff_grads,
               job->run.result.diff_grads / largest, types[t].rel_error, job->run.result.diff_loss);
        /* the fp16 / fp8 scale agreement adds a few bytes per bucket */
        ck_assert(ratio >= types[t].bytes / 4.0 && ratio < types[t].bytes / 4.0 + 0.01);
        ck_assert(job->run.result.diff_grads <= types[t].rel_error * largest);
        ck_assert(job->run.result.diff_grads > 0);   /* compression really happened */
        ck_assert(job->run.result.diff_loss < 0.02);
        ddp_result_free(job);
    }
    ddp_result_free(full);
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* fp8 gradients still train: the loss falls as the baseline's does. */
START_TEST(fp8_training_still_converges) {
    run_config cfg = tiny_config(8, 30);
    cfg.adamw.lr = 3e-3f;
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    ddp_options opts = ddp_options_default();
    opts.wire = COMM_F8E4M3;
    ddp_result *job = run_ddp(&cfg, data, 2, opts);
    const int last = cfg.steps - 1;
    printf("fp8 DDP: loss %.3f -> %.3f over %d steps (baseline %.3f -> %.3f)\n", job->run.loss[0],
           job->run.loss[last], cfg.steps, base->loss[0], base->loss[last]);
    ck_assert(job->run.loss[last] < job->run.loss[0] - 1.0);
    ck_assert(fabs(job->run.loss[last] - base->loss[last]) < 0.1);
    ddp_result_free(job);
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* ---- a batch that does not split ---------------------------------------------------- */

/* Runs body(arg) in a child process: its stderr into line (at most size - 1 bytes),
 * *length the bytes read; returns the child's wait status. */
static int stderr_of_child(void (*body)(const void *), const void *arg, char *line,
                           size_t size, size_t *length) {
    int pipe_fds[2];
    ck_assert_int_eq(pipe(pipe_fds), 0);
    fflush(stdout);   /* or the child's exit prints this test's lines again */
    pid_t child = fork();
    if (child == 0) {
        dup2(pipe_fds[1], STDERR_FILENO);
        body(arg);
        _exit(0);   /* not reached when body stops as it must */
    }
    close(pipe_fds[1]);
    memset(line, 0, size);
    size_t n = 0;   /* stderr is unbuffered: the line may come in several writes */
    for (ssize_t got; n < size - 1 && (got = read(pipe_fds[0], line + n, size - 1 - n)) > 0;)
        n += (size_t)got;
    close(pipe_fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    printf("child: exit %d, stderr: %s", WEXITSTATUS(status), n > 0 ? line : "(nothing)\n");
    fflush(stdout);
    *length = n;
    return status;
}

static void check_batch_6_on_4_ranks(const void *unused) {
    (void)unused;
    cli_check_batch(6, 4, 1);
}

START_TEST(uneven_batch_is_refused_with_exit_status_2) {
    char err[256];
    ck_assert(ddp_check_batch(12, 4, 1, err, sizeof err));
    ck_assert(ddp_check_batch(12, 3, 2, err, sizeof err));
    ck_assert(!ddp_check_batch(10, 4, 1, err, sizeof err));
    printf("batch 10 on 4 ranks: %s\n", err);
    ck_assert(strstr(err, "--batch 10") && strstr(err, "4 ranks") && strstr(err, "--batch 8"));
    ck_assert(!ddp_check_batch(12, 2, 4, err, sizeof err));
    ck_assert(strstr(err, "--grad-accum 4"));

    /* what main does with it: one line on stderr, exit status 2 */
    char line[512];
    size_t n;
    const int status = stderr_of_child(check_batch_6_on_4_ranks, NULL, line, sizeof line, &n);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    ck_assert(strstr(line, "--batch 6 does not split evenly over 4 ranks") != NULL);
    ck_assert(strchr(line, '\n') == line + n - 1);   /* exactly one line */
}
END_TEST

/* DataParallel in bf16 and fp16, with fp32 and 16-bit gradients, against the baseline in
 * the same precision within tolerances.h's bounds (chapter 1's: tolerances_for_grads16
 * over the replicas); the master's link carries 16-bit compute weights out and the
 * gradients in their type. Control: the replicas' gradients never summed. */
START_TEST(dp_matches_baseline_in_16_bits) {
    static const struct { precision p, grads; } runs[] = {
        {PRECISION_BF16, PRECISION_FP32}, {PRECISION_BF16, PRECISION_BF16},
        {PRECISION_FP16, PRECISION_FP32}, {PRECISION_FP16, PRECISION_FP16}};
    dataset *data = dataset_builtin();
    const int threads = 2;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        run_config cfg = tiny_config(12, TOL_STEPS);
        cfg.precision = runs[i].p;
        cfg.grad_precision = runs[i].grads;
        baseline_run *base = baseline_train(&cfg, data);
        run_config on_threads = cfg;
        on_threads.comm.ranks = threads;
        const run_tolerances tol = tolerances_for_grads16(&on_threads, threads,
                                                          baseline_largest_grad(base));
        for (int control = 0; control <= (i == 1); control++) {
            dp_result *dp = run_dp(&cfg, data, &(dp_options){.threads = threads,
                                                             .skip_gather = control});
            strategy_outcome_compare(&dp->o, base);
            const double worst = run_worst_fraction_of(&dp->o.result, tol);
            char label[80];
            snprintf(label, sizeof label, "dp %s%s%s, 2 threads (%.0f%% of bounds):",
                     precision_name(runs[i].p), runs[i].grads != PRECISION_FP32 ? " grads" : "",
                     control ? " NO GATHER" : "", 100 * worst);
            print_diffs(label, &dp->o.result);
            ck_assert_msg(control ? worst > 1 : worst <= 1, "%s", label);
            const double P = (double)base->num_params;
            ck_assert_double_eq(dp->x.params_out_bytes, (threads - 1) * 2.0 * P);
            ck_assert_double_eq(dp->x.grads_in_bytes,
                                (threads - 1) * (double)precision_bytes(runs[i].grads) * P);
            dp_result_free(dp);
        }
        baseline_free(base);
    }
    dataset_free(data);
}
END_TEST

static Suite *chapter1_suite(void) {
    Suite *s = suite_create("chapter1");
    TCase *tc = tcase_create("ddp-vs-dp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, ddp_matches_baseline_on_1_to_4_ranks);
    tcase_add_test(tc, dp_matches_baseline_with_2_and_4_threads);
    tcase_add_test(tc, dp_with_one_thread_is_the_baseline_bit_for_bit);
    tcase_add_test(tc, ddp_without_allreduce_fails_the_comparison);
    tcase_add_test(tc, accumulation_equals_a_larger_batch);
    tcase_add_test(tc, bucket_plan_follows_backward_order_and_cap);
    tcase_add_test(tc, bucket_sizes_give_the_same_result);
    tcase_add_test(tc, ddp_sends_2_n_minus_1_over_n_gradient_bytes);
    tcase_add_test(tc, compression_sends_fewer_bytes_with_bounded_error);
    tcase_add_test(tc, fp8_training_still_converges);
    tcase_add_test(tc, uneven_batch_is_refused_with_exit_status_2);
    tcase_add_test(tc, dp_matches_baseline_in_16_bits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return check_run(chapter1_suite(), 0);
}
