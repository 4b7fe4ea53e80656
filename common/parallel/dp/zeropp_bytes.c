/* ZeRO-3's bytes per tier per step, to the byte (zeropp.h): each call of a step as the
 * threads backend moves it (comm_threads_algorithms.c), counted on the rank that sends:
 *   ring all-gather of c elements over n: rank p sends every piece but its right
 *     neighbour's, c - len(p+1), all to p+1;
 *   ring reduce-scatter: every piece but its own, c - len(p);
 *   ring all-reduce (per slab of n 2^18 elements): both, 2c - len(p) - len(p+1);
 *   all-to-all of E-byte blocks: E to each other rank, each on its own tier;
 * pieces comm_shard's. A step of fsdp.c gathers the embedding twice (its lookup, then the
 * tied head), every block twice (forward, backward), the final LayerNorm once, and
 * reduces every slab once. */
#include "zeropp.h"

#include <math.h>
#include <stdlib.h>

enum { RING_SLICE = 1 << 18 };   /* comm_internal.h's COMM_SLICE_ELEMENTS */

static double piece(size_t c, int n, int p) {
    return (double)comm_shard(c, n, ((p % n) + n) % n, NULL);
}
double ring_allgather_elements(size_t c, int n, int p) {
    return n > 1 ? (double)c - piece(c, n, p + 1) : 0;
}
static double ring_reduce_scatter_elements(size_t c, int n, int p) {
    return n > 1 ? (double)c - piece(c, n, p) : 0;
}

double ring_allreduce_elements(size_t c, int n, int p) {
    if (n < 2) return 0;
    const size_t slab = (size_t)n * RING_SLICE;
    double sent = 0;
    for (size_t first = 0; first < c; first += slab) {
        const size_t count = c - first < slab ? c - first : slab;
        sent += 2 * (double)count - piece(count, n, p) - piece(count, n, p + 1);
    }
    return sent;
}

typedef struct {
    const gpt_shape *s;
    int pieces, hsdp, N, K, d;
    int w, node, local;   /* the rank counted */
    const zeropp_links *links;   /* for the time, or NULL */
    double sent[2], seconds;
} step_count;

/* A call's bytes on the tier this rank sends them on, and its alpha-beta time: `steps`
 * transfers in sequence on link `slowest` (a ring waits on its slowest link). */
static void add_call(step_count *c, comm_tier tier, double bytes, int steps, comm_tier slowest) {
    c->sent[tier] += bytes;
    if (!c->links || steps == 0) return;
    c->seconds += steps * c->links->alpha[slowest] + bytes / c->links->beta[slowest];
}

static void add(step_count *c, comm_tier tier, double bytes) {   /* inside a node, K - 1 steps */
    add_call(c, tier, bytes, c->K - 1, tier);
}

/* A call on a ring over all N ranks: its bytes go to the next rank's tier. */
static void add_world(step_count *c, double bytes) {
    const comm_tier to = (c->w + 1) % c->N / c->K == c->node ? COMM_TIER_INTRA : COMM_TIER_INTER;
    add_call(c, to, bytes, c->N - 1, c->d > 1 ? COMM_TIER_INTER : COMM_TIER_INTRA);
}

static int is_block(const gpt_shape *s, int slab) {
    return slab != gpt_embed_slab(s) && slab != gpt_final_slab(s);
}

static void gather(step_count *c, int slab, int backward) {
    const size_t S = gpt_slab_numel(c->s, slab);
    if (c->hsdp || (backward && (c->pieces & ZEROPP_HPZ) && is_block(c->s, slab)))
        add(c, COMM_TIER_INTRA, 4 * ring_allgather_elements(S, c->K, c->local));
    else if (c->pieces & ZEROPP_QWZ)
        add_world(c, (double)(c->N - 1) * (double)quant_encoded_bytes(
                         QUANT_INT8, (S + c->N - 1) / c->N, ZEROPP_WEIGHT_BLOCK));
    else
        add_world(c, 4 * ring_allgather_elements(S, c->N, c->w));
}

static void reduce(step_count *c, int slab) {
    const size_t S = gpt_slab_numel(c->s, slab);
    if (c->hsdp) {
        add(c, COMM_TIER_INTRA, 4 * ring_reduce_scatter_elements(S, c->K, c->local));
        add_call(c, COMM_TIER_INTER, 4 * ring_allreduce_elements(comm_shard(S, c->K, c->local, NULL),
                                                        c->d, c->node),
                 2 * (c->d - 1), COMM_TIER_INTER);
    } else if (c->pieces & ZEROPP_QGZ) {
        const double E = (double)quant_encoded_bytes(QUANT_INT4, (S + c->N - 1) / c->N,
                                                     ZEROPP_GRAD_BLOCK);
        add(c, COMM_TIER_INTRA, (double)(c->K - 1) * c->d * E);
        add_call(c, COMM_TIER_INTER, (double)(c->d - 1) * E, c->d - 1, COMM_TIER_INTER);
    } else {
        add_world(c, 4 * ring_reduce_scatter_elements(S, c->N, c->w));
    }
}

static void count_step(step_count *c) {
    const gpt_shape *s = c->s;
    gather(c, gpt_embed_slab(s), 0);
    for (int layer = 0; layer < s->cfg.layers; layer++) gather(c, gpt_block_slab(s, layer), 0);
    gather(c, gpt_final_slab(s), 0);
    gather(c, gpt_embed_slab(s), 0);   /* the tied head */
    for (int layer = 0; layer < s->cfg.layers; layer++) gather(c, gpt_block_slab(s, layer), 1);
    for (int slab = 0; slab < gpt_num_slabs(s); slab++) reduce(c, slab);
}

zeropp_links zeropp_links_of(const comm_options *o) {
    zeropp_links l;
    const double scale = o->link_scale > 0 ? o->link_scale : 1.0;
    for (int t = 0; t < 2; t++) {   /* comm_tier_seconds' figures: none, no time */
        const comm_link_figures f = comm_link_spec(comm_tier_link(o, (comm_tier)t));
        l.alpha[t] = f.bandwidth > 0 ? scale * f.latency : 0;
        l.beta[t] = f.bandwidth > 0 ? f.bandwidth / scale : INFINITY;
    }
    return l;
}

double zeropp_step_predict(const gpt_shape *s, int pieces, int hsdp, int N, int K,
                           const zeropp_links *links, double bytes[2]) {
    double seconds = 0;
    bytes[0] = bytes[1] = 0;
    for (int w = 0; w < N; w++) {
        step_count c = {.s = s, .pieces = pieces, .hsdp = hsdp, .N = N, .K = K, .d = N / K,
                        .w = w, .node = w / K, .local = w % K, .links = links};
        count_step(&c);
        for (int t = 0; t < 2; t++)
            if (c.sent[t] > bytes[t]) bytes[t] = c.sent[t];
        if (c.seconds > seconds) seconds = c.seconds;
    }
    return seconds;
}

void zeropp_tier_bytes(const gpt_shape *s, int pieces, int hsdp, int N, int K, double out[2]) {
    zeropp_step_predict(s, pieces, hsdp, N, K, NULL, out);
}

double zeropp_hpz_extra_bytes(const gpt_shape *s, int K) {
    double elements = 0;   /* local rank 0 holds the longest node-pieces */
    for (int layer = 0; layer < s->cfg.layers; layer++)
        elements += (double)comm_shard(gpt_slab_numel(s, gpt_block_slab(s, layer)), K, 0, NULL);
    return 4 * elements;
}
