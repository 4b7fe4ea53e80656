#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "grad_buckets.h"
#include "ops.h"
#include "train_loop.h"

ddp_options ddp_options_default(void) {
    return (ddp_options){.bucket_bytes = 25u << 20, .first_bucket_bytes = 1u << 20,
                         .grad_accum = 1, .wire = COMM_F32, .allreduce = 1};
}

int ddp_check_batch(int batch, int ranks, int grad_accum, char *err, size_t err_len) {
    const long parts = (long)ranks * grad_accum;
    if (batch % parts == 0) return 1;
    const long below = batch / parts * parts, above = below + parts;
    char fits[64];
    if (below > 0) snprintf(fits, sizeof fits, "--batch %ld or %ld", below, above);
    else snprintf(fits, sizeof fits, "--batch %ld", above);
    if (grad_accum == 1)
        snprintf(err, err_len, "--batch %d does not split evenly over %d ranks (try %s, or "
                 "a rank count that divides %d)", batch, ranks, fits, batch);
    else
        snprintf(err, err_len, "--batch %d does not split into %d ranks x --grad-accum %d "
                 "equal micro-batches (try %s)", batch, ranks, grad_accum, fits);
    return 0;
}

/* One rank's DDP state for the training loop. */
typedef struct {
    const run_config *cfg;
    const dataset *data;
    const ddp_options *opts;
    comm *world;
    gpt_model *model;
    replica rep;
    grad_buckets *buckets;
    float *first_grads;   /* world rank 0: the caller's; NULL elsewhere */
} ddp_rank;

/* One rank's forward and backward over the micro-steps of one step; returns its share
 * of the global mean loss. The buckets' all-reduces start during the last backward. */
static float ddp_compute_grads(void *arg, int step, float loss_scale) {
    ddp_rank *d = arg;
    const run_config *cfg = d->cfg;
    comm *world = d->world;
    const int K = d->opts->grad_accum, N = comm_size(world);
    const int per_rank = cfg->batch / N, micro = per_rank / K;
    const int first = comm_rank(world) * per_rank;
    /* every token's loss weighs 1/(global batch tokens): the SUM over ranks is the mean */
    const float dloss = loss_scale / ((float)cfg->batch * (float)cfg->model.ctx);
    float loss = 0.0f;
    replica_grads_zero(&d->rep);
    const void *weights = replica_compute_params(&d->rep);
    for (int k = 0; k < K; k++) {
        trace_begin(world, "forward");
        load_batch(d->model, d->data, cfg, step, first + k * micro, micro);
        loss += gpt_forward(d->model, weights) / (float)K;
        trace_end(world);
        const int sync = d->opts->allreduce && k == K - 1;
        trace_begin(world, sync ? "backward (all-reduce in buckets)" : "backward (no sync)");
        replica_backward(&d->rep, d->model, weights, dloss,
                         sync ? grad_buckets_slab_ready : NULL, d->buckets);
        trace_end(world);
    }
    trace_begin(world, "wait for gradients");
    grad_buckets_wait(d->buckets);
    trace_end(world);
    /* every rank's sequences are equally many: the global mean is the mean of means */
    return loss / (float)N;
}

static int ddp_optimizer_grads(void *arg, grad_vector *vectors) {
    return replica_optimizer_grads(&((ddp_rank *)arg)->rep, vectors);
}

static void ddp_keep_first_grads(void *arg) {
    ddp_rank *d = arg;
    if (d->first_grads) replica_download_grads(&d->rep, d->first_grads);
}

static void ddp_update(void *arg, int step) {
    (void)step;
    ddp_rank *d = arg;
    trace_begin(d->world, "optimizer");
    replica_adamw(&d->rep, &d->cfg->adamw);
    trace_end(d->world);
}

static void ddp_checkpoint_state(void *arg, ckpt_state *out) {
    ddp_rank *d = arg;
    replica_checkpoint_state(&d->rep, comm_rank(d->world) == 0, out);   /* one replica */
}

/* Rank 0 keeps the bucket plan for the tables (room for one bucket per slab). */
static void record_buckets(ddp_extra *x, const grad_buckets *buckets) {
    x->num_buckets = grad_buckets_count(buckets);
    for (int i = 0; i < x->num_buckets; i++)
        x->bucket_numel[i] = grad_buckets_numel(buckets, i);
}

/* After the run, outside the measurements: are all replicas still the same model? */
static double replica_divergence(comm *metrics, const replica *rep) {
    float *reference = mem_alloc(MEM_OTHER, rep->num_params * sizeof(float));
    float *mine = mem_alloc(MEM_OTHER, rep->num_params * sizeof(float));
    ops_download(mine, rep->params, rep->num_params * sizeof(float));
    memcpy(reference, mine, rep->num_params * sizeof(float));
    comm_broadcast(metrics, reference, rep->num_params, COMM_F32, 0);
    float diff = (float)max_abs_diff(mine, reference, rep->num_params);
    comm_allreduce(metrics, &diff, 1, COMM_F32, COMM_MAX);
    mem_free(reference);
    mem_free(mine);
    return diff;
}

