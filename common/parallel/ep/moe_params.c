/* A mesh rank's MoE routers and experts (moe_params.h). */
#include "moe_params.h"

#include <string.h>

#include "alloc.h"
#include "zero_rule.h"

static int group_size(comm *g) { return g ? comm_size(g) : 1; }

static float *floats(mem_tag tag, size_t n) {
    return mem_alloc(tag, (n ? n : 1) * sizeof(float));
}

/* A vector's buffers at rest (zero_rule.h), its parameters from init (which writes the
 * whole vector: a temporary where the rank keeps its piece alone). */
static moe_vector vector_make(size_t n, comm *group, comm *replicate, int zero,
                              void (*init)(const moe_shape *, uint64_t, float *),
                              const moe_shape *s, uint64_t seed) {
    moe_vector v = {.n = n, .group = group, .replicate = replicate,
                    .zero = moe_vector_zero(zero, group_size(group)), .piece_len = n};
    if (group_size(group) > 1)
        v.piece_len = comm_shard(n, comm_size(group), comm_rank(group), &v.piece_at);
    const zero_sharded z = zero_sharded_at(v.zero);
    const size_t moments = z.optimizer ? v.piece_len : n, grads = z.grads ? v.piece_len : n;
    v.params = floats(MEM_PARAMS, z.params ? v.piece_len : n);
    v.grads = floats(MEM_GRADS, grads);
    v.adam_m = floats(MEM_OPTIMIZER, moments);
    v.adam_v = floats(MEM_OPTIMIZER, moments);
    vec_zero(v.adam_m, moments);
    vec_zero(v.adam_v, moments);
    vec_zero(v.grads, grads);
    if (!z.params) {
        init(s, seed, v.params);
        return v;
    }
    float *whole = floats(MEM_OTHER, n);
    init(s, seed, whole);
    vec_copy(v.params, whole + v.piece_at, v.piece_len);
    mem_free(whole);
    return v;
}

static void vector_free(moe_vector *v) {
    mem_free(v->params), mem_free(v->grads), mem_free(v->adam_m), mem_free(v->adam_v);
    mem_free(v->step_params), mem_free(v->step_grads);
}

/* The whole vectors the layer reads and accumulates into this step. */
static float *whole_params(const moe_vector *v) {
    return v->zero >= 3 ? v->step_params : v->params;
}
static float *whole_grads(const moe_vector *v) { return v->zero >= 2 ? v->step_grads : v->grads; }

static void bind_layer(moe_params *p) {
    moe_layer_bind(p->layer, whole_params(&p->routers), whole_params(&p->experts),
                   whole_grads(&p->routers), whole_grads(&p->experts));
}

void moe_params_init(moe_params *p, const moe_config *cfg, const gpt_config *model,
                     const moe_params_groups *g, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->shape = moe_shape_make(cfg, model, g->ep_size, g->ep_rank);
    p->routers = vector_make(moe_router_numel(&p->shape), g->dense, g->replicate, g->zero,
                             moe_init_routers, &p->shape, seed);
    p->experts = vector_make(moe_local_experts_numel(&p->shape), g->expert_dp, NULL, g->zero,
                             moe_init_local_experts, &p->shape, seed);
    p->routers.skip_gather = p->experts.skip_gather = g->test_skip_param_gather;
    p->dense = g->dense;
    p->replicate = g->replicate;
    p->expert_dp = g->expert_dp;
    const int ep_alone = !g->ep || comm_size(g->ep) == 1;
    p->layer = moe_layer_create(&p->shape, g->tokens, &(moe_layer_options){
        .world = g->world && comm_size(g->world) > 1 ? g->world : NULL,
        .ep = ep_alone ? NULL : g->ep, .test_combine_misorder = g->test_combine_misorder});
    bind_layer(p);
}

void moe_vector_state_bytes(size_t n, int zero, int group, int rank, double bytes[3]) {
    size_t at;
    const double piece = (double)(group > 1 ? comm_shard(n, group, rank, &at) : n);
    const zero_sharded z = zero_sharded_at(moe_vector_zero(zero, group));
    const double f32 = sizeof(float), whole = (double)n;
    bytes[0] += f32 * (z.params ? piece : whole);
    bytes[1] += f32 * (z.grads ? piece : whole);
    bytes[2] += 2 * f32 * (z.optimizer ? piece : whole);
}

void moe_params_free(moe_params *p) {
    moe_layer_free(p->layer);
    vector_free(&p->routers);
    vector_free(&p->experts);
    memset(p, 0, sizeof *p);
}

/* zero 3: the whole parameters gathered for the step; zero 2-3: a whole gradient. */
static void vector_step_begin(moe_vector *v) {
    if (v->zero >= 3 && !v->step_params) {
        v->step_params = floats(MEM_PARAMS, v->n);
        comm_allgather(v->group, v->params, v->step_params, v->n, COMM_F32);
    }
    if (v->zero >= 2 && !v->step_grads) v->step_grads = floats(MEM_GRADS, v->n);
    vec_zero(whole_grads(v), v->n);
}

void moe_params_step_begin(moe_params *p, float dloss) {
    vector_step_begin(&p->routers);
    vector_step_begin(&p->experts);
    bind_layer(p);
    moe_layer_set_dloss(p->layer, dloss);
    moe_layer_step_begin(p->layer);
}

