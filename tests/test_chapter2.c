/* Chapter 2, ZeRO stages 0-3 on thread ranks: every stage against the single-device
 * baseline on 1-4 ranks with shards that do not divide evenly, negative controls that
 * must fail, measured model-state bytes against the formulas, the bytes moved against
 * ring theory, --estimate against hand-computed cases, and activation checkpointing. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "compare.h"
#include "estimate.h"
#include "floats.h"
#include "tables.h"
#include "tolerances.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "zero_train.h"
#include "check_run.h"

/* A model whose slabs divide by neither 3 nor 4, and a batch uneven on 2-4 ranks
 * (small_model.h). */
static run_config tiny_config(int ranks) { return uneven_model_config(ranks); }

static size_t tiny_params(void) {
    run_config cfg = tiny_config(1);
    gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    return gpt_num_params(&s);
}

static const char *option_text(const zero_options *o) {
    return o->prefetch ? "+prefetch" : o->checkpoint_activations ? "+ckpt" : "";
}

START_TEST(shards_are_uneven_in_the_test_model) {
    run_config cfg = tiny_config(1);
    gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    for (int n = 3; n <= 4; n++) {
        int uneven = 0;
        for (int slab = 0; slab < gpt_num_slabs(&s); slab++)
            uneven += gpt_slab_numel(&s, slab) % n != 0;
        ck_assert_int_eq(uneven, gpt_num_slabs(&s));   /* no slab divides by 3 or 4 */
        shard_layout l;
        size_t covered = 0;
        for (int r = 0; r < n; r++) {
            shard_layout_init(&l, &s, n, r);
            covered += l.shard_len;
            shard_layout_free(&l);
        }
        ck_assert_uint_eq(covered, gpt_num_params(&s));   /* pieces tile the vector */
    }
}
END_TEST

/* Every stage on 1, 2, 3 and 4 ranks: loss of every step, step 1's gradient before the
 * update (gathered from the shards) and the parameters after 5 steps. */
