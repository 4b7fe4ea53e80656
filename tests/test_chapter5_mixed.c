/* Mixed precision (bf16 and fp16 compute, fp32 master weights, gradients and AdamW) in
 * tensor parallelism, every pipeline schedule and the TP x PP x DP mesh, on thread
 * ranks, against the single-device run in the SAME precision: TP 2 (and x DP 2), the
 * naive, GPipe, 1F1B, interleaved and ZB-H1 schedules on 2 to 4 stages, and 2 x 2 x 2
 * meshes; a negative control that must fail; every rank's bytes per group equal to the
 * formulas with activations at 2 B per element; fp16's forced overflow skipping the
 * same step on every rank of a mesh.
 *
 * Tolerances: common/train/tolerances.h's, derived there (tolerances_for_tp, which the
 * chapters' verdicts use too). Pipelines (and DP inside a mesh without TP) hold
 * chapter 2's mixed tolerances: a stage runs the same 16-bit ops on the same token rows
 * as the baseline, its boundary tensors travel as the very 16-bit values the next stage
 * would have read on one device, and only the sums over tokens split (micro-batches,
 * dp groups), in fp32. Measured on the masters: 3.5e-4 on a GPipe of 3 stages in bf16
 * and 2.9e-4 on 1F1B in fp16, the same on 2 or 3 stages (the micro-batch sums, not the
 * stages), within AdamW's drift bound; DDP on these models stays below 1e-7. TP adds
 * its 16-bit all-reduces' own rounding: step 1's gradients within 4 L u G, the loss
 * within 4 L u ln V / sqrt(B T).
 * Measured worst differences are printed beside these bounds. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "check_run.h"
#include "compare.h"
#include "strategy_runs.h"
#include "matmul16.h"
#include "tolerances.h"
#include "tp_train.h"

static const precision sixteen_bits[] = {PRECISION_BF16, PRECISION_FP16};

static run_config tiny_config(int ranks, int layers, precision p) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = layers, .heads = 4, .dim = 32};
    cfg.batch = 8;
    cfg.steps = TOL_STEPS;
    cfg.quiet = 1;
    cfg.precision = p;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

typedef run_tolerances tolerances;

/* The tolerances of the header, for a run of tp TP ranks against baseline b. */
static tolerances tolerances_of(const run_config *cfg, const baseline_run *b, int tp) {
    return tp_run_tolerances(cfg, tp, b);
}

static double check_within(const char *what, const run_result *r, tolerances t) {
    printf("%-34s max |diff| loss %.2e  grads %.2e  params %.2e  (bounds %.1e %.1e %.1e)\n",
           what, r->diff_loss, r->diff_grads, r->diff_params, t.loss, t.grads, t.params);
    ck_assert_msg(r->diff_grads <= t.grads, "%s: grads %g", what, r->diff_grads);
    ck_assert_msg(r->diff_loss <= t.loss, "%s: loss %g", what, r->diff_loss);
    ck_assert_msg(r->diff_params <= t.params, "%s: params %g", what, r->diff_params);
    return run_worst_fraction_of(r, t);
}

/* ---- TP ----------------------------------------------------------------------------- */

static strategy_outcome run_tp(const run_config *cfg, const dataset *d, int tp,
                               const tp_options *opts, tp_extra *x) {
    strategy_outcome o = {.extra = x};
    ck_assert_int_eq(tp_launch(cfg, d, tp, opts, &o), 0);
    return o;
}

