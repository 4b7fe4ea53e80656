/* Chapter 6's mixture of experts (common/plan/plan_moe.h): parameters, FLOPs a
 * token, memory per GPU under expert parallelism and the all-to-all bytes, each against
 * a case computed by hand here, a dense model's figures where an MoE of one expert
 * must give them, and the rumoured GPT-4 shape's sums. Every comparison is exact (to
 * 1e-12 relative: sums of a few doubles) and prints the largest difference it saw; a
 * negative control shows that formulas with a factor left out are caught. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "by_hand.h"
#include "check_run.h"
#include "plan_moe.h"
#include "plan_moe_this_model.h"
#include "plan_time.h"
#include "planner.h"
#include "predict.h"

/* l 2, h 64, a 4, V 100, s 16 (test_chapter6's hand case): 107392 parameters dense;
 * 4 experts of MLP size 128, top-2, in every layer */
static const plan_model small = {.layers = 2, .hidden = 64, .heads = 4, .vocab = 100, .seq = 16};
static const plan_moe small_moe = {.experts = 4, .top_k = 2, .every = 1, .expert_ffn = 128};

START_TEST(parameters_and_flops_by_hand) {
    worst = 0;
    /* MLP 8 * 4096 + 5 * 64; an expert 2 * 64 * 128 + 128 + 64; the router 64 * 4 */
    EXACT(plan_mlp_params(64), 33088);
    EXACT(plan_expert_params(64, 128), 16576);
    /* 107392 + 2 (256 + 4 * 16576 - 33088) and + 2 (256 + 2 * 16576 - 33088) */
    EXACT(plan_moe_total_params(&small, &small_moe), 174336);
    EXACT(plan_moe_active_params(&small, &small_moe), 108032);
    /* every other layer: one MoE layer of the two */
    plan_moe every_other = small_moe;
    every_other.every = 2;
    ck_assert_int_eq(plan_moe_layers_in(2, &every_other), 1);
    ck_assert_int_eq(plan_moe_layers_in(5, &every_other), 2);
    EXACT(plan_moe_total_params(&small, &every_other), 107392 + 33472);
    /* forward: 2 (8 * 4096 + 4 * 16 * 64) + 2 (2 * 64 * 4 + 2 * 4 * 64 * 128) + 2 * 64 * 100
     *        = 73728 + 132096 + 12800 */
    EXACT(plan_moe_forward_flops_per_token(&small, &small_moe), 218624);
    /* the all-to-all: 2 x 2 x k 2 x h 64 x 2 B x 3/4 on ep 4; nothing leaves one rank */
    EXACT(plan_moe_alltoall_bytes_per_token(&small_moe, 64, 2, 4), 768);
    EXACT(plan_moe_alltoall_bytes_per_token(&small_moe, 64, 2, 1), 0);
    printf("MoE parameters, FLOPs and all-to-all bytes by hand: largest relative difference"
           " %.3g (tolerance %g)\n", worst, TOLERANCE);
}
END_TEST

START_TEST(one_expert_of_4h_is_the_dense_model) {
    worst = 0;
    const plan_moe one = {.experts = 1, .top_k = 1, .every = 1, .expert_ffn = 4 * 64};
    /* the same MLP, plus the router's h weights and 2 h FLOPs a layer */
    EXACT(plan_moe_total_params(&small, &one), plan_params(&small) + 2 * 64);
    EXACT(plan_moe_active_params(&small, &one), plan_params(&small) + 2 * 64);
    EXACT(3 * plan_moe_forward_flops_per_token(&small, &one),
          plan_flops_per_iteration(&small, 1, RECOMPUTE_NONE) / small.seq + 3 * 2 * 2 * 64);
    /* no experts at all: the planner's dense figures on every mesh */
    const plan_moe dense = {0};
    const plan_mesh meshes[] = {
        {.tp = 2, .pp = 1, .dp = 4, .zero_stage = 1, .micro_batch = 1, .global_batch = 8,
         .sequence_parallel = 1},
        {.tp = 1, .pp = 2, .dp = 2, .zero_stage = 1, .micro_batch = 1, .global_batch = 8,
         .recompute = RECOMPUTE_FULL},
        {.tp = 2, .pp = 1, .dp = 4, .zero_stage = 3, .micro_batch = 2, .global_batch = 16,
         .recompute = RECOMPUTE_SELECTIVE},
    };
    for (size_t i = 0; i < sizeof meshes / sizeof meshes[0]; i++) {
        const plan_bytes moe = plan_moe_memory_per_gpu(&small, &dense, &meshes[i], 1, PLAN_MIXED_ADAM);
        const plan_bytes ref = plan_memory_per_gpu(&small, &meshes[i], PLAN_MIXED_ADAM);
        EXACT(moe.params, ref.params);
        EXACT(moe.grads, ref.grads);
        EXACT(moe.optimizer, ref.optimizer);
        EXACT(moe.activations, ref.activations);
    }
    printf("an MoE of one 4h expert against the dense planner: largest relative difference"
           " %.3g (tolerance %g)\n", worst, TOLERANCE);
}
END_TEST