START_TEST(every_stage_matches_the_baseline_on_1_to_4_ranks) {
    dataset *d = dataset_builtin();
    run_config base_cfg = tiny_config(1);
    baseline_run *b = baseline_train(&base_cfg, d);
    double worst[3] = {0, 0, 0};
    for (int ranks = 1; ranks <= 4; ranks++) {
        run_config cfg = tiny_config(ranks);
        for (int variant = 0; variant < 5; variant++) {
            /* stages 0-3, and stage 3 again with prefetch */
            zero_options opts = {.stage = variant < 4 ? variant : 3, .prefetch = variant == 4};
            strategy_outcome o = launch_zero(&cfg, d, opts);
            compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
            printf("stage %d%-9s %d ranks: max |diff| loss %.2e  grads %.2e  params %.2e\n",
                   opts.stage, option_text(&opts), ranks, o.result.diff_loss,
                   o.result.diff_grads, o.result.diff_params);
            ck_assert_msg(o.result.diff_loss <= TOL_LOSS, "loss %g", o.result.diff_loss);
            ck_assert_msg(o.result.diff_grads <= TOL_GRADS, "grads %g", o.result.diff_grads);
            ck_assert_msg(o.result.diff_params <= TOL_PARAMS, "params %g",
                          o.result.diff_params);
            worst[0] = fmax(worst[0], o.result.diff_loss);
            worst[1] = fmax(worst[1], o.result.diff_grads);
            worst[2] = fmax(worst[2], o.result.diff_params);
            zero_outcome_free(&o);
        }
    }
    printf("all stages, 1-4 ranks: max |diff| loss %.2e (tol %.0e), grads %.2e (tol %.0e),"
           " params %.2e (tol %.0e)\n", worst[0], TOL_LOSS, worst[1], TOL_GRADS,
           worst[2], TOL_PARAMS);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* Leaving out a step of the algorithm must break the agreement: the comparison can
 * fail. */
START_TEST(negative_controls_fail) {
    dataset *d = dataset_builtin();
    run_config base_cfg = tiny_config(1);
    baseline_run *b = baseline_train(&base_cfg, d);
    run_config cfg = tiny_config(2);
    const struct { int stage; zero_fault fault; const char *what; } cases[] = {
        {1, ZERO_FAULT_SKIP_PARAM_ALLGATHER, "stage 1 without the parameter all-gather"},
        {2, ZERO_FAULT_SKIP_PARAM_ALLGATHER, "stage 2 without the parameter all-gather"},
        {0, ZERO_FAULT_SKIP_GRAD_REDUCE, "stage 0 without the gradient all-reduce"},
        {3, ZERO_FAULT_SKIP_GRAD_REDUCE, "stage 3 with local gradients, no reduce-scatter"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zero_options opts = {.stage = cases[i].stage, .fault = cases[i].fault};
        strategy_outcome o = launch_zero(&cfg, d, opts);
        compare_to_baseline(&o.result, b, o.loss, o.first_grads, o.final_params);
        double worst = zero_worst_fraction_of_tolerance(&o.result, &(run_tolerances){TOL_GRADS, TOL_LOSS, TOL_PARAMS}, 1);
        printf("negative control, %s: max |diff| loss %.2e grads %.2e params %.2e"
               " (%.0fx the tolerance)\n", cases[i].what, o.result.diff_loss,
               o.result.diff_grads, o.result.diff_params, worst);
        ck_assert_msg(worst > 10, "%s went unnoticed", cases[i].what);
        ck_assert(o.result.diff_params > TOL_PARAMS);
        zero_outcome_free(&o);
    }
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* Bytes held between steps, measured by the accounting allocator, against the
 * as-stored formula: equal up to the uneven-shard allowance (one element per slab and
 * sharded vector), and at stage 3 falling as 1/N. */
START_TEST(model_state_bytes_match_the_stored_formula) {
    dataset *d = dataset_builtin();
    const size_t P = tiny_params();
    run_config one = tiny_config(1);
    gpt_shape s = gpt_shape_make(&one.model, 1, 0);
    const int slabs = gpt_num_slabs(&s);
    double stage3_at_1 = 0;
    for (int ranks = 1; ranks <= 4; ranks++) {
        run_config cfg = tiny_config(ranks);
        cfg.steps = 2;
        for (int stage = 0; stage <= 3; stage++) {
            strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = stage});
            const double measured = o.state[0] + o.state[1] + o.state[2];
            const double formula = stage_stored_formula(stage, P, ranks, PRECISION_FP32);
            const double padding = stage_padding_bytes(&o, P);
            const int sharded = stage == 0 ? 0 : stage + 1;
            printf("stage %d, %d ranks: model state %.0f B measured, formula %.0f B,"
                   " diff %+.0f B (uneven shards %.0f B)\n", stage, ranks, measured, formula,
                   measured - formula, padding);
            ck_assert(fabs(measured - (formula + padding)) < 1e-6);
            ck_assert(padding >= 0 && padding <= 4.0 * sharded * slabs);
            /* and the parts: what is whole is 4P, what is sharded is 4 x the largest shard */
            const double whole = 4.0 * P, shard = 4.0 * zero_extra_of(&o)->shard_len_largest;
            ck_assert(o.state[0] == (stage <= 2 ? whole : shard));
            ck_assert(o.state[1] == (stage <= 1 ? whole : shard));
            ck_assert(o.state[2] == 2 * (stage == 0 ? whole : shard));
            if (stage == 3 && ranks == 1) stage3_at_1 = measured;
            if (stage == 3)   /* 1/N, up to one element per slab and vector */
                ck_assert(fabs(measured * ranks - stage3_at_1) <= 16.0 * slabs * ranks);
            zero_outcome_free(&o);
        }
    }
    dataset_free(d);
}
END_TEST

/* The temporaries of stages 2 and 3 really come and go per slab: the peaks are the
 * shard plus the slabs alive at the worst moment, not the whole model. */
START_TEST(stage2_and_3_free_whole_slabs_as_they_go) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(3);
    cfg.steps = 2;
    cfg.model.layers = 3;   /* so that the blocks outweigh the embedding */
    gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    const double P = (double)gpt_num_params(&s);
    const double embed = (double)gpt_slab_numel(&s, 0), block = (double)gpt_slab_numel(&s, 1);
    const double final_ln = (double)gpt_slab_numel(&s, gpt_final_slab(&s));

    strategy_outcome o = launch_zero(&cfg, d, (zero_options){.stage = 2});
    /* backward holds the tied embedding's gradient throughout, plus one other slab */
    double expected = 4 * ((double)zero_extra_of(&o)->shard_len_largest + embed + fmax(block, final_ln));
    printf("stage 2 peak gradient bytes %zu (shard + embedding + one block = %.0f;"
           " whole model %.0f)\n", o.result.memory.peak[MEM_GRADS], expected, 4 * P);
    ck_assert(o.result.memory.peak[MEM_GRADS] == expected);
    ck_assert(expected < 4 * P);
    zero_outcome_free(&o);

    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        o = launch_zero(&cfg, d, (zero_options){.stage = 3, .prefetch = prefetch});
        /* without prefetch: one unit at a time, the head's being final LN + embedding;
         * with it: this unit and the next */
        double gathered = prefetch ? fmax(2 * block, block + embed + final_ln)
                                   : fmax(block, embed + final_ln);
        expected = 4 * ((double)zero_extra_of(&o)->shard_len_largest + gathered);
        printf("stage 3%s peak parameter bytes %zu (shard + gathered %.0f = %.0f;"
               " whole model %.0f)\n", prefetch ? " +prefetch" : "",
               o.result.memory.peak[MEM_PARAMS], 4 * gathered, expected, 4 * P);
        ck_assert(o.result.memory.peak[MEM_PARAMS] == expected);
        zero_outcome_free(&o);
    }
    dataset_free(d);
}
END_TEST

