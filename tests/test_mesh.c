/* The device mesh: Megatron-core's order (rank = tp + t (cp + c (dp + d pp)), dp =
 * shard + s replicate, expert layers ep + e expert_dp over cp x dp) for 16, 32 and 1024
 * ranks against lists written out by hand, the communicators mesh_create makes on 8
 * thread ranks, and each refusal of mesh_check with its reason. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "mesh.h"

static void assert_group(const mesh_shape *m, mesh_group_kind kind, int index,
                         const int *expected, int n) {
    int members[64];
    ck_assert_int_eq(mesh_group_members(m, kind, index, members), n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(members[i] == expected[i], "%s group %d: member %d is rank %d, not %d",
                      mesh_group_kind_name(kind), index, i, members[i], expected[i]);
}

START_TEST(sixteen_ranks_in_megatron_order) {
    const mesh_shape m = {.tp = 2, .pp = 4, .dp = 2};
    /* TP groups [0,1], [2,3], ...; DP groups [0,2], [1,3], [4,6], ...; PP groups
     * [0,4,8,12], [1,5,9,13], ... */
    for (int g = 0; g < 8; g++) assert_group(&m, MESH_TP, g, (int[]){2 * g, 2 * g + 1}, 2);
    assert_group(&m, MESH_DP, 0, (int[]){0, 2}, 2);
    assert_group(&m, MESH_DP, 1, (int[]){1, 3}, 2);
    assert_group(&m, MESH_DP, 2, (int[]){4, 6}, 2);
    assert_group(&m, MESH_DP, 3, (int[]){5, 7}, 2);
    assert_group(&m, MESH_PP, 0, (int[]){0, 4, 8, 12}, 4);
    assert_group(&m, MESH_PP, 1, (int[]){1, 5, 9, 13}, 4);
    assert_group(&m, MESH_PP, 2, (int[]){2, 6, 10, 14}, 4);
    assert_group(&m, MESH_PP, 3, (int[]){3, 7, 11, 15}, 4);
    for (int k = 0; k < MESH_KINDS; k++)
        ck_assert_int_eq(mesh_group_count(&m, k), 16 / (k == MESH_TP ? 2 : k == MESH_PP ? 4 : 2));
    printf("16 ranks, tp 2 x pp 4 x dp 2: TP [0,1],[2,3].. DP [0,2],[1,3],[4,6].. PP "
           "[0,4,8,12],[1,5,9,13].. as Megatron-LM lays them out\n");
}
END_TEST

/* ---- an independent reading of the layout ------------------------------------------ */

/* A rank's indices straight from the formula in the header, without the library:
 * [tp, cp, shard, replicate, pp, ep, expert_dp]. */
enum { AX_TP, AX_CP, AX_SHARD, AX_REPLICATE, AX_PP, AX_EP, AX_EXPERT_DP, AX_COUNT };
static void by_formula(const mesh_shape *m, int rank, int at[AX_COUNT]) {
    const int t = m->tp, c = m->cp > 0 ? m->cp : 1, d = m->dp;
    const int s = m->dp_shard > 0 ? m->dp_shard : d, e = m->ep > 0 ? m->ep : 1;
    at[AX_TP] = rank % t;
    at[AX_CP] = rank / t % c;
    const int dp = rank / (t * c) % d;
    at[AX_SHARD] = dp % s;
    at[AX_REPLICATE] = dp / s;
    at[AX_PP] = rank / (t * c * d);
    const int j = at[AX_CP] + c * dp;
    at[AX_EP] = j % e;
    at[AX_EXPERT_DP] = j / e;
}

/* Whether members is a group of `kind`: every member agrees with the first on the
 * indices the group does not span, and the members come in the order of the group's
 * own index (the fastest axis first), each once. */
static int group_is_sound(const mesh_shape *m, mesh_group_kind kind, const int *members,
                          int n) {
    static const unsigned spans[MESH_ALL_KINDS] = {
        [MESH_TP] = 1u << AX_TP, [MESH_CP] = 1u << AX_CP, [MESH_PP] = 1u << AX_PP,
        [MESH_DP] = 1u << AX_SHARD | 1u << AX_REPLICATE, [MESH_DP_SHARD] = 1u << AX_SHARD,
        [MESH_DP_REPLICATE] = 1u << AX_REPLICATE,
        [MESH_DP_CP] = 1u << AX_CP | 1u << AX_SHARD | 1u << AX_REPLICATE,
        [MESH_EP] = 1u << AX_EP, [MESH_EXPERT_DP] = 1u << AX_EXPERT_DP,
        [MESH_DP_SHARD_CP] = 1u << AX_CP | 1u << AX_SHARD};
    /* the expert layouts span ep or expert_dp and keep tp and pp; cp x dp is theirs */
    const unsigned fixed = kind == MESH_EP || kind == MESH_EXPERT_DP
                               ? (1u << AX_TP | 1u << AX_PP | 1u << AX_EP | 1u << AX_EXPERT_DP) &
                                     ~spans[kind]
                               : (1u << AX_TP | 1u << AX_CP | 1u << AX_SHARD |
                                  1u << AX_REPLICATE | 1u << AX_PP) & ~spans[kind];
    int first[AX_COUNT], at[AX_COUNT];
    by_formula(m, members[0], first);
    for (int i = 0; i < n; i++) {
        by_formula(m, members[i], at);
        for (int a = 0; a < AX_COUNT; a++)
            if ((fixed >> a & 1u) && at[a] != first[a]) return 0;
        if (i > 0 && members[i] <= members[i - 1]) return 0;   /* fastest axis first */
    }
    return 1;
}

