/* The MoE layer at run time: a block's forward and backward through the router, the
 * exchanges and the experts, and what it measured (moe.h). */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "moe_internal.h"
#include "ops.h"

static void *acts(size_t bytes) { return mem_alloc(MEM_ACTIVATIONS, bytes ? bytes : 1); }

static void block_alloc(moe_layer *m, moe_block_state *b) {
    const size_t N = m->N, E = m->s.cfg.experts, k = m->s.cfg.top_k, C = m->s.dim;
    const size_t H = m->s.hidden, EP = m->s.ep_size, El = m->s.experts_local;
    b->probs = acts(N * E * sizeof(float));
    b->expert = acts(N * k * sizeof(int));
    b->gate = acts(N * k * sizeof(float));
    b->pos = acts(N * k * sizeof(int));
    b->order = acts(N * k * sizeof(int));
    b->send_per_expert = acts(E * sizeof(size_t));
    b->recv_per_source = acts(EP * El * sizeof(size_t));
    b->y = acts(N * k * C * sizeof(float));
    b->x_in = acts(m->max_rows * C * sizeof(float));
    b->h_act = acts(m->max_rows * H * sizeof(float));
    b->h_gelu = acts(m->max_rows * H * sizeof(float));
    b->load = acts(3 * E * sizeof(double));
    b->first = b->load + E;
    b->prob_sum = b->load + 2 * E;
}

