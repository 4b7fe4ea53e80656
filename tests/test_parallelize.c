/* parallelize (parallelize.h) on 4 ranks against the single-device baseline in the same
 * precision: HSDP (dp_shard 2 x dp_replicate 2, ZeRO-3: reduce-scattered within the
 * shard group, each piece all-reduced across the replicas) and CP 2 x DP 2 at ZeRO 1
 * and 3 (dense gradients summed over dp x cp, ZeRO's shards over dp_shard x cp), in
 * fp32 and bf16 (bf16 gradients too) where the model computes them: loss, step-1
 * gradients and parameters within tolerances.h's bounds, every rank's bytes on every
 * group equal to pipeline_bytes_formula to the byte and its model state to
 * dp_grads_state_bytes'. Negative controls, one a dimension: the replicas' all-reduce
 * left out (HSDP), the dense gradients summed over dp without cp (CP), no dp reduction
 * (the shard group): each fails the comparison. A combination the model refuses (CP in
 * bf16 so far) is refused by parallelize_check with the model's reason. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "compare.h"
#include "parallelize.h"
#include "strategy_runs.h"
#include "tolerances.h"

static run_config tiny_config(int ranks, precision p, int grads16) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 4, .dim = 32};
    cfg.batch = 8;
    cfg.steps = TOL_STEPS;
    cfg.quiet = 1;
    cfg.precision = p;
    if (grads16) cfg.grad_precision = p;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

static pipeline_options one_stage(int zero) {
    return (pipeline_options){.schedule = PP_1F1B, .micro = 1, .chunks = 1, .zero_stage = zero,
                              .cp = {.kind = CP_RING, .split = CP_BALANCED}};
}

/* The run against its baseline: the largest difference over its tolerance (1 = at it). */
static double run_against(const run_config *cfg, const dataset *d, mesh_shape shape,
                          pipeline_options opts, const baseline_run *b, const char *what,
                          int check_formulas) {
    char why[256];
    const parallel_options po = pipeline_parallel_options(&opts);
    ck_assert_msg(!parallelize_check(cfg, &shape, cfg->comm.ranks, &po, why, sizeof why),
                  "%s: %s", what, why);
    mesh_result *o = launch_mesh(cfg, d, shape, opts, b);
    const run_result *r = &o->run.result;
    const run_tolerances t = tolerances_with_grads16(
        tolerances_for(cfg), cfg, shape.dp * mesh_cp_size(&shape), baseline_largest_grad(b));
    const double worst = run_worst_fraction_of(r, t);
    printf("%-44s loss %.2e grads %.2e params %.2e (%.0f%% of the bounds); bytes vs formula"
           " %.1e\n", what, r->diff_loss, r->diff_grads, r->diff_params, 100 * worst,
           o->x.worst_bytes_error);
    if (check_formulas) check_mesh_formulas(o, shape, 0.0);
    mesh_result_free(o);
    return worst;
}

static const mesh_shape hsdp = {.tp = 1, .pp = 1, .dp = 4, .cp = 1, .dp_shard = 2};
static const mesh_shape cp_dp = {.tp = 1, .pp = 1, .dp = 2, .cp = 2};

START_TEST(hsdp_matches_the_baseline) {
    dataset *d = dataset_builtin();
    for (int k = 0; k < 3; k++) {
        const precision p = k == 0 ? PRECISION_FP32 : PRECISION_BF16;
        run_config cfg = tiny_config(4, p, k == 2);
        run_config one = cfg;
        one.comm.ranks = 1;
        baseline_run *b = baseline_train(&one, d);
        char what[80];
        snprintf(what, sizeof what, "HSDP 2 x 2 ZeRO-3 %s%s:", precision_name(p),
                 k == 2 ? " grads" : "");
        ck_assert(run_against(&cfg, d, hsdp, one_stage(3), b, what, 1) <= 1.0);
        if (k == 0) {   /* the replicas' sums left out */
            pipeline_options bad = one_stage(3);
            bad.fault = PIPELINE_FAULT_SKIP_REPLICATE_REDUCE;
            const double f = run_against(&cfg, d, hsdp, bad, b, "  control, no replica all-reduce:", 0);
            ck_assert_msg(f > 1.0, "without the replicas' all-reduce: %.2f of the bounds", f);
        }
        baseline_free(b);
    }
    dataset_free(d);
}
END_TEST

