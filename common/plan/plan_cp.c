#include "plan_cp.h"

double plan_cp_chunk_bytes(const plan_model *m, const plan_mesh *mesh, double element_bytes) {
    const double tokens = (double)mesh->micro_batch * m->seq / plan_cp_size(mesh);
    return element_bytes * tokens * m->hidden / mesh->tp;
}

double plan_cp_chunks_per_layer(const plan_mesh *mesh) {
    const double P = plan_cp_size(mesh);
    if (P == 1) return 0;
    const int again = mesh->recompute == RECOMPUTE_FULL;   /* the forward's sends again */
    if (mesh->cp_attention == CP_ULYSSES) return (8 + 4 * again) * (P - 1) / P;
    return 6 * P - 4 + again * 2 * (P - 1);
}

/* The ring's dK/dV chunks a layer: P blocks of 2, sent in fp32. */
static double ring_dkv_chunks(const plan_mesh *mesh) {
    const int P = plan_cp_size(mesh);
    return P > 1 && mesh->cp_attention == CP_RING ? 2.0 * P : 0;
}

double plan_cp_bytes_per_layer(const plan_model *m, const plan_mesh *mesh,
                               double element_bytes) {
    const double dkv = ring_dkv_chunks(mesh), rest = plan_cp_chunks_per_layer(mesh) - dkv;
    return plan_cp_chunk_bytes(m, mesh, 1) * (rest * element_bytes + dkv * sizeof(float));
}

/* What attention keeps beyond the chunk's Q, K, V and output (plan_cp.h), in bytes. */
static double attention_kept(const plan_model *m, const plan_mesh *mesh) {
    const double P = plan_cp_size(mesh), t = mesh->tp;
    const double s = m->seq, b = mesh->micro_batch, h = m->hidden, a = m->heads;
    if (mesh->cp_attention == CP_RING)
        return 4 * a * s * b / (t * P) + 4 * s * b * h / (t * P);
    const double probabilities =
        mesh->recompute == RECOMPUTE_SELECTIVE ? 0 : 5 * a * s * s * b / (t * P);
    return 8 * s * b * h / (t * P) + probabilities;
}

double plan_layer_activations_cp(const plan_model *m, const plan_mesh *mesh) {
    const int P = plan_cp_size(mesh);
    if (P == 1)
        return plan_layer_activations(m, mesh->micro_batch, mesh->tp, mesh->sequence_parallel,
                                      mesh->recompute);
    plan_model chunk = *m;
    chunk.seq = m->seq / P;
    /* the s b h terms of the chunk: Korthikanti's count less its attention term */
    const plan_recompute linear = mesh->recompute == RECOMPUTE_FULL ? RECOMPUTE_FULL
                                                                     : RECOMPUTE_SELECTIVE;
    const double tokens_wise = plan_layer_activations(&chunk, mesh->micro_batch, mesh->tp,
                                                      mesh->sequence_parallel, linear);
    if (mesh->recompute == RECOMPUTE_FULL) return tokens_wise;
    return tokens_wise + attention_kept(m, mesh);
}

double plan_cp_seconds_per_layer(const plan_model *m, const plan_mesh *mesh,
                                 double element_bytes, double latency, double bandwidth) {
    const double P = plan_cp_size(mesh);
    if (P == 1 || bandwidth <= 0) return 0;
    const double chunk = plan_cp_chunk_bytes(m, mesh, element_bytes);
    const int again = mesh->recompute == RECOMPUTE_FULL;
    if (mesh->cp_attention == CP_ULYSSES)
        return (8 + 4 * again) * ((P - 1) * latency + (P - 1) / P * chunk / bandwidth);
    /* every send a block of 2 chunks: K/V in element_bytes, dK/dV in fp32 */
    const double kv_sends = 2 * (P - 1) + again * (P - 1), dkv_sends = P;
    const double dkv_chunk = plan_cp_chunk_bytes(m, mesh, sizeof(float));
    return (kv_sends + dkv_sends) * latency +
           (kv_sends * 2 * chunk + dkv_sends * 2 * dkv_chunk) / bandwidth;
}
