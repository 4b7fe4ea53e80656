/* The mixture-of-experts layer (common/model/moe.h) and expert parallelism
 * as a configuration of the mesh trainer (common/parallel/compose/mesh_train.h).
 *
 * The layer alone: its float backward against central finite differences of a double
 * reference (moe_reference.h) of J = sum(G * out) + aux, for the router, every expert
 * and the input, with top-1 and top-2, with and without dropping; the auxiliary loss,
 * the loads and the dropped pairs against values worked out by hand.
 *
 * A difference is |got - want| / max(1, |want|), as in test_ops; each check prints the
 * largest it saw next to its tolerance.
 *
 * Expert parallelism: the mesh's order; EP 2, EP 4 with dropping, EP 2 x DP 2 with and
 * without dropping and EP 4 x DP 2 on thread ranks against the single-device MoE run
 * (loss, step-1 gradients, final parameters within the chapters' tolerances); every
 * rank's all-to-all bytes equal to the bytes its routing implies, exactly; and two
 * negative controls that must fail: the combine's rows in the wrong order, the experts'
 * gradients reduced over the wrong group. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "compare.h"
#include "mesh_train.h"
#include "moe.h"
#include "moe_reference.h"
#include "rng.h"
#include "strategy_runs.h"

/* ---- the layer against finite differences ------------------------------------------ */

/* float backward vs double finite differences: the reference is exact to ~1e-10 */
#define TOL_MOE_FD 1e-6

typedef struct {
    moe_shape s;
    int N;
    float *routers, *experts, *router_grads, *expert_grads, *x, *out, *d_x;
    double *G;
    moe_layer *layer;
} layer_case;

static void fill_uniform(float *x, size_t n, uint64_t stream, double half_width) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((2 * rng_uniform(77, stream, i) - 1) * half_width);
}

static layer_case layer_case_make(int top_k, double capacity_factor, float aux) {
    layer_case t = {.N = 8};
    const moe_config cfg = {.experts = 4, .top_k = top_k, .every = 1,
                            .capacity_factor = capacity_factor, .aux_coef = aux};
    const gpt_config model = {.vocab = 16, .ctx = 8, .layers = 1, .heads = 1, .dim = 8};
    t.s = moe_shape_make(&cfg, &model, 1, 0);
    const size_t R = moe_router_numel(&t.s), X = moe_local_experts_numel(&t.s);
    const size_t NC = (size_t)t.N * t.s.dim;
    t.routers = calloc(R, sizeof(float));
    t.experts = calloc(X, sizeof(float));
    t.router_grads = calloc(R, sizeof(float));
    t.expert_grads = calloc(X, sizeof(float));
    t.x = calloc(NC, sizeof(float));
    t.out = calloc(NC, sizeof(float));
    t.d_x = calloc(NC, sizeof(float));
    t.G = calloc(NC, sizeof(double));
    fill_uniform(t.routers, R, 1, 1.0);
    fill_uniform(t.experts, X, 2, 0.5);
    fill_uniform(t.x, NC, 3, 1.0);
    for (size_t i = 0; i < NC; i++) t.G[i] = 2 * rng_uniform(77, 4, i) - 1;
    t.layer = moe_layer_create(&t.s, t.N, &(moe_layer_options){0});
    moe_layer_bind(t.layer, t.routers, t.experts, t.router_grads, t.expert_grads);
    return t;
}

static void layer_case_free(layer_case *t) {
    moe_layer_free(t->layer);
    free(t->routers), free(t->experts), free(t->router_grads), free(t->expert_grads);
    free(t->x), free(t->out), free(t->d_x), free(t->G);
}

/* forward, then backward with d out = G and dloss (1 / N: the aux gradient is J's) */
static void layer_step(layer_case *t, float dloss) {
    const gpt_mlp_hook *h = moe_layer_hook(t->layer);
    float *G = malloc((size_t)t->N * t->s.dim * sizeof(float));
    for (int i = 0; i < t->N * t->s.dim; i++) G[i] = (float)t->G[i];
    h->forward(h->ctx, 0, 0, PRECISION_FP32, t->out, t->x);
    moe_layer_set_dloss(t->layer, dloss);
    h->backward(h->ctx, 0, 0, PRECISION_FP32, t->d_x, G);
    free(G);
}

