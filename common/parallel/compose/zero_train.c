#include "zero_train.h"

#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "pp_train.h"
#include "tolerances.h"

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

/* What the tables show, measured after the loop and before any checking traffic: the
 * model state held between steps (since before the mesh trainer allocated it), the
 * collectives per kind, their formula. */
typedef struct {
    zero_options opts;
    mem_stats at_start;
} zero_measure_args;

static void zero_measure(comm *world, pipeline_rank *r, void *ctx, strategy_outcome *out) {
    const zero_measure_args *a = ctx;
    const int N = comm_size(world);
    const mem_stats at_end = *mem_stats_current();
    comm_stats stats = comm_stats_all(world);
    if (out->extra && strategy_outcome_keeps(out))
        *(zero_extra *)out->extra = (zero_extra){.opts = a->opts,
                                                 .shard_len_largest = shard_largest_len(
                                                     &r->dp[0].shape, N)};
    out->result.bytes_formula = zero_bytes_formula(&r->dp[0].shape, &a->opts, N);
    strategy_outcome_measure_comm(out, world, &stats);
    strategy_outcome_measure_state(out, world, &a->at_start, &at_end);
}

/* ZeRO's negative controls as the mesh trainer's. */
static pipeline_fault pipeline_fault_of(zero_fault fault) {
    return fault == ZERO_FAULT_SKIP_GRAD_REDUCE ? PIPELINE_FAULT_SKIP_DP_REDUCE
           : fault == ZERO_FAULT_SKIP_PARAM_ALLGATHER ? PIPELINE_FAULT_SKIP_DP_PARAM_GATHER
                                                      : PIPELINE_FAULT_NONE;
}

void zero_train(comm *world, const run_config *cfg, const dataset *data,
                const zero_options *options, strategy_outcome *out) {
    const int N = comm_size(world);
    zero_measure_args a = {.opts = *options};
    a.opts.precision = cfg->precision;   /* the run's */
    a.opts.grad_precision = cfg->grad_precision;
    a.opts.ranks_per_node = cfg->comm.ranks_per_node;
    const int K = a.opts.ranks_per_node > 0 ? a.opts.ranks_per_node : N;
    mem_stats *mem = mem_stats_current();
    a.at_start = *mem;
    mem_stats_reset_peaks(mem);
    /* every rank a data-parallel replica of the whole model; HSDP: ZeRO-3 over a node
     * (dp_shard), each reduced piece all-reduced across the nodes */
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = 1, .pp = 1, .dp = N,
                                        .dp_shard = a.opts.hsdp ? K : 0});
    const pipeline_options popts = {
        .schedule = PP_1F1B, .micro = 1, .chunks = 1, .zero_stage = a.opts.stage,
        .zero_way = 1, .zero = a.opts,
        .layers = {.checkpoint_activations = a.opts.checkpoint_activations},
        .bookkeeping_aside = 1, .fault = pipeline_fault_of(a.opts.fault)};
    pp_train_on_mesh(world, &m, cfg, data, &popts, zero_strategy_name(a.opts.stage),
                     zero_measure, &a, out);
    mesh_free(&m);
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
