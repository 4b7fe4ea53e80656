/* The MoE layer at run time: a block's forward and backward through the router, the
 * exchanges and the experts, and what it measured (moe.h). */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "moe_internal.h"
#include "ops.h"
#include "ops_mixed.h"

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

/* Slots [m->slots, slots) of every block, allocated: the table grows, the kept slots'
 * state moves with it (at a schedule's first step only, as the model's slots). */
static void grow_slots(moe_layer *m, int slots) {
    if (slots <= m->slots) return;
    const size_t L = m->s.moe_layers, had = (size_t)m->slots * L;
    moe_block_state *table = mem_alloc(MEM_OTHER, (size_t)slots * L * sizeof *table);
    memset(table, 0, (size_t)slots * L * sizeof *table);
    if (had) memcpy(table, m->blocks, had * sizeof *table);
    for (size_t i = had; i < (size_t)slots * L; i++) block_alloc(m, &table[i]);
    mem_free(m->blocks);
    m->blocks = table;
    m->slots = slots;
}

/* Micro-batch slot `slot`'s state of MoE block i. */
static moe_block_state *block_of(moe_layer *m, int slot, int i) {
    grow_slots(m, slot + 1);
    return &m->blocks[(size_t)slot * m->s.moe_layers + i];
}

static int hook_replaces(void *ctx, int layer) {
    return moe_is_moe_layer(&((moe_layer *)ctx)->s, layer);
}
static void hook_forward(void *ctx, int slot, int layer, precision p, void *out,
                         const void *ln2);
