#include "stage_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "train_loop.h"

const char *stage_strategy_name(int stage) {
    static const char *const names[ZERO_STAGES] = {"zero0", "zero1", "zero2", "zero3"};
    return stage >= 0 && stage < ZERO_STAGES ? names[stage] : "zero?";
}

double stage_worst_fraction_of_tolerance(const run_result *r, int all_three) {
    const int later = all_three || r->steps <= ZERO_TOL_STEPS;   /* loss, parameters too */
    return run_worst_fraction_of_tolerance(r, ZERO_TOL_GRADS, later ? ZERO_TOL_LOSS : 0,
                                           later ? ZERO_TOL_PARAMS : 0);
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

/* One rank's ZeRO step for the training loop. */
typedef struct {
    zero_rank *z;
    const run_config *cfg;
    const dataset *data;
    int first, count;   /* this rank's sequences of every global batch */
    float *first_grads;
} zero_step;

static float zero_compute_grads(void *arg, int step) {
    zero_step *st = arg;
    const int T = st->cfg->model.ctx;
    const double global_tokens = (double)st->cfg->batch * T;
    load_batch(st->z->model, st->data, st->cfg, step, st->first, st->count);
    /* Each rank's gradient is d(sum of its tokens' losses)/(B*T): summed over ranks,
     * that is the gradient of the global-batch mean, as in the baseline. */
    float loss = zero_forward_backward(st->z, (float)(1.0 / global_tokens));
    return (float)(loss * st->count * T / global_tokens);
}

static void zero_keep_first_grads(void *arg) {
    zero_step *st = arg;
    zero_gather_grads(st->z, st->first_grads);
}

static void zero_update(void *arg, int step) {
    (void)step;
    zero_step *st = arg;
    zero_optimizer_step(st->z, &st->cfg->adamw);
}

static void zero_step_checkpoint_state(void *arg, ckpt_state *out) {
    zero_checkpoint_state(((zero_step *)arg)->z, out);
}

void stage_train(comm *world, const run_config *cfg, const dataset *data,
                 const zero_options *opts, stage_outcome *out) {
    const int N = comm_size(world), rank = comm_rank(world);
    const int T = cfg->model.ctx;
    memset(out, 0, sizeof *out);
    out->opts = *opts;
    out->world_size = N;
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

    zero_step step = {.z = zero_rank_create(world, &shape, count, T, cfg->seed, opts),
                      .cfg = cfg, .data = data, .first = (int)first, .count = count,
                      .first_grads = out->first_grads};
    out->shard_len_largest = shard_largest_len(&shape, N);
    train_strategy strategy = {.name = stage_strategy_name(opts->stage), .ctx = &step,
                               .compute_grads = zero_compute_grads,
                               .keep_first_grads = zero_keep_first_grads,
                               .update = zero_update,
                               .checkpoint_state = zero_step_checkpoint_state};
    train_outcome run;
    train_loop(world, cfg, (double)cfg->batch * T, &strategy, &run);
    out->result = run.result;
    out->loss = train_outcome_take_loss(&run);
    out->result.loss = out->loss;
    out->step_seconds = train_outcome_take_step_seconds(&run);   /* this rank's; rank 0's are kept */
    const int timed_steps = run.result.timed_steps;
    train_outcome_free(&run);

    /* measurements, before any checking traffic */
    const mem_stats at_end = *mem;
    const mem_tag state_tags[3] = {MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER};
    for (int i = 0; i < 3; i++)
        out->state[i] = (double)(at_end.current[state_tags[i]] - at_start.current[state_tags[i]]);
    comm_plan plan = zero_comm_plan(&shape, opts->stage);
    out->result.bytes_formula = 0;
    for (int k = 0; k < COMM_NKINDS; k++)
        out->result.bytes_formula += ring_bytes(plan.elements[k], N);
    comm_stats stats = comm_stats_all(world);
    for (int k = 0; k < COMM_NKINDS; k++) {
        out->comm_calls[k] = (double)stats.calls[k] / timed_steps;
        out->comm_bytes[k] = (double)stats.bytes_sent[k] / timed_steps;
        out->comm_seconds[k] = stats.seconds[k] / timed_steps;
    }
    out->async_seconds = stats.async_seconds / timed_steps;
    out->hidden_seconds = stats.hidden_seconds / timed_steps;

    /* checking: the whole parameters, then free everything of this stage */
    zero_gather_params(step.z, out->final_params);
    zero_rank_free(step.z);

    /* the largest rank of everything the tables show */
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
