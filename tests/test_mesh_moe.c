/* Expert parallelism as a configuration of the mesh trainer (parallelize.h, moe_params.h):
 * the MoE model (4 experts, top-2, MoE in every other block) on EP 2, EP 2 x DP 2 (ZeRO 0
 * and 1), EP 2 on 2 shards x 2 replicas (HSDP at ZeRO 3) and TP 2 x EP 2 in fp32 and
 * bf16; EP 2 in CP 2 x DP 2 and in PP 2 x DP 2 (MoE in every block) in fp32 (ZeRO 0 and
 * 1), bf16 and bf16 with bf16 gradients; each against the single-device MoE run in the
 * same precision (the same trainer on one rank: every group of one, nothing exchanged,
 * chapter 10's baseline): loss, step-1 gradients and parameters (the dense model's, and
 * the routers and every expert gathered over the EP group and the stages) within
 * mesh_run_tolerances, every rank's bytes per group and model state equal to their
 * formulas, and its all-to-all bytes equal to what its routing sent; with capacity too
 * (the same pairs dropped). ZeRO 1-3 shard the routers and experts too (EP 2 x DP 2 at
 * zero 2 and 3 in fp32, bf16, bf16 with bf16 gradients; HSDP at zero 2). Negative
 * controls, the experts' gradients summed over the EP group instead of expert_dp (on
 * EP x DP, EP x CP and EP x PP) and ZeRO-1's updated MoE pieces left ungathered, must
 * fail; combinations not trained yet are refused by parallelize_check with a reason.
 * Micro-batches (4, under 1F1B and GPipe, EP x PP x DP in fp32 and bf16, with capacity
 * too) against one device accumulating the same micro-batches; control: against the
 * whole batch at once. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "compare.h"
#include "parallelize.h"
#include "strategy_runs.h"

/* capacity 0 (no dropping), but in capacity_drops_the_same_pairs */
static moe_config moe = {.experts = 4, .top_k = 2, .every = 2, .aux_coef = 0.01f};

static precision grad_dtype = PRECISION_FP32;   /* --grad-dtype: fp32, or bf16 with bf16 */
static int micro = 1;                            /* micro-batches a step, the mesh's and */
static pp_schedule_kind schedule = PP_1F1B;      /* ... the one device's alike */
static int sp = 0;                               /* --sp on the mesh (none on one device) */
static int layers = 2;                           /* 4 for the interleaved schedule */
static int steps = TOL_STEPS;                    /* more in long_16_bit_runs_... */
static double loss_bound = 0;                    /* mixed_loss_tolerance's, where set */
static double last_loss_fraction;                /* run_case's loss against its bound */

static run_config tiny(int ranks, precision p) {
    run_config cfg = run_config_default();
    cfg.grad_precision = p == PRECISION_FP32 ? PRECISION_FP32 : grad_dtype;
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = layers, .heads = 4, .dim = 32};
    cfg.batch = 8;
    cfg.steps = steps;
    cfg.quiet = 1;
    cfg.precision = p;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

static pipeline_options options(int zero, pipeline_fault fault) {
    return (pipeline_options){.schedule = schedule, .micro = micro,
                              .chunks = pp_schedule_chunks(schedule, 2),
                              .zero_stage = zero, .moe = moe, .fault = fault,
                              .sequence_parallel = sp};
}

/* The one-rank MoE run, as the baseline the meshes are compared with. */
typedef struct {
    mesh_result *run;
    baseline_run b;
} one_device;

static one_device one_device_run(const dataset *d, precision p) {
    const run_config cfg = tiny(1, p);
    const mesh_shape one = {.tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1};
    pipeline_options o1 = options(0, PIPELINE_FAULT_NONE);
    o1.sequence_parallel = 0;
    o1.schedule = PP_1F1B;   /* one stage: the micro-batches in order */
    o1.chunks = 1;
    one_device o = {.run = launch_mesh(&cfg, d, one, o1, NULL)};
    const strategy_outcome *r = &o.run->run;
    o.b = (baseline_run){.result = r->result, .loss = r->loss, .first_grads = r->first_grads,
                         .final_params = r->final_params, .num_params = r->num_params};
    return o;
}