static void hook_backward(void *ctx, int slot, int layer, precision p, void *d_ln2,
                          const void *d_out);

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
    grow_slots(m, 1);
    m->steps = mem_alloc(MEM_OTHER, (size_t)s->moe_layers * sizeof *m->steps);
    for (int i = 0; i < s->moe_layers; i++)
        m->steps[i] = (moe_block_step){.load = acts(E * sizeof(double))};
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
    for (size_t i = 0; i < (size_t)m->slots * m->s.moe_layers; i++) block_free(&m->blocks[i]);
    for (int i = 0; i < m->s.moe_layers; i++) mem_free(m->steps[i].load);
    moe_mixed_free(m);
    void *all[] = {m->blocks, m->steps, m->send, m->recv, m->rows, m->d_rows, m->d_h, m->dgate,
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

void moe_layer_step_begin(moe_layer *m) {
    m->remote_rows = m->exchanged_rows = 0;
    m->experts16_fresh = 0;   /* the optimizer may have changed the experts */
    for (int i = 0; i < m->s.moe_layers; i++) {
        moe_block_step *t = &m->steps[i];
        memset(t->load, 0, (size_t)m->s.cfg.experts * sizeof(double));
        t->dropped = t->aux = 0;
        t->runs = 0;
    }
}

/* The micro-batch's statistics into the step's sums. */
static void step_add(moe_layer *m, int i, const moe_block_state *b) {
    moe_block_step *t = &m->steps[i];
    for (int e = 0; e < m->s.cfg.experts; e++) t->load[e] += b->load[e];
    t->dropped += b->dropped;
    t->aux += b->aux;
    t->runs++;
}

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

/* The block's input in fp32: the model's own, or widened into ln2_32 (exact). */
static const float *input32(moe_layer *m, const void *ln2) {
    if (m->p == PRECISION_FP32) return ln2;
    mixed_widen(m->p, m->ln2_32, ln2, (size_t)m->N * m->s.dim);
    return m->ln2_32;
}

/* Where an fp32 result of [N, C] is formed: the model's buffer itself, or io32, which
 * finish() rounds into it. */
static float *result32(moe_layer *m, void *model_buffer) {
    return m->p == PRECISION_FP32 ? model_buffer : m->io32;
}
static void finish(moe_layer *m, void *model_buffer) {
    if (m->p != PRECISION_FP32) mixed_round(m->p, model_buffer, m->io32, (size_t)m->N * m->s.dim);
}

/* Routes ln2's tokens, sends each kept pair's row to its expert and brings back the
 * expert's output: router -> dispatch -> experts -> combine -> gates. In 16 bits the
 * router (logits, softmax, top-k, gates) and the gated sum run in fp32 on the widened
 * input, the experts' products in 16 bits (moe_experts.c); the output is rounded once.
 * The experts' 16-bit copy is rounded from the fp32 masters once a step, at its first MoE
 * block: the optimizer has changed them since the last step, and nothing changes them
 * between its micro-batches. */
static void hook_forward(void *ctx, int slot, int layer, precision p, void *out,
                         const void *ln2) {
    moe_layer *m = ctx;
    const int i = moe_layer_index(&m->s, layer), k = m->s.cfg.top_k;
    const size_t C = m->s.dim;
    moe_block_state *b = block_of(m, slot, i);
    m->p = p;
    if (p != PRECISION_FP32) moe_mixed_ensure(m);
    /* a new micro-batch's first MoE block (of this pipeline stage: the blocks run in
     * order, so a block at or before the last one starts a new pass) */
    if (p != PRECISION_FP32 && !m->experts16_fresh) {
        moe_mixed_round_experts(m);
        m->experts16_fresh = 1;
    }
    const float *x = input32(m, ln2);
    moe_route(m, b, i, x);
    step_add(m, i, b);
    b->ln2 = ln2;
    for (int r = 0; r < b->sent; r++)
        memcpy(m->send + r * C, x + (size_t)(b->order[r] / k) * C, C * sizeof(float));
    moe_exchange_plan(m, b);
    moe_dispatch(m, b, m->send, b->x_in);
    moe_experts_forward(m, b, i, m->rows);
    moe_combine(m, b, m->rows, b->y);
    combine_gated(m, b, result32(m, out));
    finish(m, out);
}

/* The forward's path backwards: d gates and d y from d out, d y to the experts, their
 * backward, d x back, summed per token, then the router's backward onto it. */
static void hook_backward(void *ctx, int slot, int layer, precision p, void *d_ln2_out,
                          const void *d_out_model) {
    moe_layer *m = ctx;
    const int i = moe_layer_index(&m->s, layer), k = m->s.cfg.top_k, N = m->N;
    const size_t C = m->s.dim;
    moe_block_state *b = block_of(m, slot, i);
    m->p = p;
    const float *d_out = d_out_model;
    if (p != PRECISION_FP32) {
        mixed_widen(p, m->io32, d_out_model, (size_t)N * C);
        d_out = m->io32;
    }
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
    float *d_ln2 = result32(m, d_ln2_out);   /* io32's d out is read: free again */
    memset(d_ln2, 0, (size_t)N * C * sizeof(float));
    for (int a = 0; a < N * k; a++) {
        if (b->pos[a] < 0) continue;
        vec_add(d_ln2 + (size_t)(a / k) * C, m->send + (size_t)b->pos[a] * C, C);
    }
    moe_route_backward(m, b, i, input32(m, b->ln2), d_ln2);
    finish(m, d_ln2_out);
}

double moe_layer_aux_loss(const moe_layer *m) {
    double sum = 0;
    for (int i = 0; i < m->s.moe_layers; i++)
        if (m->steps[i].runs) sum += m->steps[i].aux / m->steps[i].runs;
    return sum;
}

const double *moe_layer_expert_load(const moe_layer *m, int moe_layer) {
    return m->steps[moe_layer].load;
}

double moe_layer_dropped(const moe_layer *m, int moe_layer) {
    return m->steps[moe_layer].dropped;
}

double moe_layer_capacity(const moe_layer *m) { return m->capacity; }

double moe_layer_remote_rows(const moe_layer *m) { return m->remote_rows; }

double moe_layer_exchanged_rows(const moe_layer *m) { return m->exchanged_rows; }