START_TEST(memory_under_expert_parallelism_by_hand) {
    worst = 0;
    /* tp 2, pp 1, dp 4, ep 2, ZeRO-1, micro-batch 1 of global 8, SP, no recomputation */
    const plan_mesh mesh = {.tp = 2, .pp = 1, .dp = 4, .zero_stage = 1, .micro_batch = 1,
                            .global_batch = 8, .sequence_parallel = 1};
    /* dense part: 2 layers (12 * 4096 + 13 * 64) / 2 + 100 * 64 / 2 + 16 * 64 = 54208,
     * less 2 x (33088 / 2 - 256): each MLP gone, its router kept whole */
    EXACT(plan_moe_dense_params_per_gpu(&small, &small_moe, 2, 1), 21632);
    /* 2 layers x 4/2 experts x 16576 / 2 */
    EXACT(plan_moe_expert_params_per_gpu(&small, &small_moe, 2, 1, 2), 33152);
    const plan_bytes b = plan_moe_memory_per_gpu(&small, &small_moe, &mesh, 2, PLAN_MIXED_ADAM);
    /* 2 B each of both; 12 B sharded over dp 4 (dense) and dp / ep = 2 (experts) */
    EXACT(b.params, 2 * 21632 + 2 * 33152);
    EXACT(b.grads, 2 * 21632 + 2 * 33152);
    EXACT(b.optimizer, 12 * 21632 / 4.0 + 12 * 33152 / 2.0);
    /* dense: 2 layers of s b h (34/2 + 5 a s / (h t)) = 1024 x 19.5, + head 2 s b h + 4 s b V / t
     * = 39936 + 2048 + 3200; each MoE layer's MLP: k s b (3h + 4f) / t = 2 * 16 * 704 / 2
     * in place of 16 * 1216 / 2: + 1536 a layer */
    EXACT(b.activations, 45184 + 2 * 1536);
    printf("memory per GPU under EP by hand: largest relative difference %.3g (tolerance %g)\n",
           worst, TOLERANCE);
}
END_TEST

START_TEST(gpt4_rumoured_shape_gives_the_reported_sums) {
    worst = 0;
    /* SemiAnalysis (July 2023): ~1.8T in 120 layers, 16 experts of ~111B, 2 a token,
     * ~280B active, ~55B of attention; h 10752 is ours: 8 h^2 x 120 = 111.0B an expert */
    const plan_model m = {.layers = 120, .hidden = 10752, .heads = 96, .vocab = 100277, .seq = 8192};
    const plan_moe moe = {.experts = 16, .top_k = 2, .every = 1, .expert_ffn = 4 * 10752};
    /* 120 (12 h^2 + 13 h) + (100277 + 8192) h */
    EXACT(plan_params(&m), 167654957568.0);
    EXACT(120 * plan_expert_params(10752, 4 * 10752), 110987735040.0);
    /* + 120 (16 h + 16 expert - MLP) and + 120 (16 h + 2 expert - MLP) */
    EXACT(plan_moe_total_params(&m, &moe), 1832491627008.0);
    EXACT(plan_moe_active_params(&m, &moe), 278663336448.0);
    /* 120 (8 h^2 + 4 s h) + 120 (2 h 16 + 2 x 4 h 4h) + 2 h V */
    EXACT(plan_moe_forward_flops_per_token(&m, &moe), 599382647808.0);
    /* 2 x 2 x 2 x 10752 x 2 B x 15/16 */
    EXACT(plan_moe_alltoall_bytes_per_token(&moe, 10752, 2, 16), 161280);
    ck_assert(fabs(plan_moe_total_params(&m, &moe) / 1.8e12 - 1) < 0.02);
    ck_assert(fabs(plan_moe_active_params(&m, &moe) / 280e9 - 1) < 0.01);
    printf("GPT-4's rumoured shape: %.4g parameters, %.4g active; largest relative difference"
           " %.3g (tolerance %g)\n", plan_moe_total_params(&m, &moe),
           plan_moe_active_params(&m, &moe), worst, TOLERANCE);
}
END_TEST

