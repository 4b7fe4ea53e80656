/* A mesh rank's MoE routers and experts (moe_params.h). */
#include "moe_params.h"

#include <string.h>

#include "alloc.h"

static moe_vector vector_make(size_t n) {
    const size_t bytes = (n ? n : 1) * sizeof(float);
    moe_vector v = {.params = mem_alloc(MEM_PARAMS, bytes), .grads = mem_alloc(MEM_GRADS, bytes),
                    .adam_m = mem_alloc(MEM_OPTIMIZER, bytes),
                    .adam_v = mem_alloc(MEM_OPTIMIZER, bytes), .n = n};
    vec_zero(v.adam_m, n);
    vec_zero(v.adam_v, n);
    vec_zero(v.grads, n);
    return v;
}

static void vector_free(moe_vector *v) {
    mem_free(v->params), mem_free(v->grads), mem_free(v->adam_m), mem_free(v->adam_v);
}

void moe_params_init(moe_params *p, const moe_config *cfg, const gpt_config *model,
                     const moe_params_groups *g, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->shape = moe_shape_make(cfg, model, g->ep_size, g->ep_rank);
    p->routers = vector_make(moe_router_numel(&p->shape));
    p->experts = vector_make(moe_local_experts_numel(&p->shape));
    moe_init_routers(&p->shape, seed, p->routers.params);
    moe_init_local_experts(&p->shape, seed, p->experts.params);
    p->dense = g->dense;
    p->replicate = g->replicate;
    p->expert_dp = g->expert_dp;
    const int ep_alone = !g->ep || comm_size(g->ep) == 1;
    p->layer = moe_layer_create(&p->shape, g->tokens, &(moe_layer_options){
        .world = g->world && comm_size(g->world) > 1 ? g->world : NULL,
        .ep = ep_alone ? NULL : g->ep, .test_combine_misorder = g->test_combine_misorder});
    moe_layer_bind(p->layer, p->routers.params, p->experts.params, p->routers.grads,
                   p->experts.grads);
}

void moe_params_free(moe_params *p) {
    moe_layer_free(p->layer);
    vector_free(&p->routers);
    vector_free(&p->experts);
    memset(p, 0, sizeof *p);
}

void moe_params_step_begin(moe_params *p, float dloss) {
    vec_zero(p->routers.grads, p->routers.n);
    vec_zero(p->experts.grads, p->experts.n);
    moe_layer_set_dloss(p->layer, dloss);
}

static void all_reduce(comm *group, float *v, size_t n) {
    if (group && comm_size(group) > 1 && n > 0) comm_allreduce(group, v, n, COMM_F32, COMM_SUM);
}

void moe_params_reduce(moe_params *p) {
    p->remote_rows += moe_layer_remote_rows(p->layer);
    p->exchanged_rows += moe_layer_exchanged_rows(p->layer);
    all_reduce(p->dense, p->routers.grads, p->routers.n);
    all_reduce(p->replicate, p->routers.grads, p->routers.n);
    all_reduce(p->expert_dp, p->experts.grads, p->experts.n);
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

void moe_params_adamw(moe_params *p, const adamw_config *a) {
    p->adam_step++;
    moe_vector *mine[2] = {&p->routers, &p->experts};
    for (int i = 0; i < 2; i++)
        if (mine[i]->n > 0)
            adamw_update(mine[i]->params, mine[i]->grads, mine[i]->adam_m, mine[i]->adam_v,
                         mine[i]->n, a, p->adam_step);
}

int moe_params_grad_vectors(moe_params *p, grad_vector *vectors) {
    vectors[0] = grad_vector_fp32(p->routers.grads, p->routers.n);
    vectors[1] = grad_vector_fp32(p->experts.grads, p->experts.n);
    return 2;
}

size_t moe_params_whole_numel(const moe_params *p) {
    return p->routers.n + p->experts.n * (size_t)p->shape.ep_size;
}

void moe_params_whole(const moe_params *p, comm *ep, int grads, float *out) {
    const moe_shape *s = &p->shape;
    const size_t local = p->experts.n, X = moe_expert_numel(s), El = s->experts_local;
    const int EP = s->ep_size;
    float *all = mem_alloc(MEM_OTHER, (local * EP + 1) * sizeof(float));
    const float *mine = grads ? p->experts.grads : p->experts.params;
    if (EP > 1) comm_allgather(ep, mine, all, local * EP, COMM_F32);
    else memcpy(all, mine, local * sizeof(float));
    if (out) {   /* EP rank q's experts are global experts [q El, (q + 1) El) */
        memcpy(out, grads ? p->routers.grads : p->routers.params, p->routers.n * sizeof(float));
        float *experts = out + p->routers.n;
        for (int q = 0; q < EP; q++)
            for (int i = 0; i < s->moe_layers; i++)
                memcpy(experts + ((size_t)i * s->cfg.experts + q * El) * X,
                       all + q * local + (size_t)i * El * X, El * X * sizeof(float));
    }
    mem_free(all);
}
