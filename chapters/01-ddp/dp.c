#include "dp.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "device.h"
#include "gil.h"
#include "grads16.h"
#include "ops.h"
#include "ops_mixed.h"
#include "train_loop.h"

/* One replica and the thread that runs it. Replica 0 lives on the master device and
 * uses the master's compute weights and gradients, as DataParallel's device_ids[0]
 * does. In bf16/fp16 the replicas are sent the master's 16-bit compute copy (the fp32
 * masters stay with AdamW), and with --grad-dtype bf16|fp16 each holds its gradients in
 * 16 bits, as autocast's replicas would. */
typedef struct {
    const comm_options *comm;  /* where replica k computes: device index k */
    int index;
    gpt_model *model;          /* the model's own code, run op by op under the lock */
    void *params;              /* compute weights, in the run's precision */
    float *grads;              /* fp32 gradients; NULL when they are 16-bit */
    void *grads16;             /* --grad-dtype bf16|fp16: the gradients, else NULL */
    precision grad_precision;
    size_t num_params;
    float dloss;               /* this step's (the loss scale's multiple of 1/tokens) */
    float loss;
    gil_thread thread;
    mem_stats stats;           /* this replica's device */
    int *tokens;               /* host staging for its slice of the batch */
} dp_worker;

static void worker_backward(dp_worker *w) {
    if (w->grads16) {
        mixed_vec_zero(w->grad_precision, w->grads16, w->num_params);   /* zero_grad */
        gpt_backward_grads16(w->model, w->params, w->grad_precision, w->grads16, w->dloss,
                             NULL, NULL);
        return;
    }
    vec_zero(w->grads, w->num_params);   /* zero_grad is Python too */
    gpt_backward(w->model, w->params, w->grads, w->dloss, NULL, NULL);
}

