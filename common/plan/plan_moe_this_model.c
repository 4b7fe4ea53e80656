/* THIS model's MoE count (plan_moe_this_model.h). */
#include "plan_moe_this_model.h"

#include <math.h>

#include "activation_memory.h"
#include "plan_cp.h"

/* What an MoE layer holds beside the dense part: its routers, fp32 Adam. */
static const plan_precision FP32_STATES = {4, 4, 8, 4, 0};

static int stage_moe_layers(const plan_model *m, const plan_moe *moe, const plan_mesh *mesh) {
    return plan_moe_layers_in(plan_layers_per_stage(m, mesh->pp), moe);
}

/* The MLP a tp rank holds of a dense layer: fc and its bias split, fc2 split, its bias
 * whole. */
static double mlp_on_tp_rank(int hidden, int tp) {
    const double h = hidden;
    return (8 * h * h + 4 * h) / tp + h;
}

static double routers(const plan_model *m, const plan_moe *moe, const plan_mesh *mesh) {
    return (double)stage_moe_layers(m, moe, mesh) * m->hidden * moe->experts;
}

double plan_moe_this_model_dense_params(const plan_model *m, const plan_moe *moe,
                                        const plan_mesh *mesh) {
    const double mlps = stage_moe_layers(m, moe, mesh) * mlp_on_tp_rank(m->hidden, mesh->tp);
    return plan_mesh_params_per_gpu(m, mesh) - mlps + routers(m, moe, mesh);
}

double plan_moe_this_model_expert_params(const plan_model *m, const plan_moe *moe,
                                         const plan_mesh *mesh, int ep) {
    return (double)stage_moe_layers(m, moe, mesh) * (moe->experts / ep) *
           plan_expert_params(m->hidden, moe->expert_ffn);
}

static int expert_dp(const plan_mesh *mesh, int ep) {
    return mesh->dp * plan_cp_size(mesh) / ep;
}

static void add_states(plan_bytes *b, plan_bytes more) {
    b->params += more.params;
    b->grads += more.grads;
    b->optimizer += more.optimizer;
}

/* Tokens of a micro-batch on a rank (a CP rank's rows). */
static double micro_rows(const plan_model *m, const plan_mesh *mesh) {
    return (double)mesh->micro_batch * m->seq / plan_cp_size(mesh);
}

/* The rows an expert rank may receive a micro-batch of n tokens (moe_layer_create). */
static double expert_rows(const plan_moe *moe, const plan_mesh *mesh, int ep, double n) {
    const double all = (double)ep * n * moe->top_k;
    if (moe->capacity_factor <= 0) return all;
    const double batch = n * mesh->dp * plan_cp_size(mesh);
    const double capacity = ceil(moe->capacity_factor * batch * moe->top_k / moe->experts);
    return fmin(all, capacity * (moe->experts / ep));
}

/* The MoE layer's activation buffers (moe.c's block_alloc and moe_layer_create, and
 * moe_mixed.c's in 16 bits), bytes. */
static double moe_activations(const plan_model *m, const plan_moe *moe, const plan_mesh *mesh,
                              int ep, double element_bytes) {
    const double f32 = sizeof(float), i32 = sizeof(int), f64 = sizeof(double);
    const double n = micro_rows(m, mesh);
    const double E = moe->experts, k = moe->top_k, C = m->hidden, f = moe->expert_ffn;
    const double rows = expert_rows(moe, mesh, ep, n);
    const int slots = plan_micro_batches_in_flight(mesh);
    const double block = f32 * (n * E + n * k + n * k * C + rows * (C + 2 * f)) +
                         i32 * 3 * n * k + sizeof(size_t) * (E + ep * (E / ep)) + f64 * 3 * E;
    const double moe_layers = plan_moe_layers_in(m->layers, moe);
    double once = f32 * (n * k * C + 3 * rows * C + rows * f + n * k + n * E + n * C) +
                  sizeof(size_t) * 4 * ep +
                  f64 * ((2.0 + mesh->dp * plan_cp_size(mesh)) * E + moe_layers * E);
    if (element_bytes < f32)
        once += f32 * 2 * n * C + element_bytes * (2 * rows * C + rows * f);
    return slots * moe_layers * block + once;
}

/* The dense count's MLP buffers the model does not hold where the MoE layer replaces
 * the MLP (model_instance.c): fc's and GELU's outputs, 8 r h / t elements a MoE block
 * per micro-batch slot (under full recomputation the one rebuilt block is not counted),
 * and their gradients' scratch, 8 r h / t more, where no block of the stage is dense. */
static double unheld_mlp_buffers(const plan_model *m, const plan_moe *moe,
                                 const plan_mesh *mesh, double element_bytes) {
    const double r = micro_rows(m, mesh);
    const double mlp = element_bytes * 8 * r * m->hidden / mesh->tp;
    const int slots = plan_micro_batches_in_flight(mesh);
    const int moe_layers = stage_moe_layers(m, moe, mesh);
    double bytes = mesh->recompute == RECOMPUTE_FULL ? 0 : (double)slots * moe_layers * mlp;
    if (moe_layers == plan_layers_per_stage(m, mesh->pp)) bytes += mlp;
    return bytes;
}

plan_bytes plan_moe_this_model_memory(const plan_model *m, const plan_moe *moe,
                                      const plan_mesh *mesh, int ep, plan_precision precision) {
    const int shards = plan_dp_shard_size(mesh) * plan_cp_size(mesh);
    const double dense = plan_moe_this_model_dense_params(m, moe, mesh) - routers(m, moe, mesh);
    const double experts = plan_moe_this_model_expert_params(m, moe, mesh, ep);
    plan_bytes b = plan_states_at_peak(mesh, dense, plan_mesh_layer_params(m, mesh), shards,
                                       precision);
    add_states(&b, plan_states_bytes(routers(m, moe, mesh), mesh->zero_stage, shards,
                                     FP32_STATES));
    add_states(&b, plan_states_bytes(experts, mesh->zero_stage, expert_dp(mesh, ep),
                                     FP32_STATES));
    if (precision.params < FP32_STATES.params) b.params += precision.params * experts + 1;
    b.activations = plan_this_model_activations(m, mesh, precision.activation) -
                    unheld_mlp_buffers(m, moe, mesh, precision.activation) +
                    moe_activations(m, moe, mesh, ep, precision.activation);
    return b;
}

plan_group_bytes plan_moe_this_model_bytes(const plan_model *m, const plan_moe *moe,
                                           const plan_mesh *mesh, int ep,
                                           plan_precision precision) {
    plan_group_bytes b = plan_bytes_sent(m, mesh, precision);
    const int shards = plan_dp_shard_size(mesh) * plan_cp_size(mesh);
    const int replicas = plan_dp_replicas(mesh);
    const double dense_params = plan_moe_this_model_dense_params(m, moe, mesh) -
                                routers(m, moe, mesh);
    double dp, dp_replicate, unused;
    plan_dp_bytes(mesh, dense_params, precision, shards, replicas, &b.dp, &b.dp_replicate);
    plan_dp_bytes(mesh, routers(m, moe, mesh), FP32_STATES, shards, replicas, &dp,
                  &dp_replicate);
    b.dp += dp;
    b.dp_replicate += dp_replicate;
    plan_dp_bytes(mesh, plan_moe_this_model_expert_params(m, moe, mesh, ep), FP32_STATES,
                  expert_dp(mesh, ep), 1, &b.expert_dp, &unused);
    return b;
}
