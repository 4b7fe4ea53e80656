/* Mixed precision (bf16 and fp16 compute, fp32 master weights, gradients and AdamW) in
 * tensor parallelism, every pipeline schedule and the TP x PP x DP mesh, on thread
 * ranks, against the single-device run in the SAME precision: TP 2 (and x DP 2), the
 * naive, GPipe, 1F1B, interleaved and ZB-H1 schedules on 2 to 4 stages (and with
 * 16-bit gradients ZB-H1, interleaved, ZB-V and 1F1B x DP 2), and 2 x 2 x 2 meshes; a
 * negative control that must fail; every rank's bytes per group equal to the formulas
 * with activations at 2 B per element; fp16's forced overflow skipping the
 * same step on every rank of a mesh. With 16-bit gradients (--grad-dtype: a stage sums
 * its micro-batches in fp32, rounds the sum once and reduces it over dp in 16 bits) the
 * mesh at every ZeRO stage, TP 2 (x DP 2; and over the wrong group failing), dp's bytes and the gradients held half of fp32 gradients',
 * and a mesh that skips the 16-bit dp reduction failing.
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

/* The tolerances of a run of tp TP ranks and dp pipelines: tolerances_of's, with 16-bit
 * gradients raised for the gradients to tolerances_with_grads16's (dp + 2) u G (each of
 * the dp partial gradients rounded once, the 16-bit reduction rounding their sum once
 * more, the baseline its own once). */
static tolerances bounds_of(const run_config *cfg, const baseline_run *b, int tp, int dp) {
    return tolerances_with_grads16(tolerances_of(cfg, b, tp), cfg, dp,
                                   baseline_largest_grad(b));
}

/* ---- TP ----------------------------------------------------------------------------- */

static strategy_outcome run_tp(const run_config *cfg, const dataset *d, int tp,
                               const tp_options *opts, tp_extra *x) {
    strategy_outcome o = {.extra = x};
    ck_assert_int_eq(tp_launch(cfg, d, tp, opts, &o), 0);
    return o;
}

/* fp32 gradients, then 16-bit ones (--grad-dtype: each slab summed in fp32, rounded once
 * as backward finishes it, all-reduced over dp in 16 bits). */
