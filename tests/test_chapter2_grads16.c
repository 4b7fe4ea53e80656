/* 16-bit gradients (--grad-dtype bf16|fp16, grads16.h) in DDP and every ZeRO stage:
 * against the baseline with the same precision and gradient dtype, within
 * tolerances_for_grads16 ((parts + 2) u G on step-1 gradients, derived in
 * tolerances.h), and a run that skips the reduction fails. The gradient tag's peak of
 * every run equals its formula to the byte (no fp32 copy of the vector for AdamW or
 * the loss scale). Their model state by tag (2P + 2P + 12P) and bytes (reductions at
 * 2 B an element) are test_chapter2_mixed's. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "baseline.h"
#include "check_run.h"
#include "compare.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "tolerances.h"
#include "zero_train.h"

static const precision sixteen_bits[] = {PRECISION_BF16, PRECISION_FP16};

/* chapter 2's test model (test_chapter2_mixed's), gradients held in 16 bits */
static run_config tiny_config(int ranks, precision p) {
    run_config cfg = uneven_model_config(ranks);
    cfg.precision = p;
    cfg.grad_precision = p;
    return cfg;
}

/* The gradient tag's peak on the largest rank: the 16-bit gradients held (whole at
 * stages 0-1, the baseline and DDP; else the shard) and backward's fp32 working slabs
 * at the worst moment, the tied embedding's (alive through the pass) and one other,
 * which stages 2-3 round in place for its reduce-scatter. AdamW and the loss scale add
 * nothing: they widen a chunk at a time in the 16-bit ops' scratch. */
static double grads16_peak_formula(const run_config *cfg, int stage, size_t shard_len) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    const double held = stage <= 1 ? (double)gpt_num_params(&s) : (double)shard_len;
    const double embed = (double)gpt_slab_numel(&s, gpt_embed_slab(&s));
    const double slab = fmax((double)gpt_slab_numel(&s, 1),
                             (double)gpt_slab_numel(&s, gpt_final_slab(&s)));
    return 2.0 * held + 4.0 * (embed + slab);
}

static void check_grads16_peak(const char *what, const run_config *cfg, int stage,
                               size_t shard_len, const run_result *r) {
    const double formula = grads16_peak_formula(cfg, stage, shard_len);
    const double measured = (double)r->memory.peak[MEM_GRADS];
    printf("%-30s grads peak %.0f B, formula %.0f B\n", what, measured, formula);
    ck_assert_msg(measured == formula, "%s: grads peak %.0f B, formula %.0f B", what, measured,
                  formula);
}

/* The worst fraction of the run's 16-bit-gradient tolerances. */
static double fraction_of_tolerance(const char *what, const run_config *cfg, int parts,
                                    const baseline_run *b, const run_result *r) {
    const run_tolerances t = tolerances_for_grads16(cfg, parts, baseline_largest_grad(b));
    printf("%-30s grads %.2e (tolerance %.2e)  loss %.2e  params %.2e\n", what, r->diff_grads,
           t.grads, r->diff_loss, r->diff_params);
    return run_worst_fraction_of_tolerance(r, t.grads, t.loss, t.params);
}

