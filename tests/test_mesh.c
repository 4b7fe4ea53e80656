/* The device mesh: Megatron-LM's order (rank = tp + t * (dp + d * pp)) for 16 and 1024
 * ranks, the communicators mesh_create makes on 8 thread ranks, and meshes that do not
 * multiply to the world size refused with sizes that would fit. */
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

START_TEST(every_rank_in_exactly_one_group_of_each_kind) {
    const mesh_shape shapes[] = {{8, 16, 8, 1}, {1, 1, 1024, 1}, {4, 8, 32, 1}, {2, 1, 3, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const mesh_shape *m = &shapes[s];
        const int world = mesh_world(m);
        for (int rank = 0; rank < world; rank++) {
            mesh_coord c = mesh_coord_of(m, rank);
            ck_assert_int_eq(rank, c.tp + m->tp * (c.dp + m->dp * c.pp));
            ck_assert_int_eq(mesh_rank_of(m, c), rank);
        }
        for (int k = 0; k < MESH_KINDS; k++) {
            static int seen[1024];
            memset(seen, 0, sizeof seen);
            for (int g = 0; g < mesh_group_count(m, k); g++) {
                int members[1024];
                int n = mesh_group_members(m, k, g, members);
                for (int i = 0; i < n; i++) {
                    seen[members[i]]++;
                    ck_assert_int_eq(mesh_group_index(m, k, members[i]), g);
                }
            }
            for (int rank = 0; rank < world; rank++) ck_assert_int_eq(seen[rank], 1);
        }
    }
}
END_TEST

static int ranks_agree(comm *world, void *arg) {
    (void)arg;
    const mesh_shape shape = {.tp = 2, .pp = 2, .dp = 2};
    mesh m;
    mesh_create(&m, world, shape);
    const int rank = comm_rank(world);
    comm *groups[MESH_KINDS] = {m.tp, m.pp, m.dp};
    for (int k = 0; k < MESH_KINDS; k++) {
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
    const int at_an_end = m.me.pp == 0 || m.me.pp == shape.pp - 1;
    if (at_an_end != (m.embedding != NULL)) comm_abort(world, "embedding group membership");
    mesh_free(&m);
    return 0;
}

START_TEST(communicators_follow_the_layout) {
    comm_options co = comm_options_default();
    co.ranks = 8;
    ck_assert_int_eq(launch(&co, ranks_agree, NULL), 0);
}
END_TEST

START_TEST(meshes_that_do_not_multiply_are_refused) {
    char err[256];
    ck_assert(mesh_check(&(mesh_shape){2, 2, 2, 1}, 8, NULL, NULL, err, sizeof err));
    ck_assert(!mesh_check(&(mesh_shape){2, 2, 2, 1}, 6, NULL, NULL, err, sizeof err));
    printf("refused: %s\n", err);
    ck_assert_msg(strstr(err, "needs 8 ranks, not 6"), "%s", err);
    ck_assert_msg(strstr(err, "--tp 2 --pp 3 --dp 1") || strstr(err, "--tp 2 --pp 1 --dp 3"),
                  "no fitting suggestion in: %s", err);
    ck_assert(!mesh_check(&(mesh_shape){0, 2, 2, 1}, 4, NULL, NULL, err, sizeof err));
    ck_assert_msg(strstr(err, "at least 1"), "%s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mesh");
    TCase *tc = tcase_create("mesh");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, sixteen_ranks_in_megatron_order);
    tcase_add_test(tc, every_rank_in_exactly_one_group_of_each_kind);
    tcase_add_test(tc, communicators_follow_the_layout);
    tcase_add_test(tc, meshes_that_do_not_multiply_are_refused);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