/* Calls per kind as planned, bytes as a ring sends them (an uneven piece moves the
 * count by at most one element per call), and stage 3 at 1.5x stage 0. */
START_TEST(communication_matches_ring_theory) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(3);
    cfg.steps = 3;
    gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
    double totals[5] = {0};
    for (int variant = 0; variant < 5; variant++) {
        zero_options opts = {.stage = variant < 4 ? variant : 3, .prefetch = variant == 4};
        strategy_outcome o = launch_zero(&cfg, d, opts);
        comm_plan plan = zero_comm_plan(&s, opts.stage, PRECISION_FP32);
        double sent = 0, theory = 0;
        for (int k = 0; k < COMM_NKINDS; k++) {
            ck_assert_msg(o.comm_calls[k] == plan.calls[k], "stage %d %s: %g calls, plan %g",
                          opts.stage, comm_kind_name(k), o.comm_calls[k], plan.calls[k]);
            double expected = ring_bytes(plan.elements[k], 3);
            ck_assert_msg(fabs(o.comm_bytes[k] - expected) <= 4.0 * plan.calls[k] * 2,
                          "stage %d %s: %g bytes, theory %g", opts.stage, comm_kind_name(k),
                          o.comm_bytes[k], expected);
            sent += o.comm_bytes[k];
            theory += expected;
        }
        totals[variant] = sent;
        printf("stage %d%-9s 3 ranks: %.0f bytes sent per rank per step, ring theory %.0f"
               " (diff %+.0f)\n", opts.stage, option_text(&opts), sent, theory, sent - theory);
        if (opts.prefetch) {
            printf("  prefetch: %.3f ms in flight per step, %.3f ms hidden\n",
                   1e3 * o.async_seconds, 1e3 * o.hidden_seconds);
            /* in flight = hidden under compute + blocked in the waits, never more */
            double blocked = 0;
            for (int k = 0; k < COMM_NKINDS; k++) blocked += o.comm_seconds[k];
            ck_assert(o.async_seconds > 0 && o.hidden_seconds <= o.async_seconds * 1.0001);
            ck_assert(o.async_seconds <= (o.hidden_seconds + blocked) * 1.0001 + 1e-9);
        }
        zero_outcome_free(&o);
    }
    printf("stage 3 / stage 0 bytes: %.4f; stages 1, 2 / stage 0: %.4f, %.4f\n",
           totals[3] / totals[0], totals[1] / totals[0], totals[2] / totals[0]);
    ck_assert(fabs(totals[3] / totals[0] - 1.5) < 0.01);
    ck_assert(fabs(totals[4] / totals[0] - 1.5) < 0.01);
    ck_assert(fabs(totals[1] / totals[0] - 1.0) < 0.01);
    ck_assert(fabs(totals[2] / totals[0] - 1.0) < 0.01);
    dataset_free(d);
}
END_TEST

/* --estimate: the ZeRO paper's example, 7.5B parameters on 64 devices, by hand:
 *   stage 0: 16 x 7.5 = 120 GB;  stage 1: 4 x 7.5 + 12 x 7.5/64 = 30 + 1.40625
 *   stage 2: 2 x 7.5 + 14 x 7.5/64 = 15 + 1.640625;  stage 3: 16 x 7.5/64 = 1.875 */