START_TEST(every_rank_in_exactly_one_group_of_each_kind) {
    /* {tp, pp, dp, cp, ep, dp_shard} */
    const mesh_shape shapes[] = {{8, 16, 8, 1, 1, 8}, {1, 1, 1024, 1, 1, 1024}, {4, 8, 32, 1, 1, 32},
                                 {2, 1, 3, 1, 1, 3},  {2, 2, 4, 2, 4, 2},        {1, 1, 8, 1, 4, 8},
                                 {2, 1, 6, 2, 3, 3},  {4, 2, 8, 2, 16, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const mesh_shape *m = &shapes[s];
        const int world = mesh_world(m);
        for (int rank = 0; rank < world; rank++) {
            mesh_coord c = mesh_coord_of(m, rank);
            ck_assert_int_eq(rank, c.tp + m->tp * (c.cp + mesh_cp_size(m) * (c.dp + m->dp * c.pp)));
            ck_assert_int_eq(mesh_rank_of(m, c), rank);
        }
        for (int k = 0; k < MESH_ALL_KINDS; k++) {
            static int seen[1024];
            memset(seen, 0, sizeof seen);
            for (int g = 0; g < mesh_group_count(m, k); g++) {
                int members[1024];
                int n = mesh_group_members(m, k, g, members);
                for (int i = 0; i < n; i++) {
                    seen[members[i]]++;
                    ck_assert_int_eq(mesh_group_index(m, k, members[i]), g);
                    ck_assert_int_eq(mesh_group_rank(m, k, members[i]), i);
                }
                ck_assert_msg(group_is_sound(m, k, members, n), "%s group %d",
                              mesh_group_kind_name(k), g);
            }
            for (int rank = 0; rank < world; rank++) ck_assert_int_eq(seen[rank], 1);
        }
    }
}
END_TEST

/* 32 ranks, every dimension: tp 2, cp 2, dp 4 (2 shards x 2 replicas), pp 2, and EP 4
 * over cp x dp; the lists below are worked out by hand from the header's formulas:
 * rank = tp + 2 (cp + 2 (dp + 4 pp)), dp = shard + 2 replicate, j = cp + 2 dp,
 * ep = j % 4, expert_dp = j / 4. */
START_TEST(thirty_two_ranks_every_dimension_by_hand) {
    const mesh_shape m = {.tp = 2, .cp = 2, .dp = 4, .dp_shard = 2, .pp = 2, .ep = 4};
    ck_assert_int_eq(mesh_world(&m), 32);
    assert_group(&m, MESH_TP, 0, (int[]){0, 1}, 2);
    assert_group(&m, MESH_CP, 0, (int[]){0, 2}, 2);
    assert_group(&m, MESH_CP, 1, (int[]){1, 3}, 2);
    assert_group(&m, MESH_DP, 0, (int[]){0, 4, 8, 12}, 4);
    assert_group(&m, MESH_DP, 3, (int[]){3, 7, 11, 15}, 4);     /* tp 1, cp 1 */
    assert_group(&m, MESH_DP_SHARD, 0, (int[]){0, 4}, 2);
    assert_group(&m, MESH_DP_SHARD, 4, (int[]){8, 12}, 2);      /* replica 1 */
    assert_group(&m, MESH_DP_REPLICATE, 0, (int[]){0, 8}, 2);
    assert_group(&m, MESH_DP_REPLICATE, 4, (int[]){4, 12}, 2);  /* shard 1 */
    assert_group(&m, MESH_DP_CP, 0, (int[]){0, 2, 4, 6, 8, 10, 12, 14}, 8);
    assert_group(&m, MESH_DP_CP, 3, (int[]){17, 19, 21, 23, 25, 27, 29, 31}, 8);
    assert_group(&m, MESH_DP_SHARD_CP, 0, (int[]){0, 2, 4, 6}, 4);
    assert_group(&m, MESH_DP_SHARD_CP, 2, (int[]){8, 10, 12, 14}, 4);   /* replica 1 */
    assert_group(&m, MESH_PP, 0, (int[]){0, 16}, 2);
    assert_group(&m, MESH_EP, 0, (int[]){0, 2, 4, 6}, 4);
    assert_group(&m, MESH_EP, 2, (int[]){8, 10, 12, 14}, 4);    /* expert_dp 1 */
    assert_group(&m, MESH_EXPERT_DP, 0, (int[]){0, 8}, 2);
    assert_group(&m, MESH_EXPERT_DP, 2, (int[]){2, 10}, 2);     /* ep 1 */
    const int counts[MESH_ALL_KINDS] = {[MESH_TP] = 16, [MESH_PP] = 16, [MESH_DP] = 8,
                                        [MESH_CP] = 16, [MESH_DP_SHARD] = 16,
                                        [MESH_DP_REPLICATE] = 16, [MESH_DP_CP] = 4,
                                        [MESH_EP] = 8, [MESH_EXPERT_DP] = 16,
                                        [MESH_DP_SHARD_CP] = 8};
    for (int k = 0; k < MESH_ALL_KINDS; k++) ck_assert_int_eq(mesh_group_count(&m, k), counts[k]);
    /* rank 29 = 1 + 2 x 14, 14 = 0 + 2 x 7, 7 = 3 + 4 x 1: dp 3 = shard 1 + 2 x 1;
     * j = 0 + 2 x 3 = 6: ep 2, expert_dp 1 */
    const mesh_coord c = mesh_coord_of(&m, 29);
    const int got[8] = {c.tp, c.cp, c.dp, c.pp, c.dp_shard, c.dp_replicate, c.ep, c.expert_dp};
    const int want[8] = {1, 0, 3, 1, 1, 1, 2, 1};
    for (int i = 0; i < 8; i++) ck_assert_int_eq(got[i], want[i]);
    ck_assert_int_eq(mesh_rank_of(&m, c), 29);
    /* negative control: a DP group read with the 3D stride (t, not t x c) is refused by
     * the independent check that the partition test relies on */
    ck_assert(group_is_sound(&m, MESH_DP, (int[]){0, 4, 8, 12}, 4));
    ck_assert(!group_is_sound(&m, MESH_DP, (int[]){0, 2, 4, 6}, 4));
    printf("32 ranks, tp 2 x cp 2 x dp 4 (2 x 2) x pp 2, ep 4: every list as by hand; a DP"
           " group of stride t (0,2,4,6) refused\n");
}
END_TEST

/* On thread ranks: every communicator of mesh_create holds the ranks of its group, in
 * group order. */
static int ranks_agree(comm *world, void *arg) {
    const mesh_shape shape = *(const mesh_shape *)arg;
    mesh m;
    mesh_create(&m, world, shape);
    const int rank = comm_rank(world);
    comm *groups[MESH_ALL_KINDS] = {
        [MESH_TP] = m.tp, [MESH_PP] = m.pp, [MESH_DP] = m.dp, [MESH_CP] = m.cp,
        [MESH_DP_SHARD] = m.dp_shard, [MESH_DP_REPLICATE] = m.dp_replicate,
        [MESH_DP_CP] = m.dp_cp, [MESH_EP] = m.ep, [MESH_EXPERT_DP] = m.expert_dp,
        [MESH_DP_SHARD_CP] = m.dp_shard_cp};
    for (int k = 0; k < MESH_ALL_KINDS; k++) {
        int members[8], world_ranks[8];
        int n = mesh_group_members(&shape, k, mesh_group_index(&shape, k, rank), members);
        if (comm_size(groups[k]) != n) comm_abort(world, "%s group size", mesh_group_kind_name(k));
        int mine = comm_world_rank(groups[k]);
        comm_allgather(groups[k], &mine, world_ranks, (size_t)n, COMM_F32);
        for (int i = 0; i < n; i++)
            if (world_ranks[i] != members[i])
                comm_abort(world, "%s group member %d is %d, not %d",
                           mesh_group_kind_name(k), i, world_ranks[i], members[i]);
    }
    /* the embedding group: the first and the last stage of my pipeline */
    const int at_an_end = shape.pp > 1 && (m.me.pp == 0 || m.me.pp == shape.pp - 1);
    if (at_an_end != (m.embedding != NULL)) comm_abort(world, "embedding group membership");
    mesh_free(&m);
    return 0;
}

START_TEST(communicators_follow_the_layout) {
    comm_options co = comm_options_default();
    co.ranks = 8;
    mesh_shape three_d = {.tp = 2, .pp = 2, .dp = 2};
    mesh_shape every = {.tp = 2, .pp = 1, .dp = 2, .cp = 2, .ep = 2, .dp_shard = 1};
    ck_assert_int_eq(launch(&co, ranks_agree, &three_d), 0);
    ck_assert_int_eq(launch(&co, ranks_agree, &every), 0);
}
END_TEST

/* mesh_check: each refusal by its reason, and meshes that fit pass. */
START_TEST(meshes_that_do_not_fit_are_refused_with_their_reason) {
    char err[512];
    const struct {
        mesh_config c;
        const char *reason;   /* NULL: fits */
    } cases[] = {
        {{.shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1}, .world = 8}, NULL},
        {{.shape = {.tp = 2, .pp = 2, .dp = 2}, .world = 8}, NULL},
        {{.shape = {.tp = 1, .pp = 1, .cp = 4}, .world = 8}, NULL},
        {{.shape = {.tp = 1, .pp = 1, .dp = 8, .ep = 4}, .world = 8, .experts = 8}, NULL},
        {{.shape = {.tp = 2, .pp = 2, .dp = 4, .cp = 2, .ep = 4, .dp_shard = 2}, .world = 32}, NULL},
        {{.shape = {.tp = 2, .pp = 2, .dp = 2, .cp = 1}, .world = 6}, "--tp 2 --pp 2 --dp 2 needs 8 ranks, not 6; with that many ranks try "},
        {{.shape = {.tp = 0, .pp = 2, .dp = 2, .cp = 1}, .world = 4}, "--tp 0 --pp 2 --dp 2: every size must be at least 1; try "},
        {{.shape = {.tp = 2, .pp = 1, .dp = 2, .cp = 2}, .world = 16}, "--tp 2 --cp 2 --dp 2 --pp 1 needs 8 ranks, not 16"},
        {{.shape = {.tp = 1, .pp = 1, .cp = 3}, .world = 4}, "--cp 3 does not divide the 4 ranks (ranks = cp x dp)"},
        {{.shape = {.tp = 2, .pp = 1, .cp = 3}, .world = 8}, "--cp 3 x --tp does not divide the 8 ranks (ranks = tp x cp x dp)"},
        {{.shape = {.tp = 1, .pp = 1, .cp = 0}, .world = 4}, "--cp 0 does not divide the 4 ranks"},
        {{.shape = {.tp = 1, .pp = 1, .dp = 6, .dp_shard = 4}, .world = 6}, "--dp-shard 4 does not divide --dp 6 (dp = dp_replicate x dp_shard: try a divisor of 6)"},
        {{.shape = {.tp = 1, .pp = 1, .dp = 6, .ep = 4}, .world = 6}, "--ep 4 does not divide the 6 ranks of dp x cp"},
        {{.shape = {.tp = 1, .pp = 1, .dp = 6, .ep = 3}, .world = 6, .experts = 4}, "EP 3 does not divide --experts 4"},
        {{.shape = {.tp = 2, .pp = 1, .dp = 2, .ep = 2}, .world = 4, .experts = 4}, NULL},
        {{.shape = {.tp = 1, .pp = 1, .dp = 2, .cp = 2, .ep = 2}, .world = 4}, NULL},   /* EP x CP: ep carved from dp x cp */
        {{.shape = {.tp = 1, .pp = 2, .dp = 2, .ep = 2}, .world = 4}, NULL},   /* EP x PP: every stage's ep */
        {{.shape = {.tp = 1, .pp = 2, .dp = 1, .cp = 2}, .world = 4}, NULL},   /* one micro-batch: parallelize_check */
        {{.shape = {.tp = 1, .pp = 1, .dp = 4, .dp_shard = 2}, .world = 4}, NULL},   /* HSDP trains (test_parallelize) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = mesh_check(&cases[i].c, err, sizeof err);
        printf("case %zu: %s\n", i, got ? got : "fits");
        if (!cases[i].reason) ck_assert_msg(got == NULL, "case %zu: %s", i, got);
        else ck_assert_msg(got && strstr(got, cases[i].reason) == got, "case %zu: %s", i,
                           got ? got : "fits");
    }
    /* the suggestions fit the world */
    mesh_check(&cases[5].c, err, sizeof err);
    ck_assert_msg(strstr(err, "--tp 2 --pp 3 --dp 1") || strstr(err, "--tp 2 --pp 1 --dp 3"),
                  "no fitting suggestion in: %s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mesh");
    TCase *tc = tcase_create("mesh");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, sixteen_ranks_in_megatron_order);
    tcase_add_test(tc, every_rank_in_exactly_one_group_of_each_kind);
    tcase_add_test(tc, communicators_follow_the_layout);
    tcase_add_test(tc, thirty_two_ranks_every_dimension_by_hand);
    tcase_add_test(tc, meshes_that_do_not_fit_are_refused_with_their_reason);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
