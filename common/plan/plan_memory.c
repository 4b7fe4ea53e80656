#include "plan_memory.h"

#include <math.h>

#include "activation_memory.h"
#include "plan_cp.h"
#include "zero_rule.h"

const plan_precision PLAN_MIXED_ADAM = {2, 2, 12, 2, 0};
const plan_precision PLAN_MIXED_FP32_GRADS = {2, 4, 12, 2, 0};
const plan_precision PLAN_FP32_ADAM = {4, 4, 8, 4, 0};

/* element_bytes per kept activation; Korthikanti's counts are of 2-byte elements. With
 * context parallelism every term is a rank's chunk of s / cp tokens (plan_cp.h). */
static double activations_of(const plan_model *m, const plan_mesh *mesh, double element_bytes) {
    if (mesh->activations == PLAN_ACTS_THIS_MODEL)
        return plan_this_model_activations(m, mesh, element_bytes);
    const double scale = element_bytes / 2;
    const int in_flight = plan_micro_batches_in_flight(mesh);
    const double layers = plan_layers_per_stage(m, mesh->pp);
    double bytes = layers * in_flight * plan_layer_activations_cp(m, mesh);
    if (mesh->recompute == RECOMPUTE_FULL) {
        plan_mesh whole_layer = *mesh;
        whole_layer.recompute = RECOMPUTE_NONE;
        bytes += plan_layer_activations_cp(m, &whole_layer);
    }
    bytes *= scale;
    if (mesh->pp == 1) {
        const double sb = (double)m->seq / plan_cp_size(mesh) * mesh->micro_batch;
        bytes += 2 * scale * sb * m->hidden + 4 * sb * m->vocab / mesh->tp;
    }
    return bytes;
}

double plan_activations_per_gpu(const plan_model *m, const plan_mesh *mesh) {
    return activations_of(m, mesh, 2);
}

double plan_activations_in(const plan_model *m, const plan_mesh *mesh,
                           plan_precision precision) {
    return activations_of(m, mesh, precision.activation);
}

plan_bytes plan_states_bytes(double params, int zero_stage, int dp, plan_precision precision) {
    const zero_sharded z = zero_sharded_at(zero_stage);
    return (plan_bytes){
        .params = precision.params * params * zero_share(z.params, dp),
        .grads = precision.grads * params * zero_share(z.grads, dp),
        .optimizer = precision.optimizer * params * zero_share(z.optimizer, dp),
    };
}

double plan_gathered_bytes(plan_precision p) { return p.gathered > 0 ? p.gathered : p.params; }

plan_bytes plan_states_at_peak(const plan_mesh *mesh, double params, double layer, int shards,
                               plan_precision precision) {
    plan_bytes b = plan_states_bytes(params, mesh->zero_stage, shards, precision);
    const zero_sharded z = zero_sharded_at(mesh->zero_stage);
    if (mesh->gather == PLAN_GATHER_PER_STEP) {
        /* the step's gradient is summed in fp32 over the micro-batches */
        const double fp32 = 4;
        if ((z.grads && shards > 1) || precision.grads < fp32) b.grads += fp32 * params;
        if (z.params && shards > 1) b.params += plan_gathered_bytes(precision) * params;
        return b;
    }
    if (z.grads && shards > 1) b.grads += precision.grads * layer;
    if (z.params && shards > 1) b.params += plan_gathered_bytes(precision) * layer;
    return b;
}

plan_bytes plan_model_states(const plan_model *m, const plan_mesh *mesh,
                             plan_precision precision) {
    /* the cp ranks hold the same weights: ZeRO shards over dp x cp, as Megatron-LM's
     * distributed optimizer does; HSDP over its shard group x cp only */
    const int shards = plan_dp_shard_size(mesh) * plan_cp_size(mesh);
    return plan_states_at_peak(mesh, plan_mesh_params_per_gpu(m, mesh),
                               plan_mesh_layer_params(m, mesh), shards, precision);
}

plan_bytes plan_memory_per_gpu(const plan_model *m, const plan_mesh *mesh,
                               plan_precision precision) {
    plan_bytes b = plan_model_states(m, mesh, precision);
    b.activations = plan_activations_in(m, mesh, precision);
    return b;
}

double plan_max_params(int zero_stage, double gpu_bytes, int dp, int mp,
                       plan_precision precision) {
    return mp * gpu_bytes / plan_total(plan_states_bytes(1, zero_stage, dp, precision));
}