START_TEST(cp_dp_zero_matches_the_baseline) {
    dataset *d = dataset_builtin();
    run_config cfg = tiny_config(4, PRECISION_FP32, 0);
    run_config one = cfg;
    one.comm.ranks = 1;
    baseline_run *b = baseline_train(&one, d);
    for (int zero = 0; zero <= 3; zero += zero == 0 ? 1 : 2) {
        char what[80];
        snprintf(what, sizeof what, "CP 2 x DP 2 ring balanced ZeRO-%d fp32:", zero);
        ck_assert(run_against(&cfg, d, cp_dp, one_stage(zero), b, what, 1) <= 1.0);
    }
    pipeline_options bad = one_stage(1);
    bad.fault = PIPELINE_FAULT_GRADS_OVER_DP_ONLY;
    double f = run_against(&cfg, d, cp_dp, bad, b, "  control, gradients over dp alone:", 0);
    ck_assert_msg(f > 1.0, "gradients over dp alone: %.2f of the bounds", f);
    bad.fault = PIPELINE_FAULT_SKIP_DP_REDUCE;
    f = run_against(&cfg, d, cp_dp, bad, b, "  control, no dp x cp reduction:", 0);
    ck_assert_msg(f > 1.0, "no dp x cp reduction: %.2f of the bounds", f);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* What the model computes now passes the check (CP in 16 bits, CP with micro-batches in
 * flight); what the mesh does not train yet is refused before any rank starts, with its
 * reason. */
START_TEST(refusals_carry_the_reason) {
    char why[256];
    const run_config bf16 = tiny_config(4, PRECISION_BF16, 0);
    const parallel_options o = pipeline_parallel_options(&(pipeline_options){
        .micro = 1, .zero_stage = 1, .cp = {.kind = CP_RING}});
    const char *got = parallelize_check(&bf16, &cp_dp, 4, &o, why, sizeof why);
    printf("cp 2 x dp 2 in bf16: %s\n", got ? got : "trains");
    ck_assert_ptr_null(got);
    const run_config fp32 = tiny_config(4, PRECISION_FP32, 0);
    ck_assert_ptr_null(parallelize_check(&fp32, &cp_dp, 4, &o, why, sizeof why));
    ck_assert_ptr_null(parallelize_check(&bf16, &hsdp, 4, &o, why, sizeof why));
    /* CP with stages: a saved state per micro-batch in flight */
    const mesh_shape cp_pp = {.tp = 1, .pp = 2, .dp = 1, .cp = 2};
    parallel_options two = o;
    two.micro = 2;
    got = parallelize_check(&fp32, &cp_pp, 4, &two, why, sizeof why);
    printf("cp 2 x pp 2, 2 micro-batches: %s\n", got ? got : "trains");
    ck_assert_ptr_null(got);
    const mesh_shape ep = {.tp = 1, .pp = 1, .dp = 4, .cp = 1, .ep = 2};
    got = parallelize_check(&fp32, &ep, 4, &o, why, sizeof why);
    printf("ep 2 x dp 4: %s\n", got ? got : "trains");
    ck_assert_ptr_nonnull(got);
}
END_TEST

static Suite *parallelize_suite(void) {
    Suite *s = suite_create("parallelize");
    TCase *t = tcase_create("meshes");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, hsdp_matches_the_baseline);
    tcase_add_test(t, cp_dp_zero_matches_the_baseline);
    tcase_add_test(t, refusals_carry_the_reason);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return check_run(parallelize_suite(), 0); }
