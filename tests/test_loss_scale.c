/* Tests of the dynamic loss scale (loss_scale.h), on the CPU and the threads backend.
 *
 * The state machine step by step (skip and back off, growth after exactly
 * growth_interval clean steps, a skip restarting the count, the min_scale floor, no
 * growth to infinity, disabled doing nothing); grads_finite with inf, -inf and NaN at
 * the first, a middle and the last position, and on finite vectors whose sum overflows
 * fp32; the all-ranks decision on 4 thread ranks where only rank 2 saw an inf; the fp16
 * flush and overflow shares on vectors whose answer is known, then measured on the
 * model's gradients. Negative controls: a float sum WOULD call the large finite vector
 * non-finite, and a scaler that does not skip lets the inf into the parameters, which
 * the check used here sees. The training loop's own unscale, on growth steps: a run
 * whose scale grows against one whose scale stays fixed. And why fp16 needs the scale:
 * one step of 16384 tokens without it, against fp32's gradients. */
#include <cblas.h>
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "check_run.h"
#include "floats.h"
#include "loss_scale.h"
#include "tolerances.h"

static loss_scale_config small_config(float init, int interval) {
    loss_scale_config c = loss_scale_defaults(PRECISION_FP16);
    c.init_scale = init;
    c.growth_interval = interval;
    return c;
}

static loss_scale started(loss_scale_config c) {
    loss_scale s;
    loss_scale_init(&s, &c);
    return s;
}

/* ---- the state machine --------------------------------------------------------- */
START_TEST(test_defaults) {
    loss_scale_config c = loss_scale_defaults(PRECISION_FP16);
    ck_assert(c.enabled);
    ck_assert_float_eq(c.init_scale, 65536.0f);
    ck_assert_float_eq(c.growth_factor, 2.0f);
    ck_assert_float_eq(c.backoff_factor, 0.5f);
    ck_assert_int_eq(c.growth_interval, 1000);
    ck_assert_float_eq(c.min_scale, 1.0f);
    ck_assert(!loss_scale_defaults(PRECISION_BF16).enabled);
    ck_assert(!loss_scale_defaults(PRECISION_FP32).enabled);
    loss_scale s = started(c);
    ck_assert_float_eq(s.scale, 65536.0f);
    ck_assert_int_eq(s.clean_steps, 0);
    ck_assert_int_eq(s.skipped_steps, 0);
}
END_TEST

START_TEST(test_skip_backs_off) {
    loss_scale s = started(small_config(1024.0f, 3));
    ck_assert_int_eq(loss_scale_update(&s, 1), 1);
    ck_assert_int_eq(s.clean_steps, 1);
    ck_assert_int_eq(loss_scale_update(&s, 0), 0);   /* skip: no optimizer step */
    ck_assert_float_eq(s.scale, 512.0f);
    ck_assert_int_eq(s.skipped_steps, 1);
    ck_assert_int_eq(s.clean_steps, 0);
    ck_assert_int_eq(loss_scale_update(&s, 0), 0);
    ck_assert_float_eq(s.scale, 256.0f);
    ck_assert_int_eq(s.skipped_steps, 2);
}
END_TEST

START_TEST(test_growth_after_exactly_interval) {
    loss_scale s = started(small_config(1024.0f, 3));
    for (int i = 1; i <= 2; i++) {
        ck_assert_int_eq(loss_scale_update(&s, 1), 1);
        ck_assert_float_eq(s.scale, 1024.0f);   /* not yet */
        ck_assert_int_eq(s.clean_steps, i);
    }
    ck_assert_int_eq(loss_scale_update(&s, 1), 1);
    ck_assert_float_eq(s.scale, 2048.0f);       /* the 3rd clean step in a row */
    ck_assert_int_eq(s.clean_steps, 0);
    for (int i = 0; i < 3; i++) loss_scale_update(&s, 1);
    ck_assert_float_eq(s.scale, 4096.0f);       /* and again 3 later */
    ck_assert_int_eq(s.skipped_steps, 0);
}
END_TEST

