/* Mixed precision (bf16 and fp16 compute, fp32 master weights, gradients and AdamW) in
 * the data-parallel strategies, on thread ranks: DDP and ZeRO 0-3 against the
 * single-device run in the SAME precision, a negative control that must fail, the
 * model-state bytes per tag against the mixed-precision formulas, the bytes moved
 * against ring theory with 16-bit all-gathers, and activations at half their fp32 size.
 *
 * Tolerances: tolerances.h's for mixed precision (tolerances_for), derived there. In
 * short: a strategy runs the same 16-bit arithmetic as the baseline on the same tokens,
 * so step 1's gradients differ by the fp32 reduction order alone (TOL_GRADS, as in
 * fp32); later, a master that lies within rounding of a 16-bit boundary makes the two
 * runs' compute weights differ by a whole 16-bit step, and AdamW can turn the changed
 * gradient into a changed update of up to the learning rate (parameters within 2 x the
 * sum of the learning rates; loss within MIXED_TOL_LOSS). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "check_run.h"
#include "compare.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "tables.h"
#include "tolerances.h"
#include "zero_train.h"

static const precision sixteen_bits[] = {PRECISION_BF16, PRECISION_FP16};

/* chapter 2's test model: slabs that divide by neither 3 nor 4, a batch of 5 */
static run_config tiny_config(int ranks, precision p) {
    run_config cfg = uneven_model_config(ranks);
    cfg.precision = p;
    return cfg;
}

/* Held to the tolerances the chapters hold cfg's run to against baseline b (with fp16's
 * row-sum allowance where its products go through sgemm); returns the worst fraction. */
static double check_against_baseline(const char *what, const run_config *cfg,
                                     const baseline_run *b, const run_result *r) {
    const run_tolerances t = tolerances_for_grads16(cfg, cfg->comm.ranks,
                                                    baseline_largest_grad(b));
    printf("%-28s max |diff| loss %.2e  grads %.2e  params %.2e\n", what, r->diff_loss,
           r->diff_grads, r->diff_params);
    ck_assert_msg(r->diff_grads <= t.grads, "%s: grads %g", what, r->diff_grads);
    ck_assert_msg(r->diff_loss <= t.loss, "%s: loss %g", what, r->diff_loss);
    ck_assert_msg(r->diff_params <= t.params, "%s: params %g", what, r->diff_params);
    return run_worst_fraction_of_tolerance(r, t.grads, t.loss, t.params);
}

START_TEST(every_data_parallel_strategy_matches_the_baseline_in_its_precision) {
    dataset *d = dataset_builtin();
    double worst = 0;
    for (size_t i = 0; i < sizeof sixteen_bits / sizeof sixteen_bits[0]; i++) {
        const precision p = sixteen_bits[i];
        run_config base_cfg = tiny_config(1, p);
        baseline_run *b = baseline_train(&base_cfg, d);
        for (int ranks = 2; ranks <= 3; ranks++) {
            run_config cfg = tiny_config(ranks, p);
            char what[64];
            for (int variant = 0; variant < 5; variant++) {
                zero_options opts = {.stage = variant < 4 ? variant : 3, .prefetch = variant == 4};
                strategy_outcome o = launch_zero(&cfg, d, opts);
                compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
                snprintf(what, sizeof what, "%s zero%d%s, %d ranks:", precision_name(p),
                         opts.stage, opts.prefetch ? "+prefetch" : "", ranks);
                worst = fmax(worst, check_against_baseline(what, &cfg, b, &o.result));
                zero_outcome_free(&o);
            }
        }
        run_config cfg = tiny_config(1, p);   /* DDP: a batch that 2 ranks divide */
        cfg.batch = 4;
        baseline_run *b4 = baseline_train(&cfg, d);
        cfg.comm.ranks = 2;
        ddp_result *o = launch_ddp(&cfg, d, ddp_options_default(), b4);
        char what[64];
        snprintf(what, sizeof what, "%s ddp, 2 ranks:", precision_name(p));
        worst = fmax(worst, check_against_baseline(what, &cfg, b4, &o->run.result));
        ddp_result_free(o);
        baseline_free(b4);
        baseline_free(b);
    }
    const run_tolerances t = tolerances_for(&(run_config){.precision = PRECISION_BF16,
                                                          .steps = TOL_STEPS,
                                                          .adamw = run_config_default().adamw});
    printf("worst: %.0f%% of the tolerances (grads %.0e, loss %.0e, params %.1e)\n",
           100 * worst, t.grads, t.loss, t.params);
    dataset_free(d);
}
END_TEST

/* The tolerances can fail: stage 1 whose 16-bit all-gather is left out computes with
 * other ranks' stale weights. And they tell precisions apart: a bf16 run is far from the
 * fp32 baseline. */
