#include "dp.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "device.h"
#include "dp_replica.h"
#include "ops.h"

/* One replica and the thread that runs it. Replica 0 lives on the master device and
 * uses the master's parameters and gradients, as DataParallel's device_ids[0] does. */
typedef struct {
    const comm_options *comm;  /* where replica k computes: device index k */
    int index;
    dp_replica *model;
    float *params, *grads;     /* the master's for replica 0, copies for the others */
    size_t num_params;
    float dloss;
    float loss;
    dp_thread thread;
    mem_stats stats;           /* this replica's device */
    int *tokens;               /* host staging for its slice of the batch */
} dp_worker;

static void *worker_main(void *arg) {
    dp_worker *w = arg;
    launch_select_device(w->comm, w->index);   /* a new thread starts on the CPU */
    mem_stats_bind(&w->stats);
    w->loss = dp_replica_forward(w->model, w->params, &w->thread);
    gil_acquire(w->thread.lock, &w->thread.account);   /* zero_grad is Python too */
    vec_zero(w->grads, w->num_params);
    gil_release(w->thread.lock, &w->thread.account);
    dp_replica_backward(w->model, w->params, w->grads, w->dloss, &w->thread);
    ops_synchronize();   /* the master reads the gradients once the thread has joined */
    return NULL;
}

static void run_replicas_in_threads(dp_worker *workers, int n) {
    pthread_t *threads = malloc(sizeof *threads * (size_t)n);
    for (int k = 0; k < n; k++)
        if (pthread_create(&threads[k], NULL, worker_main, &workers[k]) != 0) {
            fprintf(stderr, "error: DataParallel could not start thread %d\n", k);
            exit(1);
        }
    for (int k = 0; k < n; k++) pthread_join(threads[k], NULL);
    free(threads);
}