/* The EP search (chapter 6's moe.c) on the hand case's mesh, 8 GPUs of 4 a node: the
 * all-to-all of each ep by hand (16 tokens a GPU x 2 MoE layers x 2 2 k h 2 B (ep-1)/ep),
 * NVLink while tp x ep fits a node; the choice, the lightest recomputation that fits
 * then the least all-to-all; the control, a choice by all-to-all alone, differs. */
START_TEST(the_ep_search_by_hand) {
    worst = 0;
    plan_request r = {.model = small, .moe = small_moe, .dtype = PRECISION_BF16,
                      .cluster = {.gpus = 8, .gpus_per_node = 4, .between_nodes = LINK_IB,
                                  .flops_per_gpu = 1e12},
                      .micro_batch = 1, .global_batch = 8, .recompute = -1, .gpu_bytes = 1e12,
                      .mesh = {.tp = 2, .pp = 1, .dp = 4, .zero_stage = 1, .micro_batch = 1,
                               .global_batch = 8}};
    plan_ep_option o[PLAN_MAX_EP_OPTIONS];
    const int n = plan_ep_options(&r, o, PLAN_MAX_EP_OPTIONS);
    ck_assert_int_eq(n, 3);   /* ep 1, 2, 4: the divisors of 4 experts and dp 4 */
    const double per_token[] = {0, 512, 768};
    const comm_link links[] = {LINK_NVLINK, LINK_NVLINK, LINK_IB};
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(o[i].ep, 1 << i);
        EXACT(o[i].alltoall_bytes, 16 * 2 * per_token[i]);
        ck_assert_int_eq(o[i].link, links[i]);
        EXACT(o[i].alltoall_seconds, o[i].alltoall_bytes / comm_link_spec(links[i]).bandwidth);
    }
    /* room for all: no recomputation anywhere, ep 1 sends nothing */
    ck_assert_int_eq(o[plan_best_ep(o, n)].ep, 1);
    /* room for ep 4 without recomputation and for ep 2 with it in full: ep 4, not the
     * lighter all-to-all that must recompute */
    plan_mesh none = r.mesh, full = r.mesh;
    none.sequence_parallel = full.sequence_parallel = 1;
    full.recompute = RECOMPUTE_FULL;
    r.gpu_bytes = fmax(plan_total(plan_moe_memory_per_gpu(&small, &small_moe, &none, 4,
                                                          PLAN_MIXED_ADAM)),
                       plan_total(plan_moe_memory_per_gpu(&small, &small_moe, &full, 2,
                                                          PLAN_MIXED_ADAM)));
    const int m = plan_ep_options(&r, o, PLAN_MAX_EP_OPTIONS), best = plan_best_ep(o, m);
    ck_assert_int_eq(o[best].ep, 4);
    ck_assert_int_eq(o[best].recompute, RECOMPUTE_NONE);
    int least = -1;   /* the control: the least all-to-all of those that fit */
    for (int i = 0; i < m; i++)
        if (o[i].fits && (least < 0 || o[i].alltoall_seconds < o[least].alltoall_seconds))
            least = i;
    printf("EP search by hand: largest relative difference %.3g; with room for ep 4 unrecomputed"
           " and ep 2 recomputed it takes ep %d, the all-to-all alone would take ep %d (%s)\n",
           worst, o[best].ep, o[least].ep, plan_recompute_names[o[least].recompute]);
    ck_assert_int_ne(o[least].ep, o[best].ep);
}
END_TEST