START_TEST(negative_controls_fail) {
    dataset *d = dataset_builtin();
    run_config base_cfg = tiny_config(1, PRECISION_BF16);
    baseline_run *b = baseline_train(&base_cfg, d);
    run_config cfg = tiny_config(2, PRECISION_BF16);
    strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = 1,
                                                           .fault = ZERO_FAULT_SKIP_PARAM_ALLGATHER});
    compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
    run_tolerances t = tolerances_for(&cfg);
    double worst = run_worst_fraction_of_tolerance(&o.result, t.grads, t.loss, t.params);
    printf("negative control, bf16 zero1 without its 16-bit all-gather: %.0fx the tolerance\n",
           worst);
    ck_assert(worst > 10);
    zero_outcome_free(&o);

    run_config fp32_cfg = tiny_config(1, PRECISION_FP32);
    baseline_run *b32 = baseline_train(&fp32_cfg, d);
    compare_to_baseline(&b->result, b32, b->loss, b->first_grads, b->final_params);
    worst = run_worst_fraction_of_tolerance(&b->result, t.grads, t.loss, t.params);
    printf("negative control, the bf16 baseline against the fp32 one: %.0fx the tolerance"
           " (grads %.2e)\n", worst, b->result.diff_grads);
    ck_assert(worst > 10);
    baseline_free(b32);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* fp16's loss scale decides together: world rank 0's gradient overflows at step 2 (the
 * test hook), and every rank must skip that update and halve the scale, or its
 * parameters (its shard, or its replica) leave the baseline's, which skips it too. A
 * baseline that does not skip shows that the skip is seen. */
START_TEST(a_forced_overflow_skips_the_same_step_on_every_rank) {
    dataset *d = dataset_builtin();
    run_config base_cfg = tiny_config(1, PRECISION_FP16);
    base_cfg.batch = 6;
    base_cfg.test_overflow_step = 2;
    baseline_run *b = baseline_train(&base_cfg, d);
    ck_assert_int_eq(b->result.skipped_steps, 1);
    ck_assert(b->result.loss_scale == 32768.0f);
    run_config cfg = base_cfg;
    cfg.comm.ranks = 3;
    for (int stage = 0; stage <= 3; stage++) {
        strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage});
        compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
        char what[64];
        snprintf(what, sizeof what, "fp16 zero%d overflow at step 2:", stage);
        check_against_baseline(what, &cfg, b, &o.result);
        ck_assert_int_eq(o.result.skipped_steps, 1);
        ck_assert(o.result.loss_scale == 32768.0f);
        zero_outcome_free(&o);
    }
    ddp_result *o = launch_ddp(&cfg, d, ddp_options_default(), b);
    check_against_baseline("fp16 ddp overflow at step 2:", &cfg, b, &o->run.result);
    ck_assert(o->x.replica_max_diff == 0);   /* the replicas took the same steps */
    ck_assert_int_eq(o->run.result.skipped_steps, 1);
    ddp_result_free(o);

    run_config no_skip = base_cfg;
    no_skip.test_overflow_step = 0;
    baseline_run *b2 = baseline_train(&no_skip, d);
    compare_to_baseline(&b2->result, b, b2->loss, b2->first_grads, b2->final_params);
    const run_tolerances t = tolerances_for(&base_cfg);
    const double worst = run_worst_fraction_of_tolerance(&b2->result, t.grads, t.loss, t.params);
    printf("negative control, a run that takes step 2: loss differs by %.2e, params by %.2e"
           " (%.1fx the tolerance)\n", b2->result.diff_loss, b2->result.diff_params, worst);
    ck_assert(worst > 1);
    baseline_free(b2);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* Bytes held between steps, by tag, against 2P + 4P + 12P and its ZeRO shardings (the
 * masters count with m and v as optimizer state), and with 16-bit gradients (--grad-dtype
 * bf16) 2P + 2P + 12P: the ZeRO paper's K = 12 column itself; up to the uneven-shard
 * allowance. */
START_TEST(model_state_bytes_match_the_mixed_formulas) {
    dataset *d = dataset_builtin();
    run_config one = tiny_config(1, PRECISION_BF16);
    gpt_shape s = gpt_shape_make(&one.model, 1, 0);
    const size_t P = gpt_num_params(&s);
    const precision grad_types[2] = {PRECISION_FP32, PRECISION_BF16};
    for (int g = 0; g < 2; g++)
        for (int ranks = 1; ranks <= 4; ranks++) {
            run_config cfg = tiny_config(ranks, PRECISION_BF16);
            cfg.grad_precision = grad_types[g];
            cfg.steps = 2;
            const double grad_bytes = (double)precision_bytes(cfg.grad_precision);
            for (int stage = 0; stage <= 3; stage++) {
                strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage});
                const double measured = o.state[0] + o.state[1] + o.state[2];
                const double formula = stage_stored_formula_grads(stage, P, ranks,
                                                                  PRECISION_BF16, grad_types[g]);
                const double paper = state_total(zero_paper_bytes(stage, (double)P, ranks, 12));
                const double padding = stage_padding_bytes(&o, P);
                const double shard_len = (double)zero_extra_of(&o)->shard_len_largest;
                printf("bf16, %s gradients, stage %d, %d ranks: params %.0f grads %.0f optimizer"
                       " %.0f B; formula %.0f B (paper K = 12: %.0f B), uneven %.0f B\n",
                       precision_name(grad_types[g]), stage, ranks, o.state[0], o.state[1],
                       o.state[2], formula, paper, padding);
                ck_assert(fabs(measured - (formula + padding)) < 1e-6);
                if (grad_types[g] != PRECISION_FP32) ck_assert(formula == paper);
                ck_assert(o.state[0] == 2.0 * (stage <= 2 ? (double)P : shard_len));
                ck_assert(o.state[1] == grad_bytes * (stage <= 1 ? (double)P : shard_len));
                ck_assert(o.state[2] == 12.0 * (stage == 0 ? (double)P : shard_len));
                zero_outcome_free(&o);
            }
        }
    dataset_free(d);
}
END_TEST