START_TEST(tp_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    double worst = 0;
    for (int k = 0; k < 4; k++) {
        run_config base = tiny_config(1, 2, sixteen_bits[k % 2]);
        const int grads16 = k >= 2;
        if (grads16) base.grad_precision = base.precision;
        baseline_run *b = baseline_train(&base, d);
        for (int ranks = 2; ranks <= 4; ranks += 2) {
            run_config cfg = base;
            cfg.comm.ranks = ranks;
            tp_extra x;
            strategy_outcome o = run_tp(&cfg, d, 2, NULL, &x);
            compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
            char what[64];
            snprintf(what, sizeof what, "%s%s tp 2 x dp %d:", precision_name(cfg.precision),
                     grads16 ? " grads" : "", ranks / 2);
            worst = fmax(worst, check_within(what, &o.result, bounds_of(&cfg, b, 2, ranks / 2)));
            ck_assert_int_eq(x.vocab_parallel, 1);   /* 16 bits too: the vocabulary split */
            ck_assert_msg(x.replica_drift == 0, "replicated copies differ by %g",
                          x.replica_drift);
            const double formula = o.result.bytes_formula;
            ck_assert_msg(o.result.bytes_sent_per_step == formula,
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

/* grads16: with --grad-dtype in the compute's precision (test_chapter5_grads16.c says
 * how: a stage's micro-batches summed in fp32, the sum rounded once and reduced over dp
 * in 16 bits), on the schedules whose backward differs (split in two, two chunks a
 * rank, a V) and two pipelines side by side (ranks = 2 x stages). */
typedef struct {
    pp_schedule_kind schedule;
    int stages, micro, chunks, layers, grads16, ranks;
} pp_case;

static const pp_case pp_cases[] = {
    {PP_NAIVE, 2, 1, 1, 2, 0, 2},       {PP_GPIPE, 2, 4, 1, 2, 0, 2},
    {PP_GPIPE, 3, 4, 1, 3, 0, 3},       {PP_1F1B, 2, 4, 1, 2, 0, 2},
    {PP_1F1B, 4, 4, 1, 4, 0, 4},        {PP_INTERLEAVED, 2, 2, 2, 4, 0, 2},
    {PP_ZB_H1, 2, 4, 1, 2, 0, 2},       {PP_ZB_H1, 4, 4, 1, 4, 0, 4},
    {PP_ZB_H1, 2, 4, 1, 2, 1, 2},       {PP_INTERLEAVED, 2, 2, 2, 4, 1, 2},
    {PP_ZB_V, 2, 4, 2, 4, 1, 2},        {PP_1F1B, 2, 2, 1, 2, 1, 4},
};

START_TEST(every_schedule_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    double worst = 0;
    for (size_t i = 0; i < sizeof sixteen_bits / sizeof sixteen_bits[0]; i++) {
        for (size_t k = 0; k < sizeof pp_cases / sizeof pp_cases[0]; k++) {
            const pp_case *c = &pp_cases[k];
            run_config cfg = tiny_config(1, c->layers, sixteen_bits[i]);
            if (c->grads16) cfg.grad_precision = cfg.precision;
            baseline_run *b = baseline_train(&cfg, d);
            cfg.comm.ranks = c->ranks;
            pipeline_options opts = {.schedule = c->schedule, .micro = c->micro,
                                     .chunks = c->chunks};
            pp_result *o = launch_pp(&cfg, d, c->stages, opts, b);
            const int dp = c->ranks / c->stages;
            char what[64];
            snprintf(what, sizeof what, "%s%s %s p %d x dp %d m %d v %d:",
                     precision_name(cfg.precision), c->grads16 ? " grads" : "",
                     pp_schedule_name(c->schedule), c->stages, dp, c->micro, c->chunks);
            worst = fmax(worst, check_within(what, &o->run.result, bounds_of(&cfg, b, 1, dp)));
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

/* fp32 gradients at ZeRO 0 and 3; 16-bit ones (--grad-dtype) at every stage: every
 * rank's bytes (dp's reductions at 2 B a gradient) and state (gradients held at 2 B an
 * element) equal to their formulas to the byte. */
START_TEST(the_mesh_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    double worst = 0;
    for (int k = 0; k < 4; k++) {
        run_config cfg = tiny_config(1, 2, sixteen_bits[k % 2]);
        const int grads16 = k >= 2;
        if (grads16) cfg.grad_precision = cfg.precision;
        baseline_run *b = baseline_train(&cfg, d);
        cfg.comm.ranks = mesh_world(&shape);
        for (int zero = 0; zero <= 3; zero += grads16 ? 1 : 3) {
            mesh_result *o = launch_mesh(&cfg, d, shape, one_f_one_b(zero), b);
            char what[64];
            snprintf(what, sizeof what, "%s%s 2 x 2 x 2 1f1b zero %d:",
                     precision_name(cfg.precision), grads16 ? " grads" : "", zero);
            worst = fmax(worst, check_within(what, &o->run.result, bounds_of(&cfg, b, 2, 2)));
            check_mesh_formulas(o, shape, grads16 ? 0 : 1e-3);
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

/* Activations and their gradients travel at 2 B per element: bf16's pp bytes are half of
 * fp32's, its tp bytes half but for the vocab-parallel loss's fp32 numbers, the dp and
 * embedding bytes (fp32 gradients of the same split vocabulary) the same. */
START_TEST(sixteen_bit_activations_take_half_the_bytes) {
    dataset *d = dataset_builtin();
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    mesh_rank_traffic t[2];
    for (int i = 0; i < 2; i++) {
        run_config cfg = tiny_config(8, 2, i ? PRECISION_BF16 : PRECISION_FP32);
        mesh_result *o = launch_mesh(&cfg, d, shape, one_f_one_b(0), NULL);
        check_mesh_formulas(o, shape, 1e-3);
        t[i] = o->x.ranks[7];   /* the last stage: the head */
        mesh_result_free(o);
    }
    printf("rank 7 bytes a step, fp32 -> bf16: tp %.0f -> %.0f, pp %.0f -> %.0f, dp %.0f ->"
           " %.0f\n", t[0].bytes[PIPELINE_TP], t[1].bytes[PIPELINE_TP], t[0].bytes[PIPELINE_PP],
           t[1].bytes[PIPELINE_PP], t[0].bytes[PIPELINE_DP], t[1].bytes[PIPELINE_DP]);
    ck_assert(t[1].bytes[PIPELINE_PP] == t[0].bytes[PIPELINE_PP] / 2);
    ck_assert(t[1].bytes[PIPELINE_TP] > t[0].bytes[PIPELINE_TP] / 2);   /* the loss's fp32 */
    ck_assert(t[1].bytes[PIPELINE_TP] < t[0].bytes[PIPELINE_TP]);
    ck_assert(t[1].bytes[PIPELINE_DP] == t[0].bytes[PIPELINE_DP]);
    ck_assert(t[1].bytes[PIPELINE_EMBEDDING] == t[0].bytes[PIPELINE_EMBEDDING]);
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

/* dp's bytes at 2 B a gradient: half of the same mesh's with fp32 gradients at ZeRO 0
 * (an all-reduce of gradients only), its tp and pp bytes unchanged. */
START_TEST(sixteen_bit_gradients_halve_the_dp_bytes) {
    dataset *d = dataset_builtin();
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1};
    const pipeline_options opts = {.schedule = PP_1F1B, .micro = 4, .chunks = 1};
    mesh_rank_traffic t[2];
    for (int i = 0; i < 2; i++) {
        run_config cfg = tiny_config(8, 2, PRECISION_BF16);
        if (i) cfg.grad_precision = PRECISION_BF16;
        mesh_result *o = launch_mesh(&cfg, d, shape, opts, NULL);
        check_mesh_formulas(o, shape, 0);
        t[i] = o->x.ranks[0];
        mesh_result_free(o);
    }
    printf("rank 0 bytes a step, fp32 -> bf16 gradients: dp %.0f -> %.0f, tp %.0f -> %.0f,"
           " pp %.0f -> %.0f; grads held %.0f -> %.0f B\n", t[0].bytes[PIPELINE_DP],
           t[1].bytes[PIPELINE_DP], t[0].bytes[PIPELINE_TP], t[1].bytes[PIPELINE_TP],
           t[0].bytes[PIPELINE_PP], t[1].bytes[PIPELINE_PP], t[0].state[1], t[1].state[1]);
    ck_assert(t[1].bytes[PIPELINE_DP] * 2 == t[0].bytes[PIPELINE_DP]);
    ck_assert(t[1].state[1] * 2 == t[0].state[1]);
    ck_assert(t[1].bytes[PIPELINE_TP] == t[0].bytes[PIPELINE_TP]);
    ck_assert(t[1].bytes[PIPELINE_PP] == t[0].bytes[PIPELINE_PP]);
    dataset_free(d);
}
END_TEST

/* Negative controls: each dp rank of a mesh keeps its own 16-bit gradient (no
 * reduction); TP 2 x DP 2 all-reduces its 16-bit gradients over the tp group. */
START_TEST(skipping_the_16_bit_reduction_fails) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(1, 2, PRECISION_BF16);
    cfg.grad_precision = PRECISION_BF16;
    baseline_run *b = baseline_train(&cfg, d);
    cfg.comm.ranks = 4;
    tp_extra x;
    strategy_outcome tp = run_tp(&cfg, d, 2, &(tp_options){.grads_over_tp = 1}, &x);
    compare_to_baseline(&tp.result, b, tp.loss, tp.first_grads, tp.final_params);
    const double wrong = run_worst_fraction_of(&tp.result, bounds_of(&cfg, b, 2, 2));
    printf("negative control, bf16 grads tp 2 x dp 2 reduced over tp: %.1fx the bounds"
           " (grads %.2e)\n", wrong, tp.result.diff_grads);
    ck_assert(wrong > 3);
    strategy_outcome_free(&tp);
    cfg.comm.ranks = 8;
    for (int zero = 0; zero <= 3; zero += 3) {
        const pipeline_options opts = {.schedule = PP_1F1B, .micro = 4, .chunks = 1,
                                       .zero_stage = zero,
                                       .fault = PIPELINE_FAULT_SKIP_DP_REDUCE};
        mesh_result *o = launch_mesh(&cfg, d, (mesh_shape){.tp = 2, .pp = 2, .dp = 2, .cp = 1},
                                     opts, b);
        char what[64];
        snprintf(what, sizeof what, "bf16 grads zero %d, no dp reduction:", zero);
        const tolerances t = bounds_of(&cfg, b, 2, 2);
        const double f = run_worst_fraction_of(&o->run.result, t);
        printf("negative control, %s %.1fx the bounds (grads %.2e)\n", what, f,
               o->run.result.diff_grads);
        ck_assert(f > 3);
        mesh_result_free(o);
    }
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
    tcase_add_test(t, sixteen_bit_gradients_halve_the_dp_bytes);
    tcase_add_test(t, skipping_the_16_bit_reduction_fails);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