/* 2 clean, a skip, 2 clean: without the restart the 3rd clean step overall would grow. */
START_TEST(test_skip_restarts_the_count) {
    loss_scale s = started(small_config(1024.0f, 3));
    loss_scale_update(&s, 1);
    loss_scale_update(&s, 1);
    loss_scale_update(&s, 0);
    ck_assert_float_eq(s.scale, 512.0f);
    loss_scale_update(&s, 1);
    loss_scale_update(&s, 1);
    ck_assert_float_eq(s.scale, 512.0f);
    ck_assert_int_eq(s.clean_steps, 2);
    loss_scale_update(&s, 1);
    ck_assert_float_eq(s.scale, 1024.0f);
}
END_TEST

START_TEST(test_min_scale_floor) {
    loss_scale s = started(small_config(4.0f, 3));
    for (int i = 0; i < 4; i++) ck_assert_int_eq(loss_scale_update(&s, 0), 0);
    ck_assert_float_eq(s.scale, 1.0f);          /* 4, 2, 1, 1, 1 */
    ck_assert_int_eq(s.skipped_steps, 4);
    loss_scale_config c = small_config(4.0f, 3);
    c.min_scale = 3.0f;
    s = started(c);
    loss_scale_update(&s, 0);
    ck_assert_float_eq(s.scale, 3.0f);          /* not 2: the floor is not a power of 2 */
}
END_TEST

START_TEST(test_growth_stays_finite) {
    loss_scale s = started(small_config(0x1p127f, 1));
    ck_assert_int_eq(loss_scale_update(&s, 1), 1);
    ck_assert_float_eq(s.scale, 0x1p127f);
    ck_assert_int_eq(s.clean_steps, 0);
}
END_TEST

START_TEST(test_disabled_does_nothing) {
    loss_scale_config c = loss_scale_defaults(PRECISION_BF16);
    c.growth_interval = 1;
    loss_scale s = started(c);
    ck_assert_float_eq(s.scale, 1.0f);
    const loss_scale before = s;
    ck_assert_int_eq(loss_scale_update(&s, 0), 1);   /* no skip */
    ck_assert_int_eq(loss_scale_update(&s, 1), 1);   /* no growth */
    ck_assert_int_eq(memcmp(&s, &before, sizeof s), 0);
    float g[3] = {1e-30f, 3.0f, -7.5f};
    loss_scale_unscale(&s, g, 3);
    ck_assert(g[0] == 1e-30f && g[1] == 3.0f && g[2] == -7.5f);
}
END_TEST

/* A power-of-two scale: S x g / S is g, bit for bit. */
START_TEST(test_unscale_exact) {
    loss_scale s = started(small_config(65536.0f, 3));
    float g[4] = {1e-30f * 65536.0f, 0.1f * 65536.0f, -3e30f * 65536.0f, 0.0f};
    loss_scale_unscale(&s, g, 4);
    ck_assert(g[0] == 1e-30f && g[1] == 0.1f && g[2] == -3e30f && g[3] == 0.0f);
}
END_TEST

/* The header's recipe on a growth step: the update doubles S, and the gradients made
 * with the S before it come back exactly; divided by the grown S (the negative control)
 * they come back halved. */
START_TEST(test_unscale_by_the_scale_before_a_growth) {
    loss_scale s = started(small_config(1024.0f, 1));
    const loss_scale used = s;
    ck_assert_int_eq(loss_scale_update(&s, 1), 1);
    ck_assert_float_eq(s.scale, 2048.0f);
    float g[2] = {0.375f * 1024.0f, -3e-20f * 1024.0f}, grown[2] = {g[0], g[1]};
    loss_scale_unscale(&used, g, 2);
    ck_assert(g[0] == 0.375f && g[1] == -3e-20f);
    loss_scale_unscale(&s, grown, 2);
    ck_assert(grown[0] == 0.375f / 2 && grown[1] == -3e-20f / 2);
}
END_TEST

