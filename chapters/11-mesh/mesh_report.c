/* Chapter 11's tables: the mesh in rank order, bytes per group and memory per rank,
 * each next to its formula (mesh_chapter.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_chapter.h"
#include "report.h"

/* The dense layers' axes, fastest first, then the expert layers' (mesh.h). */
static const mesh_group_kind layout_kinds[] = {MESH_TP,          MESH_CP,      MESH_DP_SHARD,
                                               MESH_DP_REPLICATE, MESH_PP,     MESH_DP_CP,
                                               MESH_DP_SHARD_CP, MESH_EP,      MESH_EXPERT_DP};
enum { LAYOUT_KINDS = sizeof layout_kinds / sizeof layout_kinds[0] };

static void print_groups(const mesh_shape *s) {
    printf("\n  %-12s %6s %7s   first group (ranks)\n", "group", "size", "groups");
    for (int i = 0; i < LAYOUT_KINDS; i++) {
        const mesh_group_kind k = layout_kinds[i];
        int *members = malloc((size_t)mesh_world(s) * sizeof(int));
        const int n = mesh_group_members(s, k, 0, members);
        printf("  %-12s %6d %7d   ", mesh_group_kind_name(k), n, mesh_group_count(s, k));
        for (int j = 0; j < n && j < 16; j++) printf("%s%d", j ? " " : "", members[j]);
        printf("%s\n", n > 16 ? " ..." : "");
        free(members);
    }
}

void mesh_print_layout(const mesh_shape *s) {
    const int world = mesh_world(s);
    printf("\nThe mesh in rank order (tp fastest, then cp, dp_shard, dp_replicate, pp;"
           " expert layers: ep and expert_dp over cp x dp)\n");
    printf("  %5s %3s %3s %8s %12s %3s | %3s %9s\n", "rank", "tp", "cp", "dp_shard",
           "dp_replicate", "pp", "ep", "expert_dp");
    for (int w = 0; w < world; w++) {
        if (world > 40 && w == 32) {
            printf("  ...\n");
            w = world - 4;
        }
        const mesh_coord c = mesh_coord_of(s, w);
        printf("  %5d %3d %3d %8d %12d %3d | %3d %9d\n", w, c.tp, c.cp, c.dp_shard,
               c.dp_replicate, c.pp, c.ep, c.expert_dp);
    }
    print_groups(s);
}

void mesh_print_only(const mesh_shape *s, int json) {
    if (!json) {
        printf("Mesh of %d ranks: tp %d x cp %d x dp %d (dp_shard %d x dp_replicate %d) x pp"
               " %d, ep %d\n", mesh_world(s), s->tp, mesh_cp_size(s), s->dp,
               mesh_dp_shard_size(s), mesh_dp_replicate_size(s), s->pp, mesh_ep_size(s));
        mesh_print_layout(s);
        return;
    }
    printf("{\"world\": %d, \"tp\": %d, \"cp\": %d, \"dp\": %d, \"dp_shard\": %d, "
           "\"dp_replicate\": %d, \"pp\": %d, \"ep\": %d, \"groups\": {", mesh_world(s), s->tp,
           mesh_cp_size(s), s->dp, mesh_dp_shard_size(s), mesh_dp_replicate_size(s), s->pp,
           mesh_ep_size(s));
    for (int i = 0; i < LAYOUT_KINDS; i++) {
        const mesh_group_kind k = layout_kinds[i];
        printf("%s\"%s\": {\"size\": %d, \"count\": %d}", i ? ", " : "", mesh_group_kind_name(k),
               mesh_group_members(s, k, 0, NULL), mesh_group_count(s, k));
    }
    printf("}}\n");
}