/* The mesh against the baseline: returns the fraction of the bounds it reaches, after
 * checking its bytes and state (exact) and its all-to-alls against its routing. */
/* max |a - b| over n */
static double largest_difference(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

static double run_case(const dataset *d, const one_device *one, precision p, mesh_shape s,
                       int zero, pipeline_fault fault, const char *what) {
    char label[80];
    snprintf(label, sizeof label, "%s%s", what,
             p != PRECISION_FP32 && grad_dtype != PRECISION_FP32 ? " (16-bit grads)" : "");
    what = label;
    const baseline_run *b = &one->b;
    const run_config cfg = tiny(mesh_world(&s), p);
    const pipeline_options o = options(zero, fault);
    char why[300];
    ck_assert_msg(!parallelize_check(&cfg, &s, mesh_world(&s), &(parallel_options){
                      .zero = zero, .micro = micro, .moe = moe, .sequence_parallel = sp},
                      why, sizeof why), "%s", why);
    mesh_result *r = launch_mesh(&cfg, d, s, o, b);
    run_tolerances t = mesh_run_tolerances(&cfg, s, &o.moe, b);
    t.loss = fmax(t.loss, loss_bound);
    last_loss_fraction = r->run.result.diff_loss / t.loss;
    /* the routers and every expert: step 1's gradients and the final parameters */
    const size_t n = one->run->x.moe_num_params;
    ck_assert(n > 0 && r->x.moe_num_params == n);
    const double moe_grads = largest_difference(r->x.moe_first_grads, one->run->x.moe_first_grads, n);
    const double moe_params = largest_difference(r->x.moe_final_params,
                                                 one->run->x.moe_final_params, n);
    const double worst = fmax(run_worst_fraction_of(&r->run.result, t),
                              fmax(moe_grads / t.grads, moe_params / t.params));
    double alltoall = 0, mismatch = 0;
    for (int w = 0; w < mesh_world(&s); w++) {
        alltoall = fmax(alltoall, r->x.ranks[w].alltoall);
        mismatch = fmax(mismatch, fabs(r->x.ranks[w].alltoall - r->x.ranks[w].alltoall_routed));
    }
    printf("  %-34s %s: grads %.2e params %.2e loss %.2e, routers and experts: grads %.2e"
           " params %.2e: %5.0f%% of the bounds; all-to-all %.0f B a step, %.0f off the"
           " routing's\n", what, precision_name(p), r->run.result.diff_grads,
           r->run.result.diff_params, r->run.result.diff_loss, moe_grads, moe_params,
           100 * worst, alltoall, mismatch);
    if (fault == PIPELINE_FAULT_NONE) {
        check_mesh_formulas(r, s, 0.0);
        ck_assert_double_eq(mismatch, 0);
        ck_assert(mesh_ep_size(&s) == 1 || alltoall > 0);
        for (int w = 0; w < mesh_world(&s); w++)   /* the experts' sums are measured */
            ck_assert(mesh_expert_dp_size(&s) == 1 || r->x.ranks[w].bytes[PIPELINE_EXPERT_DP] > 0);
    }
    mesh_result_free(r);
    return worst;
}

static const mesh_shape ep2 = {.tp = 1, .pp = 1, .dp = 2, .cp = 1, .ep = 2};
static const mesh_shape ep2_dp2 = {.tp = 1, .pp = 1, .dp = 4, .cp = 1, .ep = 2};
static const mesh_shape ep2_hsdp = {.tp = 1, .pp = 1, .dp = 4, .cp = 1, .ep = 2, .dp_shard = 2};
static const mesh_shape tp2_ep2 = {.tp = 2, .pp = 1, .dp = 2, .cp = 1, .ep = 2};

START_TEST(ep_on_the_mesh_matches_one_device) {
    dataset *d = dataset_builtin();
    const precision ps[2] = {PRECISION_FP32, PRECISION_BF16};
    for (int k = 0; k < 2; k++) {
        one_device one = one_device_run(d, ps[k]);
        ck_assert(run_case(d, &one, ps[k], ep2, 0, 0, "ep 2:") <= 1.0);
        ck_assert(run_case(d, &one, ps[k], ep2_dp2, 0, 0, "ep 2 x dp 2:") <= 1.0);
        ck_assert(run_case(d, &one, ps[k], ep2_dp2, 1, 0, "ep 2 x dp 2, zero 1:") <= 1.0);
        ck_assert(run_case(d, &one, ps[k], ep2_hsdp, 3, 0, "ep 2 x dp 2 x 2 (HSDP, zero 3):") <= 1.0);
        ck_assert(run_case(d, &one, ps[k], tp2_ep2, 0, 0, "tp 2 x ep 2:") <= 1.0);
        mesh_result_free(one.run);
    }
    dataset_free(d);
}
END_TEST

/* With capacity (chapter 11's default 1.25, and 1.0) each expert keeps the first pairs of
 * the global batch in token order: the same pairs drop on the mesh as on one device. */
START_TEST(capacity_drops_the_same_pairs) {
    dataset *d = dataset_builtin();
    const double factors[2] = {1.25, 1.0};
    for (int i = 0; i < 2; i++) {
        moe.capacity_factor = factors[i];
        printf("capacity factor %.2f:\n", factors[i]);
        one_device one = one_device_run(d, PRECISION_FP32);
        ck_assert(run_case(d, &one, PRECISION_FP32, ep2_dp2, 0, 0, "ep 2 x dp 2:") <= 1.0);
        ck_assert(run_case(d, &one, PRECISION_FP32, tp2_ep2, 0, 0, "tp 2 x ep 2:") <= 1.0);
        mesh_result_free(one.run);
    }
    moe.capacity_factor = 0;
    dataset_free(d);
}
END_TEST

static void control_fails(dataset *d, const one_device *one, int zero, pipeline_fault fault,
                          const char *what) {
    const double worst = run_case(d, one, PRECISION_FP32, ep2_dp2, zero, fault, what);
    ck_assert_msg(worst > 1.0, "%s passed: %.2f of the bounds", what, worst);
}

/* Negative controls: each EP rank's experts summed with the other EP rank's (different
 * experts) instead of with their own copies on the other dp group, at ZeRO 0 and
 * sharded and reduce-scattered so at ZeRO 2; at ZeRO 1 each rank's updated router and
 * expert pieces left apart (no all-gather after AdamW: the others' pieces go stale). */
START_TEST(expert_grads_over_the_wrong_group_fail) {
    dataset *d = dataset_builtin();
    one_device one = one_device_run(d, PRECISION_FP32);
    control_fails(d, &one, 0, PIPELINE_FAULT_EXPERT_GRADS_OVER_EP, "control, experts over ep:");
    control_fails(d, &one, 2, PIPELINE_FAULT_EXPERT_GRADS_OVER_EP,
                  "control, experts sharded over ep:");
    control_fails(d, &one, 1, PIPELINE_FAULT_MOE_SKIP_PARAM_GATHER,
                  "control, pieces not gathered:");
    mesh_result_free(one.run);
    dataset_free(d);
}
END_TEST

/* ZeRO 1-3 on the MoE part (moe_params.h): the routers sharded over the dense
 * gradients' group, the experts over expert_dp (EP 2 x DP 2: two ranks each), their
 * gradients reduce-scattered, stage 3 gathering them at the step's start; fp32, bf16 and
 * bf16 with bf16 gradients, HSDP too, each rank's state and bytes (expert_dp's
 * included) equal to their formulas (run_case). The rule for one vector by hand: 10
 * floats on 4 ranks, rank 3's comm_shard piece is 2 of them. */
START_TEST(zero_shards_routers_and_experts) {
    const double whole[3] = {40, 40, 80};
    const double at[4][3] = {{40, 40, 80}, {40, 40, 16}, {40, 8, 16}, {8, 8, 16}};
    for (int zero = 0; zero <= 3; zero++) {
        double b[3] = {0, 0, 0}, alone[3] = {0, 0, 0};
        moe_vector_state_bytes(10, zero, 4, 3, b);
        moe_vector_state_bytes(10, zero, 1, 0, alone);   /* one rank: nothing to shard */
        for (int i = 0; i < 3; i++) {
            ck_assert_double_eq(b[i], at[zero][i]);
            ck_assert_double_eq(alone[i], whole[i]);
        }
    }
    dataset *d = dataset_builtin();
    const precision ps[3] = {PRECISION_FP32, PRECISION_BF16, PRECISION_BF16};
    for (int k = 0; k < 3; k++) {
        grad_dtype = k == 2 ? PRECISION_BF16 : PRECISION_FP32;
        one_device one = one_device_run(d, ps[k]);
        ck_assert(run_case(d, &one, ps[k], ep2_dp2, 2, 0, "ep 2 x dp 2, zero 2:") <= 1.0);
        ck_assert(run_case(d, &one, ps[k], ep2_dp2, 3, 0, "ep 2 x dp 2, zero 3:") <= 1.0);
        if (k == 0)
            ck_assert(run_case(d, &one, ps[k], ep2_hsdp, 2, 0, "ep 2 x dp 2 x 2 (HSDP, zero 2):")
                      <= 1.0);
        mesh_result_free(one.run);
    }
    grad_dtype = PRECISION_FP32;
    dataset_free(d);
}
END_TEST

/* EP x CP (expert ranks carved from dp x cp, Megatron-core's layout: here each EP group
 * is a CP pair, expert_dp across the dp groups) and EP x PP (every stage's MoE blocks on
 * its own EP group, one micro-batch in flight), in fp32, bf16 and bf16 with bf16
 * gradients; the PP model has MoE in every block, so that each stage holds some. */
static const mesh_shape cp2_dp2_ep2 = {.tp = 1, .pp = 1, .dp = 2, .cp = 2, .ep = 2};
static const mesh_shape pp2_dp2_ep2 = {.tp = 1, .pp = 2, .dp = 2, .cp = 1, .ep = 2};

static void ep_with(mesh_shape s, int every, const char *what) {
    dataset *d = dataset_builtin();
    moe.every = every;
    const precision ps[3] = {PRECISION_FP32, PRECISION_BF16, PRECISION_BF16};
    for (int k = 0; k < 3; k++) {
        grad_dtype = k == 2 ? PRECISION_BF16 : PRECISION_FP32;
        one_device one = one_device_run(d, ps[k]);
        ck_assert(run_case(d, &one, ps[k], s, 0, 0, what) <= 1.0);
        if (k == 0) {   /* ZeRO-1 over the dense gradients' shards too */
            ck_assert(run_case(d, &one, ps[k], s, 1, 0, "  zero 1:") <= 1.0);
            const double worst = run_case(d, &one, ps[k], s, 0,
                                          PIPELINE_FAULT_EXPERT_GRADS_OVER_EP,
                                          "  control, experts over ep:");
            ck_assert_msg(worst > 1.0, "the control passed: %.2f of the bounds", worst);
        }
        mesh_result_free(one.run);
    }
    grad_dtype = PRECISION_FP32;
    moe.every = 2;
    dataset_free(d);
}

START_TEST(ep_with_cp_matches_one_device) { ep_with(cp2_dp2_ep2, 2, "cp 2 x dp 2, ep 2:"); }
END_TEST
START_TEST(ep_with_pp_matches_one_device) { ep_with(pp2_dp2_ep2, 1, "pp 2 x dp 2, ep 2:"); }
END_TEST

/* Micro-batches (gradient accumulation) as Megatron-core: each global micro-batch (the
 * dp ranks' micro-batches of one index) routed, capped and balanced by itself, the aux
 * loss their mean (moe.h); the reference one device accumulating the same 4
 * micro-batches. EP 2 x PP 2 x DP 2 (MoE in every block) under 1F1B and GPipe (2 and 4
 * micro-batches in flight on stage 0: the layer's slots) in fp32 and bf16, interleaved
 * (4 blocks, 2 chunks a rank) in fp32; EP 2 x CP 2
 * in fp32; EP 2 (dp 2) with capacity 1.0 (the same pairs dropped in each micro-batch). Negative control: the
 * mesh's 4 micro-batches against the whole batch at once on one device (one routing
 * and aux loss for the 8 sequences) must fail. The exact equivalence held on one
 * device: with no aux loss and no capacity, 4 micro-batches accumulated equal the
 * whole batch. */
static void micro_batches_case(dataset *d, precision p, mesh_shape s, const char *what) {
    one_device one = one_device_run(d, p);
    ck_assert(run_case(d, &one, p, s, 0, 0, what) <= 1.0);
    mesh_result_free(one.run);
}

START_TEST(ep_with_pp_and_micro_batches_matches_one_device) {
    dataset *d = dataset_builtin();
    const precision ps[2] = {PRECISION_FP32, PRECISION_BF16};
    const pp_schedule_kind kinds[2] = {PP_1F1B, PP_GPIPE};
    moe.every = 1;
    micro = 4;
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < 2; k++) {
            schedule = kinds[j];
            char what[80];
            snprintf(what, sizeof what, "pp 2 x dp 2, ep 2, %s x 4:", pp_schedule_name(kinds[j]));
            micro_batches_case(d, ps[k], pp2_dp2_ep2, what);
        }
    schedule = PP_INTERLEAVED;   /* 2 chunks a rank: 4 blocks */
    layers = 4;
    micro_batches_case(d, PRECISION_FP32, pp2_dp2_ep2, "pp 2 x dp 2, ep 2, interleaved x 4:");
    layers = 2;
    schedule = PP_1F1B;   /* EP x CP: CP's bytes once a micro-batch too */
    micro_batches_case(d, PRECISION_FP32, cp2_dp2_ep2, "cp 2 x dp 2, ep 2, 1f1b x 4:");
    moe.capacity_factor = 1.0;
    micro_batches_case(d, PRECISION_FP32, ep2, "ep 2, 1f1b x 4, capacity 1:");
    moe.capacity_factor = 0;
    micro = 1;   /* the control: one device routes the whole batch at once */
    one_device whole = one_device_run(d, PRECISION_FP32);
    micro = 4;
    const double worst = run_case(d, &whole, PRECISION_FP32, pp2_dp2_ep2, 0,
                                  PIPELINE_FAULT_NONE, "control, against the whole batch:");
    ck_assert_msg(worst > 1.0, "the control passed: %.2f of the bounds", worst);
    mesh_result_free(whole.run);
    micro = 1;
    moe.every = 2;
    dataset_free(d);
}
END_TEST