START_TEST(test_config_check) {
    const loss_scale_config good = loss_scale_defaults(PRECISION_FP16);
    char why[160];
    ck_assert(loss_scale_config_check(&good, why, sizeof why));
    struct {
        loss_scale_config c;
        const char *named;
    } bad[] = {{good, "min_scale 0"}, {good, "init_scale 0.5"}, {good, "growth_factor 1"},
               {good, "backoff_factor 1"}, {good, "growth_interval 0"},
               {good, "init_scale inf"}};
    bad[0].c.min_scale = 0.0f;
    bad[1].c.init_scale = 0.5f;
    bad[2].c.growth_factor = 1.0f;
    bad[3].c.backoff_factor = 1.0f;
    bad[4].c.growth_interval = 0;
    bad[5].c.init_scale = INFINITY;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert(!loss_scale_config_check(&bad[i].c, why, sizeof why));
        ck_assert_msg(strstr(why, bad[i].named), "'%s' does not name '%s'", why, bad[i].named);
        bad[i].c.enabled = 0;   /* disabled: the fields are not used */
        ck_assert(loss_scale_config_check(&bad[i].c, why, sizeof why));
    }
}
END_TEST

/* An exit test: the child must exit with status 2. */
/* A config that fails the check returns 0 and leaves the scale off (1): the library
 * says so and the caller stops; it exits nothing (a rank's thread calling exit took
 * the whole process down under the other ranks). */
START_TEST(test_init_refuses_bad_config) {
    loss_scale_config c = loss_scale_defaults(PRECISION_FP16);
    c.backoff_factor = 2.0f;
    loss_scale s;
    ck_assert(!loss_scale_init(&s, &c));
    ck_assert(!s.cfg.enabled && s.scale == 1.0f);
    ck_assert(loss_scale_update(&s, 0));   /* off: every step is taken */
    c.backoff_factor = 0.5f;
    ck_assert(loss_scale_init(&s, &c) && s.cfg.enabled && s.scale == 65536.0f);
}
END_TEST

/* The start scale the command line refuses, by hand: 512 tokens (batch 8 x ctx 64), so
 * a token's target logit overflows fp16 for sure from 2 x 65520 x 512 = 67092480 (1 - p
 * >= 1/2); 5 steps halve the scale 4 times, so every step is lost from 16 x 67092480 =
 * 1073479680 on. A scale past fp32's largest number is no scale at all. */
START_TEST(test_start_check) {
    char why[512];
    ck_assert(loss_scale_start_check(65536, 0.5, 512, 5, why, sizeof why));
    ck_assert(loss_scale_start_check(1073479679.0, 0.5, 512, 5, why, sizeof why));
    ck_assert(!loss_scale_start_check(1073479680.0, 0.5, 512, 5, why, sizeof why));
    ck_assert_msg(strstr(why, "every one of the 5 steps would overflow fp16") &&
                      strstr(why, "step 6 would be the first taken; valid: below 1.07e+09"),
                  "%s", why);
    ck_assert(!loss_scale_start_check(1e38, 0.5, 512, 10, why, sizeof why));
    ck_assert_msg(strstr(why, "step 102 would be the first taken"), "%s", why);
    ck_assert(!loss_scale_start_check(3.5e38, 0.5, 512, 1000, why, sizeof why));
    ck_assert_msg(strstr(why, "more than fp32's largest number"), "%s", why);
    /* a long run backs off far enough from fp32's largest scale: allowed */
    ck_assert(loss_scale_start_check(FLT_MAX, 0.5, 512, 1000, why, sizeof why));
}
END_TEST

/* ---- grads_finite ---------------------------------------------------------------- */
static float float_sum(const float *x, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

START_TEST(test_grads_finite_positions) {
    static const size_t sizes[] = {1, 7, 8, 9, 1001};   /* around the 8 summing lanes */
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const size_t n = sizes[k];
        float *g = malloc(n * sizeof *g);
        for (size_t i = 0; i < n; i++) g[i] = (float)((double)i * 1e-3 - 0.4);
        ck_assert(grads_finite(g, n));
        const size_t where[] = {0, n / 2, n - 1};
        for (int b = 0; b < 3; b++)
            for (int w = 0; w < 3; w++) {
                const float kept = g[where[w]];
                g[where[w]] = bad[b];
                ck_assert_msg(!grads_finite(g, n), "%g at %zu of %zu not seen",
                              (double)bad[b], where[w], n);
                g[where[w]] = kept;
            }
        free(g);
    }
    float both[] = {INFINITY, 1.0f, -INFINITY};   /* the sum is NaN: still not finite */
    ck_assert(!grads_finite(both, 3));
    ck_assert(grads_finite(NULL, 0));
}
END_TEST

