#include "zero_formulas.h"

#include "zero_rule.h"

state_bytes zero_paper_bytes(int stage, double P, int N, double K) {
    const zero_sharded z = zero_sharded_at(stage);
    return (state_bytes){2 * P * zero_share(z.params, N), 2 * P * zero_share(z.grads, N),
                         K * P * zero_share(z.optimizer, N)};
}

state_bytes zero_stored_bytes(int stage, double P, int N, precision p) {
    /* fp32: 4-byte parameters and gradients, Adam's m and v (K = 8); mixed: 2-byte
     * compute weights, 4-byte gradients, masters + m + v (K = 12) */
    const int fp32 = p == PRECISION_FP32;
    state_bytes b = zero_paper_bytes(stage, P, N, fp32 ? 8.0 : 12.0);
    if (fp32) b.params *= 2;
    b.grads *= 2;
    return b;
}

state_bytes zero_stored_bytes_grads(int stage, double P, int N, precision p, precision gp) {
    state_bytes b = zero_stored_bytes(stage, P, N, p);
    b.grads *= (double)precision_bytes(gp) / 4.0;
    return b;
}

double zero_largest_model(int stage, double bytes, int N, double K) {
    return bytes / state_total(zero_paper_bytes(stage, 1.0, N, K));
}

comm_plan zero_comm_plan(const gpt_shape *s, int stage, precision p) {
    return zero_comm_plan_grads(s, stage, p, PRECISION_FP32);
}

comm_plan zero_comm_plan_grads(const gpt_shape *s, int stage, precision p, precision gp) {
    comm_plan plan = {0};
    for (int k = 0; k < COMM_NKINDS; k++) plan.element_bytes[k] = (double)precision_bytes(gp);
    plan.element_bytes[COMM_KIND_ALLGATHER] = (double)precision_bytes(p);   /* weights */
    const double P = (double)gpt_num_params(s), slabs = gpt_num_slabs(s);
    const int layers = s->cfg.layers;
    if (stage == 0) {
        plan.calls[COMM_KIND_ALLREDUCE] = 1;
        plan.elements[COMM_KIND_ALLREDUCE] = 2 * P;
    } else if (stage <= 2) {
        /* one reduce-scatter and one all-gather per slab */
        plan.calls[COMM_KIND_REDUCE_SCATTER] = slabs;
        plan.elements[COMM_KIND_REDUCE_SCATTER] = P;
        plan.calls[COMM_KIND_ALLGATHER] = slabs;
        plan.elements[COMM_KIND_ALLGATHER] = P;
    } else {
        /* forward gathers every slab once and the tied embedding a second time for the
         * head; backward gathers the blocks again (the head's slabs are still there,
         * the embedding's backward needs none): 2P less the final LayerNorm */
        const double embed = (double)gpt_slab_numel(s, 0);
        const double final_ln = (double)gpt_slab_numel(s, gpt_final_slab(s));
        plan.calls[COMM_KIND_ALLGATHER] = (layers + 3) + layers;
        plan.elements[COMM_KIND_ALLGATHER] = (P + embed) + (P - embed - final_ln);
        plan.calls[COMM_KIND_REDUCE_SCATTER] = slabs;
        plan.elements[COMM_KIND_REDUCE_SCATTER] = P;
    }
    return plan;
}

double ring_bytes(double elements, int N) {
    return N > 1 ? elements * 4.0 * (N - 1) / N : 0.0;
}

double plan_ring_bytes(const comm_plan *plan, int kind, int N) {
    return ring_bytes(plan->elements[kind], N) * plan->element_bytes[kind] / 4.0;
}
