#include "baseline.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "alloc.h"
#include "device.h"
#include "ops.h"
#include "replica.h"
#include "train_loop.h"

/* The baseline's step: the whole batch on one rank. */
typedef struct {
    const run_config *cfg;
    const dataset *data;
    replica rep;
    gpt_model *model;
    baseline_run *out;
} baseline_step;

static float baseline_grads(void *arg, int step, float loss_scale) {
    baseline_step *b = arg;
    const int B = b->cfg->batch, T = b->cfg->model.ctx;
    load_batch(b->model, b->data, b->cfg, step, 0, B);
    replica_grads_zero(&b->rep);
    const void *weights = replica_compute_params(&b->rep);
    float loss = gpt_forward(b->model, weights);
    replica_backward(&b->rep, b->model, weights, loss_scale / (float)(B * T), NULL, NULL);
    return loss;
}

static int baseline_optimizer_grads(void *arg, grad_vector *vectors) {
    return replica_optimizer_grads(&((baseline_step *)arg)->rep, vectors);
}

static void baseline_keep_grads(void *arg) {
    baseline_step *b = arg;
    replica_download_grads(&b->rep, b->out->first_grads);
}

static void baseline_checkpoint_state(void *arg, ckpt_state *out) {
    replica_checkpoint_state(&((baseline_step *)arg)->rep, 1, out);
}

static void baseline_update(void *arg, int step) {
    (void)step;
    baseline_step *b = arg;
    replica_adamw(&b->rep, &b->cfg->adamw);
}

baseline_run *baseline_train(const run_config *cfg, const dataset *data) {
    openblas_set_num_threads(1);   /* one core, like one rank of a strategy */
    /* On the device the flags choose (GPU 0, as rank 0), on this thread; a thread that
     * computed on the CPU does so again afterwards (helper threads it starts later, as
     * chapter 1's DataParallel does, compute on the CPU too). */
    const device_kind caller_device = device_current();
    const device_kind device = launch_select_device(&cfg->comm, 0);
    mem_stats *caller_stats = mem_stats_current();
    mem_stats stats = {0};
    mem_stats_bind(&stats);

    baseline_run *out = calloc(1, sizeof *out);
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    baseline_step b = {.cfg = cfg, .data = data, .out = out};
    replica_init(&b.rep, &shape, cfg->init_seed ? cfg->init_seed : cfg->seed, 1);
    replica_set_precision(&b.rep, cfg->precision);
    replica_set_grad_precision(&b.rep, cfg->grad_precision);
    b.rep.masters_in_16_bits = cfg->test_16bit_masters;
    b.model = gpt_model_create(&shape, cfg->batch, cfg->model.ctx,
                               &(gpt_model_options){.precision = cfg->precision});
    out->num_params = b.rep.num_params;
    out->first_grads = malloc(b.rep.num_params * sizeof(float));
    out->final_params = malloc(b.rep.num_params * sizeof(float));

    train_strategy strategy = {.name = "baseline", .ctx = &b, .compute_grads = baseline_grads,
                               .keep_first_grads = baseline_keep_grads,
                               .update = baseline_update,
                               .optimizer_grads = baseline_optimizer_grads,
                               .checkpoint_state = baseline_checkpoint_state};
    train_outcome run;
    train_loop(NULL, cfg, (double)cfg->batch * cfg->model.ctx, &strategy, &run);
    ops_download(out->final_params, b.rep.params, b.rep.num_params * sizeof(float));
    out->loss = train_outcome_take_loss(&run);   /* kept: the outcome's other arrays go */
    out->result = run.result;
    out->result.loss = out->loss;
    out->result.diff_loss = out->result.diff_grads = out->result.diff_params = 0;
    out->result.bytes_formula = 0;
    train_outcome_free(&run);

    gpt_model_free(b.model);
    replica_free(&b.rep);
    mem_stats_bind(caller_stats);
    if (caller_device == DEVICE_CPU && device != DEVICE_CPU) device_select(DEVICE_CPU, 0);
    return out;
}

baseline_run *baseline_reference(const run_config *cfg, const dataset *data) {
    run_config reference = *cfg;
    reference.save_dir = NULL;
    return baseline_train(&reference, data);
}

void baseline_free(baseline_run *b) {
    if (!b) return;
    free(b->loss);
    free(b->first_grads);
    free(b->final_params);
    free(b);
}

double baseline_largest_grad(const baseline_run *b) {
    double largest = 0;
    for (size_t i = 0; i < b->num_params; i++) largest = fmax(largest, fabs(b->first_grads[i]));
    return largest;
}