/* The run's DDP numbers, after the loop: the buckets' traffic (the largest rank's time
 * in flight), and whether the replicas stayed identical. Collective over metrics. */
static void ddp_measure(const ddp_rank *d, comm *metrics, int timed_steps, ddp_extra *x) {
    comm_stats gradient_stats = grad_buckets_stats(d->buckets);
    float async = (float)gradient_stats.async_seconds;
    comm_allreduce(metrics, &async, 1, COMM_F32, COMM_MAX);
    x->async_seconds = async;
    /* the buckets' alone, without fp8 / fp16 scale agreements */
    x->allreduce_calls = comm_stats_get(d->world).calls[COMM_KIND_ALLREDUCE] /
                         (uint64_t)timed_steps;
    x->replica_max_diff = replica_divergence(metrics, &d->rep);
}

void ddp_train(comm *world, const run_config *cfg, const dataset *data,
               const ddp_options *opts, strategy_outcome *out) {
    const int N = comm_size(world), rank = comm_rank(world);
    const int micro = cfg->batch / N / opts->grad_accum;
    /* the end-of-run checks go over their own group, so the statistics of the gradient
     * group hold the gradient traffic alone */
    comm *metrics = comm_split(world, 0, rank, "metrics");
    ddp_extra x = {.opts = *opts, .backend = comm_backend_name(world)};
    ddp_extra *wanted = strategy_outcome_keeps(out) ? out->extra : NULL;
    if (wanted) x.bucket_numel = wanted->bucket_numel;
    if (rank == 0 && opts->header_title) report_header(cfg, opts->header_title, N, 1);

    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    ddp_rank d = {.cfg = cfg, .data = data, .opts = opts, .world = world,
                  .first_grads = out->first_grads};
    replica_init(&d.rep, &shape, cfg->seed, 1);
    replica_set_precision(&d.rep, cfg->precision);
    replica_set_grad_precision(&d.rep, cfg->grad_precision);
    d.model = gpt_model_create(&shape, micro, cfg->model.ctx,
                               &(gpt_model_options){.precision = cfg->precision});
    /* 16-bit gradients are all-reduced as they are held (--compress is refused then) */
    const comm_dtype held = comm_dtype_of(cfg->grad_precision);
    d.buckets = grad_buckets_create_held(world, &shape,
                                         d.rep.grads16 ? d.rep.grads16 : (void *)d.rep.grads,
                                         held, opts->first_bucket_bytes, opts->bucket_bytes,
                                         held == COMM_F32 ? opts->wire : held);
    if (wanted) record_buckets(&x, d.buckets);

    train_strategy strategy = {.name = "ddp", .ctx = &d, .compute_grads = ddp_compute_grads,
                               .keep_first_grads = ddp_keep_first_grads,
                               .update = ddp_update,
                               .optimizer_grads = ddp_optimizer_grads,
                               .checkpoint_state = ddp_checkpoint_state};
    strategy_outcome_train(world, cfg, &strategy, out);
    out->result.bytes_formula = opts->allreduce
        ? 2.0 * (N - 1) / N * (double)d.rep.num_params *
              (double)comm_dtype_size(held == COMM_F32 ? opts->wire : held)
        : 0.0;
    ddp_measure(&d, metrics, out->result.timed_steps, &x);
    if (out->final_params)
        ops_download(out->final_params, d.rep.params, d.rep.num_params * sizeof(float));
    if (wanted) *wanted = x;

    grad_buckets_free(d.buckets);
    gpt_model_free(d.model);
    replica_free(&d.rep);
    comm_free(metrics);
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    const ddp_options *opts;
} ddp_launch_args;

static void ddp_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const ddp_launch_args *a = args;
    ddp_train(world, a->cfg, a->data, a->opts, out);
}

int ddp_launch(const run_config *cfg, const dataset *data, const ddp_options *opts,
               strategy_outcome *rank0_out) {
    ddp_extra *x = rank0_out->extra;
    if (x) {
        const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
        *x = (ddp_extra){.opts = *opts};
        x->bucket_numel = calloc((size_t)gpt_num_slabs(&whole), sizeof *x->bucket_numel);
    }
    ddp_launch_args args = {cfg, data, opts};
    return strategy_launch(cfg, ddp_rank_fn, &args, rank0_out);
}

void ddp_extra_free(ddp_extra *x) {
    free(x->bucket_numel);
    memset(x, 0, sizeof *x);
}