/* Past TOL_STEPS steps in 16 bits the loss is held within twice the one-device bf16
 * run's largest distance from its fp32 twin (mixed_loss_tolerance): 15 steps of EP 2 x
 * PP 2 x DP 2 with 4 micro-batches under 1F1B, MoE in every block (chapter 11's MoE
 * mesh, where a flipped top-k choice moves a token to another expert). Control: the last
 * stage sending zeros as its d(input), so that stage 0 never learns, must fail the loss
 * bound itself. (ZeRO-1's MoE pieces left ungathered stay within it here: over 15 steps
 * a stale piece is at most the AdamW drift that 16 bits allow; fp32 catches it.) */
START_TEST(long_16_bit_runs_within_twice_the_fp32_distance) {
    /* the rule by hand: twice the largest distance, never under MIXED_TOL_LOSS; NaN: that */
    const float l16[3] = {5.0f, 4.5f, 4.0f}, l32[3] = {5.0f, 4.503f, 3.999f};
    const float close[3] = {5.0f, 4.5001f, 4.0f}, nan32[3] = {5.0f, NAN, 4.0f};
    ck_assert_double_eq_tol(mixed_loss_tolerance(l16, l32, 3), 2 * (4.503f - 4.5f), 1e-9);
    ck_assert_double_eq(mixed_loss_tolerance(l16, close, 3), MIXED_TOL_LOSS);
    ck_assert_double_eq(mixed_loss_tolerance(l16, nan32, 3), MIXED_TOL_LOSS);
    dataset *d = dataset_builtin();
    steps = 3 * TOL_STEPS;
    moe.every = 1;
    micro = 4;
    one_device b16 = one_device_run(d, PRECISION_BF16), b32 = one_device_run(d, PRECISION_FP32);
    loss_bound = mixed_loss_tolerance(b16.b.loss, b32.b.loss, steps);
    printf("%d steps in bf16: the loss bound %.2e (one device's bf16 from fp32: %.2e)\n",
           steps, loss_bound, largest_difference(b16.b.loss, b32.b.loss, (size_t)steps));
    ck_assert(loss_bound >= MIXED_TOL_LOSS);
    ck_assert(run_case(d, &b16, PRECISION_BF16, pp2_dp2_ep2, 0, 0, "pp 2 x dp 2, ep 2, 1f1b x 4:")
              <= 1.0);
    run_case(d, &b16, PRECISION_BF16, pp2_dp2_ep2, 0, PIPELINE_FAULT_DROP_INPUT_GRAD,
             "control, stage 0 gets no gradient:");
    ck_assert_msg(last_loss_fraction > 1.0, "the control's loss passed: %.2f of its bound",
                  last_loss_fraction);
    loss_bound = 0;
    micro = 1;
    moe.every = 2;
    steps = TOL_STEPS;
    mesh_result_free(b16.run);
    mesh_result_free(b32.run);
    dataset_free(d);
}
END_TEST

