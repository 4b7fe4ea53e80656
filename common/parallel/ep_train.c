/* MoE training on one device or an EP x DP mesh (ep_train.h). */
#include "ep_train.h"

#include <cblas.h>

#include "alloc.h"
#include "ep_collect.h"
#include "moe_params.h"
#include "ops.h"
#include "replica.h"
#include "train_loop.h"

typedef struct {
    const run_config *cfg;
    const dataset *data;
    const ep_options *opts;
    mesh mesh;               /* groups NULL on one device (mesh_single) */
    int world_rank, world_size, batch_local;
    moe_shape shape;         /* this rank's experts */
    replica dense;           /* the model's slabs (their MLPs unused in MoE blocks) */
    moe_params moe;          /* the routers, this rank's experts, the layer */
    gpt_model *model;
    ep_keep keep;            /* step 1's gradients, the routing per step, the rows sent */
    ep_outcome *out;         /* world rank 0's; NULL elsewhere */
} ep_rank;

static void all_reduce(comm *group, float *v, size_t n) {
    if (group && n > 0) comm_allreduce(group, v, n, COMM_F32, COMM_SUM);
}

/* The dense gradient summed over every rank, but for the MoE blocks' own MLP weights
 * (the end of their slabs), which the MoE layer replaces: zero everywhere, not sent. */
static void reduce_dense(ep_rank *r) {
    const gpt_shape *s = &r->dense.shape;
    const size_t mlp_at = gpt_block_offsets(s).fc_w;   /* fc, fc2: the slab's last tensors */
    size_t start = 0;
    for (int layer = 0; layer < s->cfg.layers; layer++) {
        if (!moe_is_moe_layer(&r->shape, layer)) continue;
        const int slab = gpt_block_slab(s, layer);
        const size_t at = gpt_slab_offset(s, slab);
        all_reduce(r->mesh.dp_cp, r->dense.grads + start, at + mlp_at - start);
        start = at + gpt_slab_numel(s, slab);
    }
    all_reduce(r->mesh.dp_cp, r->dense.grads + start, r->dense.num_params - start);
}

static float ep_grads(void *arg, int step, float loss_scale) {
    ep_rank *r = arg;
    const int B = r->cfg->batch, T = r->cfg->model.ctx;
    load_batch(r->model, r->data, r->cfg, step, r->world_rank * r->batch_local, r->batch_local);
    replica_grads_zero(&r->dense);
    const float dloss = loss_scale / (float)(B * T);
    moe_params_step_begin(&r->moe, dloss);
    const float loss = gpt_forward(r->model, r->dense.params);
    replica_backward(&r->dense, r->model, r->dense.params, dloss, NULL, NULL);
    /* the global batch's gradients: dense ones and the routers' over every rank, the
     * experts' over the ranks that hold the same experts */
    reduce_dense(r);
    moe_params_reduce(&r->moe);
    const double aux = moe_layer_aux_loss(r->moe.layer);
    ep_keep_step(&r->keep, r->moe.layer, step, r->out);
    /* this rank's share of the global mean: its tokens' part, and aux / world */
    return loss * (float)r->batch_local / (float)B + (float)(aux / r->world_size);
}

static void ep_update(void *arg, int step) {
    (void)step;
    ep_rank *r = arg;
    const adamw_config *a = &r->cfg->adamw;
    replica_adamw(&r->dense, a);
    moe_params_adamw(&r->moe, a);
}

static void ep_keep_first(void *arg) {
    ep_rank *r = arg;
    ep_keep_vectors(&r->keep, r->dense.grads, r->moe.routers.grads, r->moe.experts.grads, 1);
}

static void ep_after_warmup(void *arg) { ep_keep_reset_traffic(&((ep_rank *)arg)->keep); }

static int ep_optimizer_grads(void *arg, grad_vector *vectors) {
    ep_rank *r = arg;
    vectors[0] = grad_vector_fp32(r->dense.grads, r->dense.num_params);
    return 1 + moe_params_grad_vectors(&r->moe, vectors + 1);
}