/* Negative control: the comparison rejects the formulas with a factor left out. */
START_TEST(formulas_with_a_factor_left_out_are_caught) {
    const double k = 2, h = 64, bytes = 2;
    const double alltoall = plan_moe_alltoall_bytes_per_token(&small_moe, 64, 2, 4);
    const double wrong[] = {
        2 * 2 * k * h * bytes,                  /* every byte counted as leaving the rank */
        2 * k * h * bytes * 3 / 4.0,            /* forward only */
        2 * 2 * h * bytes * 3 / 4.0,            /* k left out */
    };
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(!agrees(wrong[i], alltoall), "%g passed for %g", wrong[i], alltoall);
        printf("negative control: all-to-all %g bytes against %g: differs by %.3g, caught\n",
               wrong[i], alltoall, fabs(wrong[i] - alltoall) / alltoall);
    }
    /* active parameters counted with all E experts, as total */
    ck_assert(!agrees(plan_moe_total_params(&small, &small_moe), 108032));
}
END_TEST

/* Chapter 11's MoE mesh (predict_mesh.c's PREDICT_MESH_MOE: tp 1 x dp 4, ZeRO-1, one
 * micro-batch of 2, MoE every other block with 4 experts top-2 capacity 1.25 on ep 2),
 * as ./run 4 --tp 1 --pp 1 --dp-shard 4 --zero 1 --micro 1 --ep 2 --experts 4
 * --moe-every 2 --preset bench256 --json measured it: dp and expert_dp bytes; peak
 * params, grads, optimizer; activations. */
enum { MOE_FIGURES = 6 };
static const double moe_measured_fp32[MOE_FIGURES] = {13154304, 8409088, 17178624, 17178624,
                                                      12793856, 23226496};
static const double moe_measured_bf16[MOE_FIGURES] = {6583296, 8409088, 17002497, 21559296,
                                                      14984192, 20473984};
/* The same mesh with every block MoE (--moe-every 1): the stage runs no dense MLP, so the
 * model holds no MLP gradient scratch either. */
static const double every_block_fp32[MOE_FIGURES] = {6859776, 16818176, 21391360, 21391360,
                                                     19104768, 30054912};
static const double every_block_bf16[MOE_FIGURES] = {3442176, 16818176, 27522049, 23669760,
                                                     20243968, 28875264};

/* How the MoE mesh is counted: this model's MoE count, and the controls that must miss. */
typedef enum {
    THIS_MODEL,        /* plan_moe_this_model.h */
    DENSE_MODEL,       /* no experts: the dense MLPs, no routers, nothing on expert_dp */
    PAPERS_MOE,        /* plan_moe_memory_per_gpu: the papers' dense count, experts split */
    EXPERTS_OVER_DP,   /* the experts sharded and reduced over dp 4, not expert_dp 2 */
    MLP_BUFFERS_KEPT,  /* the MoE blocks' unused dense fc and GELU outputs still counted */
} moe_count;

static void planned_moe_figures(precision dtype, int every, moe_count count,
                                double out[MOE_FIGURES]) {
    int ranks;
    plan_request r = predict_mesh_moe_request(4, dtype);
    r.moe.every = every;
    const plan_mesh given = predict_mesh_given(PREDICT_MESH_MOE, &ranks);
    const plan_mesh mesh = plan_evaluate(&r, "mesh", given).mesh;
    ck_assert_int_eq(ranks, 4);
    if (count == DENSE_MODEL) r.moe.experts = 0;
    predict_mesh_figures p = predict_mesh_planned(&r, &mesh);
    if (count == PAPERS_MOE)
        p.state = plan_moe_memory_per_gpu(&r.model, &r.moe, &mesh, r.ep, plan_precision_for(&r));
    if (count == EXPERTS_OVER_DP) {
        const double experts = plan_moe_this_model_expert_params(&r.model, &r.moe, &mesh, r.ep);
        const plan_precision fp32 = PLAN_FP32_ADAM;
        double unused;
        p.state.optimizer += fp32.optimizer * experts * (1.0 / mesh.dp - 1.0 / (mesh.dp / r.ep));
        plan_dp_bytes(&mesh, experts, fp32, mesh.dp, 1, &p.bytes[6], &unused);
    }
    if (count == MLP_BUFFERS_KEPT) {   /* one slot (pp 1): 2 x b s x 4 h / t a MoE block */
        const double rows = (double)mesh.micro_batch * r.model.seq;
        const int moe_layers = plan_moe_layers_in(r.model.layers, &r.moe);
        const int scratch = moe_layers == r.model.layers;   /* no dense block: d_fch too */
        p.state.activations += (moe_layers + scratch) * 2.0 * rows * 4 * r.model.hidden /
                               mesh.tp * (double)precision_bytes(dtype);
    }
    const double planned[MOE_FIGURES] = {p.bytes[2], p.bytes[6], p.state.params, p.state.grads,
                                         p.state.optimizer, p.state.activations};
    for (int i = 0; i < MOE_FIGURES; i++) out[i] = planned[i];
}