static double *widen(const float *x, size_t n) {
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Largest difference between got [n] and central differences of J over v [n], one of
 * the reference's inputs (x, router or experts). */
static double fd_check(layer_case *t, double *x, double *router, double *experts, double *v,
                       const float *got, size_t n) {
    const double eps = 1e-5;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double keep = v[i];
        v[i] = keep + eps;
        const double up = moe_reference_objective(&t->s, t->N, x, router, experts, t->G);
        v[i] = keep - eps;
        const double down = moe_reference_objective(&t->s, t->N, x, router, experts, t->G);
        v[i] = keep;
        const double want = (up - down) / (2 * eps);
        worst = fmax(worst, fabs(got[i] - want) / fmax(1.0, fabs(want)));
    }
    return worst;
}

static void check_layer_gradients(int top_k, double capacity_factor) {
    layer_case t = layer_case_make(top_k, capacity_factor, 0.5f);
    layer_step(&t, 1.0f / t.N);
    const size_t R = moe_router_numel(&t.s), X = moe_local_experts_numel(&t.s);
    const size_t NC = (size_t)t.N * t.s.dim;
    double *x = widen(t.x, NC), *router = widen(t.routers, R), *experts = widen(t.experts, X);
    const double d_router = fd_check(&t, x, router, experts, router, t.router_grads, R);
    const double d_experts = fd_check(&t, x, router, experts, experts, t.expert_grads, X);
    const double d_input = fd_check(&t, x, router, experts, x, t.d_x, NC);
    printf("moe top-%d capacity %g (dropped %g): max |diff| router %.1e, experts %.1e,"
           " input %.1e (tol %.0e)\n", top_k, capacity_factor, moe_layer_dropped(t.layer, 0),
           d_router, d_experts, d_input, TOL_MOE_FD);
    ck_assert_double_le(d_router, TOL_MOE_FD);
    ck_assert_double_le(d_experts, TOL_MOE_FD);
    ck_assert_double_le(d_input, TOL_MOE_FD);
    if (capacity_factor > 0) ck_assert_double_gt(moe_layer_dropped(t.layer, 0), 0);
    free(x), free(router), free(experts);
    layer_case_free(&t);
}

START_TEST(top1_gradients_match_finite_differences) { check_layer_gradients(1, 0); }
END_TEST
START_TEST(top2_gradients_match_finite_differences) { check_layer_gradients(2, 0); }
END_TEST
START_TEST(top1_with_dropping_matches_finite_differences) { check_layer_gradients(1, 1.0); }
END_TEST
START_TEST(top2_with_dropping_matches_finite_differences) { check_layer_gradients(2, 1.0); }
END_TEST

/* Negative control: the router's gradient without the auxiliary loss's part is wrong
 * by it, so the check above can fail. */
START_TEST(the_check_sees_a_missing_aux_gradient) {
    layer_case t = layer_case_make(1, 0, 0.5f);
    layer_step(&t, 0);
    const size_t R = moe_router_numel(&t.s), X = moe_local_experts_numel(&t.s);
    double *x = widen(t.x, (size_t)t.N * t.s.dim), *router = widen(t.routers, R);
    double *experts = widen(t.experts, X);
    const double d_router = fd_check(&t, x, router, experts, router, t.router_grads, R);
    printf("negative control, aux gradient left out: router max |diff| %.1e (must exceed"
           " %.0e)\n", d_router, TOL_MOE_FD);
    ck_assert_double_gt(d_router, TOL_MOE_FD);
    free(x), free(router), free(experts);
    layer_case_free(&t);
}
END_TEST