/* What each kind moves, for the table's last column. */
static const char *const what_moves[PIPELINE_ALL_KINDS] = {
    "TP's all-reduces (SP: all-gathers and reduce-scatters) of the rows",
    "activations forward and gradients back between stages",
    "gradients over dp x cp (ZeRO: reduce-scatter + all-gather over dp_shard x cp)",
    "the tied embedding's gradient, first and last stage",
    "ring: K/V blocks round the cp ranks; Ulysses: all-to-alls",
    "HSDP: each reduced gradient piece all-reduced across the replicas",
    "MoE: the experts' gradients over the ranks holding the same experts (ZeRO: sharded"
    " there)"};

void mesh_print_bytes(const mesh_extra *x, int world) {
    char a[32], b[32];
    printf("\nBytes each rank sends per step, by group (measured / formula)\n  %5s", "rank");
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++)
        printf(" %23s", pipeline_group_kind_name(k));
    printf("\n");
    for (int w = 0; w < world; w++) {
        if (world > 16 && w == 8) {
            printf("  ...\n");
            w = world - 2;
        }
        const mesh_rank_traffic *t = &x->ranks[w];
        printf("  %5d", w);
        for (int k = 0; k < PIPELINE_ALL_KINDS; k++)
            printf(" %11s/%-11s", report_bytes(t->bytes[k], a), report_bytes(t->formula[k], b));
        printf("\n");
    }
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++)
        printf("  %-13s %s\n", pipeline_group_kind_name(k), what_moves[k]);
    printf("  largest |measured / formula - 1| over all ranks and groups: %.1e\n",
           x->worst_bytes_error);
    if (x->shape.ep < 2) return;
    double most = 0;
    for (int w = 0; w < world; w++) most = fmax(most, x->ranks[w].alltoall);
    printf("  ep            MoE's all-to-alls (dispatch and combine, forward and backward):"
           " %s a rank at most, the rows its routing sent to other ranks to %.0f B\n",
           report_bytes(most, a), x->alltoall_mismatch);
}

/* MoE: rank 0's routers and experts as ZeRO shards them (moe_params.h), next to
 * what it would hold whole; part of the table's formula. */
static void print_moe_state(const mesh_extra *x, const run_config *cfg) {
    const mesh_shape *s = &x->shape;
    if (x->opts.moe.experts <= 0) return;
    const int zero = s->dp * mesh_cp_size(s) > 1 ? x->opts.zero_stage : 0;
    const moe_shape ms = moe_shape_make(&x->opts.moe, &cfg->model, mesh_ep_size(s), 0);
    int group, group_rank, replicas;
    parallel_grads_groups(s, 0, zero, &group, &group_rank, &replicas);
    const size_t routers = moe_router_numel(&ms), experts = moe_local_experts_numel(&ms);
    const int expert_dp = mesh_expert_dp_size(s);
    double held[3] = {0}, whole[3] = {0};
    moe_vector_state_bytes(routers, zero, group, group_rank, held);
    moe_vector_state_bytes(experts, zero, expert_dp, 0, held);
    moe_vector_state_bytes(routers + experts, 0, 1, 0, whole);
    char h[3][32], w[3][32];
    for (int i = 0; i < 3; i++) report_bytes(held[i], h[i]), report_bytes(whole[i], w[i]);
    printf("  of which MoE on rank 0 (fp32 masters, ZeRO-%d: the routers' %zu floats on %d"
           " rank%s, its experts' %zu on expert_dp's %d): params %s, grads %s,"
           " optimizer %s (unsharded: %s, %s, %s)\n", zero, routers, group,
           group == 1 ? "" : "s", experts, expert_dp, h[0], h[1], h[2], w[0], w[1], w[2]);
}

