/* Chapter 6's context parallelism (common/plan/plan_cp.h): the chunk, the bytes a
 * rank sends per layer (ring: 6 cp - 4 chunks, dK/dV's 2 cp in fp32; Ulysses: 8 (cp-1)/cp),
 * the activations
 * a rank keeps and the seconds of the CP messages, each against a case computed by hand
 * here, and the bytes against chapter 9's own formula (cp_attention_bytes_formula) in
 * fp32. Every comparison is exact (to 1e-12 relative: sums of a few doubles) and prints
 * the largest difference it saw; a negative control shows that a count off by one
 * chunk is caught. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "by_hand.h"
#include "check_run.h"
#include "cp_attention.h"
#include "plan_cp.h"
#include "planner.h"
#include "plan_time.h"

/* l 2, h 64, a 4, V 100, s 16 (test_chapter6's hand case); b 2, tp 2 with SP, cp 4:
 * a chunk is 2 x 16/4 x 64/2 = 256 elements, 512 bytes in bf16 */
static const plan_model small = {.layers = 2, .hidden = 64, .heads = 4, .vocab = 100, .seq = 16};

static plan_mesh cp_mesh(cp_attention_kind kind, plan_recompute recompute) {
    return (plan_mesh){.tp = 2, .pp = 1, .dp = 1, .cp = 4, .cp_attention = kind,
                       .micro_batch = 2, .global_batch = 2, .sequence_parallel = 1,
                       .recompute = recompute};
}

START_TEST(bytes_per_layer_by_hand) {
    worst = 0;
    const plan_mesh ring = cp_mesh(CP_RING, RECOMPUTE_NONE);
    const plan_mesh ulysses = cp_mesh(CP_ULYSSES, RECOMPUTE_NONE);
    EXACT(plan_cp_chunk_bytes(&small, &ring, 2), 512);
    EXACT(plan_cp_chunks_per_layer(&ring), 20);          /* 6 x 4 - 4 */
    /* 12 chunks of K/V in bf16, the 8 of dK/dV in fp32 */
    EXACT(plan_cp_bytes_per_layer(&small, &ring, 2), 12 * 512 + 8 * 1024);
    EXACT(plan_cp_chunks_per_layer(&ulysses), 6);        /* 8 x 3/4 */
    EXACT(plan_cp_bytes_per_layer(&small, &ulysses, 2), 3072);
    /* full recomputation sends the forward's again: 3 K/V blocks; 4 all-to-alls */
    const plan_mesh ring_full = cp_mesh(CP_RING, RECOMPUTE_FULL);
    const plan_mesh ulysses_full = cp_mesh(CP_ULYSSES, RECOMPUTE_FULL);
    EXACT(plan_cp_bytes_per_layer(&small, &ring_full, 2), 18 * 512 + 8 * 1024);
    EXACT(plan_cp_bytes_per_layer(&small, &ulysses_full, 2), 9 * 512);
    plan_mesh none = ring;
    none.cp = 1;
    EXACT(plan_cp_bytes_per_layer(&small, &none, 2), 0);
    printf("CP bytes per layer by hand: largest relative difference %.3g\n", worst);
}
END_TEST

/* The planner's count without TP is chapter 9's formula, for both ways, group sizes 2
 * to 8, in fp32 and bf16. */
START_TEST(bytes_equal_chapter_9s_formula) {
    worst = 0;
    const precision wires[2] = {PRECISION_FP32, PRECISION_BF16};
    for (int w = 0; w < 2; w++)
        for (int P = 2; P <= 8; P *= 2)
            for (int kind = 0; kind < 2; kind++) {
                const plan_mesh mesh = {.tp = 1, .pp = 1, .dp = 1, .cp = P,
                                        .cp_attention = kind, .micro_batch = 2,
                                        .global_batch = 2};
                EXACT(plan_cp_bytes_per_layer(&small, &mesh, precision_bytes(wires[w])),
                      cp_attention_bytes_formula(kind, P, 2, small.seq, small.hidden, wires[w]));
            }
    printf("CP bytes against chapter 9's cp_attention_bytes_formula: largest relative"
           " difference %.3g\n", worst);
}
END_TEST