/* ---- the auxiliary loss and dropping by hand ----------------------------------------
 * C = 2, E = 2, router = identity, so the logits are the tokens themselves:
 *   token  x            p             first choice
 *   0      (0, 0)       (1/2, 1/2)    0 (a tie: the lower index)
 *   1      (ln 3, 0)    (3/4, 1/4)    0
 *   2      (0, ln 3)    (1/4, 3/4)    1
 *   3      (ln 3, 0)    (3/4, 1/4)    0
 * f = (3/4, 1/4), P = (2.25/4, 1.75/4), aux = a E sum f P = a 2 (27/64 + 7/64) = 1.0625 a.
 * Capacity factor 1: ceil(1 x 4 x 1 / 2) = 2 a expert, so token 3 (expert 0's third)
 * is dropped and its output is zero. */
START_TEST(aux_loss_load_and_dropping_by_hand) {
    const moe_config cfg = {.experts = 2, .top_k = 1, .every = 1, .capacity_factor = 1.0,
                            .aux_coef = 0.01f};
    const gpt_config model = {.vocab = 16, .ctx = 4, .layers = 1, .heads = 1, .dim = 2};
    moe_shape s = moe_shape_make(&cfg, &model, 1, 0);
    const float l3 = logf(3.0f);
    float router[4] = {1, 0, 0, 1}, x[8] = {0, 0, l3, 0, 0, l3, l3, 0}, out[8];
    float *experts = calloc(moe_local_experts_numel(&s), sizeof(float));
    float *grads = calloc(moe_local_experts_numel(&s), sizeof(float)), router_grads[4] = {0};
    for (size_t i = 0; i < moe_local_experts_numel(&s); i++) experts[i] = 0.1f;
    moe_layer *layer = moe_layer_create(&s, 4, &(moe_layer_options){0});
    moe_layer_bind(layer, router, experts, router_grads, grads);
    const gpt_mlp_hook *h = moe_layer_hook(layer);
    h->forward(h->ctx, 0, 0, PRECISION_FP32, out, x);
    const double aux = moe_layer_aux_loss(layer), want = 1.0625 * 0.01;
    const double *load = moe_layer_expert_load(layer, 0);
    printf("aux loss %.9f, by hand %.9f; load (%g, %g); capacity %g, dropped %g\n", aux, want,
           load[0], load[1], moe_layer_capacity(layer), moe_layer_dropped(layer, 0));
    ck_assert_double_le(fabs(aux - want), 1e-8);
    ck_assert(load[0] == 3 && load[1] == 1);
    ck_assert(moe_layer_capacity(layer) == 2 && moe_layer_dropped(layer, 0) == 1);
    ck_assert(out[6] == 0 && out[7] == 0);              /* token 3 dropped */
    ck_assert(out[0] != 0 && out[2] != 0 && out[4] != 0);
    /* parameters, C = 2, L = 1, V = 16, T = 4: the dense model 12 C^2 + 13 C + (V + T +
     * 2) C = 48 + 26 + 44 = 118; an expert H C + H + C H + C = 16 + 8 + 16 + 2 = 42; the
     * MoE 118 - 42 + router 4 + 2 x 42 = 164, and a token uses 1 expert: 122 */
    printf("MoE parameters %g (by hand 164), used a token %g (122)\n",
           moe_total_params(&s, &model), moe_active_params(&s, &model));
    ck_assert(moe_total_params(&s, &model) == 164 && moe_active_params(&s, &model) == 122);
    moe_layer_free(layer);
    free(experts), free(grads);
}
END_TEST

/* ---- expert parallelism against one device ------------------------------------------ */

static run_config ep_config(int ranks) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 2, .dim = 16};
    cfg.batch = 8;
    cfg.steps = TOL_STEPS;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 30;
    return cfg;
}

typedef struct { int ep, dp, top_k; double capacity; int misorder, wrong_group, every; } ep_case;