/* One device: without the aux loss and capacity the routing is per token, so 4
 * micro-batches accumulated equal the whole batch at once (within the bounds of a
 * sum in another order). */
START_TEST(one_device_accumulation_equals_the_whole_batch) {
    dataset *d = dataset_builtin();
    const mesh_shape alone = {.tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1};
    moe.aux_coef = 0;
    const precision ps[2] = {PRECISION_FP32, PRECISION_BF16};
    for (int k = 0; k < 2; k++) {
        one_device whole = one_device_run(d, ps[k]);
        micro = 4;
        ck_assert(run_case(d, &whole, ps[k], alone, 0, 0, "one device x 4, no aux loss:") <= 1.0);
        micro = 1;
        mesh_result_free(whole.run);
    }
    moe.aux_coef = 0.01f;
    dataset_free(d);
}
END_TEST

/* TP + SP with MoE blocks: the TP group's rows all-gathered before the layer and each
 * rank's positions taken after it (model.h), so every TP rank routes the whole rows as
 * without SP; TP 2 x EP 2 (dp 2) in fp32 and bf16, TP 2 x PP 2 x EP 2 with 4
 * micro-batches under 1F1B in fp32; the tp group's bytes equal their formula
 * (pipeline_bytes_formula: an MoE block's two all-gathers). Negative control: the
 * layer's whole output summed over TP (reduce-scattered) instead of sliced. */
