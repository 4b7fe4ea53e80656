/* Context parallelism on the threads backend: the mesh's CP dimension, ring attention
 * (contiguous and balanced) and Ulysses trained against the single-device baseline, the
 * negative controls that must fail, each layer's bytes against the formulas and the
 * causal mask's work imbalance; which blocks a query range computes, at the edges, and
 * training on pieces of one position, where those edges decide every block. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_block.h"
#include "baseline.h"
#include "check_run.h"
#include "cp_train.h"
#include "tolerances.h"

/* Small enough for seconds, big enough that a wrong mask or block shows: 4 heads split
 * by 4 ranks, 24 positions cut into 2 x 4 (or 2 x 3) balanced pieces. */
static run_config small_config(int ranks, int steps) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 24, .layers = 2, .heads = 4, .dim = 32};
    cfg.batch = 4;
    cfg.steps = steps;
    cfg.quiet = 1;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

typedef struct {
    run_result result;
    cp_extra extra;
} cp_case;

/* tp x cp x (ranks / (tp x cp)) with these options, compared with the baseline;
 * send_mode: comm_send's (rendezvous: it waits for the receiver, as NCCL's does). */
static cp_case train_config_on(run_config cfg, int tp, int cp, cp_options opts) {
    dataset *d = dataset_builtin();
    baseline_run *b = baseline_train(&cfg, d);
    cp_case c = {0};
    strategy_outcome out = {.extra = &c.extra};
    ck_assert_int_eq(cp_launch_tp(&cfg, d, tp, cp, &opts, &out), 0);
    strategy_outcome_compare(&out, b);
    c.result = out.result;
    c.result.loss = NULL;
    strategy_outcome_free(&out);
    baseline_free(b);
    dataset_free(d);
    return c;
}

static cp_case train_on(int ranks, int tp, int cp, cp_options opts, int steps,
                        comm_send_mode send_mode) {
    run_config cfg = small_config(ranks, steps);
    cfg.comm.send_mode = send_mode;
    return train_config_on(cfg, tp, cp, opts);
}

static cp_case train_mesh_against_baseline(int ranks, int tp, int cp, cp_options opts,
                                           int steps) {
    return train_on(ranks, tp, cp, opts, steps, COMM_SEND_BUFFERED);
}

static cp_case train_against_baseline(int ranks, int cp, cp_options opts, int steps) {
    return train_mesh_against_baseline(ranks, 1, cp, opts, steps);
}

static const char *label(cp_options o) {
    static char buf[64];
    snprintf(buf, sizeof buf, "%s%s%s", cp_attention_name(o.kind), o.kind == CP_RING ? " " : "",
             o.kind == CP_RING ? cp_split_name(o.split) : "");
    return buf;
}

static void check_mesh_training(int ranks, int tp, int cp, cp_options opts) {
    cp_case c = train_mesh_against_baseline(ranks, tp, cp, opts, 3);
    const run_result *r = &c.result;
    printf("tp %d x cp %d x dp %d, %s, 3 steps: max diff loss %.2e (tol %.0e), grads of step"
           " 1 %.2e (tol %.0e), params %.2e (tol %.0e)\n", tp, cp, ranks / (tp * cp),
           label(opts), r->diff_loss, TOL_LOSS, r->diff_grads, TOL_GRADS, r->diff_params,
           TOL_PARAMS);
    ck_assert(r->diff_loss <= TOL_LOSS);
    ck_assert(r->diff_grads <= TOL_GRADS);
    ck_assert(r->diff_params <= TOL_PARAMS);
    /* every layer's K/V blocks or all-to-alls, to the byte */
    printf("  bytes per rank per layer on the cp group: %.0f measured, %.0f formula\n",
           c.extra.cp_bytes_per_layer, c.extra.cp_bytes_per_layer_formula);
    ck_assert(c.extra.cp_bytes_per_layer == c.extra.cp_bytes_per_layer_formula);
    ck_assert(r->bytes_sent_per_step == r->bytes_formula);
}

static void check_training(int ranks, int cp, cp_options opts) {
    check_mesh_training(ranks, 1, cp, opts);
}

static const cp_options ring = {.kind = CP_RING, .split = CP_CONTIGUOUS};
static const cp_options balanced = {.kind = CP_RING, .split = CP_BALANCED};
static const cp_options ulysses = {.kind = CP_ULYSSES};

