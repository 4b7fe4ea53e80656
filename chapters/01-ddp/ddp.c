#include "ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "ddp_buckets.h"
#include "ops.h"

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

void ddp_check_batch_or_exit(int batch, int ranks, int grad_accum) {
    char err[256];
    if (ddp_check_batch(batch, ranks, grad_accum, err, sizeof err)) return;
    if (!process_hosts_rank0()) exit(2);
    cli_fail("%s", err);
}

/* One rank's forward and backward over the micro-steps of one step; returns the mean
 * loss of its sequences. The buckets' all-reduces start during the last backward. */
static float local_step(ddp_job *job, comm *world, gpt_model *model, replica *rep,
                        grad_buckets *buckets, int step) {
    const run_config *cfg = job->cfg;
    const int K = job->opts.grad_accum;
    const int per_rank = cfg->batch / comm_size(world), micro = per_rank / K;
    const int first = comm_rank(world) * per_rank;
    /* every token's loss weighs 1/(global batch tokens): the SUM over ranks is the mean */
    const float dloss = 1.0f / ((float)cfg->batch * (float)cfg->model.ctx);
    float loss = 0.0f;
    vec_zero(rep->grads, rep->num_params);
    for (int k = 0; k < K; k++) {
        trace_begin(world, "forward");
        load_batch(model, job->data, cfg, step, first + k * micro, micro);
        loss += gpt_forward(model, rep->params) / (float)K;
        trace_end(world);
        const int sync = job->opts.allreduce && k == K - 1;
        trace_begin(world, sync ? "backward (all-reduce in buckets)" : "backward (no sync)");
        gpt_backward(model, rep->params, rep->grads, dloss,
                     sync ? grad_buckets_slab_ready : NULL, buckets);
        trace_end(world);
    }
    trace_begin(world, "wait for gradients");
    grad_buckets_wait(buckets);
    trace_end(world);
    return loss;
}

/* Rank 0 keeps the bucket plan for the tables. */
static void record_buckets(ddp_job *job, const grad_buckets *buckets) {
    job->num_buckets = grad_buckets_count(buckets);
    job->bucket_numel = calloc((size_t)job->num_buckets, sizeof *job->bucket_numel);
    for (int i = 0; i < job->num_buckets; i++)
        job->bucket_numel[i] = grad_buckets_numel(buckets, i);
}

/* After the run, outside the measurements: are all replicas still the same model? */
static double replica_divergence(comm *metrics, const replica *rep) {
    float *reference = mem_alloc(MEM_OTHER, rep->num_params * sizeof(float));
    float *mine = malloc(rep->num_params * sizeof(float));
    ops_download(mine, rep->params, rep->num_params * sizeof(float));
    memcpy(reference, mine, rep->num_params * sizeof(float));
    comm_broadcast(metrics, reference, rep->num_params, COMM_F32, 0);
    float diff = (float)max_abs_diff(mine, reference, rep->num_params);
    comm_allreduce(metrics, &diff, 1, COMM_F32, COMM_MAX);
    mem_free(reference);
    free(mine);
    return diff;
}

int ddp_rank_main(comm *world, void *arg) {
    ddp_job *job = arg;
    const run_config *cfg = job->cfg;
    const int N = comm_size(world), rank = comm_rank(world);
    const int micro = cfg->batch / N / job->opts.grad_accum;
    /* losses and the end-of-run checks go over their own group, so the statistics of
     * the gradient group hold the gradient traffic alone */
    comm *metrics = comm_split(world, 0, rank, "metrics");
    if (rank == 0) {
        job->backend = comm_backend_name(world);
        if (job->header_title) report_header(cfg, job->header_title, N, job->backend);
    }

    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    replica rep;
    replica_init(&rep, &shape, cfg->seed, 1);
    gpt_model *model = gpt_model_create(&shape, micro, cfg->model.ctx, NULL);
    grad_buckets *buckets =
        grad_buckets_create(world, &shape, rep.grads, job->opts.first_bucket_bytes,
                            job->opts.bucket_bytes, job->opts.wire);
    float *loss = calloc((size_t)cfg->steps, sizeof(float));
    if (rank == 0) {
        job->first_grads = malloc(rep.num_params * sizeof(float));
        record_buckets(job, buckets);
    }

    const double tokens = (double)cfg->batch * cfg->model.ctx;
    double timed = 0.0;
    int timed_steps = 0;
    for (int step = 1; step <= cfg->steps; step++) {
        double start = comm_now();
        float local_loss = local_step(job, world, model, &rep, buckets, step);
        if (step == 1 && rank == 0)
            ops_download(job->first_grads, rep.grads, rep.num_params * sizeof(float));
        trace_begin(world, "optimizer");
        replica_adamw(&rep, &cfg->adamw);
        ops_synchronize();
        trace_end(world);
        double seconds = comm_now() - start;

        /* every rank's sequences are equally many: the global mean is the mean of means */
        float loss_sum = local_loss;
        comm_allreduce(metrics, &loss_sum, 1, COMM_F32, COMM_SUM);
        loss[step - 1] = loss_sum / (float)N;
        if (rank == 0) report_step(cfg, "ddp", step, loss[step - 1], seconds, tokens);

        /* the first step pays for page faults and warm-up; measure the rest */
        if (step == 1 && cfg->steps > 1) {
            comm_stats_reset(world);
        } else {
            timed += seconds;
            timed_steps++;
        }
    }

    run_result r = {.strategy = "ddp", .steps = cfg->steps, .seconds = timed,
                    .timed_steps = timed_steps, .tokens_per_step = tokens,
                    .diff_loss = -1, .diff_grads = -1, .diff_params = -1};
    comm_stats gradient_stats = grad_buckets_stats(buckets);
    r.comm_seconds = comm_stats_total_seconds(&gradient_stats);
    r.hidden_seconds = gradient_stats.hidden_seconds;
    r.bytes_sent_per_step = (double)comm_stats_total_sent(&gradient_stats) / timed_steps;
    r.bytes_formula = job->opts.allreduce
        ? 2.0 * (N - 1) / N * (double)rep.num_params * (double)comm_dtype_size(job->opts.wire)
        : 0.0;
    r.memory = *mem_stats_current();
    run_result_take_max(metrics, &r);
    float async = (float)gradient_stats.async_seconds;
    comm_allreduce(metrics, &async, 1, COMM_F32, COMM_MAX);
    double divergence = replica_divergence(metrics, &rep);

    if (rank == 0) {
        job->result = r;
        job->loss = loss;
        job->result.loss = loss;
        job->final_params = malloc(rep.num_params * sizeof(float));
        ops_download(job->final_params, rep.params, rep.num_params * sizeof(float));
        job->async_seconds = async;
        job->allreduce_calls =   /* the buckets' alone, without fp8 / fp16 scale agreements */
            comm_stats_get(world).calls[COMM_KIND_ALLREDUCE] / (uint64_t)timed_steps;
        job->replica_max_diff = divergence;
        job->world = N;
    } else {
        free(loss);
    }
    grad_buckets_free(buckets);
    gpt_model_free(model);
    replica_free(&rep);
    comm_free(metrics);
    return 0;
}

void ddp_job_release(ddp_job *job) {
    free(job->loss);
    free(job->first_grads);
    free(job->final_params);
    free(job->bucket_numel);
    job->loss = job->first_grads = job->final_params = NULL;
    job->bucket_numel = NULL;
}