START_TEST(activations_by_hand) {
    worst = 0;
    /* the chunk's s b h terms with TP + SP: 4 x 2 x 64 x 34/2 = 8704 bytes */
    const plan_mesh ring = cp_mesh(CP_RING, RECOMPUTE_NONE);
    /* + log-sum-exp 4 a s b / (t cp) = 64, + a K/V block 4 s b h / (t cp) = 1024 */
    EXACT(plan_layer_activations_cp(&small, &ring), 8704 + 64 + 1024);
    const plan_mesh ulysses = cp_mesh(CP_ULYSSES, RECOMPUTE_NONE);
    /* + head-sharded Q, K, V, output 8 s b h / (t cp) = 2048, + probabilities
     * 5 a s^2 b / (t cp) = 1280 */
    EXACT(plan_layer_activations_cp(&small, &ulysses), 8704 + 2048 + 1280);
    const plan_mesh selective = cp_mesh(CP_ULYSSES, RECOMPUTE_SELECTIVE);
    EXACT(plan_layer_activations_cp(&small, &selective), 8704 + 2048);
    const plan_mesh full = cp_mesh(CP_RING, RECOMPUTE_FULL);
    EXACT(plan_layer_activations_cp(&small, &full), 2.0 * 4 * 2 * 64 / 2);
    /* cp 1 is Korthikanti's count as before */
    plan_mesh whole = ring;
    whole.cp = 0;
    EXACT(plan_layer_activations_cp(&small, &whole),
          plan_layer_activations(&small, 2, 2, 1, RECOMPUTE_NONE));
    printf("CP activations per layer by hand: largest relative difference %.3g\n", worst);
}
END_TEST

START_TEST(seconds_and_states_by_hand) {
    worst = 0;
    const plan_mesh ring = cp_mesh(CP_RING, RECOMPUTE_NONE);
    const plan_mesh ulysses = cp_mesh(CP_ULYSSES, RECOMPUTE_NONE);
    /* alpha 1 us, beta 1 GB/s: ring 3 x 4 - 2 = 10 sends of 1024 B; Ulysses 8
     * all-to-alls of 3 alpha + 3/4 x 512 B */
    /* 6 K/V sends of 2 x 512 B, 4 dK/dV sends of 2 x 1024 B */
    EXACT(plan_cp_seconds_per_layer(&small, &ring, 2, 1e-6, 1e9),
          10 * 1e-6 + (6 * 1024 + 4 * 2048) * 1e-9);
    EXACT(plan_cp_seconds_per_layer(&small, &ulysses, 2, 1e-6, 1e9), 8 * (3e-6 + 384e-9));
    /* a step: 2 layers x 1 micro-batch on the CP group, 4 ranks 2 apart in a node of 8 */
    const plan_cluster node = {.gpus = 8, .gpus_per_node = 8, .between_nodes = LINK_IB,
                               .flops_per_gpu = 1e12};
    const plan_link nvlink = plan_link_of(LINK_NVLINK);
    EXACT(plan_step_time(&small, &ring, &node, PLAN_MIXED_ADAM).cp_comm,
          2 * plan_cp_seconds_per_layer(&small, &ring, 2, nvlink.latency, nvlink.bandwidth));
    /* ZeRO-1 shards over dp x cp: dp 1 x cp 4 as dp 4 */
    plan_mesh zero1 = ring;
    zero1.zero_stage = 1;
    plan_mesh dp4 = {.tp = 2, .pp = 1, .dp = 4, .zero_stage = 1, .micro_batch = 2,
                     .global_batch = 8};
    EXACT(plan_model_states(&small, &zero1, PLAN_MIXED_ADAM).optimizer,
          plan_model_states(&small, &dp4, PLAN_MIXED_ADAM).optimizer);
    printf("CP seconds and states by hand: largest relative difference %.3g\n", worst);
}
END_TEST

/* A ring counted one chunk short, or Ulysses' all-to-alls counted whole: caught. */
START_TEST(a_count_off_by_one_chunk_is_caught) {
    const plan_mesh ring = cp_mesh(CP_RING, RECOMPUTE_NONE);
    const double right = plan_cp_bytes_per_layer(&small, &ring, 2);
    const double short_one = right - plan_cp_chunk_bytes(&small, &ring, 2);
    ck_assert(!agrees(short_one, right));
    printf("negative control: ring with a K/V chunk less %g bytes against %g: caught\n",
           short_one, right);
    const double dkv_16 = (6 * 4 - 4) * plan_cp_chunk_bytes(&small, &ring, 2);
    ck_assert(!agrees(dkv_16, right));
    printf("negative control: ring with dK/dV in bf16 %g bytes against %g: caught\n", dkv_16,
           right);
    const plan_mesh ulysses = cp_mesh(CP_ULYSSES, RECOMPUTE_NONE);
    const double whole = 8 * plan_cp_chunk_bytes(&small, &ulysses, 2);
    ck_assert(!agrees(whole, plan_cp_bytes_per_layer(&small, &ulysses, 2)));
    printf("negative control: Ulysses' all-to-alls counted whole %g bytes against %g: caught\n",
           whole, plan_cp_bytes_per_layer(&small, &ulysses, 2));
}
END_TEST