dp_run *dp_train(const run_config *cfg, const dataset *data, const dp_options *opts) {
    openblas_set_num_threads(1);   /* each thread's matmuls stay on its own core */
    /* The master computes on device 0, as the replica threads do on device k; a caller
     * that computed on the CPU does so again afterwards (as with baseline_train). */
    const device_kind caller_device = device_current();
    const device_kind device = launch_select_device(&cfg->comm, 0);
    mem_stats *caller_stats = mem_stats_current();
    const int N = opts->threads, T = cfg->model.ctx, per_replica = cfg->batch / N;
    const double tokens = (double)cfg->batch * T;
    dp_run *run = calloc(1, sizeof *run);
    run->opts = *opts;
    gil lock;
    gil_init(&lock);

    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    dp_worker *workers = calloc((size_t)N, sizeof *workers);
    replica master;
    mem_stats_bind(&workers[0].stats);
    replica_init(&master, &shape, cfg->seed, 1);
    const size_t P = master.num_params, param_bytes = P * sizeof(float);
    for (int k = 0; k < N; k++) {
        dp_worker *w = &workers[k];
        mem_stats_bind(&w->stats);
        w->comm = &cfg->comm;
        w->index = k;
        w->model = dp_replica_create(&shape, per_replica, T);
        w->params = k == 0 ? master.params : mem_alloc_on(MEM_DEVICE, MEM_PARAMS, param_bytes);
        w->grads = k == 0 ? master.grads : mem_alloc_on(MEM_DEVICE, MEM_GRADS, param_bytes);
        w->num_params = P;
        w->dloss = 1.0f / (float)tokens;   /* the master's sum is then the mean */
        w->thread = (dp_thread){.lock = &lock, .release_in_kernels = opts->release_gil};
        w->tokens = malloc(sizeof(int) * 2 * (size_t)per_replica * T);
    }
    mem_stats_bind(caller_stats);

    run->loss = calloc((size_t)cfg->steps, sizeof(float));
    run->first_grads = malloc(param_bytes);
    run->final_params = malloc(param_bytes);
    const size_t batch_bytes = sizeof(int) * 2 * (size_t)per_replica * T;
    double phase[5] = {0}, timed = 0.0;
    int timed_steps = 0;
    for (int step = 1; step <= cfg->steps; step++) {
        double t0 = comm_now();
        for (int k = 1; k < N; k++) vec_copy(workers[k].params, master.params, P);
        ops_synchronize();   /* the replicas' threads compute on streams of their own */
        double t1 = comm_now();
        for (int k = 0; k < N; k++) {
            int *tok = workers[k].tokens, *tgt = tok + per_replica * T;
            dataset_batch(data, cfg->seed, step, k * per_replica, per_replica, T, tok, tgt);
            dp_replica_set_batch(workers[k].model, tok, tgt);
        }
        double t2 = comm_now();
        run_replicas_in_threads(workers, N);
        double t3 = comm_now();
        for (int k = 1; k < N; k++) vec_add(master.grads, workers[k].grads, P);
        if (step == 1) ops_download(run->first_grads, master.grads, param_bytes);
        double t4 = comm_now();
        replica_adamw(&master, &cfg->adamw);
        ops_synchronize();
        double t5 = comm_now();

        float loss = 0.0f;
        for (int k = 0; k < N; k++) loss += workers[k].loss;
        run->loss[step - 1] = loss / (float)N;
        report_step(cfg, "dp", step, run->loss[step - 1], t5 - t0, tokens);
        /* the first step pays for page faults and warm-up; measure the rest */
        if (step == 1 && cfg->steps > 1) {
            for (int k = 0; k < N; k++) workers[k].thread.account = (gil_account){0};
            continue;
        }
        double times[5] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4};
        for (int i = 0; i < 5; i++) phase[i] += times[i];
        timed += t5 - t0;
        timed_steps++;
    }
    ops_download(run->final_params, master.params, param_bytes);

    run->replicate_seconds = phase[0] / timed_steps;
    run->scatter_seconds = phase[1] / timed_steps;
    run->parallel_seconds = phase[2] / timed_steps;
    run->gather_seconds = phase[3] / timed_steps;
    run->optimizer_seconds = phase[4] / timed_steps;
    for (int k = 0; k < N; k++) {
        run->gil_wait_seconds += workers[k].thread.account.wait_seconds / timed_steps;
        run->gil_held_seconds += workers[k].thread.account.held_seconds / timed_steps;
        run->gil_acquisitions += (double)workers[k].thread.account.acquisitions / timed_steps;
    }
    if (run->parallel_seconds > 0)
        run->gil_busy_fraction = run->gil_held_seconds / run->parallel_seconds;
    run->params_out_bytes = (double)(N - 1) * param_bytes;
    run->batch_out_bytes = (double)(N - 1) * batch_bytes;
    run->grads_in_bytes = (double)(N - 1) * param_bytes;

    /* the master's device holds the most: the optimizer state on top of a replica */
    mem_stats largest = workers[0].stats;
    for (int k = 1; k < N; k++)
        if (workers[k].stats.peak_total > largest.peak_total) largest = workers[k].stats;
    run->result = (run_result){
        .strategy = "dp", .steps = cfg->steps, .loss = run->loss,
        .diff_loss = -1, .diff_grads = -1, .diff_params = -1,
        .seconds = timed, .timed_steps = timed_steps, .tokens_per_step = tokens,
        /* the master's link is busy while it copies parameters, batches and gradients */
        .comm_seconds = phase[0] + phase[1] + phase[3], .hidden_seconds = 0,
        .bytes_sent_per_step = run->params_out_bytes + run->batch_out_bytes,
        .bytes_formula = (double)(N - 1) * param_bytes, .memory = largest};

    for (int k = 0; k < N; k++) {
        dp_worker *w = &workers[k];
        mem_stats_bind(&w->stats);
        dp_replica_free(w->model);
        if (k > 0) {
            mem_free(w->params);
            mem_free(w->grads);
        }
        free(w->tokens);
    }
    mem_stats_bind(&workers[0].stats);
    replica_free(&master);
    mem_stats_bind(caller_stats);
    free(workers);
    gil_destroy(&lock);
    if (caller_device == DEVICE_CPU && device != DEVICE_CPU) device_select(DEVICE_CPU, 0);
    return run;
}

void dp_run_free(dp_run *r) {
    if (!r) return;
    free(r->loss);
    free(r->first_grads);
    free(r->final_params);
    free(r);
}
