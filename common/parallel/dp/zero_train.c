#include "zero_train.h"

#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "replica.h"
#include "tolerances.h"
#include "train_loop.h"

const char *zero_strategy_name(int stage) {
    static const char *const names[ZERO_STAGES] = {"zero0", "zero1", "zero2", "zero3"};
    return stage >= 0 && stage < ZERO_STAGES ? names[stage] : "zero?";
}

double zero_worst_fraction_of_tolerance(const run_result *r, const run_tolerances *tol,
                                        int all_three) {
    const int later = all_three || r->steps <= TOL_STEPS;   /* loss, parameters too */
    return run_worst_fraction_of_tolerance(r, tol->grads, later ? tol->loss : 0,
                                           later ? tol->params : 0);
}

/* One rank's ZeRO step for the training loop. */
typedef struct {
    zero_rank *z;
    const run_config *cfg;
    const dataset *data;
    int first, count;   /* this rank's sequences of every global batch */
    float *first_grads; /* world rank 0: the caller's; NULL elsewhere */
} zero_step;

static float zero_compute_grads(void *arg, int step, float loss_scale) {
    zero_step *st = arg;
    const int T = st->cfg->model.ctx;
    const double global_tokens = (double)st->cfg->batch * T;
    load_batch(st->z->model, st->data, st->cfg, step, st->first, st->count);
    /* Each rank's gradient is d(sum of its tokens' losses)/(B*T): summed over ranks,
     * that is the gradient of the global-batch mean, as in the baseline. */
    float loss = zero_forward_backward(st->z, (float)(loss_scale / global_tokens));
    return (float)(loss * st->count * T / global_tokens);
}

static int zero_optimizer_grads(void *arg, grad_vector *vectors) {
    return dp_grads_optimizer_grads(&((zero_step *)arg)->z->dp, vectors);
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

/* The textbook bytes a rank sends per step: the stage's collectives in a ring; ZeRO++
 * and HSDP: both tiers' bytes of zeropp_tier_bytes (to the byte). */
static double zero_bytes_formula(const gpt_shape *shape, const zero_options *opts, int N) {
    if (opts->stage == 3 && (opts->zeropp || opts->hsdp)) {
        double tiers[2];
        const int K = opts->ranks_per_node > 0 ? opts->ranks_per_node : N;
        zeropp_tier_bytes(shape, opts->zeropp, opts->hsdp, N, K, tiers);
        return tiers[0] + tiers[1];
    }
    comm_plan plan = zero_comm_plan_grads(shape, opts->stage, opts->precision,
                                          opts->grad_precision);
    double bytes = 0;
    for (int k = 0; k < COMM_NKINDS; k++) bytes += plan_ring_bytes(&plan, k, N);
    return bytes;
}

void zero_train(comm *world, const run_config *cfg, const dataset *data,
                const zero_options *options, strategy_outcome *out) {
    const int N = comm_size(world), rank = comm_rank(world);
    zero_options stage_opts = *options;
    stage_opts.precision = cfg->precision;   /* the run's */
    stage_opts.grad_precision = cfg->grad_precision;
    stage_opts.ranks_per_node = cfg->comm.ranks_per_node;
    const zero_options *opts = &stage_opts;
    const int T = cfg->model.ctx;
    out->world_size = N;
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    if (out->extra && strategy_outcome_keeps(out))
        *(zero_extra *)out->extra = (zero_extra){.opts = *opts,
                                                 .shard_len_largest = shard_largest_len(&shape, N)};

    /* this rank's sequences of every global batch (uneven when N does not divide B) */
    size_t first;
    const int count = (int)comm_shard((size_t)cfg->batch, N, rank, &first);
    mem_stats *mem = mem_stats_current();
    const mem_stats at_start = *mem;
    mem_stats_reset_peaks(mem);

    /* HSDP: ZeRO-3 over this rank's node, its pieces all-reduced across the nodes */
    comm *node = NULL, *across = NULL;
    if (opts->hsdp) {
        const int K = opts->ranks_per_node > 0 ? opts->ranks_per_node : N;
        node = comm_split(world, rank / K, rank, "hsdp-shard");
        across = comm_split(world, rank % K, rank, "hsdp-replicate");
        stage_opts.replicate = across;
    }
    zero_step step = {.z = zero_rank_create(node ? node : world, &shape, count, T, cfg->seed,
                                            opts),
                      .cfg = cfg, .data = data, .first = (int)first, .count = count,
                      .first_grads = out->first_grads};
    train_strategy strategy = {.name = zero_strategy_name(opts->stage), .ctx = &step,
                               .compute_grads = zero_compute_grads,
                               .keep_first_grads = zero_keep_first_grads,
                               .update = zero_update,
                               .optimizer_grads = zero_optimizer_grads,
                               .checkpoint_state = zero_step_checkpoint_state};
    strategy_outcome_train(world, cfg, &strategy, out);
    out->result.bytes_formula = zero_bytes_formula(&shape, opts, N);

    /* measurements, before any checking traffic: the state held between steps */
    const mem_stats at_end = *mem;
    comm_stats stats = comm_stats_all(world);
    /* checking: the whole parameters, then free everything of this stage */
    zero_gather_params(step.z, out->final_params);
    zero_rank_free(step.z);
    comm_free(node);
    comm_free(across);
    /* the largest rank of everything the tables show */
    strategy_outcome_measure_comm(out, world, &stats);
    strategy_outcome_measure_state(out, world, &at_start, &at_end);
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    const zero_options *opts;
} zero_launch_args;

static void zero_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const zero_launch_args *a = args;
    zero_train(world, a->cfg, a->data, a->opts, out);
}

int zero_launch(const run_config *cfg, const dataset *data, const zero_options *opts,
                strategy_outcome *rank0_out) {
    zero_launch_args args = {cfg, data, opts};
    return strategy_launch(cfg, zero_rank_fn, &args, rank0_out);
}
