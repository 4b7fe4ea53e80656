/* One rank's model options and gradient groups from the mesh (parallelize.h). */
#include "parallelize.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "tp_sizes.h"

#define REFUSE(...) return snprintf(why, why_len, __VA_ARGS__), why

/* CP's chunks: equal spans of the sequence, whole heads for Ulysses, the CPU. */
static const char *check_cp(const run_config *cfg, const mesh_shape *s,
                            const parallel_options *o, char *why, size_t why_len) {
    const int c = mesh_cp_size(s), T = cfg->model.ctx, H = cfg->model.heads / s->tp;
    const int balanced = o->cp.kind == CP_RING && o->cp.split == CP_BALANCED;
    const int pieces = balanced ? 2 * c : c;
    if (c == 1) return NULL;
    if (T % pieces)
        REFUSE("--ctx %d does not split into %d equal chunks (--cp %d%s): use a ctx that is a"
               " multiple of %d", T, pieces, c, balanced ? " balanced: 2 chunks per rank" : "",
               pieces);
    if (o->cp.kind == CP_ULYSSES && H % c)
        REFUSE("--cp %d does not divide --heads %d%s (Ulysses gives each rank heads/cp whole"
               " heads): use a CP size that divides %d, or --cp-attention ring", c,
               H, s->tp > 1 ? " / --tp" : "", H);
    if (o->cp.kind == CP_ULYSSES && o->cp.split == CP_BALANCED)
        REFUSE("--cp-split balanced is for ring attention: Ulysses sees the whole sequence on"
               " its heads, so no rank waits on the causal mask");
    return NULL;
}

/* MoE on the mesh: its experts over ep (carved from dp x cp), in every stage, any
 * micro-batches (each routed as a global micro-batch: moe.h). */
static const char *check_moe(const run_config *cfg, const mesh_shape *s,
                             const parallel_options *o, char *why, size_t why_len) {
    const int e = mesh_ep_size(s), c = mesh_cp_size(s);
    if (o->moe.experts <= 0) {
        if (e > 1) REFUSE("--ep %d needs MoE blocks (--experts E) to split", e);
        return NULL;
    }
    char err[200];
    if (!moe_config_check(&o->moe, cfg->model.layers, e, err, sizeof err)) REFUSE("%s", err);
    if (c > 1 && o->moe.capacity_factor > 0)
        REFUSE("--experts with --cp %d and capacity factor %g: an expert keeps the first"
               " pairs of the global batch in token order, which CP's chunks interleave"
               " across ranks; give --capacity-factor 0 (no dropping) with --cp", c,
               o->moe.capacity_factor);
    if (o->split_backward)
        REFUSE("--experts with a schedule that splits the backward (zb-h1, zb-v, dualpipev):"
               " the MoE layer's backward gives d input and its weights' gradients in one"
               " pass; give --schedule 1f1b, gpipe or interleaved");
    if (cfg->comm.device == DEVICE_CUDA)
        REFUSE("--device cuda: the MoE layer runs on the CPU here: give --device cpu");
    return NULL;
}

static const gpt_attention_hook some_attention;   /* stands for the CP group's */

/* The MoE layer's hook stands for itself: it replaces the MoE blocks' MLPs (ctx: the
 * moe_shape). */
static int replaces_moe_blocks(void *ctx, int layer) {
    return moe_is_moe_layer((const moe_shape *)ctx, layer);
}

gpt_shape parallel_model_shape(const run_config *cfg, int tp, int tp_rank,
                               const moe_config *moe) {
    gpt_shape s = gpt_shape_make(&cfg->model, tp, tp_rank);
    tp_split_vocab(&s, tp);
    if (moe->experts > 0) gpt_shape_drop_moe_mlps(&s, moe->every);
    return s;
}

