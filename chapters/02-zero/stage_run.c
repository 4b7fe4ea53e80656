#include "stage_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

const char *stage_strategy_name(int stage) {
    static const char *const names[ZERO_STAGES] = {"zero0", "zero1", "zero2", "zero3"};
    return stage >= 0 && stage < ZERO_STAGES ? names[stage] : "zero?";
}

double stage_worst_fraction_of_tolerance(const run_result *r, int all_three) {
    const double diffs[3] = {r->diff_grads, r->diff_loss, r->diff_params};
    const double tols[3] = {ZERO_TOL_GRADS, ZERO_TOL_LOSS, ZERO_TOL_PARAMS};
    const int checked = all_three || r->steps <= ZERO_TOL_STEPS ? 3 : 1;
    double worst = 0;
    for (int i = 0; i < checked; i++) {
        if (isnan(diffs[i])) return INFINITY;
        if (diffs[i] >= 0 && diffs[i] / tols[i] > worst) worst = diffs[i] / tols[i];
    }
    return worst;
}

/* Each value replaced by its maximum over the ranks of group. Doubles travel as pairs
 * of f32 words through an all-gather, which only copies. */
static void max_over_ranks(comm *group, double *values, int n) {
    const int size = comm_size(group);
    double *all = malloc(sizeof(double) * (size_t)n * size);
    if (!all) abort();
    comm_allgather(group, values, all, (size_t)n * size * 2, COMM_F32);
    for (int r = 0; r < size; r++)
        for (int i = 0; i < n; i++)
            if (all[r * n + i] > values[i]) values[i] = all[r * n + i];
    free(all);
}