static const mesh_shape tp2_pp2_ep2 = {.tp = 2, .pp = 2, .dp = 2, .cp = 1, .ep = 2};

START_TEST(ep_with_sp_matches_one_device) {
    dataset *d = dataset_builtin();
    sp = 1;
    micro_batches_case(d, PRECISION_FP32, tp2_ep2, "tp 2 + sp x ep 2:");
    micro_batches_case(d, PRECISION_BF16, tp2_ep2, "tp 2 + sp x ep 2:");
    moe.every = 1;
    micro = 4;
    micro_batches_case(d, PRECISION_FP32, tp2_pp2_ep2, "tp 2 + sp x pp 2 x ep 2, 1f1b x 4:");
    micro = 1;
    moe.every = 2;
    one_device one = one_device_run(d, PRECISION_FP32);
    const double worst = run_case(d, &one, PRECISION_FP32, tp2_ep2, 0,
                                  PIPELINE_FAULT_SP_MOE_SUMMED, "control, output summed over tp:");
    ck_assert_msg(worst > 1.0, "the control passed: %.2f of the bounds", worst);
    mesh_result_free(one.run);
    sp = 0;
    dataset_free(d);
}
END_TEST

/* What the mesh does not train with MoE yet, refused with its reason (first words):
 * dropping with CP, a split backward (zero-bubble, DualPipe). */