/* Llama 3 405B's shape (126 layers, h 16384, 128 heads, vocabulary 128256) on 16384 GPUs
 * of 80 GB, 16M tokens a step: at 8K tokens a mesh fits without context parallelism and
 * the planner names one; at 128K none does (a layer's activations are 11 TB), and the
 * search splits the sequence: a mesh with cp > 1 fits, and the tree says why. The
 * control: that mesh with its cp ranks turned into dp ones does not fit. */
static plan_decision plan_llama3(int seq, plan_row *rows, int *n) {
    const plan_request r = {.model = {126, 16384, 128, 128256, seq},
                            .cluster = {.gpus = 16384, .gpus_per_node = 8,
                                        .between_nodes = LINK_IB, .flops_per_gpu = 0.4 * 989e12},
                            .gpu_bytes = 80e9, .micro_batch = 1, .global_batch = 16777216 / seq,
                            .recompute = -1, .dtype = PRECISION_BF16};
    *n = plan_strategies(&r, rows);
    plan_decision d;
    plan_decide(&r, rows, *n, &d);
    const plan_mesh *m = &d.choice.mesh;
    printf("405B at %d tokens: %s, tp %d x cp %d x pp %d x dp %d (ZeRO-%d, shards of %d), %.2f"
           " GB a GPU\n", seq, d.strategy, m->tp, plan_cp_size(m), m->pp, m->dp, m->zero_stage,
           plan_dp_shard_size(m), plan_total(d.choice.memory) / 1e9);
    return d;
}

START_TEST(the_search_splits_the_sequence_only_when_it_must) {
    plan_row rows[PLAN_MAX_ROWS];
    int n;
    const plan_decision at_8k = plan_llama3(8192, rows, &n);
    ck_assert(at_8k.found && at_8k.choice.fits);
    ck_assert_int_eq(plan_cp_size(&at_8k.choice.mesh), 1);
    const plan_decision at_128k = plan_llama3(131072, rows, &n);
    ck_assert(at_128k.found && at_128k.choice.fits);
    ck_assert_int_gt(plan_cp_size(&at_128k.choice.mesh), 1);
    /* with HSDP in the search: tp 8 x cp 16 (Llama 3's CP at 128K) x dp 128, ZeRO-3 in
     * groups of 2 x cp, full recomputation */
    ck_assert_str_eq(at_128k.strategy, "TP + CP + PP + DP + activation checkpointing");
    ck_assert_ptr_nonnull(strstr(at_128k.steps[at_128k.num_steps - 1],
                                 "no mesh fits without splitting the sequence"));
    /* the control: the same GPUs, the cp ranks given to dp */
    const plan_request r = {.model = {126, 16384, 128, 128256, 131072},
                            .cluster = {.gpus = 16384, .gpus_per_node = 8,
                                        .between_nodes = LINK_IB, .flops_per_gpu = 0.4 * 989e12},
                            .gpu_bytes = 80e9, .micro_batch = 1, .global_batch = 128,
                            .recompute = -1, .dtype = PRECISION_BF16};
    plan_mesh no_cp = at_128k.choice.mesh;
    no_cp.dp *= no_cp.cp;
    no_cp.cp = 1;
    const plan_row control = plan_evaluate(&r, "control", no_cp);
    printf("negative control, its cp ranks as dp: %s\n", control.fits ? "fits" : "does not fit");
    ck_assert(!control.fits);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter6_cp");
    TCase *formulas = tcase_create("formulas");
    tcase_add_test(formulas, bytes_per_layer_by_hand);
    tcase_add_test(formulas, bytes_equal_chapter_9s_formula);
    tcase_add_test(formulas, activations_by_hand);
    tcase_add_test(formulas, seconds_and_states_by_hand);
    tcase_add_test(formulas, a_count_off_by_one_chunk_is_caught);
    suite_add_tcase(suite, formulas);
    TCase *search = tcase_create("search");
    tcase_add_test(search, the_search_splits_the_sequence_only_when_it_must);
    suite_add_tcase(suite, search);
    return check_run(suite, 0);
}