START_TEST(tp_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    double worst = 0;
    for (size_t i = 0; i < sizeof sixteen_bits / sizeof sixteen_bits[0]; i++) {
        run_config base = tiny_config(1, 2, sixteen_bits[i]);
        baseline_run *b = baseline_train(&base, d);
        for (int ranks = 2; ranks <= 4; ranks += 2) {
            run_config cfg = base;
            cfg.comm.ranks = ranks;
            tp_extra x;
            strategy_outcome o = run_tp(&cfg, d, 2, NULL, &x);
            compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
            char what[64];
            snprintf(what, sizeof what, "%s tp 2 x dp %d:", precision_name(cfg.precision),
                     ranks / 2);
            worst = fmax(worst, check_within(what, &o.result, tolerances_of(&cfg, b, 2)));
            ck_assert_int_eq(x.vocab_parallel, 0);   /* 16 bits: the vocabulary whole */
            ck_assert_msg(x.replica_drift == 0, "replicated copies differ by %g",
                          x.replica_drift);
            const double formula = o.result.bytes_formula;
            ck_assert_msg(fabs(o.result.bytes_sent_per_step / formula - 1) <= 1e-3,
                          "%s: %.0f bytes a step, formula %.0f", what,
                          o.result.bytes_sent_per_step, formula);
            strategy_outcome_free(&o);
        }
        baseline_free(b);
    }
    printf("tp worst: %.0f%% of the bounds\n", 100 * worst);
    dataset_free(d);
}
END_TEST

/* ---- pipelines -------------------------------------------------------------------------- */

typedef struct {
    pp_schedule_kind schedule;
    int stages, micro, chunks, layers;
} pp_case;

static const pp_case pp_cases[] = {
    {PP_NAIVE, 2, 1, 1, 2},       {PP_GPIPE, 2, 4, 1, 2},   {PP_GPIPE, 3, 4, 1, 3},
    {PP_1F1B, 2, 4, 1, 2},        {PP_1F1B, 4, 4, 1, 4},    {PP_INTERLEAVED, 2, 2, 2, 4},
    {PP_ZB_H1, 2, 4, 1, 2},       {PP_ZB_H1, 4, 4, 1, 4},
};

START_TEST(every_schedule_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    double worst = 0;
    for (size_t i = 0; i < sizeof sixteen_bits / sizeof sixteen_bits[0]; i++) {
        for (size_t k = 0; k < sizeof pp_cases / sizeof pp_cases[0]; k++) {
            const pp_case *c = &pp_cases[k];
            run_config cfg = tiny_config(1, c->layers, sixteen_bits[i]);
            baseline_run *b = baseline_train(&cfg, d);
            cfg.comm.ranks = c->stages;
            pipeline_options opts = {.schedule = c->schedule, .micro = c->micro,
                                     .chunks = c->chunks};
            pp_result *o = launch_pp(&cfg, d, c->stages, opts, b);
            char what[64];
            snprintf(what, sizeof what, "%s %s p %d m %d v %d:", precision_name(cfg.precision),
                     pp_schedule_name(c->schedule), c->stages, c->micro, c->chunks);
            worst = fmax(worst, check_within(what, &o->run.result, tolerances_of(&cfg, b, 1)));
            ck_assert_msg(o->x.tied_drift == 0, "tied copies differ by %g", o->x.tied_drift);
            const run_result *r = &o->run.result;
            ck_assert_msg(fabs(r->bytes_sent_per_step / r->bytes_formula - 1) <= 1e-3,
                          "%s: %.0f bytes a step, formula %.0f", what, r->bytes_sent_per_step,
                          r->bytes_formula);
            pp_result_free(o);
            baseline_free(b);
        }
    }
    printf("pipeline worst: %.0f%% of the bounds\n", 100 * worst);
    dataset_free(d);
}
END_TEST

/* fp16 with products widened to fp32 (matmul16's fallback here): a micro-batch under
 * 16 rows may sum differently from the whole batch's and flip an output's fp16
 * rounding (tolerances.h). This configuration did so when the fallback ran sgemm
 * (step-1 gradients 1.3e-5 apart, 13x TOL_GRADS; its micro-batches are 32 rows, and
 * OpenBLAS summed them otherwise); on oneDNN's fp32 kernel 6e-8. It must pass, within
 * the allowance. */
START_TEST(fp16_micro_batches_within_the_row_sum_allowance) {
    dataset *d = dataset_builtin();
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 16, .layers = 4, .heads = 2, .dim = 32};
    cfg.batch = 16;
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.precision = PRECISION_FP16;
    baseline_run *b = baseline_train(&cfg, d);
    cfg.comm.ranks = 2;
    pipeline_options opts = {.schedule = PP_ZB_H1, .micro = 8, .chunks = 1};
    pp_result *o = launch_pp(&cfg, d, 2, opts, b);
    const tolerances t = tolerances_of(&cfg, b, 1);
    printf("fp16 zb-h1 p 2 m 8 (matmul16 here: %s): grads %.2e apart, TOL_GRADS %.0e,"
           " allowance %.2e\n", matmul16_impl(PRECISION_FP16, 0, 1, 8, 8, 8),
           o->run.result.diff_grads, TOL_GRADS, t.grads);
    check_within("fp16 zb-h1 p 2 m 8:", &o->run.result, t);
    pp_result_free(o);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* ---- the mesh ------------------------------------------------------------------------ */

