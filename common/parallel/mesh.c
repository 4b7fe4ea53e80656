#include "mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mesh_group_kind_name(mesh_group_kind kind) {
    static const char *const names[MESH_KINDS] = {"tp", "pp", "dp"};
    return kind >= 0 && kind < MESH_KINDS ? names[kind] : "?";
}

int mesh_world(const mesh_shape *m) { return m->tp * m->pp * m->dp; }

mesh_coord mesh_coord_of(const mesh_shape *m, int rank) {
    return (mesh_coord){.tp = rank % m->tp, .dp = rank / m->tp % m->dp,
                        .pp = rank / (m->tp * m->dp)};
}

int mesh_rank_of(const mesh_shape *m, mesh_coord c) {
    return c.tp + m->tp * (c.dp + m->dp * c.pp);
}

/* A group is named by the two coordinates its members share. */
int mesh_group_index(const mesh_shape *m, mesh_group_kind kind, int rank) {
    const mesh_coord c = mesh_coord_of(m, rank);
    switch (kind) {
    case MESH_TP: return c.dp + m->dp * c.pp;
    case MESH_DP: return c.tp + m->tp * c.pp;
    default: return c.tp + m->tp * c.dp;
    }
}

int mesh_group_count(const mesh_shape *m, mesh_group_kind kind) {
    switch (kind) {
    case MESH_TP: return m->dp * m->pp;
    case MESH_DP: return m->tp * m->pp;
    default: return m->tp * m->dp;
    }
}

int mesh_group_members(const mesh_shape *m, mesh_group_kind kind, int index, int *members) {
    mesh_coord c = {0};
    int size;
    switch (kind) {
    case MESH_TP: c.dp = index % m->dp, c.pp = index / m->dp, size = m->tp; break;
    case MESH_DP: c.tp = index % m->tp, c.pp = index / m->tp, size = m->dp; break;
    default: c.tp = index % m->tp, c.dp = index / m->tp, size = m->pp; break;
    }
    for (int i = 0; i < size; i++) {
        if (kind == MESH_TP) c.tp = i;
        else if (kind == MESH_DP) c.dp = i;
        else c.pp = i;
        members[i] = mesh_rank_of(m, c);
    }
    return size;
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
    if (m->tp >= 1 && m->pp >= 1 && m->dp >= 1 && (long)m->tp * m->pp * m->dp == world)
        return 1;
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
    const int at_an_end = m->me.pp == 0 || m->me.pp == shape.pp - 1;
    m->embedding = comm_split(world, shape.pp > 1 && at_an_end
                                         ? mesh_group_index(&shape, MESH_PP, rank) : -1,
                              m->me.pp, "embedding");
}

void mesh_free(mesh *m) {
    comm_free(m->tp);
    comm_free(m->dp);
    comm_free(m->pp);
    comm_free(m->embedding);
    memset(m, 0, sizeof *m);
}
