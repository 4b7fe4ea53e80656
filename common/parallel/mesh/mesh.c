/* The mesh's arithmetic and communicators (mesh.h). */
#include "mesh.h"

#include <string.h>

const char *mesh_group_kind_name(mesh_group_kind kind) {
    static const char *const names[MESH_ALL_KINDS] = {
        "tp", "pp", "dp", "cp", "dp_shard", "dp_replicate", "dp_cp", "ep", "expert_dp",
        "dp_shard_cp"};
    return kind >= 0 && kind < MESH_ALL_KINDS ? names[kind] : "?";
}

int mesh_cp_size(const mesh_shape *m) { return m->cp > 0 ? m->cp : 1; }
int mesh_ep_size(const mesh_shape *m) { return m->ep > 0 ? m->ep : 1; }
int mesh_dp_shard_size(const mesh_shape *m) { return m->dp_shard > 0 ? m->dp_shard : m->dp; }
int mesh_dp_replicate_size(const mesh_shape *m) { return m->dp / mesh_dp_shard_size(m); }
int mesh_expert_dp_size(const mesh_shape *m) {
    return mesh_cp_size(m) * m->dp / mesh_ep_size(m);
}

int mesh_world(const mesh_shape *m) { return m->tp * mesh_cp_size(m) * m->pp * m->dp; }

/* A rank as digits in mixed radix, fastest first. The dense layers' axes are tp, cp,
 * dp_shard, dp_replicate, pp; the expert layers' tp, ep, expert_dp, pp (ep x expert_dp
 * is cp x dp flattened). A group is the ranks whose digits differ only on its axes
 * (the `along` bits). */
enum { MAX_AXES = 5 };
typedef struct {
    int n, size[MAX_AXES];
    unsigned along;
} axes;

static axes axes_of(const mesh_shape *m, mesh_group_kind kind) {
    const int t = m->tp, c = mesh_cp_size(m), d = m->dp, s = mesh_dp_shard_size(m);
    const int e = mesh_ep_size(m), p = m->pp;
    if (kind == MESH_EP || kind == MESH_EXPERT_DP)
        return (axes){4, {t, e, c * d / e, p}, kind == MESH_EP ? 1u << 1 : 1u << 2};
    static const unsigned along[MESH_ALL_KINDS] = {
        [MESH_TP] = 1u, [MESH_CP] = 2u, [MESH_DP_SHARD] = 4u, [MESH_DP_REPLICATE] = 8u,
        [MESH_DP] = 4u | 8u, [MESH_DP_CP] = 2u | 4u | 8u, [MESH_PP] = 16u,
        [MESH_DP_SHARD_CP] = 2u | 4u};
    return (axes){5, {t, c, s, d / s, p}, along[kind]};
}

static void digits_of(const axes *a, int rank, int at[MAX_AXES]) {
    for (int i = 0; i < a->n; i++) {
        at[i] = rank % a->size[i];
        rank /= a->size[i];
    }
}

static int rank_of_digits(const axes *a, const int at[MAX_AXES]) {
    int rank = 0;
    for (int i = a->n - 1; i >= 0; i--) rank = rank * a->size[i] + at[i];
    return rank;
}

/* The digits on (along) or off the group's axes as one number, fastest least. */
static int digits_number(const axes *a, const int at[MAX_AXES], int on) {
    int number = 0;
    for (int i = a->n - 1; i >= 0; i--)
        if ((int)(a->along >> i & 1u) == on) number = number * a->size[i] + at[i];
    return number;
}

mesh_coord mesh_coord_of(const mesh_shape *m, int rank) {
    const axes a = axes_of(m, MESH_TP);
    int at[MAX_AXES];
    digits_of(&a, rank, at);
    const int dp = at[2] + a.size[2] * at[3], j = at[1] + a.size[1] * dp;
    const int e = mesh_ep_size(m);
    return (mesh_coord){.tp = at[0], .cp = at[1], .dp = dp, .pp = at[4], .dp_shard = at[2],
                        .dp_replicate = at[3], .ep = j % e, .expert_dp = j / e};
}