static pipeline_options one_f_one_b(int zero) {
    return (pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1, .zero_stage = zero};
}

/* Every rank's bytes per group kind and state per tag equal their formulas. */
static void check_mesh_formulas(const mesh_result *o, mesh_shape shape) {
    ck_assert_msg(o->x.worst_bytes_error <= 1e-3, "bytes off their formula by %g",
                  o->x.worst_bytes_error);
    ck_assert_msg(o->x.tied_drift == 0.0, "tied copies drifted by %g", o->x.tied_drift);
    for (int w = 0; w < mesh_world(&shape); w++)
        for (int i = 0; i < 3; i++)
            ck_assert_msg(o->x.ranks[w].state[i] == o->x.ranks[w].state_formula[i],
                          "rank %d state %d: %.0f bytes held, formula %.0f", w, i,
                          o->x.ranks[w].state[i], o->x.ranks[w].state_formula[i]);
}

START_TEST(the_mesh_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    double worst = 0;
    for (size_t i = 0; i < sizeof sixteen_bits / sizeof sixteen_bits[0]; i++) {
        run_config cfg = tiny_config(1, 2, sixteen_bits[i]);
        baseline_run *b = baseline_train(&cfg, d);
        cfg.comm.ranks = mesh_world(&shape);
        for (int zero = 0; zero <= 3; zero += 3) {
            mesh_result *o = launch_mesh(&cfg, d, shape, one_f_one_b(zero), b);
            char what[64];
            snprintf(what, sizeof what, "%s 2 x 2 x 2 1f1b zero %d:",
                     precision_name(cfg.precision), zero);
            worst = fmax(worst, check_within(what, &o->run.result, tolerances_of(&cfg, b, 2)));
            check_mesh_formulas(o, shape);
            mesh_result_free(o);
        }
        baseline_free(b);
    }
    printf("mesh worst: %.0f%% of the bounds\n", 100 * worst);
    dataset_free(d);
}
END_TEST