START_TEST(test_grads_finite_large_values) {
    float big[9];
    for (int i = 0; i < 9; i++) big[i] = 3e38f;
    big[4] = FLT_MAX;
    ck_assert(grads_finite(big, 9));
    /* negative control: a float sum of the same vector overflows, so the check above
     * tells a double sum from a float one */
    ck_assert(isinf(float_sum(big, 9)));
    for (int i = 0; i < 9; i++) big[i] = -big[i];
    ck_assert(grads_finite(big, 9));
    const size_t n = 100000;
    float *many = malloc(n * sizeof *many);
    for (size_t i = 0; i < n; i++) many[i] = FLT_MAX;
    ck_assert(grads_finite(many, n));
    free(many);
}
END_TEST

/* ---- the decision across ranks ---------------------------------------------------- */
#define RANKS 4
#define GRAD_N 1000

typedef struct {
    int all_finite[2], step_taken[2];   /* round 0: rank 2 saw an inf; round 1: none */
    loss_scale state[2];
    uint64_t allreduces[2], bytes[2];   /* added by loss_scale_all_finite */
} rank_record;

static void one_round(comm *world, loss_scale *s, float *g, rank_record *rec, int round) {
    const comm_stats before = comm_stats_get(world);
    rec->all_finite[round] = loss_scale_all_finite(world, grads_finite(g, GRAD_N));
    const comm_stats after = comm_stats_get(world);
    rec->allreduces[round] =
        after.calls[COMM_KIND_ALLREDUCE] - before.calls[COMM_KIND_ALLREDUCE];
    rec->bytes[round] = comm_stats_total_sent(&after) - comm_stats_total_sent(&before);
    rec->step_taken[round] = loss_scale_update(s, rec->all_finite[round]);
    rec->state[round] = *s;
}

static int decision_main(comm *world, void *arg) {
    rank_record *rec = (rank_record *)arg + comm_rank(world);
    loss_scale_config c = small_config(1024.0f, 1);
    loss_scale s;
    loss_scale_init(&s, &c);
    float *g = malloc(GRAD_N * sizeof *g);
    for (size_t i = 0; i < GRAD_N; i++) g[i] = 1e-3f * (float)(comm_rank(world) + 1);
    if (comm_rank(world) == 2) g[GRAD_N / 3] = INFINITY;
    one_round(world, &s, g, rec, 0);
    g[GRAD_N / 3] = 0.5f;
    one_round(world, &s, g, rec, 1);
    free(g);
    return 0;
}

static void assert_same_state(const loss_scale *a, const loss_scale *b) {
    ck_assert_float_eq(a->scale, b->scale);
    ck_assert_int_eq(a->clean_steps, b->clean_steps);
    ck_assert_int_eq(a->skipped_steps, b->skipped_steps);
}

START_TEST(test_all_ranks_decide_together) {
    rank_record rec[RANKS];
    memset(rec, 0xff, sizeof rec);
    comm_options o = comm_options_default();
    o.ranks = RANKS;
    o.timeout_seconds = 30;
    ck_assert_int_eq(launch_threads(&o, decision_main, rec), 0);
    for (int r = 0; r < RANKS; r++) {
        ck_assert_msg(rec[r].all_finite[0] == 0, "rank %d missed rank 2's inf", r);
        ck_assert_int_eq(rec[r].step_taken[0], 0);
        ck_assert_float_eq(rec[r].state[0].scale, 512.0f);
        ck_assert_int_eq(rec[r].all_finite[1], 1);
        ck_assert_int_eq(rec[r].step_taken[1], 1);
        ck_assert_float_eq(rec[r].state[1].scale, 1024.0f);   /* interval 1: grows */
        for (int k = 0; k < 2; k++) {
            assert_same_state(&rec[r].state[k], &rec[0].state[k]);
            ck_assert_uint_eq(rec[r].allreduces[k], 1);        /* one all-reduce */
        }
    }
    printf("all-finite decision, %d thread ranks: 1 all-reduce, %llu bytes sent by rank 0\n",
           RANKS, (unsigned long long)rec[0].bytes[0]);
    ck_assert_int_eq(loss_scale_all_finite(NULL, 0), 0);   /* alone */
    ck_assert_int_eq(loss_scale_all_finite(NULL, 1), 1);
}
END_TEST