START_TEST(estimate_agrees_with_hand_computed_cases) {
    const double P = 7.5e9, GB = 1e9;
    const double paper[4] = {120.0, 31.40625, 16.640625, 1.875};
    for (int stage = 0; stage < 4; stage++) {
        double got = state_total(zero_paper_bytes(stage, P, 64, 12)) / GB;
        printf("7.5e9 params, N = 64, stage %d: %.6f GB (by hand %.6f)\n", stage, got,
               paper[stage]);
        ck_assert(fabs(got - paper[stage]) < 1e-9);
    }
    /* the course's 4x / 8x / Nx: savings as N grows (here N = 1e6), and N at stage 3 */
    const int big = 1000000;
    double base = state_total(zero_paper_bytes(0, 1, big, 12));
    ck_assert(fabs(base / state_total(zero_paper_bytes(1, 1, big, 12)) - 4) < 1e-4);
    ck_assert(fabs(base / state_total(zero_paper_bytes(2, 1, big, 12)) - 8) < 1e-4);
    ck_assert(fabs(base / state_total(zero_paper_bytes(3, 1, 8, 12)) - 8) < 1e-12);
    /* this program's fp32: 1B parameters on 4 ranks: 16, 4+4+2 = 10, 4+3 = 7, 4 GB */
    const double stored[4] = {16, 10, 7, 4};
    for (int stage = 0; stage < 4; stage++)
        ck_assert(fabs(state_total(zero_stored_bytes(stage, 1e9, 4, PRECISION_FP32)) / GB - stored[stage]) < 1e-9);
    /* largest model on an 80 GB card, N = 64: 80/16 = 5B, 80/(4 + 12/64) = 19.104B,
     * 80/(2 + 14/64) = 36.06B, 80 x 64/16 = 320B */
    const double largest[4] = {5e9, 80e9 / 4.1875, 80e9 / 2.21875, 320e9};
    for (int stage = 0; stage < 4; stage++)
        ck_assert(fabs(zero_largest_model(stage, 80e9, 64, 12) / largest[stage] - 1) < 1e-12);
    /* one device: every stage is the same 16 bytes per parameter */
    for (int stage = 0; stage < 4; stage++)
        ck_assert(state_total(zero_paper_bytes(stage, 1, 1, 12)) == 16);
    /* ring bytes: 4 ranks send 3/4 of 1000 elements of 4 bytes */
    ck_assert(ring_bytes(1000, 4) == 3000);
    ck_assert(ring_bytes(1000, 1) == 0);
}
END_TEST

/* Activation checkpointing: bit-identical gradients and losses, fewer activation
 * bytes (one block's intermediates instead of L). */
START_TEST(checkpointing_keeps_results_and_saves_activations) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(2);
    cfg.model.layers = 3;
    cfg.steps = 2;
    for (int stage = 0; stage <= 3; stage += 3) {
        strategy_outcome plain = launch_zero(&cfg, d, (zero_options){.stage = stage});
        strategy_outcome ckpt = launch_zero(&cfg, d, (zero_options){.stage = stage,
                                                               .checkpoint_activations = 1});
        gpt_shape s = gpt_shape_make(&cfg.model, 1, 0);
        size_t P = gpt_num_params(&s);
        double grad_diff = max_abs_diff(plain.first_grads, ckpt.first_grads, P);
        double param_diff = max_abs_diff(plain.final_params, ckpt.final_params, P);
        double loss_diff = max_abs_diff(plain.loss, ckpt.loss, (size_t)cfg.steps);
        size_t a_plain = plain.result.memory.peak[MEM_ACTIVATIONS];
        size_t a_ckpt = ckpt.result.memory.peak[MEM_ACTIVATIONS];
        printf("stage %d checkpointing: max |diff| grads %.1e params %.1e loss %.1e;"
               " activations %zu -> %zu bytes (%.0f%% saved)\n", stage, grad_diff,
               param_diff, loss_diff, a_plain, a_ckpt, 100.0 * (1 - (double)a_ckpt / a_plain));
        ck_assert(grad_diff == 0 && param_diff == 0 && loss_diff == 0);
        ck_assert_uint_lt(a_ckpt, a_plain);
        zero_outcome_free(&plain);
        zero_outcome_free(&ckpt);
    }
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter2");
    TCase *tc = tcase_create("zero");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, shards_are_uneven_in_the_test_model);
    tcase_add_test(tc, every_stage_matches_the_baseline_on_1_to_4_ranks);
    tcase_add_test(tc, negative_controls_fail);
    tcase_add_test(tc, model_state_bytes_match_the_stored_formula);
    tcase_add_test(tc, stage2_and_3_free_whole_slabs_as_they_go);
    tcase_add_test(tc, communication_matches_ring_theory);
    tcase_add_test(tc, estimate_agrees_with_hand_computed_cases);
    tcase_add_test(tc, checkpointing_keeps_results_and_saves_activations);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