/* The bounds can fail: a bf16 mesh whose f leaves out its backward all-reduce. */
START_TEST(negative_control_fails) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(1, 2, PRECISION_BF16);
    baseline_run *b = baseline_train(&cfg, d);
    cfg.comm.ranks = 8;
    pipeline_options opts = one_f_one_b(0);
    opts.fault = PIPELINE_FAULT_DROP_F_BACKWARD;
    mesh_result *o = launch_mesh(&cfg, d, (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, opts, b);
    const tolerances t = tolerances_of(&cfg, b, 2);
    const double worst = run_worst_fraction_of_tolerance(&o->run.result, t.grads, t.loss,
                                                         t.params);
    printf("negative control, bf16 2 x 2 x 2 without f's backward all-reduce: %.1fx the"
           " bounds (grads %.2e)\n", worst, o->run.result.diff_grads);
    ck_assert(worst > 3);
    mesh_result_free(o);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* Activations and their gradients travel at 2 B per element: bf16's tp and pp bytes are
 * half of fp32's, the dp and embedding bytes (fp32 gradients) the same. */
START_TEST(sixteen_bit_activations_take_half_the_bytes) {
    dataset *d = dataset_builtin();
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    mesh_rank_traffic t[2];
    for (int i = 0; i < 2; i++) {
        run_config cfg = tiny_config(8, 2, i ? PRECISION_BF16 : PRECISION_FP32);
        mesh_result *o = launch_mesh(&cfg, d, shape, one_f_one_b(0), NULL);
        check_mesh_formulas(o, shape);
        t[i] = o->x.ranks[7];   /* the last stage: the head */
        mesh_result_free(o);
    }
    printf("rank 7 bytes a step, fp32 -> bf16: tp %.0f -> %.0f, pp %.0f -> %.0f, dp %.0f ->"
           " %.0f\n", t[0].bytes[PIPELINE_TP], t[1].bytes[PIPELINE_TP], t[0].bytes[PIPELINE_PP],
           t[1].bytes[PIPELINE_PP], t[0].bytes[PIPELINE_DP], t[1].bytes[PIPELINE_DP]);
    ck_assert(t[1].bytes[PIPELINE_PP] == t[0].bytes[PIPELINE_PP] / 2);
    ck_assert(t[1].bytes[PIPELINE_TP] < t[0].bytes[PIPELINE_TP] / 2);   /* no vocab split */
    ck_assert(t[1].bytes[PIPELINE_DP] > t[0].bytes[PIPELINE_DP]);   /* the whole vocabulary */
    ck_assert(t[1].bytes[PIPELINE_EMBEDDING] > t[0].bytes[PIPELINE_EMBEDDING]);
    dataset_free(d);
}
END_TEST

/* fp16's loss scale decides over the world: world rank 0's gradient overflows at step
 * 2, and every rank of a 2 x 2 x 2 mesh (and of TP 2) must skip that update and halve
 * the scale, as the baseline with the same hook does; a rank that took the step alone
 * would leave the others (the tied embedding's two copies differ) and the baseline.
 * A baseline that takes step 2 shows that the skip is seen. */
START_TEST(a_forced_overflow_skips_the_same_step_on_every_rank) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(1, 2, PRECISION_FP16);
    cfg.test_overflow_step = 2;
    baseline_run *b = baseline_train(&cfg, d);
    ck_assert_int_eq(b->result.skipped_steps, 1);
    ck_assert(b->result.loss_scale == 32768.0f);
    const tolerances bounds = tolerances_of(&cfg, b, 2);
    cfg.comm.ranks = 2;
    tp_extra x;
    strategy_outcome tp = run_tp(&cfg, d, 2, NULL, &x);
    compare_to_baseline(&tp.result, b, tp.loss, tp.first_grads, tp.final_params);
    check_within("fp16 tp 2 overflow at step 2:", &tp.result, bounds);
    ck_assert_int_eq(tp.result.skipped_steps, 1);
    ck_assert(tp.result.loss_scale == 32768.0f);
    ck_assert(x.replica_drift == 0);
    strategy_outcome_free(&tp);
    cfg.comm.ranks = 8;
    for (int zero = 0; zero <= 1; zero++) {
        mesh_result *o = launch_mesh(&cfg, d, (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1}, one_f_one_b(zero), b);
        char what[64];
        snprintf(what, sizeof what, "fp16 2 x 2 x 2 zero %d overflow:", zero);
        check_within(what, &o->run.result, bounds);
        ck_assert_int_eq(o->run.result.skipped_steps, 1);
        ck_assert(o->run.result.loss_scale == 32768.0f);   /* the largest rank's */
        ck_assert(o->x.tied_drift == 0);
        mesh_result_free(o);
    }

    run_config no_skip = cfg;
    no_skip.comm.ranks = 1;
    no_skip.test_overflow_step = 0;
    baseline_run *b2 = baseline_train(&no_skip, d);
    compare_to_baseline(&b2->result, b, b2->loss, b2->first_grads, b2->final_params);
    printf("negative control, a baseline that takes step 2: params differ by %.2e\n",
           b2->result.diff_params);
    ck_assert(b2->result.diff_params > 10 * TOL_PARAMS);
    baseline_free(b2);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapters 3-5 in mixed precision");
    TCase *t = tcase_create("mixed");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, tp_matches_the_baseline_in_its_precision);
    tcase_add_test(t, every_schedule_matches_the_baseline_in_its_precision);
    tcase_add_test(t, fp16_micro_batches_within_the_row_sum_allowance);
    tcase_add_test(t, the_mesh_matches_the_baseline_in_its_precision);
    tcase_add_test(t, negative_control_fails);
    tcase_add_test(t, sixteen_bit_activations_take_half_the_bytes);
    tcase_add_test(t, a_forced_overflow_skips_the_same_step_on_every_rank);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
