/* The router: softmax gate, top-k, capacity and the auxiliary loss, forward and
 * backward (moe.h). */
#include <math.h>
#include <string.h>

#include "moe_internal.h"
#include "ops.h"

/* p = softmax(logits) in place, one row of E */
static void softmax_row(float *p, int E) {
    float max = p[0];
    for (int e = 1; e < E; e++) max = fmaxf(max, p[e]);
    double sum = 0;
    for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - max));
    for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
}

/* Token n's k experts, largest probability first; a tie goes to the lower index (the
 * strict > below), the same on every rank and every run. */
static void top_k(moe_block_state *b, int n, int E, int k) {
    const float *p = b->probs + (size_t)n * E;
    int *chosen = b->expert + (size_t)n * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (j == 1 && e == chosen[0]) continue;
            if (best < 0 || p[e] > p[best]) best = e;
        }
        chosen[j] = best;
    }
    float *g = b->gate + (size_t)n * k;
    if (k == 1) {
        g[0] = p[chosen[0]];   /* Switch: the probability itself */
    } else {                   /* Mixtral: renormalised over the two chosen */
        const float sum = p[chosen[0]] + p[chosen[1]];
        g[0] = p[chosen[0]] / sum;
        g[1] = p[chosen[1]] / sum;
    }
}

/* Pairs per expert, first choices and probability sums over this rank's tokens, then
 * over the global batch; `before` gets the pairs per expert of the ranks before this one
 * in the global batch (where this rank's pairs start in each expert's queue). */
static void global_statistics(moe_layer *m, moe_block_state *b, double *before) {
    const int E = m->s.cfg.experts, k = m->s.cfg.top_k, N = m->N;
    double *local = m->gathered;   /* [E] this rank's pairs, then [2E] first, prob_sum */
    memset(b->load, 0, E * sizeof(double));
    memset(b->first, 0, E * sizeof(double));
    memset(b->prob_sum, 0, E * sizeof(double));
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < k; j++) b->load[b->expert[n * k + j]] += 1;
        b->first[b->expert[n * k]] += 1;
        for (int e = 0; e < E; e++) b->prob_sum[e] += b->probs[(size_t)n * E + e];
    }
    memset(before, 0, E * sizeof(double));
    comm *world = m->opts.world;
    if (!world) return;
    memcpy(local, b->load, E * sizeof(double));
    double *all = m->gathered + 2 * E;   /* [world x E] */
    comm_allgather(world, local, all, (size_t)E * comm_size(world), COMM_F64);
    memset(b->load, 0, E * sizeof(double));
    for (int r = 0; r < comm_size(world); r++) {
        for (int e = 0; e < E; e++) {
            if (r < comm_rank(world)) before[e] += all[(size_t)r * E + e];
            b->load[e] += all[(size_t)r * E + e];
        }
    }
    memcpy(local, b->first, E * sizeof(double));
    memcpy(local + E, b->prob_sum, E * sizeof(double));
    comm_allreduce(world, local, 2 * (size_t)E, COMM_F64, COMM_SUM);
    memcpy(b->first, local, E * sizeof(double));
    memcpy(b->prob_sum, local + E, E * sizeof(double));
}

/* Which pairs each expert keeps (first come first served in global token order), and
 * the kept pairs sorted by expert: the order they are sent in. */
static void keep_and_sort(moe_layer *m, moe_block_state *b, const double *before) {
    const int E = m->s.cfg.experts, pairs = m->N * m->s.cfg.top_k;
    double *queue = m->gathered;   /* [E] pairs already in each expert's queue */
    memcpy(queue, before, E * sizeof(double));
    memset(b->send_per_expert, 0, E * sizeof(size_t));
    for (int a = 0; a < pairs; a++) {
        const int e = b->expert[a];
        const int kept = m->capacity == 0 || queue[e] < m->capacity;
        queue[e] += 1;
        b->pos[a] = kept ? 0 : -1;
        if (kept) b->send_per_expert[e]++;
    }
    size_t next[E];   /* a counting sort: each expert's first row, then its next */
    next[0] = 0;
    for (int e = 1; e < E; e++) next[e] = next[e - 1] + b->send_per_expert[e - 1];
    b->sent = (int)(next[E - 1] + b->send_per_expert[E - 1]);
    for (int a = 0; a < pairs; a++) {   /* pairs in order: each expert's rows stay so */
        if (b->pos[a] < 0) continue;
        const size_t row = next[b->expert[a]]++;
        b->pos[a] = (int)row;
        b->order[row] = a;
    }
}

