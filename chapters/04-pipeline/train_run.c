#include "train_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "pp_sim.h"

typedef struct {
    const run_config *cfg;
    const dataset *data;
    int stages;
    const pipeline_options *opts;
    const baseline_run *baseline;
    pp_outcome *out;
} launched;

/* The last step's passes of every rank, on every rank (padded to the longest list). */
static void gather_spans(pipeline_rank *r, pp_outcome *out) {
    comm *g = r->metrics;
    const int p = comm_size(g);
    float longest = (float)r->exec.nspans;   /* a count: exact in a float */
    comm_allreduce(g, &longest, 1, COMM_F32, COMM_MAX);
    const int most = (int)longest;
    pp_span *mine = calloc((size_t)most, sizeof *mine);
    memcpy(mine, r->exec.spans, (size_t)r->exec.nspans * sizeof *mine);
    for (int i = r->exec.nspans; i < most; i++) mine[i].rank = -1;   /* padding */
    pp_span *all = calloc((size_t)most * p, sizeof *all);
    comm_allgather(g, mine, all, (size_t)most * p * sizeof *all / 4, COMM_F32);
    out->spans = malloc((size_t)most * p * sizeof *out->spans);
    out->nspans = 0;
    for (int i = 0; i < most * p; i++)
        if (all[i].rank >= 0) out->spans[out->nspans++] = all[i];
    free(mine);
    free(all);
}

/* The row's bytes are the busiest rank's: its sends, the tied embedding's and (with
 * several pipelines) its stage's gradient all-reduce. */
static double busiest_bytes_formula(const run_config *cfg, const mesh *m,
                                    const pipeline_options *opts) {
    double most = 0;
    for (int k = 0; k < mesh_world(&m->shape); k++) {
        double bytes[PIPELINE_GROUP_KINDS], total = 0;
        pipeline_bytes_formula(cfg, m->shape, mesh_coord_of(&m->shape, k), opts, bytes);
        for (int i = 0; i < PIPELINE_GROUP_KINDS; i++) total += bytes[i];
        if (total > most) most = total;
    }
    return most;
}

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

static int rank_main(comm *world, void *arg) {
    launched *a = arg;
    const run_config *cfg = a->cfg;
    const int p = a->stages, root = comm_rank(world) == 0;
    mesh m;   /* p stages; the other ranks are more pipelines, data parallel */
    mesh_create(&m, world, (mesh_shape){.tp = 1, .pp = p, .dp = comm_size(world) / p});
    pipeline_rank r;
    pipeline_rank_init(&r, world, &m, cfg, a->data, a->opts);
    train_strategy strategy = pipeline_strategy(&r);
    train_outcome run;
    train_loop(world, cfg, (double)cfg->batch * cfg->model.ctx, &strategy, &run);

    pp_outcome o = {.opts = *a->opts, .stages = p, .replicas = m.shape.dp, .result = run.result,
                    .loss = train_outcome_take_loss(&run)};
    o.result.loss = o.loss;
    train_outcome_free(&run);
    pipeline_measures_alloc(&o.measured, p);
    pipeline_measure(&r, &o.measured);
    gather_spans(&r, &o);
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    float *final_params = root ? malloc(gpt_num_params(&whole) * sizeof(float)) : NULL;
    o.tied_drift = pipeline_gather_params(&r, final_params);

    if (root) {
        o.formula = pp_bubble_formula(a->opts->schedule, p, a->opts->micro, a->opts->chunks);
        o.cpu_ranks = cpu_ranks_bubble(r.schedule, cfg);
        o.in_flight_formula = calloc((size_t)p, sizeof(int));
        for (int k = 0; k < p; k++) o.in_flight_formula[k] = pp_peak_in_flight(r.schedule, k);
        o.bytes_formula = 2.0 * cfg->batch / m.shape.dp * cfg->model.ctx * cfg->model.dim *
                          sizeof(float);
        o.result.bytes_formula = busiest_bytes_formula(cfg, &m, a->opts);
        if (a->baseline)
            compare_to_baseline(&o.result, a->baseline, o.loss, r.first_grads, final_params);
        *a->out = o;
    } else {
        pp_outcome_free(&o);
    }
    free(final_params);
    pipeline_rank_free(&r);
    mesh_free(&m);
    return 0;
}

int pp_run_launch(const run_config *cfg, const dataset *data, int stages,
                  const pipeline_options *opts, const baseline_run *baseline, pp_outcome *out) {
    memset(out, 0, sizeof *out);
    launched a = {cfg, data, stages > 0 ? stages : cfg->comm.ranks, opts, baseline, out};
    return launch(&cfg->comm, rank_main, &a);
}

void pp_outcome_free(pp_outcome *o) {
    free(o->loss);
    free(o->in_flight_formula);
    free(o->spans);
    pipeline_measures_free(&o->measured);
    memset(o, 0, sizeof *o);
}

double pp_worst_fraction_of_tolerance(const run_result *r) {
    return run_worst_fraction_of_tolerance(r, PP_TOL_GRADS, PP_TOL_LOSS, PP_TOL_PARAMS);
}
