/* Chapter 6's HSDP (plan_mesh.dp_shard): ZeRO-3 inside a shard group of dp_shard ranks,
 * replicated across dp / dp_shard groups. The model states per GPU and the seconds of
 * the data-parallel messages against a case computed by hand here, exact to 1e-12
 * relative (sums of a few doubles), the largest difference printed; then the decision
 * tree and the mesh search choosing it where it fits and is faster. A negative control:
 * the replicas' all-reduce put on the shard group's link (NVLink instead of
 * InfiniBand) is off by far more than the tolerance. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "by_hand.h"
#include "check_run.h"
#include "planner.h"
#include "plan_time.h"

/* l 2, h 64, a 4, V 100, s 16 (test_chapter6's hand case) on 16 GPUs, 8 a node:
 * dp 16 as 2 replicas of a shard group of 8 (one node each), b 1, B 4: 4 / 16 does not
 * divide, so B 16, one micro-batch. */
static const plan_model small = {.layers = 2, .hidden = 64, .heads = 4, .vocab = 100, .seq = 16};

static plan_mesh hsdp_mesh(int dp_shard) {
    return (plan_mesh){.tp = 1, .pp = 1, .dp = 16, .dp_shard = dp_shard, .zero_stage = 3,
                       .micro_batch = 1, .global_batch = 16, .recompute = RECOMPUTE_NONE};
}

static const plan_cluster two_nodes = {.gpus = 16, .gpus_per_node = 8,
                                       .between_nodes = LINK_IB, .flops_per_gpu = 1e12};

START_TEST(states_by_hand) {
    worst = 0;
    const plan_mesh hsdp = hsdp_mesh(8), fsdp = hsdp_mesh(0);
    ck_assert_int_eq(plan_dp_shard_size(&hsdp), 8);
    ck_assert_int_eq(plan_dp_replicas(&hsdp), 2);
    ck_assert_int_eq(plan_dp_shard_size(&fsdp), 16);
    ck_assert_int_eq(plan_dp_replicas(&fsdp), 1);
    /* P on a GPU: 2 layers of 12 h^2 + 13 h, embedding V h, positions s h */
    const double h = 64, layer = 12 * h * h + 13 * h, P = 2 * layer + 100 * h + 16 * h;
    /* bf16 2 + 2 + 12 sharded 8 ways, plus one layer's gathered weights and gradients */
    const plan_bytes b = plan_model_states(&small, &hsdp, PLAN_MIXED_ADAM);
    EXACT(b.params, 2 * P / 8 + 2 * layer);
    EXACT(b.grads, 2 * P / 8 + 2 * layer);
    EXACT(b.optimizer, 12 * P / 8);
    /* FSDP over all 16: half of HSDP's shards */
    const plan_bytes f = plan_model_states(&small, &fsdp, PLAN_MIXED_ADAM);
    EXACT(f.optimizer, 12 * P / 16);
    printf("HSDP model states by hand: largest relative difference %.3g\n", worst);
}
END_TEST

/* The data-parallel seconds of the hand case: per layer, two all-gathers of the
 * weights and a reduce-scatter of the gradients over the 8 shard ranks on NVLink, then
 * an all-reduce of an eighth of the gradients between the 2 replicas on InfiniBand. */
static double dp_seconds_by_hand(plan_link across) {
    const double h = 64, P = 2 * (12 * h * h + 13 * h) + 116 * h;
    const double per_layer = 2 * P / 2;   /* bf16, one message per layer */
    const plan_link nvlink = plan_link_of(LINK_NVLINK);
    const double gather = 7 * nvlink.latency + 7.0 / 8 * per_layer / nvlink.bandwidth;
    const double allreduce = 2 * (across.latency + 0.5 * per_layer / 8 / across.bandwidth);
    return 2 * (3 * gather + allreduce);
}