/* The all-gathers move 16-bit weights (half fp32's bytes), the reductions fp32
 * gradients, or 16-bit ones with --grad-dtype bf16: calls as planned, bytes as a ring
 * sends them, and the run's own formula the same. */
START_TEST(communication_matches_ring_theory_with_16_bit_weights) {
    dataset *d = dataset_builtin();
    const precision grad_types[2] = {PRECISION_FP32, PRECISION_BF16};
    for (int g = 0; g < 2; g++) {
        run_config cfg = tiny_config(3, PRECISION_BF16);
        cfg.grad_precision = grad_types[g];
        cfg.steps = 3;
        gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
        for (int stage = 0; stage <= 3; stage++) {
            strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage});
            comm_plan plan = zero_comm_plan_grads(&s, stage, PRECISION_BF16, grad_types[g]);
            double sent = 0, theory = 0;
            for (int k = 0; k < COMM_NKINDS; k++) {
                ck_assert_msg(o.comm_calls[k] == plan.calls[k], "stage %d %s: %g calls, plan %g",
                              stage, comm_kind_name(k), o.comm_calls[k], plan.calls[k]);
                const double expected = plan_ring_bytes(&plan, k, 3);
                ck_assert_msg(fabs(o.comm_bytes[k] - expected) <= 4.0 * plan.calls[k] * 2,
                              "stage %d %s: %g bytes, theory %g", stage, comm_kind_name(k),
                              o.comm_bytes[k], expected);
                sent += o.comm_bytes[k];
                theory += expected;
            }
            printf("bf16, %s gradients, stage %d, 3 ranks: %.0f bytes sent per rank per step,"
                   " ring theory %.0f\n", precision_name(grad_types[g]), stage, sent, theory);
            ck_assert(fabs(o.result.bytes_formula - theory) < 1e-6);
            zero_outcome_free(&o);
        }
    }
    dataset_free(d);
}
END_TEST

/* Activations kept for backward are 16-bit: their bytes are half of fp32's, but for the
 * fp32 LayerNorm statistics and losses (3 floats per token and LayerNorm) and the
 * token ids, which stay as they are. */
START_TEST(activations_take_half_the_bytes) {
    dataset *d = dataset_builtin();
    size_t bytes[2];
    const precision ps[2] = {PRECISION_FP32, PRECISION_BF16};
    for (int i = 0; i < 2; i++) {
        run_config cfg = tiny_config(1, ps[i]);
        cfg.steps = 2;
        baseline_run *b = baseline_train(&cfg, d);
        bytes[i] = b->result.memory.peak[MEM_ACTIVATIONS];
        baseline_free(b);
    }
    const run_config cfg = tiny_config(1, PRECISION_FP32);
    const double N = (double)cfg.batch * cfg.model.ctx, L = cfg.model.layers;
    /* per token: 2 statistics per LayerNorm (2 per block, 1 final), a loss, 2 token ids */
    const double kept_as_is = N * 4.0 * (2 * (2 * L + 1) + 1 + 2);
    printf("activations: fp32 %zu B, bf16 %zu B (%.3f); fp32 statistics and ids %.0f B\n",
           bytes[0], bytes[1], (double)bytes[1] / (double)bytes[0], kept_as_is);
    ck_assert(fabs((double)bytes[1] - ((double)bytes[0] - kept_as_is) / 2 - kept_as_is) < 1);
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter 2 in mixed precision");
    TCase *t = tcase_create("mixed");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, every_data_parallel_strategy_matches_the_baseline_in_its_precision);
    tcase_add_test(t, negative_controls_fail);
    tcase_add_test(t, a_forced_overflow_skips_the_same_step_on_every_rank);
    tcase_add_test(t, model_state_bytes_match_the_mixed_formulas);
    tcase_add_test(t, communication_matches_ring_theory_with_16_bit_weights);
    tcase_add_test(t, activations_take_half_the_bytes);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