int mesh_rank_of(const mesh_shape *m, mesh_coord c) {
    return c.tp + m->tp * (c.cp + mesh_cp_size(m) * (c.dp + m->dp * c.pp));
}

int mesh_group_index(const mesh_shape *m, mesh_group_kind kind, int rank) {
    const axes a = axes_of(m, kind);
    int at[MAX_AXES];
    digits_of(&a, rank, at);
    return digits_number(&a, at, 0);
}

int mesh_group_rank(const mesh_shape *m, mesh_group_kind kind, int rank) {
    const axes a = axes_of(m, kind);
    int at[MAX_AXES];
    digits_of(&a, rank, at);
    return digits_number(&a, at, 1);
}

int mesh_group_count(const mesh_shape *m, mesh_group_kind kind) {
    return mesh_world(m) / mesh_group_members(m, kind, 0, NULL);
}

int mesh_group_members(const mesh_shape *m, mesh_group_kind kind, int index, int *members) {
    const axes a = axes_of(m, kind);
    int at[MAX_AXES], size = 1;
    for (int i = 0; i < a.n; i++) {   /* the shared digits, from the index */
        if (a.along >> i & 1u) {
            size *= a.size[i];
            continue;
        }
        at[i] = index % a.size[i];
        index /= a.size[i];
    }
    for (int k = 0; members && k < size; k++) {
        int rest = k;
        for (int i = 0; i < a.n; i++)
            if (a.along >> i & 1u) {
                at[i] = rest % a.size[i];
                rest /= a.size[i];
            }
        members[k] = rank_of_digits(&a, at);
    }
    return size;
}

/* ---- communicators -------------------------------------------------------------- */

static comm *group_of(comm *world, const mesh_shape *s, mesh_group_kind kind) {
    const int rank = comm_rank(world);
    return comm_split(world, mesh_group_index(s, kind, rank), mesh_group_rank(s, kind, rank),
                      mesh_group_kind_name(kind));
}

void mesh_create(mesh *m, comm *world, mesh_shape shape) {
    const int rank = comm_rank(world);
    memset(m, 0, sizeof *m);
    m->shape = shape;
    m->world = world;
    m->me = mesh_coord_of(&shape, rank);
    m->tp = group_of(world, &shape, MESH_TP);
    m->dp = group_of(world, &shape, MESH_DP);
    m->pp = group_of(world, &shape, MESH_PP);
    m->cp = group_of(world, &shape, MESH_CP);
    const int at_an_end = m->me.pp == 0 || m->me.pp == shape.pp - 1;
    m->embedding = comm_split(world, shape.pp > 1 && at_an_end
                                         ? mesh_group_index(&shape, MESH_PP, rank) : -1,
                              m->me.pp, "embedding");
    m->dp_shard = group_of(world, &shape, MESH_DP_SHARD);
    m->dp_replicate = group_of(world, &shape, MESH_DP_REPLICATE);
    m->dp_cp = group_of(world, &shape, MESH_DP_CP);
    m->dp_shard_cp = group_of(world, &shape, MESH_DP_SHARD_CP);
    m->ep = group_of(world, &shape, MESH_EP);
    m->expert_dp = group_of(world, &shape, MESH_EXPERT_DP);
}

void mesh_single(mesh *m) {
    memset(m, 0, sizeof *m);
    m->shape = (mesh_shape){.tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1, .dp_shard = 1};
}

void mesh_free(mesh *m) {
    comm *groups[] = {m->tp, m->dp, m->pp, m->cp, m->embedding, m->dp_shard,
                      m->dp_replicate, m->dp_cp, m->dp_shard_cp, m->ep, m->expert_dp};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) comm_free(groups[i]);
    memset(m, 0, sizeof *m);
}