/* The figures of six the count gets wrong. */
static int moe_misses(precision dtype, int every, moe_count count,
                      const double measured[MOE_FIGURES]) {
    static const char *const names[] = {"this model's MoE count", "the dense model's count",
                                        "the papers' MoE count", "experts over dp",
                                         "the MoE blocks' MLP buffers kept"};
    double planned[MOE_FIGURES];
    planned_moe_figures(dtype, every, count, planned);
    int wrong = 0;
    for (int i = 0; i < MOE_FIGURES; i++) wrong += planned[i] != measured[i];
    printf("MoE mesh, every %d, %s, %s: dp %.0f (measured %.0f), expert_dp %.0f (%.0f), params %.0f"
           " (%.0f), optimizer %.0f (%.0f), activations %.0f (%.0f): %d of %d differ\n",
           every, precision_name(dtype), names[count], planned[0], measured[0], planned[1],
           measured[1], planned[2], measured[2], planned[4], measured[4], planned[5],
           measured[5], wrong, MOE_FIGURES);
    return wrong;
}

START_TEST(the_moe_mesh_as_chapter_11_measured_it) {
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 2, THIS_MODEL, moe_measured_fp32), 0);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 2, THIS_MODEL, moe_measured_bf16), 0);
    /* negative controls */
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 2, DENSE_MODEL, moe_measured_fp32), 6);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 2, DENSE_MODEL, moe_measured_bf16), 6);
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 2, PAPERS_MOE, moe_measured_fp32), 4);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 2, PAPERS_MOE, moe_measured_bf16), 4);
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 2, EXPERTS_OVER_DP, moe_measured_fp32), 2);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 2, EXPERTS_OVER_DP, moe_measured_bf16), 2);
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 2, MLP_BUFFERS_KEPT, moe_measured_fp32), 1);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 2, MLP_BUFFERS_KEPT, moe_measured_bf16), 1);
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 1, THIS_MODEL, every_block_fp32), 0);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 1, THIS_MODEL, every_block_bf16), 0);
    ck_assert_int_eq(moe_misses(PRECISION_FP32, 1, MLP_BUFFERS_KEPT, every_block_fp32), 1);
    ck_assert_int_eq(moe_misses(PRECISION_BF16, 1, MLP_BUFFERS_KEPT, every_block_bf16), 1);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter6_moe");
    TCase *formulas = tcase_create("formulas");
    tcase_add_test(formulas, parameters_and_flops_by_hand);
    tcase_add_test(formulas, one_expert_of_4h_is_the_dense_model);
    tcase_add_test(formulas, memory_under_expert_parallelism_by_hand);
    tcase_add_test(formulas, gpt4_rumoured_shape_gives_the_reported_sums);
    tcase_add_test(formulas, formulas_with_a_factor_left_out_are_caught);
    tcase_add_test(formulas, the_ep_search_by_hand);
    suite_add_tcase(suite, formulas);
    TCase *recorded = tcase_create("recorded");
    tcase_add_test(recorded, the_moe_mesh_as_chapter_11_measured_it);   /* chapter 11's */
    suite_add_tcase(suite, recorded);
    return check_run(suite, 0);
}
