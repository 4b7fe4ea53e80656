/* Context parallelism (x tensor and data parallelism) as a configuration of the mesh
 * trainer (cp_train.h): parallelize hands the model the CP group's attention and its
 * span, dp_grads sums the gradients over cp x dp; here only what chapter 9 measures. */
#include "cp_train.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "parallelize.h"
#include "pp_train.h"

int cp_check_sizes(const run_config *cfg, int world, int tp, int cp, const cp_options *opts,
                   char *err, size_t err_len) {
    if (cp > CP_MAX_RANKS || world > CP_MAX_RANKS) {
        snprintf(err, err_len, "--cp %d on %d ranks: at most %d ranks here", cp, world,
                 CP_MAX_RANKS);
        return 0;
    }
    const int per_dp = tp > 0 && cp > 0 ? tp * cp : 1;
    const mesh_shape shape = {.tp = tp, .pp = 1, .cp = cp,
                              .dp = world % per_dp ? 0 : world / per_dp};
    const parallel_options po = {.cp = *opts, .micro = 1};
    return parallelize_check(cfg, &shape, world, &po, err, err_len) == NULL;
}

static const char *strategy_name(const cp_options *o) {
    if (o->kind == CP_ULYSSES) return "cp-ulysses";
    return o->split == CP_BALANCED ? "cp-ring-balanced" : "cp-ring";
}

/* Each rank's numbers per step, gathered into world rank 0's extra (collective). */
static void cp_measure(comm *world, pipeline_rank *r, void *ctx, strategy_outcome *out) {
    const cp_options *opts = ctx;
    const run_config *cfg = r->cfg;
    const mesh *m = r->mesh;
    const int W = comm_size(world), L = cfg->model.layers;
    const int timed = out->result.timed_steps > 0 ? out->result.timed_steps : 1;
    comm_stats cp_stats = comm_stats_get(m->cp), grad_stats = comm_stats_get(r->par.grads);
    cp_rank_numbers mine = {
        .attention_work = r->par.attention   /* cp 1: the model's own attention */
                              ? (double)cp_attention_work(r->par.attention) / cfg->steps : 0,
        .cp_bytes = (double)comm_stats_total_sent(&cp_stats) / timed,
        .grad_bytes = (double)comm_stats_total_sent(&grad_stats) / timed,
        .activations = (double)mem_stats_current()->peak[MEM_ACTIVATIONS]};
    enum { K = sizeof(cp_rank_numbers) / sizeof(double) };
    comm *metrics = comm_split(world, 0, comm_rank(world), "metrics");
    double *all = mem_alloc(MEM_OTHER, (size_t)W * K * sizeof(double));
    comm_allgather(metrics, &mine, all, (size_t)W * K, COMM_F64);
    double bytes[PIPELINE_ALL_KINDS], total = 0;   /* this rank's, by the formulas */
    pipeline_bytes_formula(cfg, m->shape, m->me, &r->opts, bytes);
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++) total += bytes[k];
    out->result.bytes_formula = total;
    cp_extra *x = strategy_outcome_keeps(out) ? out->extra : NULL;
    if (x) {
        *x = (cp_extra){.tp = m->shape.tp, .cp = m->shape.cp, .dp = m->shape.dp, .opts = *opts};
        memcpy(x->ranks, all, (size_t)W * sizeof *x->ranks);
        double most_work = 0, total_work = 0;
        for (int i = 0; i < W; i++) {
            const cp_rank_numbers *n = &x->ranks[i];
            if (n->cp_bytes / L > x->cp_bytes_per_layer) x->cp_bytes_per_layer = n->cp_bytes / L;
            if (n->attention_work > most_work) most_work = n->attention_work;
            total_work += n->attention_work;
        }
        x->work_imbalance = total_work > 0 ? most_work / (total_work / W) : 1.0;
        x->cp_bytes_per_layer_formula = cp_attention_bytes_formula(
            opts->kind, x->cp, cfg->batch / m->shape.dp, cfg->model.ctx,
            r->chunks[0].shape.dim_local, cfg->precision);
    }
    mem_free(all);
    comm_free(metrics);
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    int tp, cp;
    const cp_options *opts;
} cp_launch_args;

static void cp_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const cp_launch_args *a = args;
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = a->tp, .pp = 1, .cp = a->cp,
                                        .dp = comm_size(world) / (a->tp * a->cp)});
    /* one stage, one micro-batch (CP's attention keeps one), the gradients all-reduced */
    const pipeline_options opts = {.schedule = PP_1F1B, .micro = 1, .chunks = 1,
                                   .cp = *a->opts};
    pp_train_on_mesh(world, &m, a->cfg, a->data, &opts, strategy_name(a->opts), cp_measure,
                     (void *)a->opts, out);
    mesh_free(&m);
}

int cp_launch_tp(const run_config *cfg, const dataset *data, int tp, int cp,
                 const cp_options *opts, strategy_outcome *rank0_out) {
    cp_launch_args args = {cfg, data, tp, cp, opts};
    return strategy_launch(cfg, cp_rank_fn, &args, rank0_out);
}

int cp_launch(const run_config *cfg, const dataset *data, int cp, const cp_options *opts,
              strategy_outcome *rank0_out) {
    return cp_launch_tp(cfg, data, 1, cp, opts, rank0_out);
}