/* ---- negative control: a scaler that never skips ------------------------------------ */
static int params_finite(const float *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

/* One plain SGD step through a decision function: the real scaler or a wrong one. */
static void sgd_step(float *params, float *grads, size_t n, loss_scale *s,
                     int (*decide)(loss_scale *, int)) {
    const loss_scale used = *s;   /* the scale the gradients were made with */
    if (!decide(s, grads_finite(grads, n))) return;
    loss_scale_unscale(&used, grads, n);
    for (size_t i = 0; i < n; i++) params[i] -= 0.1f * grads[i];
}

static int never_skips(loss_scale *s, int all_finite) {
    (void)s;
    (void)all_finite;
    return 1;
}

START_TEST(test_negative_control_no_skip) {
    float params[4] = {1, 1, 1, 1}, grads[4] = {65536, 65536, INFINITY, 65536};
    loss_scale s = started(small_config(65536.0f, 3));
    sgd_step(params, grads, 4, &s, loss_scale_update);
    ck_assert(params_finite(params, 4));
    ck_assert_float_eq(s.scale, 32768.0f);
    loss_scale wrong = started(small_config(65536.0f, 3));
    sgd_step(params, grads, 4, &wrong, never_skips);
    ck_assert_msg(!params_finite(params, 4), "the check missed an inf let through");
    ck_assert_float_eq(wrong.scale, 65536.0f);   /* and it did not back off */
}
END_TEST

/* ---- fp16 flush and overflow shares -------------------------------------------------- */
START_TEST(test_fp16_shares_known) {
    /* 4 non-zero: 2^-30 and 2^-27 flush at scale 1; 2^16 overflows at scale 2^16 */
    const float g[] = {0x1p-30f, 0.0f, -0x1p-27f, 0x1p-20f, 0.0f, 1.0f, INFINITY};
    const size_t n = sizeof g / sizeof *g;
    ck_assert_double_eq(fp16_flush_share(g, n, 1.0f), 0.5);
    ck_assert_double_eq(fp16_overflow_share(g, n, 1.0f), 0.0);
    ck_assert_double_eq(fp16_flush_share(g, n, 16.0f), 0.25);    /* 2^-26 flushes, 2^-23 not */
    ck_assert_double_eq(fp16_flush_share(g, n, 256.0f), 0.0);
    ck_assert_double_eq(fp16_flush_share(g, n, 65536.0f), 0.0);
    ck_assert_double_eq(fp16_overflow_share(g, n, 65536.0f), 0.25);
    /* the edges: 2^-25 ties to even (0), just above it rounds up to 2^-24; 65519
     * rounds to 65504, 65520 overflows */
    const float edges[] = {0x1p-25f, -nextafterf(0x1p-25f, 1.0f), 65519.0f, -65520.0f};
    ck_assert_double_eq(fp16_flush_share(edges, 4, 1.0f), 0.25);
    ck_assert_double_eq(fp16_overflow_share(edges, 4, 1.0f), 0.25);
    const float zeros[3] = {0};
    ck_assert_double_eq(fp16_flush_share(zeros, 3, 1.0f), 0.0);
}
END_TEST

/* The measurement: the model's step-1 gradients (the default model) in fp16 at several
 * scales. Flushing can only fall as the scale grows. */
START_TEST(test_fp16_shares_on_model_grads) {
    run_config cfg = run_config_default();
    cfg.steps = 1;
    cfg.quiet = 1;
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    double previous = 1.0;
    for (int e = 0; e <= 24; e += 8) {
        const float scale = ldexpf(1.0f, e);
        const double flush = fp16_flush_share(base->first_grads, base->num_params, scale);
        const double over = fp16_overflow_share(base->first_grads, base->num_params, scale);
        printf("model gradients (%zu) in fp16 at scale 2^%d: %.4f%% flush to 0, %.4f%% "
               "overflow\n", base->num_params, e, 100 * flush, 100 * over);
        ck_assert(flush <= previous);
        previous = flush;
    }
    baseline_free(base);
    dataset_free(data);
}
END_TEST

/* ---- the training loop's own unscale ----------------------------------------------------
 * The loop (train_loop.c) unscales with the scale the step's backward used, not with
 * loss_scale_unscale after loss_scale_update: on a growth step the update has already
 * doubled S. So these run the loop itself (the baseline's), fp16, a growing scale
 * against a fixed one (a growth window longer than the run). */
#define LOOP_STEPS 6

static baseline_run *fp16_loop_run(int growth_window, float *scale_trace) {
    run_config cfg = run_config_default();
    cfg.model.dim = 16;
    cfg.model.heads = 2;
    cfg.model.ctx = 8;
    cfg.steps = LOOP_STEPS;
    cfg.quiet = 1;
    cfg.precision = PRECISION_FP16;
    cfg.loss_scale_window = growth_window;
    cfg.loss_scale_trace = scale_trace;
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&cfg, d);
    dataset_free(d);
    return b;
}