void mesh_print_memory(const mesh_extra *x, int world, const run_config *cfg) {
    char s[6][32], act[32];
    printf("\nModel state per rank by tag, measured | formula (dp_grads_state_bytes: ZeRO-%d"
           " over dp_shard x cp, %s compute weights, %s gradients, fp32 optimizer%s)\n",
           x->opts.zero_stage, precision_name(cfg->precision),
           precision_name(cfg->grad_precision),
           x->opts.moe.experts > 0 ? "; MoE: moe_vector_state_bytes, the experts over expert_dp"
                                   : "");
    printf("  %5s %10s %10s %10s | %10s %10s %10s %12s\n", "rank", "params", "grads",
           "optimizer", "params", "grads", "optimizer", "activations");
    for (int w = 0; w < world; w++) {
        if (world > 16 && w == 8) {
            printf("  ...\n");
            w = world - 2;
        }
        const mesh_rank_traffic *t = &x->ranks[w];
        for (int i = 0; i < 3; i++) {
            report_bytes(t->state[i], s[i]);
            report_bytes(t->state_formula[i], s[3 + i]);
        }
        printf("  %5d %10s %10s %10s | %10s %10s %10s %12s\n", w, s[0], s[1], s[2], s[3],
               s[4], s[5], report_bytes(t->activations, act));
    }
    print_moe_state(x, cfg);
}

/* , "state_largest_per_tag": {...}: each tag's largest over the ranks (what a planner's
 * "the GPU that holds the most" is held against) */
static void mesh_json_largest_state(const mesh_extra *x, int world, char *s, size_t room) {
    double most[4] = {0}, peak[3] = {0};
    for (int w = 0; w < world; w++) {
        for (int i = 0; i < 3; i++) most[i] = fmax(most[i], x->ranks[w].state[i]);
        for (int i = 0; i < 3; i++) peak[i] = fmax(peak[i], x->ranks[w].state_peak[i]);
        most[3] = fmax(most[3], x->ranks[w].activations);
    }
    snprintf(s, room, ", \"state_largest_per_tag\": {\"params\": %.0f, \"grads\": %.0f, "
             "\"optimizer\": %.0f, \"activations\": %.0f}, \"state_peak_largest_per_tag\": "
             "{\"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f}", most[0], most[1],
             most[2], most[3], peak[0], peak[1], peak[2]);
}

char *mesh_json(const mesh_extra *x, int world, const mesh_args *a) {
    double largest[PIPELINE_ALL_KINDS] = {0}, formula[PIPELINE_ALL_KINDS] = {0};
    int state_equal = 1;
    for (int w = 0; w < world; w++) {
        for (int k = 0; k < PIPELINE_ALL_KINDS; k++)
            if (x->ranks[w].bytes[k] >= largest[k])
                largest[k] = x->ranks[w].bytes[k], formula[k] = x->ranks[w].formula[k];
        for (int i = 0; i < 3; i++)
            state_equal &= x->ranks[w].state[i] == x->ranks[w].state_formula[i];
    }
    const size_t room = 2048;
    char *s = malloc(room);
    int n = snprintf(s, room, "\"mesh\": {\"tp\": %d, \"sp\": %d, \"cp\": %d, \"dp_shard\": "
                     "%d, \"dp_replicate\": %d, \"pp\": %d, \"ep\": %d}, \"schedule\": \"%s\", "
                     "\"micro\": %d, \"zero\": %d, \"bytes_per_group_kind\": {",
                     x->shape.tp, a->sp, mesh_cp_size(&x->shape), mesh_dp_shard_size(&x->shape),
                     mesh_dp_replicate_size(&x->shape), x->shape.pp, mesh_ep_size(&x->shape),
                     pp_schedule_name(x->opts.schedule), x->opts.micro, x->opts.zero_stage);
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++)
        n += snprintf(s + n, room - n, "%s\"%s\": %.0f", k ? ", " : "",
                      pipeline_group_kind_name(k), largest[k]);
    n += snprintf(s + n, room - n, "}, \"bytes_formula_per_group_kind\": {");
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++)
        n += snprintf(s + n, room - n, "%s\"%s\": %.0f", k ? ", " : "",
                      pipeline_group_kind_name(k), formula[k]);
    n += snprintf(s + n, room - n, "}, \"worst_bytes_error\": %g, \"state_equals_formula\": %s",
                  x->worst_bytes_error, state_equal ? "true" : "false");
    mesh_json_largest_state(x, world, s + n, room - n);
    return s;
}
