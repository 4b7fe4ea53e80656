#include "mesh_table.h"

#include <stdio.h>
#include <stdlib.h>

static void print_group(const mesh_shape *m, mesh_group_kind kind, int index, int *members) {
    const int n = mesh_group_members(m, kind, index, members);
    printf("[");
    for (int i = 0; i < n; i++) {
        if (n > 8 && i == 3) {
            printf(", ...");
            i = n - 2;
            continue;
        }
        printf("%s%d", i ? "," : "", members[i]);
    }
    printf("]");
}

/* Groups of one kind: all when few, else the first three and the last. */
static void print_groups(const mesh_shape *m, mesh_group_kind kind, int *members) {
    const int count = mesh_group_count(m, kind);
    printf("  %s groups (%d of %d ranks): ", mesh_group_kind_name(kind), count,
           mesh_world(m) / count);
    for (int g = 0; g < count; g++) {
        if (count > 8 && g == 3) {
            printf(" ...");
            g = count - 2;
            continue;
        }
        printf("%s", g ? " " : "");
        print_group(m, kind, g, members);
    }
    printf("\n");
}

void print_mesh(mesh_shape shape) {
    const int W = mesh_world(&shape);
    int *members = malloc(sizeof(int) * (size_t)W);
    printf("The mesh: tp %d x pp %d x dp %d = %d ranks, in Megatron-LM's order"
           " rank = tp + t x (dp + d x pp)\n", shape.tp, shape.pp, shape.dp, W);
    if (W <= 32) {   /* rank -> (tp, pp, dp), as digits: 101 is tp 1, pp 0, dp 1 */
        printf("  %-12s", "rank");
        for (int r = 0; r < W; r++) printf(" %3d", r);
        printf("\n  %-12s", "(tp pp dp)");
        for (int r = 0; r < W; r++) {
            mesh_coord c = mesh_coord_of(&shape, r);
            printf(" %d%d%d", c.tp, c.pp, c.dp);
        }
        printf("\n");
    }
    for (int k = 0; k < MESH_KINDS; k++) print_groups(&shape, k, members);
    if (shape.pp > 1) {
        printf("  embedding groups (first and last stage of each pipeline):");
        for (int g = 0; g < mesh_group_count(&shape, MESH_PP) && g < 8; g++) {
            const int n = mesh_group_members(&shape, MESH_PP, g, members);
            printf(" [%d,%d]", members[0], members[n - 1]);
        }
        printf("%s\n", mesh_group_count(&shape, MESH_PP) > 8 ? " ..." : "");
    }
    printf("  TP is innermost: its all-reduces run in every layer of every micro-batch, so its"
           " ranks must be neighbours on the fastest links (one node, NVLink); pipeline"
           " stages, which pass one activation per micro-batch, are outermost\n\n");
    free(members);
}

/* ---- --mesh-only ---------------------------------------------------------------------- */

/* Every check of the layout; prints each failure, returns how many. */
static int check_layout(const mesh_shape *m) {
    const int W = mesh_world(m);
    int *seen = calloc((size_t)W, sizeof(int)), *members = malloc(sizeof(int) * (size_t)W);
    int failures = 0;
    for (int r = 0; r < W; r++) {
        const mesh_coord c = mesh_coord_of(m, r);
        if (c.tp + m->tp * (c.dp + m->dp * c.pp) != r || mesh_rank_of(m, c) != r) {
            printf("  FAILED: rank %d is not tp + t (dp + d pp)\n", r);
            failures++;
        }
    }
    for (int k = 0; k < MESH_KINDS; k++) {
        for (int r = 0; r < W; r++) seen[r] = 0;
        for (int g = 0; g < mesh_group_count(m, k); g++) {
            const int n = mesh_group_members(m, k, g, members);
            for (int i = 0; i < n; i++) {
                seen[members[i]]++;
                /* TP groups are runs of consecutive ranks */
                if (k == MESH_TP && members[i] != members[0] + i) failures++;
            }
        }
        for (int r = 0; r < W; r++)
            if (seen[r] != 1) {
                printf("  FAILED: rank %d is in %d %s groups\n", r, seen[r],
                       mesh_group_kind_name(k));
                failures++;
            }
    }
    free(seen);
    free(members);
    return failures;
}

static void print_json(const mesh_shape *m) {
    const int W = mesh_world(m);
    int *members = malloc(sizeof(int) * (size_t)W);
    printf("{\"world\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d,\n \"ranks\": [", W, m->tp, m->pp,
           m->dp);
    for (int r = 0; r < W; r++) {
        const mesh_coord c = mesh_coord_of(m, r);
        printf("%s{\"rank\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d}", r ? ", " : "", r, c.tp,
               c.pp, c.dp);
    }
    printf("],\n \"groups\": {");
    for (int k = 0; k < MESH_KINDS; k++) {
        printf("%s\"%s\": [", k ? ", " : "", mesh_group_kind_name(k));
        for (int g = 0; g < mesh_group_count(m, k); g++) {
            const int n = mesh_group_members(m, k, g, members);
            printf("%s[", g ? ", " : "");
            for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", members[i]);
            printf("]");
        }
        printf("]");
    }
    printf("}}\n");
    free(members);
}

int mesh_only(mesh_shape shape, int json) {
    const int failures = check_layout(&shape);
    if (json) {
        print_json(&shape);
        return failures ? 1 : 0;
    }
    print_mesh(shape);
    printf("checked: every rank is tp + t (dp + d pp); each rank in exactly one TP, PP and"
           " DP group; TP groups are consecutive ranks -> %s\n", failures ? "FAILED" : "yes");
    return failures ? 1 : 0;
}

/* ---- the course's examples ----------------------------------------------------------------- */

static void example(const char *what, mesh_shape m, int gpus_per_node) {
    const int W = mesh_world(&m);
    printf("%s\n  tp %d x pp %d x dp %d = %d GPUs", what, m.tp, m.pp, m.dp, W);
    if (gpus_per_node > 0)
        printf(" = %d nodes of %d; a TP group is one node (ranks %d-%d: NVLink), a"
               " pipeline spans %d nodes, a model replica %d GPUs", W / gpus_per_node,
               gpus_per_node, 0, m.tp - 1, m.pp * m.tp / gpus_per_node, m.tp * m.pp);
    printf("\n");
    int *members = malloc(sizeof(int) * (size_t)W);
    for (int k = 0; k < MESH_KINDS; k++) print_groups(&m, k, members);
    free(members);
    printf("  layout checked -> %s\n\n", check_layout(&m) ? "FAILED" : "yes");
}

void print_examples(void) {
    example("GPT-3 175B on 1024 GPUs, as the course text gives it:", (mesh_shape){.tp = 8, .pp = 16, .dp = 8, .cp = 1}, 8);
    printf("MT-NLG 530B. The course text: TP 8 x PP 35 x DP 2 on 560 A100s. The arithmetic"
           " holds (8 x 35 x 2 = 560),\n  but it is not the published run: Smith et al."
           " (2022) used 8-way tensor and 35-way pipeline parallelism, i.e. 280 GPUs per"
           " model replica,\n  with data parallelism 8 to 12 in its runs (2240 to 3360"
           " A100s); 560 is the number of DGX A100 nodes of Selene, the machine it ran on.\n\n");
    example("MT-NLG 530B as published (at its smallest data parallelism):",
            (mesh_shape){.tp = 8, .pp = 35, .dp = 8, .cp = 1}, 8);
    example("MT-NLG 530B as the course text writes it:", (mesh_shape){.tp = 8, .pp = 35, .dp = 2, .cp = 1}, 8);
}