/* What the model refuses of the options rank 0 would make, in its own words. */
static const char *check_model(const run_config *cfg, const mesh_shape *s,
                               const parallel_options *o, char *why, size_t why_len) {
    const int c = mesh_cp_size(s);
    const gpt_shape shape = parallel_model_shape(cfg, s->tp, 0, &o->moe);
    const position_span span = cp_span_of(cfg->model.ctx, c, 0, o->cp.split);
    moe_shape moe_blocks = {0};
    if (o->moe.experts > 0) moe_blocks = moe_shape_make(&o->moe, &cfg->model, 1, 0);
    const gpt_mlp_hook some_mlp = {.ctx = &moe_blocks, .replaces = replaces_moe_blocks};
    const gpt_model_options m = {.precision = cfg->precision,
                                 .sequence_parallel = o->sequence_parallel,
                                 .mlp = o->moe.experts > 0 ? &some_mlp : NULL,
                                 .attention = c > 1 ? &some_attention : NULL,
                                 .positions = c > 1 ? &span : NULL,
                                 .max_slots = o->micro > 0 ? o->micro : 1,
                                 .recompute_attention = o->layers.recompute_attention,
                                 .checkpoint_activations = o->layers.checkpoint_activations,
                                 .tp_overlap_chunks = o->layers.tp_overlap_chunks};
    char model_why[200];
    if (!gpt_model_options_check(&shape, c > 1 ? position_span_rows(&span) : cfg->model.ctx,
                                 &m, model_why, sizeof model_why))
        return NULL;
    REFUSE("--tp %d%s --cp %d in %s%s: the model refuses it (%s)", s->tp,
           o->sequence_parallel ? " --sp" : "", c, precision_name(cfg->precision),
           o->micro > 1 ? " with micro-batches" : "", model_why);
}

/* The batch over the data-parallel groups, in CP's words where there is CP. */
static const char *check_batch(const run_config *cfg, const mesh_shape *s, int world,
                               int micro, char *why, size_t why_len) {
    const int c = mesh_cp_size(s);
    if (cfg->batch % (s->dp * micro) == 0) return NULL;
    if (c > 1)
        REFUSE("--batch %d does not split over %d data-parallel groups (%d ranks / --cp %d%s)",
               cfg->batch, s->dp, world, c, s->tp > 1 ? " / --tp" : "");
    REFUSE("--batch %d does not split over --dp %d%s", cfg->batch, s->dp,
           micro > 1 ? " x the micro-batches" : "");
}

const char *parallelize_check(const run_config *cfg, const mesh_shape *shape, int world,
                              const parallel_options *o, char *why, size_t why_len) {
    const mesh_shape *s = shape;
    if (mesh_cp_size(s) > 1 && cfg->comm.device == DEVICE_CUDA)
        REFUSE("--device cuda: context parallelism runs on the CPU here (its blockwise"
               " attention has no CUDA kernels yet): give --device cpu");
    if (s->tp < 1 || cfg->model.heads % s->tp)
        REFUSE("--tp %d does not divide --heads %d", s->tp, cfg->model.heads);
    const mesh_config mc = {.shape = *shape, .world = world,
                            .experts = o->moe.experts > 0 ? o->moe.experts : 0};
    if (mesh_check(&mc, why, why_len)) return why;
    if (check_moe(cfg, s, o, why, why_len)) return why;
    if (o->sequence_parallel && !tp_sequence_check(cfg, s->tp, why, why_len)) return why;
    if (check_cp(cfg, s, o, why, why_len)) return why;
    if (check_batch(cfg, s, world, o->micro > 0 ? o->micro : 1, why, why_len)) return why;
    return check_model(cfg, s, o, why, why_len);
}

void parallel_grads_groups(const mesh_shape *shape, int rank, int zero, int *group,
                           int *group_rank, int *replicas) {
    const int all = mesh_cp_size(shape) * shape->dp;
    const mesh_group_kind kind = zero > 0 && all > 1 ? MESH_DP_SHARD_CP : MESH_DP_CP;
    *group = mesh_group_members(shape, kind, 0, NULL);
    *group_rank = mesh_group_rank(shape, kind, rank);
    *replicas = kind == MESH_DP_SHARD_CP ? mesh_dp_replicate_size(shape) : 1;
}