START_TEST(ring_cp1_is_the_baseline) { check_training(1, 1, ring); }
END_TEST
START_TEST(ring_cp2_matches_the_baseline) { check_training(2, 2, ring); }
END_TEST
START_TEST(ring_cp4_matches_the_baseline) { check_training(4, 4, ring); }
END_TEST
START_TEST(balanced_ring_cp2_matches_the_baseline) { check_training(2, 2, balanced); }
END_TEST
START_TEST(balanced_ring_cp4_matches_the_baseline) { check_training(4, 4, balanced); }
END_TEST
START_TEST(ulysses_cp2_matches_the_baseline) { check_training(2, 2, ulysses); }
END_TEST
START_TEST(ulysses_cp4_matches_the_baseline) { check_training(4, 4, ulysses); }
END_TEST
START_TEST(balanced_ring_cp2_times_dp2_matches_the_baseline) { check_training(4, 2, balanced); }
END_TEST
START_TEST(ulysses_cp2_times_dp2_matches_the_baseline) { check_training(4, 2, ulysses); }
END_TEST
/* Megatron's TP inside every chunk: the mesh's tp x cp x dp on 8 ranks */
START_TEST(balanced_ring_tp2_cp2_dp2_matches_the_baseline) {
    check_mesh_training(8, 2, 2, balanced);
}
END_TEST
START_TEST(ulysses_tp2_cp2_dp2_matches_the_baseline) { check_mesh_training(8, 2, 2, ulysses); }
END_TEST

/* The shortest pieces: ctx = P (contiguous) or 2P (balanced) gives every rank pieces of
 * one position, where a piece's diagonal block is one query against its own key. */
START_TEST(pieces_of_one_position_match_the_baseline) {
    for (int P = 2; P <= 4; P += 2)
        for (int split = 0; split < 2; split++) {
            const cp_options o = split ? balanced : ring;
            run_config cfg = small_config(P, 3);
            cfg.model.ctx = split ? 2 * P : P;
            cp_case c = train_config_on(cfg, 1, P, o);
            printf("cp %d %s, ctx %d (pieces of 1 position), 3 steps: max diff loss %.2e, "
                   "grads %.2e, params %.2e\n", P, label(o), cfg.model.ctx,
                   c.result.diff_loss, c.result.diff_grads, c.result.diff_params);
            ck_assert(c.result.diff_loss <= TOL_LOSS);
            ck_assert(c.result.diff_grads <= TOL_GRADS);
            ck_assert(c.result.diff_params <= TOL_PARAMS);
        }
}
END_TEST

/* Sends that wait for their receiver (NCCL's): the ring's order cannot deadlock, on
 * even and odd rings. */
START_TEST(ring_with_rendezvous_sends_does_not_deadlock) {
    for (int P = 2; P <= 4; P++) {
        const cp_options o = balanced;
        cp_case c = train_on(P, 1, P, o, 2, COMM_SEND_RENDEZVOUS);
        printf("rendezvous sends, cp %d %s: grads differ by %.2e\n", P, label(o),
               c.result.diff_grads);
        ck_assert(c.result.diff_grads <= TOL_GRADS);
    }
}
END_TEST

/* ---- negative controls: the comparison catches each bug ------------------------------ */

static void check_fails(cp_options opts, const char *what) {
    cp_case c = train_against_baseline(4, 4, opts, 2);
    printf("negative control, %s: grads differ by %.2e, loss by %.2e (tolerances %.0e,"
           " %.0e)\n", what, c.result.diff_grads, c.result.diff_loss, TOL_GRADS, TOL_LOSS);
    ck_assert_msg(c.result.diff_grads > 100 * TOL_GRADS, "grads differ by only %g",
                  c.result.diff_grads);
}

START_TEST(ring_without_the_diagonal_mask_fails) {
    cp_options o = ring;
    o.test_unmasked_diagonal = 1;
    check_fails(o, "the diagonal block unmasked");
}
END_TEST

START_TEST(ring_with_a_stale_kv_block_in_backward_fails) {
    cp_options o = balanced;
    o.test_stale_kv = 1;
    check_fails(o, "backward with the previous step's K/V block");
}
END_TEST

/* ---- the causal mask's work ------------------------------------------------------------ */

/* Contiguous chunks: rank i computes i + 1 blocks of (T/P)^2 (its earlier chunks and its
 * own diagonal), so the last rank works 2P/(P+1) times the mean; balanced: every rank
 * 2P + 1 blocks of (T/2P)^2, the same. */
