/* Tensor parallelism's textbook bytes per rank per step (chapter 3's formulas): the
 * ring all-reduces of TP's activations, what sequence parallelism and full recomputation
 * add, and the data-parallel gradients. */
#include "tp_bytes.h"

double tp_bytes_formula(const gpt_config *m, precision p, int B_local, int T, int tp, int dp,
                        size_t params_per_rank) {
    const double N = (double)B_local * T, ring_tp = 2.0 * (tp - 1) / tp;
    const double ring_dp = 2.0 * (dp - 1) / dp;
    const double act = (double)precision_bytes(p), f32 = sizeof(float);
    /* all-reduces of N x C activations: 2 per block forward, 2 backward; with the
     * vocabulary split (tp > 1) also the embedding (forward) and the LM head's f
     * (backward), and of N and 2N fp32 numbers the loss */
    double tp_bytes = 4.0 * m->layers * N * m->dim * act;
    if (tp > 1) tp_bytes += 2.0 * N * m->dim * act + 3.0 * N * f32;
    /* data parallel: every fp32 gradient of the slice (the loss travels on a group of
     * the training loop's own) */
    const double dp_bytes = (double)params_per_rank * f32;
    return ring_tp * tp_bytes + ring_dp * dp_bytes;
}

/* 2 all-gathers of the tokens' N x C inputs per block, again in backward */
static double gathered_again(const gpt_config *m, precision p, double tokens, int layers,
                             int tp) {
    return (tp - 1.0) / tp * 2.0 * layers * tokens * m->dim * precision_bytes(p);
}

/* 2 C numbers per LayerNorm: 2 per block and the final one, all-reduced */
static double layernorm_grads(const gpt_config *m, int layers, int final_ln, int tp) {
    return 2.0 * (tp - 1) / tp * (2.0 * layers + final_ln) * 2 * m->dim * sizeof(float);
}

double tp_sequence_bytes_gathered_again(const gpt_config *m, precision p, int B_local, int T,
                                        int tp) {
    return gathered_again(m, p, (double)B_local * T, m->layers, tp);
}

double tp_sequence_bytes_layernorm_grads(const gpt_config *m, int tp) {
    return layernorm_grads(m, m->layers, 1, tp);
}

double tp_sequence_bytes_added(const gpt_config *m, precision p, int B_local, int T, int tp) {
    return tp_sequence_stage_bytes_added(m, p, (double)B_local * T, m->layers, 1, tp);
}

double tp_sequence_stage_bytes_added(const gpt_config *m, precision p, double tokens,
                                     int layers, int final_ln, int tp) {
    return gathered_again(m, p, tokens, layers, tp) + layernorm_grads(m, layers, final_ln, tp);
}

double tp_sequence_bytes_formula(const gpt_config *m, precision p, int B_local, int T, int tp,
                                 int dp, size_t params_per_rank) {
    return tp_bytes_formula(m, p, B_local, T, tp, dp, params_per_rank) +
           tp_sequence_bytes_added(m, p, B_local, T, tp);
}

double tp_recompute_bytes(const gpt_config *m, precision p, int B_local, int T, int tp) {
    const double N = (double)B_local * T;
    return 2.0 * (tp - 1) / tp * 2.0 * m->layers * N * m->dim * precision_bytes(p);
}