static void *worker_main(void *arg) {
    dp_worker *w = arg;
    launch_select_device(w->comm, w->index);   /* a new thread starts on the CPU */
    mem_stats_bind(&w->stats);
    const ops_observer under_the_lock = gil_op_observer(&w->thread);
    ops_observe(&under_the_lock);
    w->loss = gpt_forward(w->model, w->params);
    worker_backward(w);
    ops_observe(NULL);
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

enum { REPLICATE, SCATTER, PARALLEL, GATHER, OPTIMIZER, PHASES };

/* The master's view of one DataParallel step, for the training loop. */
typedef struct {
    const run_config *cfg;
    const dataset *data;
    int N, per_replica;
    replica master;
    dp_worker *workers;
    strategy_outcome *out;
    double phase[PHASES];      /* seconds since warm-up, per phase */
    int skip_gather;           /* negative control (dp_options) */
} dp_master;

/* The master's replica is the model (the workers copy it every step). */
static void dp_checkpoint_state(void *arg, ckpt_state *out) {
    replica_checkpoint_state(&((dp_master *)arg)->master, 1, out);
}

static double lap(double *since) {
    double now = comm_now(), seconds = now - *since;
    *since = now;
    return seconds;
}

/* The replicas' gradients summed onto the master's: in fp32, or (16-bit gradients) in
 * their own type, one rounding per replica added, as reduce_add sums them. */
static void gather_grads(dp_master *m) {
    const size_t P = m->master.num_params;
    for (int k = 1; k < m->N; k++) {
        const dp_worker *w = &m->workers[k];
        if (w->grads16) mixed_vec_add(w->grad_precision, m->master.grads16, w->grads16, P);
        else vec_add(m->master.grads, w->grads, P);
    }
}

static float dp_compute_grads(void *arg, int step, float loss_scale) {
    dp_master *m = arg;
    const int T = m->cfg->model.ctx, per = m->per_replica;
    const size_t P = m->master.num_params;
    double t = comm_now();
    const void *weights = replica_compute_params(&m->master);   /* 16 bits: rounded */
    for (int k = 1; k < m->N; k++)
        mixed_vec_copy(m->master.precision, m->workers[k].params, weights, P);
    for (int k = 0; k < m->N; k++)   /* fp16: the loss scale's multiple */
        m->workers[k].dloss = loss_scale / (float)(m->cfg->batch * T);
    ops_synchronize();   /* the replicas' threads compute on streams of their own */
    m->phase[REPLICATE] += lap(&t);
    for (int k = 0; k < m->N; k++) {
        int *tok = m->workers[k].tokens, *tgt = tok + per * T;
        dataset_batch(m->data, m->cfg->seed, step, k * per, per, T, tok, tgt);
        gpt_set_batch(m->workers[k].model, tok, tgt);
    }
    m->phase[SCATTER] += lap(&t);
    run_replicas_in_threads(m->workers, m->N);
    m->phase[PARALLEL] += lap(&t);
    if (!m->skip_gather) gather_grads(m);
    m->phase[GATHER] += lap(&t);
    float loss = 0.0f;
    for (int k = 0; k < m->N; k++) loss += m->workers[k].loss;
    return loss / (float)m->N;
}

/* The master's gradient as the loss scale checks and unscales it (train_loop.h). */
static int dp_optimizer_grads(void *arg, grad_vector *vectors) {
    return replica_optimizer_grads(&((dp_master *)arg)->master, vectors);
}

static void dp_keep_first_grads(void *arg) {
    dp_master *m = arg;
    replica_download_grads(&m->master, m->out->first_grads);   /* 16 bits: widened */
}

static void dp_update(void *arg, int step) {
    (void)step;
    dp_master *m = arg;
    double t = comm_now();
    replica_adamw(&m->master, &m->cfg->adamw);
    ops_synchronize();
    m->phase[OPTIMIZER] += lap(&t);
}

/* the first step pays for page faults and warm-up; measure the rest */
static void dp_after_warmup(void *arg) {
    dp_master *m = arg;
    for (int i = 0; i < PHASES; i++) m->phase[i] = 0;
    for (int k = 0; k < m->N; k++) m->workers[k].thread.account = (gil_account){0};
}

/* What the tables show, per timed step. */
static void summarise(dp_master *m, int timed_steps, dp_extra *x, run_result *r) {
    const int N = m->N;
    const double P = (double)m->master.num_params;
    const double param_bytes = P * precision_bytes(m->master.precision);   /* compute copy */
    const double grad_bytes = P * precision_bytes(m->master.grad_precision);
    const double batch_bytes = sizeof(int) * 2.0 * m->per_replica * m->cfg->model.ctx;
    x->replicate_seconds = m->phase[REPLICATE] / timed_steps;
    x->scatter_seconds = m->phase[SCATTER] / timed_steps;
    x->parallel_seconds = m->phase[PARALLEL] / timed_steps;
    x->gather_seconds = m->phase[GATHER] / timed_steps;
    x->optimizer_seconds = m->phase[OPTIMIZER] / timed_steps;
    for (int k = 0; k < N; k++) {
        const gil_account *a = &m->workers[k].thread.account;
        x->gil_wait_seconds += a->wait_seconds / timed_steps;
        x->gil_held_seconds += a->held_seconds / timed_steps;
        x->gil_acquisitions += (double)a->acquisitions / timed_steps;
    }
    if (x->parallel_seconds > 0)
        x->gil_busy_fraction = x->gil_held_seconds / x->parallel_seconds;
    x->params_out_bytes = (N - 1) * param_bytes;
    x->batch_out_bytes = (N - 1) * batch_bytes;
    x->grads_in_bytes = (N - 1) * grad_bytes;

    /* the master's link is busy while it copies parameters, batches and gradients */
    r->comm_seconds = m->phase[REPLICATE] + m->phase[SCATTER] + m->phase[GATHER];
    r->hidden_seconds = 0;
    r->bytes_sent_per_step = x->params_out_bytes + x->batch_out_bytes;
    r->bytes_formula = (N - 1) * param_bytes;
    /* the master's device holds the most: the optimizer state on top of a replica */
    r->memory = m->workers[0].stats;
    for (int k = 1; k < N; k++)
        if (m->workers[k].stats.peak_total > r->memory.peak_total) r->memory = m->workers[k].stats;
}

/* Replica k: its model, and its compute weights and gradients (replica 0: the
 * master's), in the master's precision and gradient type. */
static void worker_init(dp_worker *w, int k, replica *master, const run_config *cfg,
                        int per_replica) {
    const int T = cfg->model.ctx;
    const size_t P = master->num_params;
    const precision p = master->precision, gp = master->grad_precision;
    w->comm = &cfg->comm;
    w->index = k;
    w->model = gpt_model_create(&master->shape, per_replica, T,
                                &(gpt_model_options){.precision = p});
    w->num_params = P;
    w->grad_precision = gp;
    if (k == 0) {
        w->params = master->compute;
        w->grads = master->grads;
        w->grads16 = master->grads16;
    } else {
        w->params = mem_alloc_on(MEM_DEVICE, MEM_PARAMS, P * precision_bytes(p));
        if (gp == PRECISION_FP32) w->grads = mem_alloc_on(MEM_DEVICE, MEM_GRADS, P * sizeof(float));
        else w->grads16 = mem_alloc_on(MEM_DEVICE, MEM_GRADS, P * precision_bytes(gp));
    }
    w->tokens = malloc(sizeof(int) * 2 * (size_t)per_replica * T);
}

void dp_train(const run_config *cfg, const dataset *data, const dp_options *opts,
              strategy_outcome *out) {
    openblas_set_num_threads(1);   /* each thread's matmuls stay on its own core */
    /* The master computes on device 0, as the replica threads do on device k; a caller
     * that computed on the CPU does so again afterwards (as with baseline_train). */
    const device_kind caller_device = device_current();
    const device_kind device = launch_select_device(&cfg->comm, 0);
    mem_stats *caller_stats = mem_stats_current();
    const int N = opts->threads, per_replica = cfg->batch / N;
    dp_extra x = {.opts = *opts};
    gil lock;
    gil_init(&lock);

    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    dp_master m = {.cfg = cfg, .data = data, .N = N, .per_replica = per_replica, .out = out,
                   .skip_gather = opts->skip_gather};
    m.workers = calloc((size_t)N, sizeof *m.workers);
    mem_stats_bind(&m.workers[0].stats);
    replica_init(&m.master, &shape, cfg->seed, 1);
    replica_set_precision(&m.master, cfg->precision);
    replica_set_grad_precision(&m.master, cfg->grad_precision);
    for (int k = 0; k < N; k++) {
        mem_stats_bind(&m.workers[k].stats);
        worker_init(&m.workers[k], k, &m.master, cfg, per_replica);
        m.workers[k].thread = (gil_thread){.lock = &lock, .release_in_kernels = opts->release_gil};
    }
    mem_stats_bind(caller_stats);

    train_strategy strategy = {.name = "dp", .ctx = &m, .compute_grads = dp_compute_grads,
                               .keep_first_grads = dp_keep_first_grads, .update = dp_update,
                               .optimizer_grads = dp_optimizer_grads,
                               .after_warmup = dp_after_warmup,
                               .checkpoint_state = dp_checkpoint_state};
    out->world_size = N;
    strategy_outcome_train(NULL, cfg, &strategy, out);
    ops_download(out->final_params, m.master.params, m.master.num_params * sizeof(float));
    summarise(&m, out->result.timed_steps, &x, &out->result);
    if (out->extra) *(dp_extra *)out->extra = x;

    for (int k = 0; k < N; k++) {
        dp_worker *w = &m.workers[k];
        mem_stats_bind(&w->stats);
        gpt_model_free(w->model);
        if (k > 0) {
            mem_free(w->params);
            mem_free(w->grads);
            mem_free(w->grads16);
        }
        free(w->tokens);
    }
    mem_stats_bind(&m.workers[0].stats);
    replica_free(&m.master);
    mem_stats_bind(caller_stats);
    free(m.workers);
    gil_destroy(&lock);
    if (caller_device == DEVICE_CPU && device != DEVICE_CPU) device_select(DEVICE_CPU, 0);
}