static void block_free(moe_block_state *b) {
    void *all[] = {b->probs, b->expert, b->gate, b->pos, b->order, b->send_per_expert,
                   b->recv_per_source, b->y, b->x_in, b->h_act, b->h_gelu, b->load};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

static int hook_replaces(void *ctx, int layer) {
    return moe_is_moe_layer(&((moe_layer *)ctx)->s, layer);
}
static void hook_forward(void *ctx, int layer, float *out, const float *ln2);
static void hook_backward(void *ctx, int layer, float *d_ln2, const float *d_out);

moe_layer *moe_layer_create(const moe_shape *s, int N, const moe_layer_options *opts) {
    moe_layer *m = mem_alloc(MEM_OTHER, sizeof *m);
    memset(m, 0, sizeof *m);
    m->s = *s;
    m->opts = *opts;
    m->N = N;
    const size_t k = s->cfg.top_k, C = s->dim, H = s->hidden, E = s->cfg.experts;
    const int world = opts->world ? comm_size(opts->world) : 1;
    /* the rows this rank's experts can receive: every EP rank's pairs, and with a
     * capacity no more than it a local expert (the buffers the capacity bounds) */
    m->max_rows = (size_t)s->ep_size * N * k;
    if (s->cfg.capacity_factor > 0) {   /* ceil(c x tokens x k / E) of the global batch */
        m->capacity = ceil(s->cfg.capacity_factor * (double)N * world * k / E);
        const double bound = m->capacity * s->experts_local;
        if (bound < (double)m->max_rows) m->max_rows = (size_t)bound;
    }
    m->blocks = mem_alloc(MEM_OTHER, (size_t)s->moe_layers * sizeof *m->blocks);
    for (int i = 0; i < s->moe_layers; i++) block_alloc(m, &m->blocks[i]);
    m->send = acts(N * k * C * sizeof(float));
    m->recv = acts(m->max_rows * C * sizeof(float));
    m->rows = acts(m->max_rows * C * sizeof(float));
    m->d_rows = acts(m->max_rows * C * sizeof(float));
    m->d_h = acts(m->max_rows * H * sizeof(float));
    m->dgate = acts(N * k * sizeof(float));
    m->dprobs = acts(N * E * sizeof(float));
    m->d_ln2_router = acts(N * C * sizeof(float));
    m->send_rows = acts(4 * (size_t)s->ep_size * sizeof(size_t));
    m->recv_rows = m->send_rows + s->ep_size;
    m->send_offsets = m->send_rows + 2 * s->ep_size;
    m->recv_offsets = m->send_rows + 3 * s->ep_size;
    m->gathered = acts((2 + (size_t)world) * E * sizeof(double));
    m->hook = (gpt_mlp_hook){.ctx = m, .replaces = hook_replaces, .forward = hook_forward,
                             .backward = hook_backward};
    return m;
}

void moe_layer_free(moe_layer *m) {
    if (!m) return;
    for (int i = 0; i < m->s.moe_layers; i++) block_free(&m->blocks[i]);
    void *all[] = {m->blocks, m->send, m->recv, m->rows, m->d_rows, m->d_h, m->dgate,
                   m->dprobs, m->d_ln2_router, m->send_rows, m->gathered};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
    mem_free(m);
}

void moe_layer_bind(moe_layer *m, const float *routers, const float *experts,
                    float *router_grads, float *expert_grads) {
    m->routers = routers;
    m->experts = experts;
    m->router_grads = router_grads;
    m->expert_grads = expert_grads;
}

void moe_layer_set_dloss(moe_layer *m, float dloss) { m->dloss = dloss; }

const gpt_mlp_hook *moe_layer_hook(moe_layer *m) { return &m->hook; }

/* out[n] = sum_j g_nj y_nj over token n's kept pairs, in choice order */
static void combine_gated(const moe_layer *m, const moe_block_state *b, float *out) {
    const int N = m->N, k = m->s.cfg.top_k, C = m->s.dim;
    memset(out, 0, (size_t)N * C * sizeof(float));
    for (int a = 0; a < N * k; a++) {
        if (b->pos[a] < 0) continue;   /* dropped: the residual carries the token */
        const float g = b->gate[a], *y = b->y + (size_t)b->pos[a] * C;
        float *o = out + (size_t)(a / k) * C;
        for (int c = 0; c < C; c++) o[c] += g * y[c];
    }
}

/* Routes ln2's tokens, sends each kept pair's row to its expert and brings back the
 * expert's output: router -> dispatch -> experts -> combine -> gates. */
static void hook_forward(void *ctx, int layer, float *out, const float *ln2) {
    moe_layer *m = ctx;
    const int i = moe_layer_index(&m->s, layer), k = m->s.cfg.top_k;
    const size_t C = m->s.dim;
    moe_block_state *b = &m->blocks[i];
    if (i == 0) m->remote_rows = m->exchanged_rows = 0;   /* a new step's first MoE block */
    moe_route(m, b, i, ln2);
    for (int p = 0; p < b->sent; p++)
        memcpy(m->send + p * C, ln2 + (size_t)(b->order[p] / k) * C, C * sizeof(float));
    moe_exchange_plan(m, b);
    moe_dispatch(m, b, m->send, b->x_in);
    moe_experts_forward(m, b, i, m->rows);
    moe_combine(m, b, m->rows, b->y);
    combine_gated(m, b, out);
}

/* The forward's path backwards: d gates and d y from d out, d y to the experts, their
 * backward, d x back, summed per token, then the router's backward onto it. */
static void hook_backward(void *ctx, int layer, float *d_ln2, const float *d_out) {
    moe_layer *m = ctx;
    const int i = moe_layer_index(&m->s, layer), k = m->s.cfg.top_k, N = m->N;
    const size_t C = m->s.dim;
    moe_block_state *b = &m->blocks[i];
    for (int a = 0; a < N * k; a++) {
        const float *dout = d_out + (size_t)(a / k) * C;
        m->dgate[a] = 0;
        if (b->pos[a] < 0) continue;
        const float *y = b->y + (size_t)b->pos[a] * C;
        float *dy = m->send + (size_t)b->pos[a] * C;
        double dot = 0;
        for (size_t c = 0; c < C; c++) {
            dot += (double)dout[c] * y[c];
            dy[c] = b->gate[a] * dout[c];
        }
        m->dgate[a] = (float)dot;
    }
    moe_dispatch(m, b, m->send, m->rows);
    moe_experts_backward(m, b, i, m->rows, m->d_rows);
    moe_combine(m, b, m->d_rows, m->send);
    memset(d_ln2, 0, (size_t)N * C * sizeof(float));
    for (int a = 0; a < N * k; a++) {
        if (b->pos[a] < 0) continue;
        vec_add(d_ln2 + (size_t)(a / k) * C, m->send + (size_t)b->pos[a] * C, C);
    }
    moe_route_backward(m, b, i, d_ln2);
}

double moe_layer_aux_loss(const moe_layer *m) {
    double sum = 0;
    for (int i = 0; i < m->s.moe_layers; i++) sum += m->blocks[i].aux;
    return sum;
}

const double *moe_layer_expert_load(const moe_layer *m, int moe_layer) {
    return m->blocks[moe_layer].load;
}

double moe_layer_dropped(const moe_layer *m, int moe_layer) {
    return m->blocks[moe_layer].dropped;
}

double moe_layer_capacity(const moe_layer *m) { return m->capacity; }

double moe_layer_remote_rows(const moe_layer *m) { return m->remote_rows; }

double moe_layer_exchanged_rows(const moe_layer *m) { return m->exchanged_rows; }
