#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "grad_buckets.h"
#include "ops.h"
#include "pp_train.h"

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

/* Rank 0 keeps the bucket plan for the tables (room for one bucket per slab). */
static void record_buckets(ddp_extra *x, const grad_buckets *buckets) {
    x->num_buckets = grad_buckets_count(buckets);
    for (int i = 0; i < x->num_buckets; i++)
        x->bucket_numel[i] = grad_buckets_numel(buckets, i);
}

/* After the run, outside the measurements: are all replicas still the same model? */
static double replica_divergence(comm *metrics, const dp_grads *g) {
    const size_t n = g->layout.num_params;
    float *reference = mem_alloc(MEM_OTHER, n * sizeof(float));
    float *mine = mem_alloc(MEM_OTHER, n * sizeof(float));
    ops_download(mine, g->params, n * sizeof(float));   /* zero 0: the whole fp32 masters */
    memcpy(reference, mine, n * sizeof(float));
    comm_broadcast(metrics, reference, n, COMM_F32, 0);
    float diff = (float)max_abs_diff(mine, reference, n);
    comm_allreduce(metrics, &diff, 1, COMM_F32, COMM_MAX);
    mem_free(reference);
    mem_free(mine);
    return diff;
}

/* The run's DDP numbers, after the loop: the buckets' plan and traffic (the largest
 * rank's time in flight), and whether the replicas stayed identical. Collective. */
static void ddp_measure(comm *world, pipeline_rank *r, void *ctx, strategy_outcome *out) {
    const ddp_options *opts = ctx;
    const dp_grads *g = &r->dp[0];
    const int N = comm_size(world);
    const comm_dtype held = comm_dtype_of(r->cfg->grad_precision);
    comm *metrics = comm_split(world, 0, comm_rank(world), "metrics");
    ddp_extra *wanted = strategy_outcome_keeps(out) ? out->extra : NULL;
    ddp_extra x = {.opts = *opts, .backend = comm_backend_name(world)};
    if (wanted) x.bucket_numel = wanted->bucket_numel;
    if (wanted) record_buckets(&x, g->buckets);
    comm_stats bucket_stats = grad_buckets_stats(g->buckets);
    float async = (float)bucket_stats.async_seconds;
    comm_allreduce(metrics, &async, 1, COMM_F32, COMM_MAX);
    x.async_seconds = async;
    /* the buckets' alone, without fp8 / fp16 scale agreements */
    x.allreduce_calls = comm_stats_get(r->par.grads).calls[COMM_KIND_ALLREDUCE] /
                        (uint64_t)(out->result.timed_steps > 0 ? out->result.timed_steps : 1);
    x.replica_max_diff = replica_divergence(metrics, g);
    out->result.bytes_formula = opts->allreduce
        ? 2.0 * (N - 1) / N * (double)g->layout.num_params *
              (double)comm_dtype_size(held == COMM_F32 ? opts->wire : held)
        : 0.0;
    if (wanted) *wanted = x;
    comm_free(metrics);
}

void ddp_train(comm *world, const run_config *cfg, const dataset *data,
               const ddp_options *opts, strategy_outcome *out) {
    const int N = comm_size(world);
    if (comm_rank(world) == 0 && opts->header_title)
        report_header(cfg, opts->header_title, N, 1);
    mesh m;   /* every rank a data-parallel replica of the whole model */
    mesh_create(&m, world, (mesh_shape){.tp = 1, .pp = 1, .dp = N});
    /* one stage; the grad_accum micro-batches of a step accumulate, the last one's
     * backward starts the buckets */
    const pipeline_options popts = {
        .schedule = PP_1F1B, .micro = opts->grad_accum, .chunks = 1, .ddp_buckets = 1,
        .first_bucket_bytes = opts->first_bucket_bytes, .bucket_bytes = opts->bucket_bytes,
        .wire = opts->wire, .bookkeeping_aside = 1,
        .fault = opts->allreduce ? PIPELINE_FAULT_NONE : PIPELINE_FAULT_SKIP_DP_REDUCE};
    pp_train_on_mesh(world, &m, cfg, data, &popts, "ddp", ddp_measure, (void *)opts, out);
    mesh_free(&m);
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