START_TEST(balanced_split_evens_out_the_causal_work) {
    const double P = 4;
    cp_case contiguous = train_against_baseline(4, 4, ring, 1);
    cp_case even = train_against_baseline(4, 4, balanced, 1);
    printf("attention work per rank (score entries per step):");
    for (int i = 0; i < 4; i++)
        printf(" %.0f/%.0f", contiguous.extra.ranks[i].attention_work,
               even.extra.ranks[i].attention_work);
    printf("\n  max/mean: contiguous %.3f (2P/(P+1) = %.3f), balanced %.3f\n",
           contiguous.extra.work_imbalance, 2 * P / (P + 1), even.extra.work_imbalance);
    ck_assert(contiguous.extra.work_imbalance == 2 * P / (P + 1));
    ck_assert(even.extra.work_imbalance == 1.0);
    /* per sequence, head and layer, forward + backward: (i+1) (T/P)^2 x 2 */
    const double per_block = 4.0 * 4 * 2 * 2 * (24 / 4) * (24 / 4);   /* B H L fwd+bwd */
    for (int i = 0; i < 4; i++)
        ck_assert(contiguous.extra.ranks[i].attention_work == (i + 1) * per_block);
}
END_TEST

/* ---- which blocks a query range computes ------------------------------------------------ */

/* The edges of each kind: queries 4..7 against keys that start right after the last
 * query (skipped), at it (diagonal: query 7 sees key 7), or end at the first query (full:
 * every query sees key 4); and a one-position piece against itself (full: a query sees
 * its own key) and its neighbours. */
START_TEST(block_kinds_at_their_edges) {
    static const struct {
        int q_start, q_len, k_start, k_len;
        block_kind want;
    } cases[] = {
        {4, 4, 8, 4, BLOCK_SKIPPED}, {4, 4, 7, 1, BLOCK_DIAGONAL}, {4, 4, 7, 4, BLOCK_DIAGONAL},
        {4, 4, 4, 4, BLOCK_DIAGONAL}, {4, 4, 2, 4, BLOCK_DIAGONAL}, {4, 4, 1, 4, BLOCK_FULL},
        {4, 4, 0, 1, BLOCK_FULL}, {5, 1, 5, 1, BLOCK_FULL}, {5, 1, 6, 1, BLOCK_SKIPPED},
        {5, 1, 4, 1, BLOCK_FULL}, {5, 1, 5, 2, BLOCK_DIAGONAL}, {5, 1, 4, 2, BLOCK_FULL},
    };
    static const char *names[] = {"skipped", "full", "diagonal"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const block_kind got =
            block_kind_of(cases[i].q_start, cases[i].q_len, cases[i].k_start, cases[i].k_len);
        ck_assert_msg(got == cases[i].want, "queries %d..%d, keys %d..%d: %s, not %s",
                      cases[i].q_start, cases[i].q_start + cases[i].q_len - 1,
                      cases[i].k_start, cases[i].k_start + cases[i].k_len - 1, names[got],
                      names[cases[i].want]);
    }
    printf("block kinds: %zu pairs at the edges as expected\n", sizeof cases / sizeof *cases);
}
END_TEST

/* Ulysses: after its all-to-all a rank holds H/P whole heads over all T positions and
 * computes the causal lower triangle of each, T(T+1)/2 score entries (query t sees keys
 * 0..t, t + 1 of them), in forward and again in backward, per sequence, head and layer.
 * Here B 4, H 4, L 2, T 24: T(T+1)/2 = 300, so on P = 2 (2 heads a rank)
 * 2 x L x B x 2 x 300 = 2 x 2 x 4 x 2 x 300 = 9600 per rank per step, on P = 4 (1 head)
 * 4800; every rank the same. */
START_TEST(ulysses_work_is_the_lower_triangle_of_its_heads) {
    static const struct {
        int P;
        double work;
    } by_hand[] = {{2, 9600}, {4, 4800}};
    for (int k = 0; k < 2; k++) {
        const int P = by_hand[k].P;
        cp_case c = train_against_baseline(P, P, ulysses, 1);
        printf("ulysses cp %d, attention work per rank (score entries per step):", P);
        for (int i = 0; i < P; i++) printf(" %.0f", c.extra.ranks[i].attention_work);
        printf(" (by hand %.0f)\n", by_hand[k].work);
        for (int i = 0; i < P; i++)
            ck_assert(c.extra.ranks[i].attention_work == by_hand[k].work);
        ck_assert(c.extra.work_imbalance == 1.0);
    }
}
END_TEST

/* ---- the mesh ---------------------------------------------------------------------------- */

