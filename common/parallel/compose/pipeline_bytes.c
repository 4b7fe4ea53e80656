/* The pipeline's textbook bytes per group and step (pipeline.h: pipeline_bytes_formula,
 * the formulas listed there). */
#include "pipeline.h"

#include "tp_bytes.h"
#include "tp_sizes.h"

const char *pipeline_group_kind_name(pipeline_group_kind kind) {
    static const char *const names[PIPELINE_ALL_KINDS] = {"tp", "pp", "dp", "embedding", "cp",
                                                          "dp_replicate", "expert_dp"};
    return kind >= 0 && kind < PIPELINE_ALL_KINDS ? names[kind] : "?";
}

static double ring(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

/* HSDP: this rank's pieces of a stage slice all-reduced across r replicas, one call a
 * slab, each counted as the ring's 2 (r-1)/r of its bytes in whole bytes. */
static double replicate_bytes(const gpt_shape *s, int group, int group_rank, int r,
                              double grad_bytes) {
    if (r < 2) return 0;
    shard_layout l;
    shard_layout_init(&l, s, group, group_rank);
    double total = 0;
    for (int slab = 0; slab < l.num_slabs; slab++) {
        const unsigned long long bytes = (unsigned long long)(l.piece_len[slab] * grad_bytes);
        total += (double)(2ull * (unsigned)(r - 1) * bytes / (unsigned)r);
    }
    shard_layout_free(&l);
    return total;
}

/* A stage slice's dp terms: its reduction over the gradients' group and (HSDP) the
 * replicas. */
static void dp_terms(const run_config *cfg, mesh_shape shape, mesh_coord me, int zero,
                     const gpt_shape *s, double bytes[PIPELINE_ALL_KINDS]) {
    const double act = (double)precision_bytes(cfg->precision);
    const double grad = (double)precision_bytes(cfg->grad_precision);
    /* DDP all-reduces the gradients; ZeRO reduce-scatters them (half a ring) and
     * all-gathers the compute weights (the other half: 16-bit in mixed precision) */
    const double dp_bytes_per_param = 0.5 * (grad + (zero == 0 ? grad : act));
    int group, group_rank, replicas;
    parallel_grads_groups(&shape, mesh_rank_of(&shape, me), zero, &group, &group_rank,
                          &replicas);
    bytes[PIPELINE_DP] += ring(group) * (double)gpt_num_params(s) * dp_bytes_per_param;
    bytes[PIPELINE_DP_REPLICATE] += replicate_bytes(s, group, group_rank, replicas, grad);
}

/* An fp32 all-reduce of n floats on g ranks, as the ring's 2 (g-1)/g of its bytes. */
static double allreduce_bytes(size_t n, int g) {
    const unsigned long long bytes = (unsigned long long)(n * sizeof(float));
    return g > 1 ? (double)(2ull * (unsigned)(g - 1) * bytes / (unsigned)g) : 0;
}

/* One ring pass (a reduce-scatter or an all-gather) of n floats on g ranks. */
static double ring_pass_bytes(size_t n, int g) {
    const unsigned long long bytes = (unsigned long long)(n * sizeof(float));
    return g > 1 ? (double)((unsigned)(g - 1) * bytes / (unsigned)g) : 0;
}

/* An MoE vector of n floats (moe_params.h) on rank `rank` of `group` with `replicas`:
 * ZeRO 0 all-reduces it on both; from ZeRO 1 on a reduce-scatter and an all-gather on
 * the group (zero 1-2: of the updated pieces; zero 3: at the step's start) and this
 * rank's piece all-reduced across the replicas. */
static void moe_vector_terms(size_t n, int zero, int group, int rank, int replicas,
                             double *on_group, double *on_replicas) {
    if (moe_vector_zero(zero, group) == 0) {
        *on_group += allreduce_bytes(n, group);
        *on_replicas += allreduce_bytes(n, replicas);
        return;
    }
    size_t at;
    *on_group += 2 * ring_pass_bytes(n, group);
    *on_replicas += allreduce_bytes(comm_shard(n, group, rank, &at), replicas);
}

/* MoE: the routers' gradient reduced where the dense ones are, the experts' on
 * expert_dp. */
static void moe_terms(const run_config *cfg, mesh_shape shape, mesh_coord me, int zero,
                      const moe_config *moe, double bytes[PIPELINE_ALL_KINDS]) {
    if (moe->experts <= 0) return;
    const moe_shape ms = moe_shape_make(moe, &cfg->model, mesh_ep_size(&shape), me.ep);
    const int rank = mesh_rank_of(&shape, me);
    int group, group_rank, replicas;
    parallel_grads_groups(&shape, rank, zero, &group, &group_rank, &replicas);
    moe_vector_terms(moe_router_numel(&ms), zero, group, group_rank, replicas,
                     &bytes[PIPELINE_DP], &bytes[PIPELINE_DP_REPLICATE]);
    double none = 0;
    moe_vector_terms(moe_local_experts_numel(&ms), zero, mesh_expert_dp_size(&shape),
                     mesh_group_rank(&shape, MESH_EXPERT_DP, rank), 1,
                     &bytes[PIPELINE_EXPERT_DP], &none);
}

/* The stage's MoE blocks (0 for a dense model). */
static int moe_blocks_of(const gpt_shape *s, const moe_config *moe) {
    if (moe->experts <= 0) return 0;
    const moe_shape ms = moe_shape_make(moe, &s->cfg, 1, 0);
    int n = 0;
    for (int l = s->layer_begin; l < s->layer_end; l++) n += moe_is_moe_layer(&ms, l);
    return n;
}

/* SP's MoE block (model.h): its rows all-gathered before the layer and the output's
 * gradient before its backward, (t-1)/t of the N x C rows each, where the formula above
 * counts the block's attention alone (2 all-reduces) and a dense block's two inputs
 * gathered again (tp_sequence_stage_bytes_added; an MoE block has no fc input): one
 * all-gather more a block. */
static double sp_moe_bytes(int tp, int moe_blocks, double rows_bytes) {
    return (tp - 1.0) / tp * moe_blocks * rows_bytes;
}

void pipeline_bytes_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                            const pipeline_options *opts, double bytes[PIPELINE_ALL_KINDS]) {
    const int v = opts->chunks, S = v * shape.pp, m = opts->micro, c = mesh_cp_size(&shape);
    /* tokens per micro-batch on this rank: a CP rank's rows of its sequences */
    const double N = (double)cfg->batch / shape.dp / m * cfg->model.ctx / c;
    const double C = cfg->model.dim, f32 = sizeof(float);
    /* activations and their gradients travel in the model's precision (the loss's
     * numbers in fp32), gradients in --grad-dtype's, the tied weight's in fp32 (summed
     * before the gradient is rounded) */
    const double act = (double)precision_bytes(cfg->precision);
    const int zero = shape.dp * c > 1 ? opts->zero_stage : 0;
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++) bytes[k] = 0;
    const int vshape = pp_schedule_vshape(opts->schedule);
    for (int ch = 0; ch < v; ch++) {
        const int k = pp_stage_of(vshape, shape.pp, me.pp, ch);
        int before = -1, after = -1, chunk;   /* the ranks of stages k - 1 and k + 1 */
        if (k > 0) pp_place_of(vshape, shape.pp, k - 1, &before, &chunk);
        if (k < S - 1) pp_place_of(vshape, shape.pp, k + 1, &after, &chunk);
        gpt_shape s = parallel_model_shape(cfg, shape.tp, me.tp, &opts->moe);
        gpt_shape_split_stages(&s, S, k);
        /* an MoE block's MLP is computed whole on every TP rank: its f and g are not */
        double tp_bytes = (4.0 * gpt_stage_layers(&s) - 2.0 * moe_blocks_of(&s, &opts->moe)) *
                          N * C * act;
        if (s.vocab_parallel && s.has_embed) tp_bytes += N * C * act;
        if (s.vocab_parallel && s.has_head) tp_bytes += N * C * act + 3 * N * f32;
        bytes[PIPELINE_TP] += m * ring(shape.tp) * tp_bytes;
        /* with SP a stage's LayerNorms are on T/tp positions: gathered again, and their
         * gradients all-reduced, in each micro-batch's backward */
        if (opts->sequence_parallel)
            bytes[PIPELINE_TP] += m * (tp_sequence_stage_bytes_added(
                                           &cfg->model, cfg->precision, N, gpt_stage_layers(&s),
                                           s.has_head, shape.tp) +
                                       sp_moe_bytes(shape.tp, moe_blocks_of(&s, &opts->moe),
                                                    N * C * act));
        /* a V's turn (stages p-1 and p on one rank) is no message; with SP the
         * boundary is this rank's T/tp positions of each sequence (Megatron's) */
        const double boundary = N / (opts->sequence_parallel ? shape.tp : 1) * C * act;
        bytes[PIPELINE_PP] += m * boundary * ((after >= 0 && after != me.pp) +
                                              (before >= 0 && before != me.pp));
        dp_terms(cfg, shape, me, zero, &s, bytes);
        if (shape.pp > 1 && !vshape && (s.has_embed || s.has_head))
            bytes[PIPELINE_EMBEDDING] += ring(2) * (double)gpt_tied_weight_numel(&s) * f32;
        if (c > 1)   /* every micro-batch's attention, in every layer of the stage */
            bytes[PIPELINE_CP] += m * gpt_stage_layers(&s) *
                                  cp_attention_bytes_formula(opts->cp.kind, c, (int)(N * c / cfg->model.ctx),
                                                             cfg->model.ctx, s.dim_local,
                                                             cfg->precision);
    }
    moe_terms(cfg, shape, me, zero, &opts->moe, bytes);
}