static void ep_rank_init(ep_rank *r, comm *world) {
    const run_config *cfg = r->cfg;
    r->world_size = world ? comm_size(world) : 1;
    r->world_rank = world ? comm_rank(world) : 0;
    r->batch_local = cfg->batch / r->world_size;
    if (world) mesh_create(&r->mesh, world, r->opts->mesh);
    else mesh_single(&r->mesh);
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    replica_init(&r->dense, &whole, cfg->seed, 1);
    const moe_params_groups g = {
        .world = world, .ep = r->mesh.ep, .dense = r->mesh.dp_cp,
        .expert_dp = r->opts->test_expert_grads_over_ep ? r->mesh.ep : r->mesh.expert_dp,
        .ep_size = mesh_ep_size(&r->mesh.shape), .ep_rank = r->mesh.me.ep,
        .tokens = r->batch_local * cfg->model.ctx,
        .test_combine_misorder = r->opts->test_combine_misorder};
    moe_params_init(&r->moe, &r->opts->moe, &cfg->model, &g, cfg->seed);
    r->shape = r->moe.shape;
    r->model = gpt_model_create(&whole, r->batch_local, cfg->model.ctx,
                                &(gpt_model_options){.mlp = moe_layer_hook(r->moe.layer)});
    ep_keep_init(&r->keep, &r->shape, r->dense.num_params);
}

static void ep_rank_free(ep_rank *r) {
    ep_keep_free(&r->keep);
    gpt_model_free(r->model);
    moe_params_free(&r->moe);
    replica_free(&r->dense);
    if (r->mesh.world) mesh_free(&r->mesh);
}

/* One rank's whole run: train, then world rank 0's outcome gets the loss, the gathered
 * vectors, the routing and the traffic. */
static void ep_rank_run(comm *world, const run_config *cfg, const dataset *data,
                        const ep_options *opts, ep_outcome *out) {
    ep_rank r = {.cfg = cfg, .data = data, .opts = opts, .out = out};
    ep_rank_init(&r, world);
    train_strategy strategy = {.name = mesh_world(&r.mesh.shape) > 1 ? "ep" : "moe",
                               .ctx = &r, .compute_grads = ep_grads,
                               .keep_first_grads = ep_keep_first, .update = ep_update,
                               .after_warmup = ep_after_warmup,
                               .optimizer_grads = ep_optimizer_grads};
    train_outcome run;
    train_loop(world, cfg, (double)cfg->batch * cfg->model.ctx, &strategy, &run);
    ep_keep_vectors(&r.keep, r.dense.params, r.moe.routers.params, r.moe.experts.params, 0);
    ep_collect(&r.keep, &r.mesh, &run, out);
    train_outcome_free(&run);
    ep_rank_free(&r);
}

void ep_train_single(const run_config *cfg, const dataset *data, const ep_options *opts,
                     ep_outcome *out) {
    openblas_set_num_threads(1);   /* one core, like one rank */
    mem_stats *caller_stats = mem_stats_current();
    mem_stats stats = {0};
    mem_stats_bind(&stats);
    ep_options single = *opts;
    mesh one;
    mesh_single(&one);
    single.mesh = one.shape;
    ep_rank_run(NULL, cfg, data, &single, out);
    mem_stats_bind(caller_stats);
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    const ep_options *opts;
    ep_outcome *out;
} ep_launch_args;

static int ep_rank_main(comm *world, void *arg) {
    ep_launch_args *a = arg;
    ep_rank_run(world, a->cfg, a->data, a->opts, comm_rank(world) == 0 ? a->out : NULL);
    return 0;
}

int ep_launch(const run_config *cfg, const dataset *data, const ep_options *opts,
              ep_outcome *out) {
    ep_launch_args a = {cfg, data, opts, out};
    return launch(&cfg->comm, ep_rank_main, &a);
}
