#include "run3d.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "train_loop.h"

/* This rank's stage k of S = v x p, and its TP slice. */
static gpt_shape stage_shape(const run_config *cfg, mesh_shape shape, mesh_coord me, int k,
                             int S) {
    gpt_shape s = gpt_shape_make(&cfg->model, shape.tp, me.tp);
    if (shape.tp > 1) gpt_shape_split_vocab(&s);
    gpt_shape_split_stages(&s, S, k);
    return s;
}

void mesh_traffic_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                          const pipeline_options *opts, rank_traffic *t) {
    const int v = opts->chunks, S = v * shape.pp;
    const int zero = shape.dp > 1 ? opts->zero_stage : 0;   /* one replica: nothing sharded */
    pipeline_bytes_formula(cfg, shape, me, opts, t->formula);
    for (int i = 0; i < 3; i++) t->state_formula[i] = 0;
    for (int c = 0; c < v; c++) {
        const gpt_shape s = stage_shape(cfg, shape, me, c * shape.pp + me.pp, S);
        double bytes[3];
        dp_grads_state_bytes(&s, zero, shape.dp, me.dp, bytes);
        for (int i = 0; i < 3; i++) t->state_formula[i] += bytes[i];
    }
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    mesh_shape shape;
    const pipeline_options *opts;
    const baseline_run *baseline;
    mesh_outcome *out;
} launched;

static void measure(const mesh *m, int timed_steps, rank_traffic *t) {
    comm *groups[GROUP_KINDS] = {m->tp, m->pp, m->dp, m->embedding};
    for (int k = 0; k < GROUP_KINDS; k++) {
        if (!groups[k]) continue;
        comm_stats s = comm_stats_get(groups[k]);
        t->bytes[k] = (double)comm_stats_total_sent(&s) / timed_steps;
        double calls = 0;
        for (int i = 0; i < COMM_NKINDS; i++)
            if (i != COMM_KIND_BARRIER) calls += (double)s.calls[i];
        t->calls[k] = calls / timed_steps;
    }
    const mem_stats *mem = mem_stats_current();
    t->state[0] = (double)mem->current[MEM_PARAMS];
    t->state[1] = (double)mem->current[MEM_GRADS];
    t->state[2] = (double)mem->current[MEM_OPTIMIZER];
    t->activations = (double)mem->peak[MEM_ACTIVATIONS];
}

static int rank_main(comm *world, void *arg) {
    launched *a = arg;
    const run_config *cfg = a->cfg;
    const int W = comm_size(world), root = comm_rank(world) == 0;
    mesh m;
    mesh_create(&m, world, a->shape);
    pipeline_rank r;
    pipeline_rank_init(&r, world, &m, cfg, a->data, a->opts);
    train_strategy strategy = pipeline_strategy(&r);
    strategy.name = "3d";
    train_outcome run;
    train_loop(world, cfg, (double)cfg->batch * cfg->model.ctx, &strategy, &run);

    rank_traffic mine = {0};
    measure(&m, run.result.timed_steps, &mine);
    mesh_traffic_formula(cfg, a->shape, m.me, a->opts, &mine);
    rank_traffic *all = root ? calloc((size_t)W, sizeof *all) : NULL;
    rank_traffic *gathered = calloc((size_t)W, sizeof *gathered);
    comm_allgather(world, &mine, gathered, (size_t)W * sizeof mine / 4, COMM_F32);
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    float *final_params = root ? malloc(gpt_num_params(&whole) * sizeof(float)) : NULL;
    double drift = pipeline_gather_params(&r, final_params);

    if (root) {
        mesh_outcome *o = a->out;
        *o = (mesh_outcome){.shape = a->shape, .opts = *a->opts, .result = run.result,
                            .loss = train_outcome_take_loss(&run), .ranks = all,
                            .tied_drift = drift};
        o->result.loss = o->loss;
        memcpy(all, gathered, (size_t)W * sizeof *all);
        double worst = 0, largest = 0;
        for (int w = 0; w < W; w++) {
            double total = 0;
            for (int k = 0; k < GROUP_KINDS; k++) {
                const double f = all[w].formula[k], b = all[w].bytes[k];
                const double error = f > 0 ? fabs(b / f - 1) : b;
                if (error > worst) worst = error;
                total += f;
            }
            if (total > largest) largest = total;
        }
        o->worst_bytes_error = worst;
        o->result.bytes_formula = largest;   /* the row's bytes are the largest rank's too */
        if (a->baseline)
            compare_to_baseline(&o->result, a->baseline, o->loss, r.first_grads, final_params);
    }
    free(gathered);
    free(final_params);
    train_outcome_free(&run);
    pipeline_rank_free(&r);
    mesh_free(&m);
    return 0;
}

int mesh_run_launch(const run_config *cfg, const dataset *data, mesh_shape shape,
                    const pipeline_options *opts, const baseline_run *baseline,
                    mesh_outcome *out) {
    memset(out, 0, sizeof *out);
    launched a = {cfg, data, shape, opts, baseline, out};
    return launch(&cfg->comm, rank_main, &a);
}

void mesh_outcome_free(mesh_outcome *o) {
    free(o->loss);
    free(o->ranks);
    memset(o, 0, sizeof *o);
}

double mesh_worst_fraction_of_tolerance(const run_result *r) {
    return run_worst_fraction_of_tolerance(r, MESH_TOL_GRADS, MESH_TOL_LOSS, MESH_TOL_PARAMS);
}