/* Window 1: S doubles right after step 1's gradients are found finite. The step-1
 * gradients the optimizer gets (kept after the unscale) were made at 2^16 in both runs
 * and divided by that power of two: bit for bit the fixed run's. Divided by the grown
 * S they would be half of them. */
START_TEST(test_loop_unscales_step_1_by_the_scale_it_used) {
    float trace[LOOP_STEPS];
    baseline_run *fixed = fp16_loop_run(1000, NULL), *growing = fp16_loop_run(1, trace);
    ck_assert(trace[0] == 65536.0f && trace[1] == 131072.0f);
    const double diff =
        max_abs_diff(growing->first_grads, fixed->first_grads, fixed->num_params);
    printf("fp16 loop, growth window 1 against a fixed scale: step-1 gradients differ by"
           " %.3e (tolerance 0; largest %.3e)\n", diff, baseline_largest_grad(fixed));
    ck_assert(diff == 0);
    baseline_free(growing);
    baseline_free(fixed);
}
END_TEST

/* Window 2: S is 2^16, 2^16, 2^17, 2^17, 2^18, 2^18, with no overflow. Steps 1-2 used
 * 2^16 in both runs, so the parameters that step 3's loss sees are the same bits: losses
 * 1-3 equal exactly. Later steps' fp16 gradients were made at another power of two,
 * which changes only the few that flush to 0 at one scale and not at the other: within
 * the mixed-precision loss tolerance. */
START_TEST(test_loop_with_a_growing_scale_matches_a_fixed_one) {
    float trace[LOOP_STEPS];
    baseline_run *fixed = fp16_loop_run(1000, NULL), *growing = fp16_loop_run(2, trace);
    for (int i = 0; i < LOOP_STEPS; i++)
        ck_assert(trace[i] == ldexpf(65536.0f, i / 2));
    ck_assert_int_eq(growing->result.skipped_steps, 0);
    const double early = max_abs_diff(growing->loss, fixed->loss, 3);
    const double late = max_abs_diff(growing->loss, fixed->loss, LOOP_STEPS);
    printf("fp16 loop, growth window 2 against a fixed scale: losses of steps 1-3 differ by"
           " %.3e (tolerance 0), of steps 1-%d by %.3e (tolerance %.0e)\n", early,
           LOOP_STEPS, late, MIXED_TOL_LOSS);
    ck_assert(early == 0);
    ck_assert(late <= MIXED_TOL_LOSS);
    baseline_free(growing);
    baseline_free(fixed);
}
END_TEST

/* Why fp16 needs a loss scale: backward's values are d(mean loss), so each token's
 * share is 1/tokens. With 16384 tokens a step (the default model, batch 256) the
 * cross-entropy's gradients (p - onehot) / tokens fall to 1e-7 .. 1e-5, below fp16's
 * smallest normal number (6.1e-5): they land in its subnormals, where few bits are
 * left, or flush to 0. The step's weight gradients, summed in fp32 from those values,
 * then carry their error. Measured against the fp32 gradients of the same step, as
 * ||g - g32|| / ||g32||: fp16 without a scale 3.0e-3, 6.7x fp16 with the scale (4.6e-4,
 * fp16's own rounding); 33x at 32768 tokens (this model is small: fp16's range still
 * holds most values, which a real batch of a million tokens would not). Also printed:
 * the share of non-zero fp32 elements that came out 0, and the share of fp32 weight
 * gradients that fp16 itself would flush (fp16_flush_share). */