START_TEST(seconds_by_hand) {
    worst = 0;
    const plan_mesh hsdp = hsdp_mesh(8);
    const plan_step t = plan_step_time(&small, &hsdp, &two_nodes, PLAN_MIXED_ADAM);
    EXACT(t.dp_comm, dp_seconds_by_hand(plan_link_of(LINK_IB)));
    /* FSDP over both nodes: all 16 ranks on InfiniBand */
    const plan_mesh fsdp = hsdp_mesh(0);
    const plan_step f = plan_step_time(&small, &fsdp, &two_nodes, PLAN_MIXED_ADAM);
    const double h = 64, per_layer = 2 * (2 * (12 * h * h + 13 * h) + 116 * h) / 2;
    const plan_link ib = plan_link_of(LINK_IB);
    EXACT(f.dp_comm, 2 * 3 * (15 * ib.latency + 15.0 / 16 * per_layer / ib.bandwidth));
    printf("HSDP seconds by hand: largest relative difference %.3g; HSDP %.3g us against"
           " FSDP %.3g us\n", worst, 1e6 * t.dp_comm, 1e6 * f.dp_comm);
    ck_assert(t.dp_comm < f.dp_comm);
}
END_TEST

START_TEST(the_replicas_link_is_checked) {
    /* the control: the replicas' all-reduce priced on NVLink, as a planner that took the
     * shard group's link for both would */
    const plan_mesh hsdp = hsdp_mesh(8);
    const plan_step t = plan_step_time(&small, &hsdp, &two_nodes, PLAN_MIXED_ADAM);
    const double wrong = dp_seconds_by_hand(plan_link_of(LINK_NVLINK));
    const double off = fabs(wrong - t.dp_comm) / t.dp_comm;
    printf("negative control: the replicas' all-reduce on NVLink: %.3g relative, caught\n", off);
    ck_assert(!agrees(wrong, t.dp_comm));
}
END_TEST

static plan_request request_for(double params, int gpus, int global_batch) {
    return (plan_request){.model = plan_shape_for_params(params, 51200, 2048),
                          .cluster = {.gpus = gpus, .gpus_per_node = 8, .between_nodes = LINK_IB,
                                      .flops_per_gpu = 0.4 * 989e12},
                          .gpu_bytes = 80e9, .micro_batch = 1, .global_batch = global_batch,
                          .recompute = -1, .dtype = PRECISION_BF16};
}

static plan_decision decide(const plan_request *r) {
    plan_row rows[PLAN_MAX_ROWS];
    const int n = plan_strategies(r, rows);
    plan_decision d;
    plan_decide(r, rows, n, &d);
    return d;
}

START_TEST(the_tree_takes_hsdp_where_it_fits) {
    /* 40 B on 64 cards: ZeRO-1 and 2 do not fit, FSDP does; HSDP in groups of 16 fits
     * too and keeps its gathers off 64-rank rings */
    plan_request r = request_for(40e9, 64, 64);
    plan_decision d = decide(&r);
    const plan_mesh *m = &d.choice.mesh;
    printf("40B on 64 GPUs: %s, shards of %d x %d replicas\n", d.strategy,
           plan_dp_shard_size(m), plan_dp_replicas(m));
    ck_assert_ptr_nonnull(strstr(d.strategy, "HSDP"));
    ck_assert_int_eq(m->zero_stage, 3);
    ck_assert_int_gt(plan_dp_replicas(m), 1);
    ck_assert_ptr_nonnull(strstr(d.steps[1], "yes -> FSDP"));
    ck_assert_ptr_nonnull(strstr(d.steps[2], "-> HSDP"));
    /* 70 B on 64 cards: no group of nodes holds a replica; FSDP over all of them */
    r = request_for(70e9, 64, 512);
    d = decide(&r);
    printf("70B on 64 GPUs: %s\n", d.strategy);
    ck_assert_ptr_null(strstr(d.strategy, "HSDP"));
    ck_assert_int_eq(plan_dp_replicas(&d.choice.mesh), 1);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter6_hsdp");
    TCase *formulas = tcase_create("formulas");
    tcase_add_test(formulas, states_by_hand);
    tcase_add_test(formulas, seconds_by_hand);
    tcase_add_test(formulas, the_replicas_link_is_checked);
    suite_add_tcase(suite, formulas);
    TCase *search = tcase_create("search");
    tcase_add_test(search, the_tree_takes_hsdp_where_it_fits);
    suite_add_tcase(suite, search);
    return check_run(suite, 0);
}