/* The MoE layer on the mesh's ep group, its routers summed where the dense gradients
 * are, its experts over expert_dp; the model's MLP hook. */
static void parallelize_moe(parallel_rank *p, const mesh *m, const run_config *cfg,
                            const parallel_options *o, int tokens) {
    p->experts_group = o->expert_grads_over_ep ? m->ep : m->expert_dp;
    /* world: the ranks of distinct tokens, dp x cp (the dp group where cp is 1), apart
     * from the dense gradients' group so that its bytes are counted apart */
    comm *tokens_group = m->dp;
    if (mesh_cp_size(&m->shape) > 1) {
        const int rank = comm_rank(m->world);
        p->moe_world = comm_split(m->world, mesh_group_index(&m->shape, MESH_DP_CP, rank),
                                  mesh_group_rank(&m->shape, MESH_DP_CP, rank), "moe-world");
        tokens_group = p->moe_world;
    }
    const moe_params_groups g = {.world = tokens_group, .ep = m->ep, .dense = p->grads,
                                 .replicate = p->replicate, .expert_dp = p->experts_group,
                                 .ep_size = mesh_ep_size(&m->shape), .ep_rank = m->me.ep,
                                 .tokens = tokens, .zero = p->zero,
                                 .test_combine_misorder = o->combine_misorder,
                                 .test_skip_param_gather = o->moe_skip_param_gather};
    p->moe = mem_alloc(MEM_OTHER, sizeof *p->moe);
    moe_params_init(p->moe, &o->moe, &cfg->model, &g, cfg->seed);
    p->model.mlp = moe_layer_hook(p->moe->layer);
}

void parallelize(parallel_rank *p, const mesh *m, const run_config *cfg,
                 const parallel_options *o, int B) {
    const int c = mesh_cp_size(&m->shape), T = cfg->model.ctx;
    memset(p, 0, sizeof *p);
    const gpt_shape shape = gpt_shape_make(&cfg->model, m->shape.tp, m->me.tp);
    p->span = cp_span_of(T, c, m->me.cp, o->cp.split);
    p->rows = c > 1 ? position_span_rows(&p->span) : T;
    if (c > 1) {
        cp_options cp = o->cp;
        cp.wire = cfg->precision;   /* K/V and all-to-alls in the model's precision */
        p->attention = cp_attention_create(m->cp, &cp, B, T, shape.dim_local,
                                           shape.heads_local);
        p->hook = cp_attention_hook_create(p->attention, cfg->model.layers);
    }
    p->model = (gpt_model_options){
        .precision = cfg->precision, .tp = m->shape.tp > 1 ? m->tp : NULL,
        .sequence_parallel = o->sequence_parallel,
        .attention = p->hook ? cp_attention_hook_of(p->hook) : NULL,
        .positions = c > 1 ? &p->span : NULL,
        .recompute_attention = o->layers.recompute_attention,
        .checkpoint_activations = o->layers.checkpoint_activations,
        .tp_overlap_chunks = o->layers.tp_overlap_chunks,
        .tp_overlap_control = o->layers.tp_overlap_control};
    const int all = comm_size(m->dp_cp);
    p->zero = all > 1 ? o->zero : 0;
    p->grads = p->zero > 0 ? m->dp_shard_cp : m->dp_cp;
    p->replicate = p->zero > 0 ? m->dp_replicate : NULL;
    if (o->grads_over_dp_only) p->grads = p->zero > 0 ? m->dp_shard : m->dp;
    if (o->grads_over_tp) p->grads = m->tp;
    if (o->moe.experts > 0) parallelize_moe(p, m, cfg, o, B * p->rows);
}

void parallel_rank_free(parallel_rank *p) {
    if (p->moe) moe_params_free(p->moe);
    mem_free(p->moe);
    comm_free(p->moe_world);
    cp_attention_hook_free(p->hook);
    cp_attention_free(p->attention);
    memset(p, 0, sizeof *p);
}
#undef REFUSE
