/* An MoE run's measurements, kept per rank and collected on world rank 0
 * (ep_collect.h), and the outcome's buffers (ep_train.h). */
#include "ep_collect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ops.h"

static void *host_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    return p;
}

/* ---- the outcome ---------------------------------------------------------------------- */

void ep_outcome_alloc(ep_outcome *o, const run_config *cfg, const moe_config *moe) {
    memset(o, 0, sizeof *o);
    o->shape = moe_shape_make(moe, &cfg->model, 1, 0);
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    o->num_params = gpt_num_params(&whole) + moe_router_numel(&o->shape) +
                    moe_local_experts_numel(&o->shape);
    const size_t steps = cfg->steps, blocks = o->shape.moe_layers;
    o->loss = host_alloc(steps * sizeof(float));
    o->first_grads = host_alloc(o->num_params * sizeof(float));
    o->final_params = host_alloc(o->num_params * sizeof(float));
    o->aux = host_alloc(steps * sizeof(double));
    o->load = host_alloc(steps * blocks * moe->experts * sizeof(double));
    o->dropped = host_alloc(steps * blocks * sizeof(double));
    o->result.loss = o->loss;
}

void ep_outcome_free(ep_outcome *o) {
    free(o->loss), free(o->first_grads), free(o->final_params);
    free(o->aux), free(o->load), free(o->dropped);
    memset(o, 0, sizeof *o);
}

baseline_run ep_outcome_as_baseline(const ep_outcome *o) {
    return (baseline_run){.result = o->result, .loss = o->loss, .first_grads = o->first_grads,
                          .final_params = o->final_params, .num_params = o->num_params};
}

/* ---- kept per rank ---------------------------------------------------------------- */

void ep_keep_init(ep_keep *k, const moe_shape *s, size_t dense_n) {
    memset(k, 0, sizeof *k);
    k->shape = *s;
    k->dense_n = dense_n;
    const size_t n[3] = {dense_n, moe_router_numel(s), moe_local_experts_numel(s)};
    /* through the accounting allocator: a rank stopped by a failure elsewhere (a run
     * that diverged) cannot free them itself, and launch frees what is charged to it */
    for (int i = 0; i < 3; i++) {
        k->first[i] = mem_alloc(MEM_OTHER, n[i] * sizeof(float));
        k->final[i] = mem_alloc(MEM_OTHER, n[i] * sizeof(float));
    }
}

void ep_keep_free(ep_keep *k) {
    for (int i = 0; i < 3; i++) mem_free(k->first[i]), mem_free(k->final[i]);
}

void ep_keep_step(ep_keep *k, const moe_layer *layer, int step, ep_outcome *out) {
    k->remote_rows += moe_layer_remote_rows(layer);
    k->exchanged_rows += moe_layer_exchanged_rows(layer);
    if (!out) return;
    const int E = k->shape.cfg.experts, blocks = k->shape.moe_layers;
    out->aux[step - 1] = moe_layer_aux_loss(layer);
    for (int i = 0; i < blocks; i++) {
        memcpy(out->load + ((size_t)(step - 1) * blocks + i) * E,
               moe_layer_expert_load(layer, i), E * sizeof(double));
        out->dropped[(size_t)(step - 1) * blocks + i] = moe_layer_dropped(layer, i);
    }
}

void ep_keep_reset_traffic(ep_keep *k) { k->remote_rows = k->exchanged_rows = 0; }

void ep_keep_vectors(ep_keep *k, const float *dense, const float *routers,
                     const float *experts, int first) {
    const float *v[3] = {dense, routers, experts};
    const size_t n[3] = {k->dense_n, moe_router_numel(&k->shape),
                         moe_local_experts_numel(&k->shape)};
    for (int i = 0; i < 3; i++) ops_download((first ? k->first : k->final)[i], v[i],
                                             n[i] * sizeof(float));
}

/* ---- collected on world rank 0 ------------------------------------------------------ */

/* The whole model's vector from this rank's dense part and routers and the EP group's
 * experts (gathered: EP rank r's are global experts [r El, (r+1) El) of every block). */
static void whole_vector(const ep_keep *k, const mesh *mesh, float *const part[3],
                         float *out) {
    const moe_shape *s = &k->shape;
    const size_t R = moe_router_numel(s), local = moe_local_experts_numel(s);
    const size_t per_expert = moe_expert_numel(s), El = s->experts_local;
    const int EP = s->ep_size;
    float *gathered = host_alloc(local * EP * sizeof(float));
    if (mesh->ep) comm_allgather(mesh->ep, part[2], gathered, local * EP, COMM_F32);
    else memcpy(gathered, part[2], local * sizeof(float));
    if (!out) { free(gathered); return; }
    memcpy(out, part[0], k->dense_n * sizeof(float));
    memcpy(out + k->dense_n, part[1], R * sizeof(float));
    float *experts = out + k->dense_n + R;
    for (int r = 0; r < EP; r++)
        for (int i = 0; i < s->moe_layers; i++)
            memcpy(experts + ((size_t)i * s->cfg.experts + r * El) * per_expert,
                   gathered + (size_t)r * local + (size_t)i * El * per_expert,
                   El * per_expert * sizeof(float));
    free(gathered);
}

/* The EP group's bytes per timed step: measured, and from the rows this rank sent
 * (data) plus the El counts a peer of each MoE block's plan. */
static void traffic(const ep_keep *k, const mesh *mesh, const run_result *r,
                    ep_outcome *out) {
    const moe_shape *s = &k->shape;
    const int timed = r->timed_steps > 0 ? r->timed_steps : 1, EP = s->ep_size;
    double v[5] = {0};
    if (mesh->ep) {
        const comm_stats st = comm_stats_get(mesh->ep);
        v[0] = (double)comm_stats_total_sent(&st) / timed;
    }
    v[1] = (k->remote_rows * s->dim * sizeof(float) +
            (double)timed * s->moe_layers * (EP - 1) * s->experts_local * sizeof(double)) /
           timed;
    v[2] = fabs(v[0] - v[1]);
    v[3] = k->exchanged_rows > 0 ? k->remote_rows / k->exchanged_rows : 0;
    const double tokens = r->tokens_per_step / mesh_ep_size(&mesh->shape) /
                          mesh_expert_dp_size(&mesh->shape);
    v[4] = 4.0 * s->moe_layers * tokens * s->cfg.top_k * s->dim * sizeof(float) * (EP - 1) / EP;
    if (mesh->world) comm_allreduce(mesh->world, v, 5, COMM_F64, COMM_MAX);
    if (!out) return;
    out->alltoall_bytes = v[0];
    out->alltoall_routed_bytes = v[1];
    out->alltoall_worst_mismatch = v[2];
    out->remote_fraction = v[3];
    out->alltoall_uniform_bytes = v[4];
}

void ep_collect(ep_keep *k, const mesh *mesh, const train_outcome *run, ep_outcome *out) {
    traffic(k, mesh, &run->result, out);
    whole_vector(k, mesh, k->first, out ? out->first_grads : NULL);
    whole_vector(k, mesh, k->final, out ? out->final_params : NULL);
    if (!out) return;
    out->result = run->result;
    memcpy(out->loss, run->loss, (size_t)run->result.steps * sizeof(float));
    out->result.loss = out->loss;
}
