#include "train.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "device.h"
#include "ops.h"

static float *device_floats(mem_tag tag, size_t n) {
    return mem_alloc_on(MEM_DEVICE, tag, n * sizeof(float));
}

void replica_init(replica *r, const gpt_shape *s, uint64_t seed, int with_optimizer) {
    memset(r, 0, sizeof *r);
    r->shape = *s;
    r->num_params = gpt_num_params(s);
    r->params = device_floats(MEM_PARAMS, r->num_params);
    r->grads = device_floats(MEM_GRADS, r->num_params);
    if (with_optimizer) {
        r->adam_m = device_floats(MEM_OPTIMIZER, r->num_params);
        r->adam_v = device_floats(MEM_OPTIMIZER, r->num_params);
    }
    float *host = malloc(r->num_params * sizeof(float));
    gpt_init_params(s, seed, 0, r->num_params, host);
    ops_upload(r->params, host, r->num_params * sizeof(float));
    free(host);
}

void replica_free(replica *r) {
    mem_free(r->params);
    mem_free(r->grads);
    mem_free(r->adam_m);
    mem_free(r->adam_v);
    memset(r, 0, sizeof *r);
}

void replica_adamw(replica *r, const adamw_config *cfg) {
    r->adam_step++;
    adamw_update(r->params, r->grads, r->adam_m, r->adam_v, r->num_params, cfg,
                 r->adam_step);
}

void load_batch(gpt_model *m, const dataset *d, const run_config *cfg, int step,
                int first, int count) {
    const int T = cfg->model.ctx;
    int *tokens = malloc(sizeof(int) * (size_t)count * T * 2);
    dataset_batch(d, cfg->seed, step, first, count, T, tokens, tokens + count * T);
    gpt_set_batch(m, tokens, tokens + count * T);
    free(tokens);
}

double max_abs_diff(const float *a, const float *b, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

dataset *dataset_from_config(const run_config *cfg) {
    if (!cfg->data_path) return dataset_builtin();
    char err[512];
    dataset *d = dataset_load(cfg->data_path, cfg->model.ctx, err, sizeof err);
    if (!d) cli_fail("%s", err);
    return d;
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

    baseline_run *b = calloc(1, sizeof *b);
    const int B = cfg->batch, T = cfg->model.ctx;
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    replica rep;
    replica_init(&rep, &shape, cfg->seed, 1);
    gpt_model *model = gpt_model_create(&shape, B, T, NULL);
    b->num_params = rep.num_params;
    b->loss = calloc((size_t)cfg->steps, sizeof(float));
    b->first_grads = malloc(rep.num_params * sizeof(float));
    b->final_params = malloc(rep.num_params * sizeof(float));

    const double tokens = (double)B * T;
    double timed = 0.0;
    for (int step = 1; step <= cfg->steps; step++) {
        double start = comm_now();
        load_batch(model, data, cfg, step, 0, B);
        vec_zero(rep.grads, rep.num_params);
        float loss = gpt_forward(model, rep.params);
        gpt_backward(model, rep.params, rep.grads, 1.0f / (float)tokens, NULL, NULL);
        if (step == 1) ops_download(b->first_grads, rep.grads, rep.num_params * sizeof(float));
        replica_adamw(&rep, &cfg->adamw);
        ops_synchronize();
        double seconds = comm_now() - start;
        b->loss[step - 1] = loss;
        /* the first step pays for page faults and warm-up; time the rest */
        if (step > 1 || cfg->steps == 1) {
            timed += seconds;
            b->result.timed_steps++;
        }
        report_step(cfg, "baseline", step, loss, seconds, tokens);
    }
    ops_download(b->final_params, rep.params, rep.num_params * sizeof(float));

    b->result = (run_result){
        .strategy = "baseline", .steps = cfg->steps, .loss = b->loss,
        .diff_loss = 0, .diff_grads = 0, .diff_params = 0,
        .seconds = timed, .timed_steps = b->result.timed_steps, .tokens_per_step = tokens,
        .bytes_formula = 0, .memory = stats};
    gpt_model_free(model);
    replica_free(&rep);
    mem_stats_bind(caller_stats);
    if (caller_device == DEVICE_CPU && device != DEVICE_CPU) device_select(DEVICE_CPU, 0);
    return b;
}

void baseline_free(baseline_run *b) {
    if (!b) return;
    free(b->loss);
    free(b->first_grads);
    free(b->final_params);
    free(b);
}
