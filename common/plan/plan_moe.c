#include "plan_moe.h"

double plan_mlp_params(int hidden) {
    const double h = hidden;
    return 8 * h * h + 5 * h;
}

double plan_expert_params(int hidden, double expert_ffn) {
    const double h = hidden, f = expert_ffn;
    return 2 * h * f + f + h;
}

int plan_moe_layers_in(int layers, const plan_moe *moe) {
    if (moe->experts <= 0) return 0;
    return layers / moe->every;
}

/* What one MoE layer adds to a dense one when `experts` of its experts count. */
static double moe_layer_extra(const plan_model *m, const plan_moe *moe, int experts) {
    return (double)m->hidden * moe->experts + experts * plan_expert_params(m->hidden, moe->expert_ffn) -
           plan_mlp_params(m->hidden);
}

double plan_moe_total_params(const plan_model *m, const plan_moe *moe) {
    return plan_params(m) + plan_moe_layers_in(m->layers, moe) * moe_layer_extra(m, moe, moe->experts);
}

double plan_moe_active_params(const plan_model *m, const plan_moe *moe) {
    return plan_params(m) + plan_moe_layers_in(m->layers, moe) * moe_layer_extra(m, moe, moe->top_k);
}

double plan_moe_forward_flops_per_token(const plan_model *m, const plan_moe *moe) {
    const double h = m->hidden, s = m->seq, l = m->layers, V = m->vocab;
    const double moe_layers = plan_moe_layers_in(m->layers, moe);
    const double attention = 8 * h * h + 4 * s * h;
    const double dense_mlp = 16 * h * h;
    const double moe_mlp = 2 * h * moe->experts + moe->top_k * 4 * h * moe->expert_ffn;
    return l * attention + (l - moe_layers) * dense_mlp + moe_layers * moe_mlp + 2 * h * V;
}

double plan_moe_alltoall_bytes_per_token(const plan_moe *moe, int hidden, double element_bytes,
                                         int ep) {
    if (ep <= 1) return 0;
    const double leaves_rank = (ep - 1.0) / ep;
    return 2 * 2 * (double)moe->top_k * hidden * element_bytes * leaves_rank;
}

double plan_moe_dense_params_per_gpu(const plan_model *m, const plan_moe *moe, int tp, int pp) {
    const int layers = plan_layers_per_stage(m, pp);
    const int moe_layers = plan_moe_layers_in(layers, moe);
    const double dense = plan_params_per_gpu(m, tp, pp);
    /* an MoE layer keeps the dense layer but its MLP, plus the router, whole on every rank */
    return dense - moe_layers * (plan_mlp_params(m->hidden) / tp - (double)m->hidden * moe->experts);
}

double plan_moe_expert_params_per_gpu(const plan_model *m, const plan_moe *moe, int tp, int pp,
                                      int ep) {
    const int moe_layers = plan_moe_layers_in(plan_layers_per_stage(m, pp), moe);
    const double experts_here = (double)moe->experts / ep;
    return moe_layers * experts_here * plan_expert_params(m->hidden, moe->expert_ffn) / tp;
}

/* One MoE layer's MLP activations (Korthikanti's 2-byte count) for k experts of size f,
 * one micro-batch: k s b (3h + 4f) with TP splitting the 4f, SP everything. */
static double mlp_activations(const plan_model *m, const plan_mesh *mesh, int k, double f) {
    const double sb = (double)m->seq * mesh->micro_batch, h = m->hidden, t = mesh->tp;
    if (mesh->sequence_parallel && mesh->tp > 1) return k * sb * (3 * h + 4 * f) / t;
    return k * sb * (3 * h + 4 * f / t);
}

/* What the first stage's MoE layers keep beyond the dense layers plan_activations_in
 * counts, in 2-byte elements. */
static double moe_extra_activations(const plan_model *m, const plan_moe *moe,
                                    const plan_mesh *mesh) {
    const int moe_layers = plan_moe_layers_in(plan_layers_per_stage(m, mesh->pp), moe);
    if (moe_layers == 0) return 0;
    const double per_layer = mlp_activations(m, mesh, moe->top_k, moe->expert_ffn) -
                             mlp_activations(m, mesh, 1, 4.0 * m->hidden);
    /* full recomputation keeps only each layer's input, and one layer in full */
    if (mesh->recompute == RECOMPUTE_FULL) return per_layer;
    const int in_flight = plan_micro_batches_in_flight(mesh);
    return (double)moe_layers * in_flight * per_layer;
}

/* The largest layer on one GPU: an MoE layer (its dense part and its E / ep experts)
 * when the stage has one. */
static double largest_layer_per_gpu(const plan_model *m, const plan_moe *moe, int tp, int pp,
                                    int ep) {
    const double dense_layer = plan_layer_params(m->hidden) / tp;
    if (plan_moe_layers_in(plan_layers_per_stage(m, pp), moe) == 0) return dense_layer;
    const double experts = (double)moe->experts / ep * plan_expert_params(m->hidden, moe->expert_ffn);
    return dense_layer - plan_mlp_params(m->hidden) / tp + (double)m->hidden * moe->experts +
           experts / tp;
}

plan_bytes plan_moe_memory_per_gpu(const plan_model *m, const plan_moe *moe,
                                   const plan_mesh *mesh, int ep, plan_precision precision) {
    const double dense = plan_moe_dense_params_per_gpu(m, moe, mesh->tp, mesh->pp);
    const double experts = plan_moe_expert_params_per_gpu(m, moe, mesh->tp, mesh->pp, ep);
    plan_bytes b = plan_states_bytes(dense, mesh->zero_stage, mesh->dp, precision);
    const plan_bytes e = plan_states_bytes(experts, mesh->zero_stage, mesh->dp / ep, precision);
    b.params += e.params;
    b.grads += e.grads;
    b.optimizer += e.optimizer;
    /* ZeRO-2/3 hold one layer whole while it is reduced or gathered */
    const double layer = largest_layer_per_gpu(m, moe, mesh->tp, mesh->pp, ep);
    if (mesh->zero_stage >= 2 && mesh->dp > 1) b.grads += precision.grads * layer;
    if (mesh->zero_stage >= 3 && mesh->dp > 1) b.params += precision.params * layer;
    b.activations = plan_activations_in(m, mesh, precision) +
                    precision.activation / 2 * moe_extra_activations(m, moe, mesh);
    return b;
}