START_TEST(mesh_puts_cp_between_tp_and_dp) {
    const mesh_shape m = {.tp = 2, .cp = 2, .dp = 2, .pp = 2};
    ck_assert_int_eq(mesh_world(&m), 16);
    for (int rank = 0; rank < 16; rank++) {
        mesh_coord c = mesh_coord_of(&m, rank);
        ck_assert_int_eq(rank, c.tp + 2 * (c.cp + 2 * (c.dp + 2 * c.pp)));
        ck_assert_int_eq(mesh_rank_of(&m, c), rank);
    }
    int members[2];
    ck_assert_int_eq(mesh_group_members(&m, MESH_CP, 0, members), 2);
    ck_assert(members[0] == 0 && members[1] == 2);   /* stride t */
    mesh_group_members(&m, MESH_DP, 0, members);
    ck_assert(members[0] == 0 && members[1] == 4);   /* stride t x c */
    mesh_group_members(&m, MESH_PP, 0, members);
    ck_assert(members[0] == 0 && members[1] == 8);
    ck_assert_int_eq(mesh_group_count(&m, MESH_CP), 8);
    ck_assert_int_eq(mesh_group_index(&m, MESH_CP, 5), mesh_group_index(&m, MESH_CP, 7));
    printf("mesh tp 2 x cp 2 x dp 2 x pp 2: cp group of rank 0 = {0, 2}, dp {0, 4}, pp {0, 8}\n");
}
END_TEST

START_TEST(sizes_that_do_not_fit_are_refused) {
    run_config cfg = small_config(4, 1);
    char err[256];
    ck_assert(cp_check_sizes(&cfg, 4, 1, 4, &balanced, err, sizeof err));
    ck_assert(!cp_check_sizes(&cfg, 4, 1, 3, &ring, err, sizeof err));
    printf("refused: %s\n", err);
    cfg.model.ctx = 12;
    ck_assert(cp_check_sizes(&cfg, 4, 1, 4, &ring, err, sizeof err));
    ck_assert(!cp_check_sizes(&cfg, 4, 1, 4, &balanced, err, sizeof err));
    printf("refused: %s\n", err);
    ck_assert(strstr(err, "--ctx 12 does not split into 8 equal chunks"));
    cfg.model.ctx = 24;
    cfg.model.heads = 2;
    ck_assert(!cp_check_sizes(&cfg, 4, 1, 4, &ulysses, err, sizeof err));
    printf("refused: %s\n", err);
    ck_assert(strstr(err, "--cp 4 does not divide --heads 2"));
    cfg.model.heads = 4;
    cfg.comm.device = DEVICE_CUDA;
    ck_assert(!cp_check_sizes(&cfg, 4, 1, 4, &ring, err, sizeof err));
    printf("refused: %s\n", err);
}
END_TEST

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);   /* lines survive a failing (forked) test */
    Suite *suite = suite_create("cp");
    TCase *pieces = tcase_create("pieces");
    tcase_add_test(pieces, mesh_puts_cp_between_tp_and_dp);
    tcase_add_test(pieces, sizes_that_do_not_fit_are_refused);
    tcase_add_test(pieces, block_kinds_at_their_edges);
    suite_add_tcase(suite, pieces);
    TCase *training = tcase_create("training");
    tcase_set_timeout(training, 120);
    tcase_add_test(training, ring_cp1_is_the_baseline);
    tcase_add_test(training, ring_cp2_matches_the_baseline);
    tcase_add_test(training, ring_cp4_matches_the_baseline);
    tcase_add_test(training, balanced_ring_cp2_matches_the_baseline);
    tcase_add_test(training, balanced_ring_cp4_matches_the_baseline);
    tcase_add_test(training, ulysses_cp2_matches_the_baseline);
    tcase_add_test(training, ulysses_cp4_matches_the_baseline);
    tcase_add_test(training, balanced_ring_cp2_times_dp2_matches_the_baseline);
    tcase_add_test(training, ulysses_cp2_times_dp2_matches_the_baseline);
    tcase_add_test(training, balanced_ring_tp2_cp2_dp2_matches_the_baseline);
    tcase_add_test(training, ulysses_tp2_cp2_dp2_matches_the_baseline);
    tcase_add_test(training, pieces_of_one_position_match_the_baseline);
    tcase_add_test(training, ring_with_rendezvous_sends_does_not_deadlock);
    tcase_add_test(training, ring_without_the_diagonal_mask_fails);
    tcase_add_test(training, ring_with_a_stale_kv_block_in_backward_fails);
    tcase_add_test(training, balanced_split_evens_out_the_causal_work);
    tcase_add_test(training, ulysses_work_is_the_lower_triangle_of_its_heads);
    suite_add_tcase(suite, training);
    return check_run(suite, 0);
}