START_TEST(test_fp16_without_a_scale_loses_gradients) {
    dataset *d = dataset_builtin();
    const struct { precision p; int no_scale; const char *name; } runs[] = {
        {PRECISION_FP32, 0, "fp32"}, {PRECISION_BF16, 0, "bf16"},
        {PRECISION_FP16, 0, "fp16, loss scale 65536"}, {PRECISION_FP16, 1, "fp16, no scale"}};
    baseline_run *b[4];
    double error[4], zeroed[4];
    for (int i = 0; i < 4; i++) {
        run_config cfg = run_config_default();   /* 4 layers, dim 128, ctx 64 */
        cfg.quiet = 1;
        cfg.precision = runs[i].p;
        cfg.no_loss_scale = runs[i].no_scale;
        cfg.steps = 1;
        cfg.batch = 256;   /* 16384 tokens: each token's gradient weighs 1/16384 */
        b[i] = baseline_train(&cfg, d);
        error[i] = relative_l2_diff(b[i]->first_grads, b[0]->first_grads, b[0]->num_params,
                                  &zeroed[i]);
        printf("%-24s step-1 gradient: relative error %.2e, %.3f%% of fp32's non-zero elements"
               " lost to 0\n", runs[i].name, error[i], 100 * zeroed[i]);
    }
    printf("fp32 gradient elements that would flush to 0 in fp16: %.3f%% unscaled, %.3f%% at"
           " scale 65536\n", 100 * fp16_flush_share(b[0]->first_grads, b[0]->num_params, 1),
           100 * fp16_flush_share(b[0]->first_grads, b[0]->num_params, 65536));
    ck_assert(error[3] > 5 * error[2]);   /* underflow in backward, seen */
    ck_assert(error[2] < 1e-2 && error[1] < 5e-2);
    for (int i = 0; i < 4; i++) baseline_free(b[i]);
    dataset_free(d);
}
END_TEST

static Suite *loss_scale_suite(void) {
    Suite *s = suite_create("loss_scale");
    TCase *tc = tcase_create("loss_scale");
    tcase_set_timeout(tc, 120);   /* sanitizer builds train the model slowly */
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_skip_backs_off);
    tcase_add_test(tc, test_growth_after_exactly_interval);
    tcase_add_test(tc, test_skip_restarts_the_count);
    tcase_add_test(tc, test_min_scale_floor);
    tcase_add_test(tc, test_growth_stays_finite);
    tcase_add_test(tc, test_disabled_does_nothing);
    tcase_add_test(tc, test_unscale_exact);
    tcase_add_test(tc, test_unscale_by_the_scale_before_a_growth);
    tcase_add_test(tc, test_config_check);
    tcase_add_test(tc, test_init_refuses_bad_config);
    tcase_add_test(tc, test_start_check);
    tcase_add_test(tc, test_grads_finite_positions);
    tcase_add_test(tc, test_grads_finite_large_values);
    tcase_add_test(tc, test_all_ranks_decide_together);
    tcase_add_test(tc, test_negative_control_no_skip);
    tcase_add_test(tc, test_fp16_shares_known);
    tcase_add_test(tc, test_fp16_shares_on_model_grads);
    tcase_add_test(tc, test_loop_unscales_step_1_by_the_scale_it_used);
    tcase_add_test(tc, test_loop_with_a_growing_scale_matches_a_fixed_one);
    suite_add_tcase(s, tc);
    /* 4 steps of 16384 tokens: make test's AddressSanitizer pass leaves it out (the
     * same loss-scale code runs there in the cases above) */
    TCase *underflow = tcase_create("underflow");
    tcase_set_timeout(underflow, 120);
    tcase_set_tags(underflow, "underflow_probe");
    tcase_add_test(underflow, test_fp16_without_a_scale_loses_gradients);
    suite_add_tcase(s, underflow);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);   /* one thread, as the programs run it */
    setvbuf(stdout, NULL, _IOLBF, 0);   /* lines survive a failing (forked) test */
    return check_run(loss_scale_suite(), 0);
}
