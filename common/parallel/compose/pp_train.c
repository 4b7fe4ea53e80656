#include "pp_train.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "pp_sim.h"

double pp_train_on_mesh(comm *world, const mesh *m, const run_config *cfg,
                        const dataset *data, const pipeline_options *opts, const char *name,
                        pp_measure_fn measure, void *ctx, strategy_outcome *out) {
    out->world_size = comm_size(world);
    pipeline_rank r;
    pipeline_rank_init(&r, world, m, cfg, data, opts);
    train_strategy strategy = pipeline_strategy(&r);
    if (name) strategy.name = name;
    strategy_outcome_train(world, cfg, &strategy, out);
    /* the rank's own copy, charged to it since the start as the measurements show */
    if (out->first_grads)
        memcpy(out->first_grads, r.first_grads, out->num_params * sizeof(float));
    if (measure) measure(world, &r, ctx, out);
    const double drift = pipeline_gather_params(&r, out->final_params);
    pipeline_rank_free(&r);
    return drift;
}

/* ---- the pipeline's own numbers ------------------------------------------------------ */

/* The last step's passes of every rank, into x on world rank 0 (padded to the longest
 * list for the all-gather; the padding dropped). */
static void gather_spans(pipeline_rank *r, pp_extra *x) {
    comm *g = r->metrics;
    const int p = comm_size(g);
    float longest = (float)r->exec.nspans;   /* a count: exact in a float */
    comm_allreduce(g, &longest, 1, COMM_F32, COMM_MAX);
    const int most = (int)longest;
    pp_span *mine = mem_alloc(MEM_OTHER, (size_t)most * sizeof *mine);
    memcpy(mine, r->exec.spans, (size_t)r->exec.nspans * sizeof *mine);
    for (int i = r->exec.nspans; i < most; i++) mine[i].rank = -1;   /* padding */
    pp_span *all = mem_alloc(MEM_OTHER, (size_t)most * p * sizeof *all);
    /* spans mix ints and doubles: copied as 32-bit words, which an all-gather moves
     * untouched (no arithmetic on them) */
    comm_allgather(g, mine, all, (size_t)most * p * sizeof *all / 4, COMM_F32);
    if (x) {
        x->nspans = 0;
        for (int i = 0; i < most * p && x->nspans < x->spans_room; i++)
            if (all[i].rank >= 0) x->spans[x->nspans++] = all[i];
    }
    mem_free(mine);
    mem_free(all);
}

/* The row's bytes are the busiest rank's: its sends, the tied embedding's and (with
 * several pipelines) its stage's gradient all-reduce. */
static double busiest_bytes_formula(const run_config *cfg, const mesh *m,
                                    const pipeline_options *opts) {
    double most = 0;
    for (int k = 0; k < mesh_world(&m->shape); k++) {
        double bytes[PIPELINE_ALL_KINDS], total = 0;
        pipeline_bytes_formula(cfg, m->shape, mesh_coord_of(&m->shape, k), opts, bytes);
        for (int i = 0; i < PIPELINE_ALL_KINDS; i++) total += bytes[i];
        if (total > most) most = total;
    }
    return most;
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    int stages;
    const pipeline_options *opts;
} pp_launch_args;

/* Every rank measures (collectives over its pipeline); world rank 0 keeps it. */
static void pp_measure(comm *world, pipeline_rank *r, void *ctx, strategy_outcome *out) {
    (void)world;
    const pp_launch_args *a = ctx;
    pp_extra *x = strategy_outcome_keeps(out) ? out->extra : NULL;
    pipeline_measures none = {0};   /* the scalars alone, on the other ranks */
    pipeline_measure(r, x ? &x->measured : &none);
    gather_spans(r, x);
    out->result.bytes_formula = busiest_bytes_formula(a->cfg, r->mesh, a->opts);
}

static void pp_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const pp_launch_args *a = args;
    mesh m;   /* p stages; the other ranks are more pipelines, data parallel */
    mesh_create(&m, world, (mesh_shape){.tp = 1, .pp = a->stages,
                                        .dp = comm_size(world) / a->stages});
    const double drift = pp_train_on_mesh(world, &m, a->cfg, a->data, a->opts, NULL,
                                          pp_measure, args, out);
    pp_extra *x = strategy_outcome_keeps(out) ? out->extra : NULL;
    if (x) x->tied_drift = drift;
    mesh_free(&m);
}

/* ---- what the schedule says, before any rank starts --------------------------------- */

/* What the compute model gives for ranks that do one operation at a time, as these do
 * (a rank in a receive, or a send that waits, computes nothing): the event simulator's
 * bubble for the same lists. Interleaving can lose to it what the formula (streams, as
 * on a GPU) counts as overlapped; the other schedules match the formula. */
static pp_bubble cpu_ranks_bubble(const pp_schedule *s, const run_config *cfg) {
    pp_sim_options o = pp_sim_options_default();
    o.sequential = 1;
    o.buffered = cfg->comm.send_mode == COMM_SEND_BUFFERED && launch_mpi_world_size() <= 0;
    pp_sim_result res;
    pp_bubble b = {-1, -1};
    if (pp_simulate(s, &o, &res)) b = (pp_bubble){res.bubble_fraction, res.bubble_over_ideal};
    pp_sim_result_free(&res);
    return b;
}

/* The extra's formulas and its arrays (one entry a stage, room for every rank's
 * passes), from the schedule the ranks will run. */
static void pp_extra_prepare(pp_extra *x, const run_config *cfg, int p,
                             const pipeline_options *opts) {
    const int d = cfg->comm.ranks / p;
    pp_schedule *s = pp_schedule_make(opts->schedule, p, opts->micro, opts->chunks,
                                      PP_COMM_ORDERED);
    *x = (pp_extra){.opts = *opts, .stages = p, .replicas = d};
    pipeline_measures_alloc(&x->measured, p);
    x->formula = pp_bubble_formula(opts->schedule, p, opts->micro, opts->chunks);
    x->in_flight_formula = calloc((size_t)p, sizeof(int));
    /* activations forward and their gradients back, in the model's precision */
    x->bytes_formula = 2.0 * cfg->batch / d * cfg->model.ctx * cfg->model.dim *
                       (double)precision_bytes(cfg->precision);
    if (!s) return;   /* no such schedule: the ranks stop with the reason */
    x->cpu_ranks = cpu_ranks_bubble(s, cfg);
    int most = 0;
    for (int k = 0; k < p; k++) {
        x->in_flight_formula[k] = pp_peak_in_flight(s, k);
        if (s->ranks[k].count > most) most = s->ranks[k].count;
    }
    x->spans_room = most * p;
    x->spans = calloc((size_t)x->spans_room + 1, sizeof *x->spans);
    pp_schedule_free(s);
}

int pp_launch(const run_config *cfg, const dataset *data, int stages,
              const pipeline_options *opts, strategy_outcome *rank0_out) {
    pp_launch_args a = {cfg, data, stages > 0 ? stages : cfg->comm.ranks, opts};
    if (rank0_out->extra) pp_extra_prepare(rank0_out->extra, cfg, a.stages, opts);
    return strategy_launch(cfg, pp_rank_fn, &a, rank0_out);
}

void pp_extra_free(pp_extra *x) {
    pipeline_measures_free(&x->measured);
    free(x->in_flight_formula);
    free(x->spans);
    memset(x, 0, sizeof *x);
}

double pp_worst_fraction_of_tolerance(const run_result *r) {
    return run_worst_fraction_of_tolerance(r, PP_TOL_GRADS, PP_TOL_LOSS, PP_TOL_PARAMS);
}