static void all_reduce(comm *group, float *v, size_t n) {
    if (group && comm_size(group) > 1 && n > 0) comm_allreduce(group, v, n, COMM_F32, COMM_SUM);
}

/* The summed gradient where AdamW reads it: whole (zero 0), else this rank's piece
 * (reduce-scattered, then summed across the replicas); the step's whole vectors go. */
static void vector_reduce(moe_vector *v) {
    if (v->zero == 0) {
        all_reduce(v->group, v->grads, v->n);
        all_reduce(v->replicate, v->grads, v->n);
        return;
    }
    float *piece = v->zero >= 2 ? v->grads : v->grads + v->piece_at;
    comm_reduce_scatter(v->group, whole_grads(v), piece, v->n, COMM_F32, COMM_SUM);
    all_reduce(v->replicate, piece, v->piece_len);
    mem_free(v->step_grads), mem_free(v->step_params);
    v->step_grads = v->step_params = NULL;
}

void moe_params_reduce(moe_params *p) {
    p->remote_rows += moe_layer_remote_rows(p->layer);
    p->exchanged_rows += moe_layer_exchanged_rows(p->layer);
    vector_reduce(&p->routers);
    vector_reduce(&p->experts);
}

void moe_params_record(moe_params *p, int step) {
    moe_routing_log *log = p->log;
    if (!log || step < 1 || step > log->steps) return;
    const int E = p->shape.cfg.experts, blocks = p->shape.moe_layers;
    const size_t at = (size_t)(step - 1) * blocks;
    log->aux[step - 1] = moe_layer_aux_loss(p->layer);
    for (int i = 0; i < blocks; i++) {
        memcpy(log->load + (at + i) * E, moe_layer_expert_load(p->layer, i),
               E * sizeof(double));
        log->dropped[at + i] = moe_layer_dropped(p->layer, i);
    }
}

/* AdamW on what this rank updates (element by element: the piece's update is the
 * whole one's there), then zero 1-2's all-gather of the updated pieces. */
static void vector_adamw(moe_vector *v, const adamw_config *a, int step) {
    if (v->n == 0) return;
    if (v->zero == 0) {
        adamw_update(v->params, v->grads, v->adam_m, v->adam_v, v->n, a, step);
        return;
    }
    float *params = v->zero >= 3 ? v->params : v->params + v->piece_at;
    const float *grads = v->zero >= 2 ? v->grads : v->grads + v->piece_at;
    adamw_update(params, grads, v->adam_m, v->adam_v, v->piece_len, a, step);
    if (v->zero <= 2 && !v->skip_gather)
        comm_allgather(v->group, params, v->params, v->n, COMM_F32);
}

void moe_params_adamw(moe_params *p, const adamw_config *a) {
    p->adam_step++;
    vector_adamw(&p->routers, a, p->adam_step);
    vector_adamw(&p->experts, a, p->adam_step);
}

int moe_params_grad_vectors(moe_params *p, grad_vector *vectors) {
    const moe_vector *mine[2] = {&p->routers, &p->experts};
    for (int i = 0; i < 2; i++)
        vectors[i] = grad_vector_fp32(mine[i]->grads,
                                      mine[i]->zero >= 2 ? mine[i]->piece_len : mine[i]->n);
    return 2;
}

/* Collective over the vector's group: its whole parameters or summed gradient, a
 * temporary where the rank holds a piece (zero 1's gradient: the pieces gathered in
 * place, over this rank's own partial sums); vector_whole_free gives it back. */
static float *vector_whole(const moe_vector *v, int grads) {
    float *mine = grads ? v->grads : v->params;
    if (grads && v->zero == 1) {
        comm_allgather(v->group, mine + v->piece_at, mine, v->n, COMM_F32);
        return mine;
    }
    if (!(grads ? v->zero >= 2 : v->zero >= 3)) return mine;
    float *whole = floats(MEM_OTHER, v->n);
    comm_allgather(v->group, mine, whole, v->n, COMM_F32);
    return whole;
}

static void vector_whole_free(const moe_vector *v, float *whole) {
    if (whole != v->params && whole != v->grads) mem_free(whole);
}

size_t moe_params_whole_numel(const moe_params *p) {
    return p->routers.n + p->experts.n * (size_t)p->shape.ep_size;
}

void moe_params_whole(const moe_params *p, comm *ep, int grads, float *out) {
    const moe_shape *s = &p->shape;
    const size_t local = p->experts.n, X = moe_expert_numel(s), El = s->experts_local;
    const int EP = s->ep_size;
    float *all = mem_alloc(MEM_OTHER, (local * EP + 1) * sizeof(float));
    float *routers = vector_whole(&p->routers, grads);
    float *mine = vector_whole(&p->experts, grads);
    if (EP > 1) comm_allgather(ep, mine, all, local * EP, COMM_F32);
    else memcpy(all, mine, local * sizeof(float));
    if (out) {   /* EP rank q's experts are global experts [q El, (q + 1) El) */
        memcpy(out, routers, p->routers.n * sizeof(float));
        float *experts = out + p->routers.n;
        for (int q = 0; q < EP; q++)
            for (int i = 0; i < s->moe_layers; i++)
                memcpy(experts + ((size_t)i * s->cfg.experts + q * El) * X,
                       all + q * local + (size_t)i * El * X, El * X * sizeof(float));
    }
    vector_whole_free(&p->routers, routers);
    vector_whole_free(&p->experts, mine);
    mem_free(all);
}
