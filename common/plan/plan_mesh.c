#include "plan_mesh.h"

#include <math.h>

const char *const plan_recompute_names[] = {"none", "selective", "full"};

double plan_layer_params(int hidden) {
    const double h = hidden;
    return 12 * h * h + 13 * h;
}

double plan_params(const plan_model *m) {
    const double h = m->hidden;
    return m->layers * plan_layer_params(m->hidden) + ((double)m->vocab + m->seq) * h;
}

plan_model plan_shape_for_params(double params, int vocab, int seq) {
    /* P ~ 12 l h^2 with l = h / 128 gives h = (128 P / 12)^(1/3) */
    double h = cbrt(128.0 * params / 12.0);
    int hidden = (int)fmax(1024, 1024 * round(h / 1024));
    plan_model m = {.layers = 1, .hidden = hidden, .heads = hidden / 128, .vocab = vocab,
                    .seq = seq};
    const double per_layer = plan_layer_params(hidden);
    const double rest = ((double)vocab + seq) * hidden;
    m.layers = (int)fmax(1, round((params - rest) / per_layer));
    return m;
}

int plan_dp_shard_size(const plan_mesh *mesh) {
    return mesh->dp_shard > 0 ? mesh->dp_shard : mesh->dp;
}

int plan_dp_replicas(const plan_mesh *mesh) { return mesh->dp / plan_dp_shard_size(mesh); }

int plan_cp_size(const plan_mesh *mesh) { return mesh->cp > 1 ? mesh->cp : 1; }

int plan_micro_batches(const plan_mesh *mesh) {
    const long per_pipeline = (long)mesh->dp * mesh->micro_batch;
    if (per_pipeline <= 0 || mesh->global_batch % per_pipeline != 0) return 0;
    return (int)(mesh->global_batch / per_pipeline);
}

int plan_micro_batches_in_flight(const plan_mesh *mesh) {
    const int micro_batches = plan_micro_batches(mesh);
    return mesh->pp < micro_batches ? mesh->pp : micro_batches;
}

int plan_layers_per_stage(const plan_model *m, int pp) {
    return (m->layers + pp - 1) / pp;
}

double plan_params_per_gpu(const plan_model *m, int tp, int pp) {
    const double h = m->hidden;
    const double layers = plan_layers_per_stage(m, pp) * plan_layer_params(m->hidden) / tp;
    return layers + (double)m->vocab * h / tp + (double)m->seq * h;
}

double plan_this_model_layer_params(int hidden, int tp) {
    const double h = hidden, t = tp;
    return 12 * h * h / t + 7 * h / t + 6 * h;
}

int plan_stage_layers(const plan_model *m, int pp, int stage) {
    const long l = m->layers;
    return (int)((stage + 1) * l / pp - stage * l / pp);
}

double plan_this_model_params_per_gpu(const plan_model *m, int tp, int pp) {
    const double h = m->hidden, layer = plan_this_model_layer_params(m->hidden, tp);
    const double rows = (double)((m->vocab + tp - 1) / tp) * h;   /* padded to ceil(V/t) */
    const double first = plan_stage_layers(m, pp, 0) * layer + rows + (double)m->seq * h;
    const double last = plan_stage_layers(m, pp, pp - 1) * layer + 2 * h + rows;
    if (pp == 1) return first + 2 * h;
    return first > last ? first : last;
}

double plan_mesh_params_per_gpu(const plan_model *m, const plan_mesh *mesh) {
    if (mesh->tp_count == PLAN_TP_THIS_MODEL)
        return plan_this_model_params_per_gpu(m, mesh->tp, mesh->pp);
    return plan_params_per_gpu(m, mesh->tp, mesh->pp);
}

double plan_mesh_layer_params(const plan_model *m, const plan_mesh *mesh) {
    if (mesh->tp_count == PLAN_TP_THIS_MODEL)
        return plan_this_model_layer_params(m->hidden, mesh->tp);
    return plan_layer_params(m->hidden) / mesh->tp;
}

double plan_layer_activations(const plan_model *m, int micro_batch, int tp, int sp,
                              plan_recompute recompute) {
    const double s = m->seq, b = micro_batch, h = m->hidden, a = m->heads, t = tp;
    const double sbh = s * b * h;
    const int split_all = sp && tp > 1;   /* SP splits the 10 s b h left whole by TP */
    if (recompute == RECOMPUTE_FULL) return split_all ? 2 * sbh / t : 2 * sbh;
    const double linear = split_all ? 34 / t : 10 + 24 / t;
    const double attention = recompute == RECOMPUTE_SELECTIVE ? 0 : 5 * a * s / (h * t);
    return sbh * (linear + attention);
}