/* dropped pairs and the auxiliary loss from the global statistics */
static void block_summary(moe_layer *m, moe_block_state *b) {
    const int E = m->s.cfg.experts;
    const double tokens = (double)m->N * (m->opts.world ? comm_size(m->opts.world) : 1);
    b->dropped = 0;
    double sum = 0;
    for (int e = 0; e < E; e++) {
        if (m->capacity > 0 && b->load[e] > m->capacity) b->dropped += b->load[e] - m->capacity;
        sum += (b->first[e] / tokens) * (b->prob_sum[e] / tokens);
    }
    b->aux = m->s.cfg.aux_coef * E * sum;
}

void moe_route(moe_layer *m, moe_block_state *b, int moe_layer, const float *ln2) {
    const int E = m->s.cfg.experts, k = m->s.cfg.top_k, N = m->N, C = m->s.dim;
    const float *router = moe_router_of(&m->s, (float *)m->routers, moe_layer);
    linear_forward(b->probs, ln2, router, NULL, N, C, E);
    for (int n = 0; n < N; n++) {
        softmax_row(b->probs + (size_t)n * E, E);
        top_k(b, n, E, k);
    }
    double before[E];
    global_statistics(m, b, before);
    keep_and_sort(m, b, before);
    block_summary(m, b);
}

/* d p from the gates' gradient: k = 1, g = p; k = 2, g_j = p_j / S with S = p_1 + p_2,
 * so d p_j = (d g_j - sum_i d g_i g_i) / S. */
static void gate_backward(const moe_block_state *b, const float *dgate, float *dprobs, int n,
                          int E, int k) {
    const int *chosen = b->expert + (size_t)n * k;
    const float *g = b->gate + (size_t)n * k, *dg = dgate + (size_t)n * k;
    float *dp = dprobs + (size_t)n * E;
    if (k == 1) {
        dp[chosen[0]] += dg[0];
        return;
    }
    const float *p = b->probs + (size_t)n * E;
    const float sum = p[chosen[0]] + p[chosen[1]], mixed = dg[0] * g[0] + dg[1] * g[1];
    for (int j = 0; j < 2; j++) dp[chosen[j]] += (dg[j] - mixed) / sum;
}

void moe_route_backward(moe_layer *m, moe_block_state *b, int moe_layer, const float *ln2,
                        float *d_ln2) {
    const int E = m->s.cfg.experts, k = m->s.cfg.top_k, N = m->N, C = m->s.dim;
    const double tokens = (double)N * (m->opts.world ? comm_size(m->opts.world) : 1);
    /* aux = a E sum_e f_e P_e: d aux / d p[n,e] = a E f_e / tokens; the objective's
     * per-token dloss already holds 1 / tokens */
    float aux_grad[E];
    for (int e = 0; e < E; e++)
        aux_grad[e] = (float)(m->dloss * m->s.cfg.aux_coef * E * b->first[e] / tokens);
    float *dlogits = m->dprobs;
    for (int n = 0; n < N; n++) {
        float *dp = dlogits + (size_t)n * E;
        const float *p = b->probs + (size_t)n * E;
        for (int e = 0; e < E; e++) dp[e] = aux_grad[e];
        gate_backward(b, m->dgate, dlogits, n, E, k);
        double dot = 0;   /* softmax: d logit_e = p_e (d p_e - sum p d p) */
        for (int e = 0; e < E; e++) dot += (double)p[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - (float)dot);
    }
    const float *router = moe_router_of(&m->s, (float *)m->routers, moe_layer);
    float *router_grad = moe_router_of(&m->s, m->router_grads, moe_layer);
    linear_backward(m->d_ln2_router, router_grad, NULL, dlogits, ln2, router, N, C, E);
    vec_add(d_ln2, m->d_ln2_router, (size_t)N * C);
}