START_TEST(unsupported_combinations_are_refused) {
    static const struct {
        mesh_shape s;
        int micro, sp, experts;
        double capacity;
        const char *words;
    } cases[] = {
        {{.tp = 1, .pp = 1, .dp = 2, .cp = 1, .ep = 2}, 1, 0, 0, 0, "--ep 2 needs MoE blocks"},
        {{.tp = 1, .pp = 1, .dp = 1, .cp = 2, .ep = 2}, 1, 0, 4, 1.25,
         "--experts with --cp 2 and capacity factor 1.25"},
        {{.tp = 1, .pp = 1, .dp = 4, .cp = 1, .ep = 4}, 1, 0, 2, 0,
         "EP 4 does not divide --experts 2"}};
    const run_config four = tiny(4, PRECISION_FP32);   /* a split backward */
    char split_why[300];
    const char *split = parallelize_check(&four, &ep2_dp2, 4, &(parallel_options){
        .micro = 2, .moe = moe, .split_backward = 1}, split_why, sizeof split_why);
    ck_assert(split && strstr(split, "--experts with a schedule that splits the backward"));
    printf("refused: %s\n", split);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const run_config cfg = tiny(mesh_world(&cases[i].s), PRECISION_FP32);
        parallel_options o = {.micro = cases[i].micro, .sequence_parallel = cases[i].sp,
                              .moe = moe};
        o.moe.experts = cases[i].experts;
        o.moe.capacity_factor = cases[i].capacity;
        char why[300];
        const char *said = parallelize_check(&cfg, &cases[i].s, mesh_world(&cases[i].s), &o,
                                             why, sizeof why);
        ck_assert_msg(said != NULL, "case %zu trained", i);
        printf("refused: %s\n", said);
        ck_assert_msg(strstr(said, cases[i].words) != NULL, "case %zu: %s", i, said);
    }
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Suite *s = suite_create("mesh moe");
    TCase *t = tcase_create("ep on the mesh");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, ep_on_the_mesh_matches_one_device);
    tcase_add_test(t, capacity_drops_the_same_pairs);
    tcase_add_test(t, expert_grads_over_the_wrong_group_fail);
    tcase_add_test(t, zero_shards_routers_and_experts);
    tcase_add_test(t, unsupported_combinations_are_refused);
    tcase_add_test(t, ep_with_cp_matches_one_device);
    tcase_add_test(t, ep_with_pp_matches_one_device);
    tcase_add_test(t, ep_with_pp_and_micro_batches_matches_one_device);
    tcase_add_test(t, one_device_accumulation_equals_the_whole_batch);
    tcase_add_test(t, ep_with_sp_matches_one_device);
    tcase_add_test(t, long_16_bit_runs_within_twice_the_fp32_distance);
    suite_add_tcase(s, t);
    return check_run(s, 0);
}