void stage_train(comm *world, const run_config *cfg, const dataset *data,
                 const zero_options *opts, stage_outcome *out) {
    const int N = comm_size(world), rank = comm_rank(world);
    const int T = cfg->model.ctx, steps = cfg->steps;
    const double global_tokens = (double)cfg->batch * T;
    memset(out, 0, sizeof *out);
    out->opts = *opts;
    out->world_size = N;
    out->loss = calloc((size_t)steps, sizeof(float));
    out->step_seconds = calloc((size_t)steps, sizeof(double));
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    const size_t P = gpt_num_params(&shape);
    if (rank == 0) {
        out->first_grads = malloc(P * sizeof(float));
        out->final_params = malloc(P * sizeof(float));
    }

    /* this rank's sequences of every global batch (uneven when N does not divide B) */
    size_t first;
    const int count = (int)comm_shard((size_t)cfg->batch, N, rank, &first);
    mem_stats *mem = mem_stats_current();
    const mem_stats at_start = *mem;
    mem_stats_reset_peaks(mem);

    zero_rank *z = zero_rank_create(world, &shape, count, T, cfg->seed, opts);
    out->shard_len_largest = shard_largest_len(&shape, N);
    /* Each rank's gradient is d(sum of its tokens' losses)/(B*T): summed over ranks,
     * that is the gradient of the global-batch mean, as in the baseline. */
    const float dloss = 1.0f / (float)global_tokens;   /* as the baseline computes it */
    float *loss_sums = calloc((size_t)steps, sizeof(float));
    double timed = 0;
    int timed_steps = 0;
    for (int step = 1; step <= steps; step++) {
        double start = comm_now();
        load_batch(z->model, data, cfg, step, (int)first, count);
        float loss = zero_forward_backward(z, dloss);
        double seconds = comm_now() - start;
        if (step == 1) zero_gather_grads(z, out->first_grads);   /* checking: not timed */
        start = comm_now();
        zero_optimizer_step(z, &cfg->adamw);
        ops_synchronize();
        seconds += comm_now() - start;
        loss_sums[step - 1] = loss * (float)count * (float)T;
        out->step_seconds[step - 1] = seconds;
        /* step 1 pays for first touches and warm-up, and carries the gradient check */
        if (step > 1 || steps == 1) {
            timed += seconds;
            timed_steps++;
        }
        if (step == 1 && steps > 1) {
            comm_stats_reset(world);
            mem_stats_reset_peaks(mem);
        }
    }

    /* measurements, before any checking traffic */
    const mem_stats at_end = *mem;
    const mem_tag state_tags[3] = {MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER};
    for (int i = 0; i < 3; i++)
        out->state[i] = (double)(at_end.current[state_tags[i]] - at_start.current[state_tags[i]]);
    run_result *r = &out->result;
    *r = (run_result){.strategy = stage_strategy_name(opts->stage), .steps = steps,
                      .loss = out->loss, .diff_loss = -1, .diff_grads = -1,
                      .diff_params = -1, .seconds = timed, .timed_steps = timed_steps,
                      .tokens_per_step = global_tokens, .memory = at_end};
    run_result_add_comm(r, world, timed_steps);
    comm_plan plan = zero_comm_plan(&shape, opts->stage);
    r->bytes_formula = 0;
    for (int k = 0; k < COMM_NKINDS; k++) r->bytes_formula += ring_bytes(plan.elements[k], N);
    comm_stats stats = comm_stats_all(world);
    for (int k = 0; k < COMM_NKINDS; k++) {
        out->comm_calls[k] = (double)stats.calls[k] / timed_steps;
        out->comm_bytes[k] = (double)stats.bytes_sent[k] / timed_steps;
        out->comm_seconds[k] = stats.seconds[k] / timed_steps;
    }
    out->async_seconds = stats.async_seconds / timed_steps;
    out->hidden_seconds = stats.hidden_seconds / timed_steps;

    /* checking: the whole parameters, then free everything of this stage */
    zero_gather_params(z, out->final_params);
    zero_rank_free(z);

    /* the largest rank of everything the tables show */
    run_result_take_max(world, r);
    enum { PER_KIND = 3 * COMM_NKINDS };
    double values[PER_KIND + 5];
    for (int k = 0; k < COMM_NKINDS; k++) {
        values[k] = out->comm_calls[k];
        values[COMM_NKINDS + k] = out->comm_bytes[k];
        values[2 * COMM_NKINDS + k] = out->comm_seconds[k];
    }
    for (int i = 0; i < 3; i++) values[PER_KIND + i] = out->state[i];
    values[PER_KIND + 3] = out->async_seconds;
    values[PER_KIND + 4] = out->hidden_seconds;
    max_over_ranks(world, values, PER_KIND + 5);
    for (int k = 0; k < COMM_NKINDS; k++) {
        out->comm_calls[k] = values[k];
        out->comm_bytes[k] = values[COMM_NKINDS + k];
        out->comm_seconds[k] = values[2 * COMM_NKINDS + k];
    }
    for (int i = 0; i < 3; i++) out->state[i] = values[PER_KIND + i];
    out->async_seconds = values[PER_KIND + 3];
    out->hidden_seconds = values[PER_KIND + 4];

    /* the global-batch loss of every step: one reduction at the end, so that the
     * timed steps carry only the stage's own collectives */
    comm_allreduce(world, loss_sums, (size_t)steps, COMM_F32, COMM_SUM);
    for (int s = 0; s < steps; s++) out->loss[s] = (float)(loss_sums[s] / global_tokens);
    free(loss_sums);
}

void stage_outcome_free(stage_outcome *o) {
    free(o->loss);
    free(o->step_seconds);
    free(o->first_grads);
    free(o->final_params);
    memset(o, 0, sizeof *o);
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    const zero_options *opts;
    stage_outcome *rank0_out;
} launched_stage;

static int launched_stage_main(comm *world, void *argument) {
    launched_stage *a = argument;
    stage_outcome o;
    stage_train(world, a->cfg, a->data, a->opts, &o);
    if (comm_rank(world) == 0) *a->rank0_out = o;
    else stage_outcome_free(&o);
    return 0;
}

int stage_run_launch(const run_config *cfg, const dataset *data, const zero_options *opts,
                     stage_outcome *rank0_out) {
    memset(rank0_out, 0, sizeof *rank0_out);
    launched_stage a = {cfg, data, opts, rank0_out};
    return launch(&cfg->comm, launched_stage_main, &a);
}