START_TEST(ddp_and_every_stage_match_the_baseline_with_16_bit_gradients) {
    dataset *d = dataset_builtin();
    double worst = 0;
    for (size_t i = 0; i < sizeof sixteen_bits / sizeof sixteen_bits[0]; i++) {
        const precision p = sixteen_bits[i];
        run_config base_cfg = tiny_config(1, p);
        baseline_run *b = baseline_train(&base_cfg, d);
        check_grads16_peak("baseline:", &base_cfg, 0, 0, &b->result);
        for (int ranks = 2; ranks <= 3; ranks++) {
            run_config cfg = tiny_config(ranks, p);
            for (int stage = 0; stage <= 3; stage++) {
                strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage});
                compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
                char what[64];
                snprintf(what, sizeof what, "%s zero%d, %d ranks:", precision_name(p), stage,
                         ranks);
                const double f = fraction_of_tolerance(what, &cfg, ranks, b, &o.result);
                ck_assert_msg(f <= 1, "%s at %.0f%% of its tolerance", what, 100 * f);
                worst = fmax(worst, f);
                check_grads16_peak(what, &cfg, stage, zero_extra_of(&o)->shard_len_largest,
                                   &o.result);
                zero_outcome_free(&o);
            }
        }
        run_config cfg = tiny_config(1, p);   /* DDP: a batch that 2 ranks x 2 divide */
        cfg.batch = 4;
        baseline_run *b4 = baseline_train(&cfg, d);
        cfg.comm.ranks = 2;
        ddp_options opts = ddp_options_default();
        opts.grad_accum = 2;
        ddp_result *o = launch_ddp(&cfg, d, opts, b4);
        char what[64];
        snprintf(what, sizeof what, "%s ddp, 2 ranks x 2 micro:", precision_name(p));
        const double f = fraction_of_tolerance(what, &cfg, 4, b4, &o->run.result);
        ck_assert_msg(f <= 1, "%s at %.0f%% of its tolerance", what, 100 * f);
        worst = fmax(worst, f);
        check_grads16_peak(what, &cfg, 0, 0, &o->run.result);
        ddp_result_free(o);
        baseline_free(b4);
        baseline_free(b);
    }
    printf("16-bit gradients: worst %.0f%% of the tolerance\n", 100 * worst);
    dataset_free(d);
}
END_TEST

/* fp16's loss scale multiplies the loss by S and hands 1/S to the update, which the
 * 16-bit gradient never sees: step 1's gradient, as AdamW reads it, must be the fp32
 * gradient's (the same backward, the same S) within one fp16 rounding of S g, undone:
 * half an ulp, 2^-11 |g|, or half fp16's subnormal spacing, 2^-25 / S. */
START_TEST(fp16_gradients_reach_the_update_unscaled) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(1, PRECISION_FP16);
    baseline_run *b16 = baseline_train(&cfg, d);
    cfg.grad_precision = PRECISION_FP32;
    baseline_run *b32 = baseline_train(&cfg, d);
    const double scale = 65536.0;   /* the default start, never backed off here */
    double worst = 0;
    for (size_t i = 0; i < b32->num_params; i++) {
        const double g = b32->first_grads[i], bound = 0x1p-11 * fabs(g) + 0x1p-25 / scale;
        worst = fmax(worst, fabs(b16->first_grads[i] - g) / bound);
    }
    printf("fp16 gradients against fp32's at step 1: worst %.2f of one fp16 rounding\n", worst);
    ck_assert_msg(worst <= 1, "fp16 gradients %.3g roundings from fp32's", worst);
    baseline_free(b32);
    baseline_free(b16);
    dataset_free(d);
}
END_TEST

/* Negative control: ranks that keep their own 16-bit gradient miss the bound. */
START_TEST(skipping_the_16_bit_reduction_fails) {
    dataset *d = dataset_builtin();
    run_config base_cfg = tiny_config(1, PRECISION_BF16);
    baseline_run *b = baseline_train(&base_cfg, d);
    run_config cfg = tiny_config(2, PRECISION_BF16);
    for (int stage = 0; stage <= 3; stage++) {
        strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage,
                                                               .fault = ZERO_FAULT_SKIP_GRAD_REDUCE});
        compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
        char what[64];
        snprintf(what, sizeof what, "bf16 zero%d, no reduction:", stage);
        ck_assert(fraction_of_tolerance(what, &cfg, 2, b, &o.result) > 1);
        zero_outcome_free(&o);
    }
    baseline_free(b);
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter 2 with 16-bit gradients");
    TCase *t = tcase_create("grads16");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, ddp_and_every_stage_match_the_baseline_with_16_bit_gradients);
    tcase_add_test(t, skipping_the_16_bit_reduction_fails);
    tcase_add_test(t, fp16_gradients_reach_the_update_unscaled);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
