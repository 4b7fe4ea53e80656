#include "mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mesh_group_kind_name(mesh_group_kind kind) {
    static const char *const names[MESH_ALL_KINDS] = {"tp", "pp", "dp", "cp"};
    return kind >= 0 && kind < MESH_ALL_KINDS ? names[kind] : "?";
}

int mesh_cp_size(const mesh_shape *m) { return m->cp > 0 ? m->cp : 1; }

int mesh_world(const mesh_shape *m) { return m->tp * mesh_cp_size(m) * m->pp * m->dp; }

mesh_coord mesh_coord_of(const mesh_shape *m, int rank) {
    const int c = mesh_cp_size(m);
    return (mesh_coord){.tp = rank % m->tp, .cp = rank / m->tp % c,
                        .dp = rank / (m->tp * c) % m->dp, .pp = rank / (m->tp * c * m->dp)};
}

int mesh_rank_of(const mesh_shape *m, mesh_coord c) {
    return c.tp + m->tp * (c.cp + mesh_cp_size(m) * (c.dp + m->dp * c.pp));
}

/* The sizes and a rank's coordinates as arrays in mesh order (fastest first: tp, cp,
 * dp, pp), so that a group is "every coordinate but one fixed". */
enum { AXES = 4 };
static const mesh_group_kind axis_kind[AXES] = {MESH_TP, MESH_CP, MESH_DP, MESH_PP};

static void sizes_of(const mesh_shape *m, int size[AXES]) {
    size[0] = m->tp, size[1] = mesh_cp_size(m), size[2] = m->dp, size[3] = m->pp;
}

static void coords_of(mesh_coord c, int at[AXES]) {
    at[0] = c.tp, at[1] = c.cp, at[2] = c.dp, at[3] = c.pp;
}

static int axis_of(mesh_group_kind kind) {
    for (int a = 0; a < AXES; a++)
        if (axis_kind[a] == kind) return a;
    return AXES - 1;
}

/* A group is named by the coordinates its members share, in mesh order. */
int mesh_group_index(const mesh_shape *m, mesh_group_kind kind, int rank) {
    int size[AXES], at[AXES], index = 0;
    sizes_of(m, size);
    coords_of(mesh_coord_of(m, rank), at);
    for (int a = AXES - 1; a >= 0; a--)
        if (a != axis_of(kind)) index = index * size[a] + at[a];
    return index;
}

int mesh_group_count(const mesh_shape *m, mesh_group_kind kind) {
    return mesh_world(m) / (mesh_group_members(m, kind, 0, NULL));
}

int mesh_group_members(const mesh_shape *m, mesh_group_kind kind, int index, int *members) {
    int size[AXES], at[AXES];
    sizes_of(m, size);
    const int along = axis_of(kind);
    for (int a = 0; a < AXES; a++) {   /* the shared coordinates, from the index */
        if (a == along) continue;
        at[a] = index % size[a];
        index /= size[a];
    }
    for (int i = 0; members && i < size[along]; i++) {
        at[along] = i;
        members[i] = mesh_rank_of(m, (mesh_coord){.tp = at[0], .cp = at[1], .dp = at[2],
                                                  .pp = at[3]});
    }
    return size[along];
}

/* ---- checking ------------------------------------------------------------------- */

/* How far a mesh is from the one asked for: sizes kept count most, and the TP size
 * (bound by the model's heads and the node) is the last one to change, then PP. */
static int distance(const mesh_shape *a, const mesh_shape *b) {
    return 5 * (a->tp != b->tp) + 4 * (a->pp != b->pp) + 3 * (a->dp != b->dp) +
           abs(a->tp - b->tp) + abs(a->pp - b->pp) + abs(a->dp - b->dp);
}

void mesh_suggest(const mesh_shape *want, int world, mesh_fits_fn fits, const void *ctx,
                  int max, char *out, size_t out_len) {
    enum { MOST = 8 };
    mesh_shape best[MOST];
    int found = 0;
    if (max > MOST) max = MOST;
    out[0] = '\0';
    for (int t = 1; t <= world; t++) {
        if (world % t) continue;
        for (int p = 1; p <= world / t; p++) {
            if (world / t % p) continue;
            mesh_shape m = {.tp = t, .pp = p, .dp = world / t / p};
            if (fits && !fits(&m, ctx)) continue;
            /* keep the `max` closest, in order */
            int at = found < max ? found++ : max;
            while (at > 0 && distance(&m, want) < distance(&best[at - 1], want)) {
                if (at < max) best[at] = best[at - 1];
                at--;
            }
            if (at < max) best[at] = m;
        }
    }
    for (int i = 0; i < found; i++)
        snprintf(out + strlen(out), out_len - strlen(out), "%s--tp %d --pp %d --dp %d",
                 i ? " or " : "", best[i].tp, best[i].pp, best[i].dp);
}

int mesh_check(const mesh_shape *m, int world, mesh_fits_fn fits, const void *ctx,
               char *err, size_t err_len) {
    if (m->tp >= 1 && m->pp >= 1 && m->dp >= 1 && (long)mesh_world(m) == world)
        return 1;
    if (mesh_cp_size(m) > 1) {   /* the 3D suggestions below know no CP */
        snprintf(err, err_len, "--tp %d --cp %d --dp %d --pp %d needs %ld ranks, not %d",
                 m->tp, m->cp, m->dp, m->pp, (long)mesh_world(m), world);
        return 0;
    }
    char try[192];
    mesh_suggest(m, world, fits, ctx, 2, try, sizeof try);
    if (m->tp < 1 || m->pp < 1 || m->dp < 1)
        snprintf(err, err_len, "--tp %d --pp %d --dp %d: every size must be at least 1%s%s",
                 m->tp, m->pp, m->dp, try[0] ? "; try " : "", try);
    else
        snprintf(err, err_len, "--tp %d --pp %d --dp %d needs %ld ranks, not %d%s%s%s",
                 m->tp, m->pp, m->dp, (long)m->tp * m->pp * m->dp, world,
                 try[0] ? "; with that many ranks try " : "", try,
                 try[0] ? "" : " (no mesh of that many ranks fits this model)");
    return 0;
}

/* ---- communicators -------------------------------------------------------------- */

void mesh_create(mesh *m, comm *world, mesh_shape shape) {
    const int rank = comm_rank(world);
    memset(m, 0, sizeof *m);
    m->shape = shape;
    m->me = mesh_coord_of(&shape, rank);
    m->tp = comm_split(world, mesh_group_index(&shape, MESH_TP, rank), m->me.tp, "tp");
    m->dp = comm_split(world, mesh_group_index(&shape, MESH_DP, rank), m->me.dp, "dp");
    m->pp = comm_split(world, mesh_group_index(&shape, MESH_PP, rank), m->me.pp, "pp");
    m->cp = comm_split(world, mesh_group_index(&shape, MESH_CP, rank), m->me.cp, "cp");
    const int at_an_end = m->me.pp == 0 || m->me.pp == shape.pp - 1;
    m->embedding = comm_split(world, shape.pp > 1 && at_an_end
                                         ? mesh_group_index(&shape, MESH_PP, rank) : -1,
                              m->me.pp, "embedding");
}

void mesh_free(mesh *m) {
    comm_free(m->tp);
    comm_free(m->dp);
    comm_free(m->pp);
    comm_free(m->cp);
    comm_free(m->embedding);
    memset(m, 0, sizeof *m);
}
