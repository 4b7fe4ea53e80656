#include "strategy_outcome.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "model.h"

static void *host_alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    return p;
}

static size_t whole_params(const run_config *cfg) {
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    return gpt_num_params(&whole);
}

/* Host buffers of n parameters (a model of cfg's shape, or fewer). */
static void outcome_alloc(strategy_outcome *o, const run_config *cfg, size_t n) {
    void *extra = o->extra;
    memset(o, 0, sizeof *o);
    o->extra = extra;
    o->num_params = n;
    o->loss = host_alloc((size_t)cfg->steps * sizeof(float));
    o->step_seconds = host_alloc((size_t)cfg->steps * sizeof(double));
    o->first_grads = host_alloc(o->num_params * sizeof(float));
    o->final_params = host_alloc(o->num_params * sizeof(float));
    o->result.loss = o->loss;
}

void strategy_outcome_alloc(strategy_outcome *o, const run_config *cfg) {
    outcome_alloc(o, cfg, whole_params(cfg));
}

void strategy_outcome_free(strategy_outcome *o) {
    free(o->loss);
    free(o->step_seconds);
    free(o->first_grads);
    free(o->final_params);
    void *extra = o->extra;
    memset(o, 0, sizeof *o);
    o->extra = extra;
}

int strategy_outcome_keeps(const strategy_outcome *o) { return o->loss != NULL; }

void strategy_outcome_take_run(strategy_outcome *out, train_outcome *run) {
    const int steps = run->result.steps;
    out->result = run->result;
    if (out->loss) {
        memcpy(out->loss, run->loss, (size_t)steps * sizeof(float));
        memcpy(out->step_seconds, run->step_seconds, (size_t)steps * sizeof(double));
    }
    out->result.loss = out->loss;
    train_outcome_free(run);
}

void strategy_outcome_train(comm *world, const run_config *cfg, const train_strategy *strategy,
                            strategy_outcome *out) {
    train_outcome run;
    train_loop(world, cfg, (double)cfg->batch * cfg->model.ctx, strategy, &run);
    strategy_outcome_take_run(out, &run);
}

void strategy_outcome_compare(strategy_outcome *out, const baseline_run *baseline) {
    compare_to_baseline(&out->result, baseline, out->loss, out->first_grads, out->final_params);
}

/* Each value replaced by its maximum over the ranks of group. */
static void max_over_ranks(comm *group, double *values, int n) {
    comm_allreduce(group, values, (size_t)n, COMM_F64, COMM_MAX);
}

void strategy_outcome_measure_comm(strategy_outcome *out, comm *metrics, const comm_stats *s) {
    const int timed = out->result.timed_steps > 0 ? out->result.timed_steps : 1;
    enum { N = 3 * COMM_NKINDS + 2 };
    double v[N];
    for (int k = 0; k < COMM_NKINDS; k++) {
        v[k] = (double)s->calls[k] / timed;
        v[COMM_NKINDS + k] = (double)s->bytes_sent[k] / timed;
        v[2 * COMM_NKINDS + k] = s->seconds[k] / timed;
    }
    v[N - 2] = s->async_seconds / timed;
    v[N - 1] = s->hidden_seconds / timed;
    max_over_ranks(metrics, v, N);
    for (int k = 0; k < COMM_NKINDS; k++) {
        out->comm_calls[k] = v[k];
        out->comm_bytes[k] = v[COMM_NKINDS + k];
        out->comm_seconds[k] = v[2 * COMM_NKINDS + k];
    }
    out->async_seconds = v[N - 2];
    out->hidden_seconds = v[N - 1];
}

void strategy_outcome_measure_state(strategy_outcome *out, comm *metrics,
                                    const mem_stats *at_start, const mem_stats *at_end) {
    const mem_tag tags[3] = {MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER};
    for (int i = 0; i < 3; i++)
        out->state[i] = (double)(at_end->current[tags[i]] - at_start->current[tags[i]]);
    max_over_ranks(metrics, out->state, 3);
}

strategy_outcome *strategy_outcome_for_rank(comm *world, strategy_outcome *callers,
                                            strategy_outcome *local) {
    if (comm_world_rank(world) == 0) return callers;
    memset(local, 0, sizeof *local);
    local->extra = callers->extra;
    local->num_params = callers->num_params;
    return local;
}

typedef struct {
    strategy_rank_fn rank_fn;
    void *args;
    strategy_outcome *rank0_out;
} launched_strategy;

static int launched_strategy_main(comm *world, void *argument) {
    launched_strategy *a = argument;
    strategy_outcome local;
    strategy_outcome *out = strategy_outcome_for_rank(world, a->rank0_out, &local);
    out->world_size = comm_size(world);
    a->rank_fn(world, a->args, out);
    return 0;
}

int strategy_launch_sized(const run_config *cfg, size_t num_params, int threads_only,
                          strategy_rank_fn rank_fn, void *args, strategy_outcome *rank0_out) {
    outcome_alloc(rank0_out, cfg, num_params);
    launched_strategy a = {rank_fn, args, rank0_out};
    return threads_only ? launch_threads(&cfg->comm, launched_strategy_main, &a)
                        : launch(&cfg->comm, launched_strategy_main, &a);
}

int strategy_launch(const run_config *cfg, strategy_rank_fn rank_fn, void *args,
                    strategy_outcome *rank0_out) {
    return strategy_launch_sized(cfg, whole_params(cfg), 0, rank_fn, args, rank0_out);
}

int strategy_launch_threads(const run_config *cfg, strategy_rank_fn rank_fn, void *args,
                            strategy_outcome *rank0_out) {
    return strategy_launch_sized(cfg, whole_params(cfg), 1, rank_fn, args, rank0_out);
}
