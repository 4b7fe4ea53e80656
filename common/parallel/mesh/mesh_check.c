/* Whether a mesh fits its world and can be trained, and meshes that would (mesh.h). */
#include "mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* One reason in why, returned. */
#define REFUSE(...) return snprintf(why, why_len, __VA_ARGS__), why

/* dp 0: what the world leaves, when t x cp x p divides it (cp given: at least 1). */
static const char *derive_dp(const mesh_config *c, mesh_shape *m, char *why, size_t why_len) {
    const int t = m->tp, p = m->pp, world = c->world;
    if (m->dp != 0) return NULL;
    if (t < 1 || p < 1 || m->cp < 1 || world % (t * m->cp * p))
        REFUSE("--cp %d%s%s does not divide the %d ranks (ranks = %scp x dp%s)", m->cp,
               t > 1 ? " x --tp" : "", p > 1 ? " x --pp" : "", world, t > 1 ? "tp x " : "",
               p > 1 ? " x pp" : "");
    m->dp = world / (t * m->cp * p);
    return NULL;
}

/* Sizes below 1, or a product that is not the world: the 3D meshes that would fit. */
static const char *check_world(const mesh_config *c, const mesh_shape *m, char *why,
                               size_t why_len) {
    const int world = c->world;
    const int below = m->tp < 1 || m->pp < 1 || m->dp < 1 || m->cp < 0 || m->ep < 0 ||
                      m->dp_shard < 0;
    if (!below && (long)mesh_world(m) == world) return NULL;
    if (!below && mesh_cp_size(m) > 1)   /* the 3D suggestions below know no CP */
        REFUSE("--tp %d --cp %d --dp %d --pp %d needs %ld ranks, not %d", m->tp, m->cp, m->dp,
               m->pp, (long)mesh_world(m), world);
    char try[192];
    mesh_suggest(m, world, c->fits, c->ctx, 2, try, sizeof try);
    if (below)
        REFUSE("--tp %d --pp %d --dp %d: every size must be at least 1%s%s", m->tp, m->pp,
               m->dp, try[0] ? "; try " : "", try);
    REFUSE("--tp %d --pp %d --dp %d needs %ld ranks, not %d%s%s%s", m->tp, m->pp, m->dp,
           (long)m->tp * m->pp * m->dp, world, try[0] ? "; with that many ranks try " : "",
           try, try[0] ? "" : " (no mesh of that many ranks fits this model)");
}

/* The data-parallel and expert splits: dp_shard of dp, ep of dp x cp and the experts. */
static const char *check_splits(const mesh_config *c, const mesh_shape *m, char *why,
                                size_t why_len) {
    const int s = mesh_dp_shard_size(m), e = mesh_ep_size(m), dc = mesh_cp_size(m) * m->dp;
    if (m->dp % s)
        REFUSE("--dp-shard %d does not divide --dp %d (dp = dp_replicate x dp_shard: try a"
               " divisor of %d)", s, m->dp, m->dp);
    if (dc % e)
        REFUSE("--ep %d does not divide the %d ranks of dp x cp (expert layers carve their"
               " EP groups from them: an EP size that divides %d)", e, dc, dc);
    if (c->experts > 0 && c->experts % e)
        REFUSE("EP %d does not divide --experts %d (each EP rank holds experts / EP of them)",
               e, c->experts);
    return NULL;
}

const char *mesh_check(const mesh_config *c, char *why, size_t why_len) {
    mesh_shape m = c->shape;
    const char *refused = derive_dp(c, &m, why, why_len);
    if (!refused) refused = check_world(c, &m, why, why_len);
    if (!refused) refused = check_splits(c, &m, why, why_len);
    return refused;
}
#undef REFUSE