static double largest_difference(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* Trains the case on an ep x dp mesh and on one rank of the same trainer; returns the
 * worst difference (the dense model's vectors, the routers' and every expert's) as a
 * fraction of its tolerance (1: at the limit), after printing the row. */
static double ep_against_one_device(ep_case c) {
    run_config cfg = ep_config(c.ep * c.dp);
    const moe_config moe = {.experts = 4, .top_k = c.top_k, .every = c.every ? c.every : 1,
                            .capacity_factor = c.capacity, .aux_coef = 0.01f};
    const pipeline_fault fault = c.misorder ? PIPELINE_FAULT_COMBINE_MISORDER
                                 : c.wrong_group ? PIPELINE_FAULT_EXPERT_GRADS_OVER_EP
                                                 : PIPELINE_FAULT_NONE;
    const pipeline_options opts = {.schedule = PP_1F1B, .micro = 1, .chunks = 1, .moe = moe,
                                   .fault = fault};
    const mesh_shape shape = {.tp = 1, .pp = 1, .dp = c.ep * c.dp, .cp = 1, .ep = c.ep};
    dataset *d = dataset_builtin();
    mesh_extra x_one;
    strategy_outcome one = {.extra = &x_one};
    const pipeline_options plain = {.schedule = PP_1F1B, .micro = 1, .chunks = 1, .moe = moe};
    ck_assert_int_eq(mesh_train_one_device(&cfg, d, &plain, &one), 0);
    const baseline_run b = mesh_outcome_as_baseline(&one);
    mesh_result *many = launch_mesh(&cfg, d, shape, opts, &b);
    run_result *r = &many->run.result;
    const size_t n = x_one.moe_num_params;
    r->diff_grads = fmax(r->diff_grads, largest_difference(many->x.moe_first_grads,
                                                           x_one.moe_first_grads, n));
    r->diff_params = fmax(r->diff_params, largest_difference(many->x.moe_final_params,
                                                             x_one.moe_final_params, n));
    double dropped = 0, alltoall = 0, routed = 0;
    const int blocks = moe_shape_make(&moe, &cfg.model, 1, 0).moe_layers;
    for (int i = 0; i < cfg.steps * blocks; i++) dropped += x_one.moe_log.dropped[i];
    for (int w = 0; w < c.ep * c.dp; w++) {
        alltoall = fmax(alltoall, many->x.ranks[w].alltoall);
        routed = fmax(routed, many->x.ranks[w].alltoall_routed);
    }
    printf("ep %d x dp %d, top-%d, MoE every %d, capacity %g (%g pairs dropped in %d steps):"
           " max |diff| loss %.1e grads %.1e params %.1e (tol %.0e %.0e %.0e); all-to-all"
           " %.0f B/step measured, %.0f routed, worst mismatch %.0f\n", c.ep, c.dp, c.top_k,
           moe.every, c.capacity, dropped, cfg.steps, r->diff_loss, r->diff_grads,
           r->diff_params, MESH_TOL_LOSS, MESH_TOL_GRADS, MESH_TOL_PARAMS, alltoall, routed,
           many->x.alltoall_mismatch);
    if (!c.wrong_group)   /* that control's all-reduce runs on the EP group too */
        ck_assert_double_eq(many->x.alltoall_mismatch, 0);
    if (c.ep > 1) ck_assert_double_gt(alltoall, 0);
    if (c.capacity > 0) ck_assert_double_gt(dropped, 0);
    const double worst = mesh_worst_fraction_of_tolerance(r);
    mesh_result_free(many);
    strategy_outcome_free(&one);
    mesh_extra_free(&x_one);
    dataset_free(d);
    return worst;
}

START_TEST(ep2_matches_one_device) {
    ck_assert_double_le(ep_against_one_device((ep_case){.ep = 2, .dp = 1, .top_k = 2}), 1);
}
END_TEST
START_TEST(ep4_with_dropping_matches_one_device) {
    ck_assert_double_le(
        ep_against_one_device((ep_case){.ep = 4, .dp = 1, .top_k = 1, .capacity = 1.0}), 1);
}
END_TEST
START_TEST(ep2_dp2_matches_one_device) {
    ck_assert_double_le(ep_against_one_device((ep_case){.ep = 2, .dp = 2, .top_k = 2}), 1);
}
END_TEST
START_TEST(ep2_dp2_with_dropping_matches_one_device) {
    ck_assert_double_le(
        ep_against_one_device((ep_case){.ep = 2, .dp = 2, .top_k = 2, .capacity = 1.25}), 1);
}
END_TEST
START_TEST(ep4_dp2_matches_one_device) {
    ck_assert_double_le(
        ep_against_one_device((ep_case){.ep = 4, .dp = 2, .top_k = 1, .capacity = 1.0}), 1);
}
END_TEST

START_TEST(ep2_with_every_other_block_moe_matches_one_device) {
    ck_assert_double_le(
        ep_against_one_device((ep_case){.ep = 2, .dp = 1, .top_k = 1, .every = 2}), 1);
}
END_TEST

/* Negative controls: each must miss the tolerance by far. */
START_TEST(rows_combined_in_the_wrong_order_fail) {
    const double worst =
        ep_against_one_device((ep_case){.ep = 2, .dp = 1, .top_k = 2, .misorder = 1});
    printf("negative control, combine in expert order: %.3g x the tolerance\n", worst);
    ck_assert_double_gt(worst, 10);
}
END_TEST
START_TEST(expert_grads_over_the_wrong_group_fail) {
    const double worst =
        ep_against_one_device((ep_case){.ep = 2, .dp = 2, .top_k = 2, .wrong_group = 1});
    printf("negative control, expert gradients over the EP group: %.3g x the tolerance\n",
           worst);
    ck_assert_double_gt(worst, 10);
}
END_TEST

/* ---- the EP x DP mesh: Megatron-LM's order ------------------------------------------ */

/* rank = ep + EP x dp: EP groups are consecutive ranks, expert_dp groups stride EP (the
 * one mesh's expert layout with tp = cp = pp = 1) */
START_TEST(the_mesh_is_in_megatron_order) {
    const mesh_shape m = {.tp = 1, .pp = 1, .dp = 6, .ep = 2};
    for (int rank = 0; rank < 6; rank++) {
        const mesh_coord c = mesh_coord_of(&m, rank);
        ck_assert_int_eq(c.ep, rank % 2);
        ck_assert_int_eq(c.expert_dp, rank / 2);
        ck_assert_int_eq(mesh_rank_of(&m, c), rank);
    }
    char err[256];
    mesh_config c = {.shape = m, .world = 6, .experts = 4};
    ck_assert(mesh_check(&c, err, sizeof err) == NULL);
    c.world = 8;
    ck_assert(mesh_check(&c, err, sizeof err) != NULL);
    printf("ep 2 x dp 3 on 8 ranks: %s\n", err);
    c = (mesh_config){.shape = {.tp = 1, .pp = 1, .dp = 6, .ep = 3}, .world = 6, .experts = 4};
    ck_assert(mesh_check(&c, err, sizeof err) != NULL);
    printf("ep 3 with 4 experts: %s\n", err);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("moe");
    TCase *layer = tcase_create("layer");
    tcase_add_test(layer, top1_gradients_match_finite_differences);
    tcase_add_test(layer, top2_gradients_match_finite_differences);
    tcase_add_test(layer, top1_with_dropping_matches_finite_differences);
    tcase_add_test(layer, top2_with_dropping_matches_finite_differences);
    tcase_add_test(layer, the_check_sees_a_missing_aux_gradient);
    tcase_add_test(layer, aux_loss_load_and_dropping_by_hand);
    tcase_add_test(layer, the_mesh_is_in_megatron_order);
    suite_add_tcase(suite, layer);
    TCase *ep = tcase_create("expert parallelism");
    tcase_set_timeout(ep, 120);
    tcase_add_test(ep, ep2_matches_one_device);
    tcase_add_test(ep, ep4_with_dropping_matches_one_device);
    tcase_add_test(ep, ep2_dp2_matches_one_device);
    tcase_add_test(ep, ep2_dp2_with_dropping_matches_one_device);
    tcase_add_test(ep, ep4_dp2_matches_one_device);
    tcase_add_test(ep, ep2_with_every_other_block_moe_matches_one_device);
    tcase_add_test(ep, rows_combined_in_the_wrong_order_fail);
    tcase_add_test(ep, expert_grads_over_the_wrong_group_fail);
    suite_add_tcase(suite, ep);
    return check_run(suite, 0);
}
