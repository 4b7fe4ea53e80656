/* Part cost: what an MoE model holds against what a token uses. Three models: the
 * dense one of the chapter's shape, the MoE one (E experts a block, k used), and a dense
 * model as large as the MoE's active part (a token's k experts are one MLP k times as
 * wide). Training FLOPs per token as the library counts a step (gpt_flops_per_step):
 * 6 x (parameters a token multiplies by, the LM head in, the embeddings out) + the
 * attention's 12 L T C. */
#include <stdio.h>

#include "moe_chapter.h"

/* 6 x (active - position embedding: the token embedding's rows are the LM head) + attention */
static double flops_per_token(double active, const gpt_config *m) {
    return 6 * (active - (double)m->ctx * m->dim) + 12.0 * m->layers * m->ctx * m->dim;
}

void cost_local(const run_config *cfg, const moe_config *moe, int ep_size, cost_report *r) {
    const gpt_config *m = &cfg->model;
    const moe_shape s = moe_shape_make(moe, m, 1, 0);
    const gpt_shape dense = gpt_shape_make(m, 1, 0);
    r->total[0] = r->active[0] = (double)gpt_num_params(&dense);
    r->total[1] = moe_total_params(&s, m);
    r->active[1] = moe_active_params(&s, m);
    r->total[2] = r->active[2] = r->active[1] - (double)moe_router_numel(&s);
    for (int i = 0; i < 3; i++) r->flops_per_token[i] = flops_per_token(r->active[i], m);
    /* what the run's vectors hold: the dense model less its MoE blocks' MLPs, the
     * routers, every expert */
    r->counted_total = (double)gpt_num_params(&dense) + (double)moe_router_numel(&s) +
                       (double)moe_local_experts_numel(&s) - (double)moe_dense_mlp_numel(&s);
    const double experts = (double)moe_local_experts_numel(&s);
    r->expert_share = experts / r->total[1];
    r->ep = ep_size;
    /* dp_grads_state_bytes' count: the compute weights and gradients in their precisions,
     * Adam's m and v, and in mixed precision the fp32 masters: 16 B in fp32, 18 in bf16 */
    r->p = cfg->precision, r->gp = cfg->grad_precision;
    r->bytes_per_param = (double)precision_bytes(r->p) + (double)precision_bytes(r->gp) +
                         (r->p == PRECISION_FP32 ? 8 : 12);
    r->state_per_rank[0] = r->bytes_per_param * r->total[1];
    r->state_per_rank[1] = r->bytes_per_param * (r->total[1] - experts + experts / ep_size);
}

void cost_print(const cost_report *r, const moe_config *moe) {
    static const char *names[3] = {"dense", "MoE", "dense, MoE's active size"};
    printf("\nActive against total parameters (%d experts, top-%d, MoE every %d block%s)\n",
           moe->experts, moe->top_k, moe->every, moe->every > 1 ? "s" : "");
    printf("  %-26s %12s %14s %18s\n", "model", "parameters", "used a token",
           "train FLOPs/token");
    for (int i = 0; i < 3; i++)
        printf("  %-26s %12.0f %14.0f %18.0f\n", names[i], r->total[i], r->active[i],
               r->flops_per_token[i]);
    printf("  the MoE holds %.2fx the dense model's parameters for %.3fx its FLOPs a token;"
           " its run's vectors hold %.0f (%s); %.0f%% of them are experts\n",
           r->total[1] / r->total[0], r->flops_per_token[1] / r->flops_per_token[0],
           r->counted_total, r->counted_total == r->total[1] ? "the same" : "DIFFERENT",
           100 * r->expert_share);
    if (r->p == PRECISION_FP32)
        printf("  model state a rank holds (16 B a parameter: fp32 weights, gradients, Adam's"
               " m and v)");
    else
        printf("  model state a rank holds (%.0f B a parameter: %s weights, %s gradients, fp32"
               " masters, Adam's m and v)", r->bytes_per_param, precision_name(r->p),
               precision_name(r->gp));
    printf(": %.2f MB on one device, %.2f MB with the experts over EP %d\n",
           r->state_per_rank[0] / 1e6, r->state_per_rank[1] / 1e6, r->ep);
    printf("  for MoE at scale (GPT-4-class sizes, memory per GPU under EP) see chapter 6's"
           " planner\n");
}

void cost_json(FILE *o, const cost_report *r) {
    static const char *keys[3] = {"dense", "moe", "dense_same_active"};
    fprintf(o, "\"cost\": {");
    for (int i = 0; i < 3; i++)
        fprintf(o, "%s\"%s\": {\"params\": %.0f, \"active_params\": %.0f,"
                " \"train_flops_per_token\": %.0f}", i ? ", " : "", keys[i], r->total[i],
                r->active[i], r->flops_per_token[i]);
    fprintf(o, ", \"expert_share\": %.4f, \"state_bytes_per_rank\": [%.0f, %.0f], \"ep\": %d}",
            r->expert_share, r->state_per_rank[0], r->state_per_rank[1], r->ep);
}
