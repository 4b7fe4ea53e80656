#include "mesh_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "baseline.h"
#include "compare.h"
#include "pp_train.h"
#include "tp_train.h"

/* This rank's stage k of S = v x p, and its TP slice. */
static gpt_shape stage_shape(const run_config *cfg, mesh_shape shape, mesh_coord me, int k,
                             int S, const moe_config *moe) {
    gpt_shape s = parallel_model_shape(cfg, shape.tp, me.tp, moe);
    gpt_shape_split_stages(&s, S, k);
    return s;
}

/* MoE (moe_params.h): the routers and this rank's experts in fp32, their gradients, m
 * and v, each sharded by ZeRO's rule over its group (the routers over the dense
 * gradients' group, the experts over expert_dp); in 16 bits the layer's 16-bit copy of
 * the experts (+ 1 byte, as it allocates). */
static void moe_state_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                              int zero, const moe_config *moe, double state[3]) {
    if (moe->experts <= 0) return;
    const moe_shape ms = moe_shape_make(moe, &cfg->model, mesh_ep_size(&shape), me.ep);
    const int rank = mesh_rank_of(&shape, me);
    int group, group_rank, replicas;
    parallel_grads_groups(&shape, rank, zero, &group, &group_rank, &replicas);
    moe_vector_state_bytes(moe_router_numel(&ms), zero, group, group_rank, state);
    moe_vector_state_bytes(moe_local_experts_numel(&ms), zero, mesh_expert_dp_size(&shape),
                           mesh_group_rank(&shape, MESH_EXPERT_DP, rank), state);
    if (cfg->precision != PRECISION_FP32)
        state[0] += (double)moe_local_experts_numel(&ms) * precision_bytes(cfg->precision) + 1;
}

void mesh_traffic_formula(const run_config *cfg, mesh_shape shape, mesh_coord me,
                          const pipeline_options *opts, mesh_rank_traffic *t) {
    const int v = opts->chunks, S = v * shape.pp;
    /* one rank in dp x cp: nothing sharded */
    const int zero = shape.dp * mesh_cp_size(&shape) > 1 ? opts->zero_stage : 0;
    int group, group_rank, replicas;
    parallel_grads_groups(&shape, mesh_rank_of(&shape, me), zero, &group, &group_rank,
                          &replicas);
    pipeline_bytes_formula(cfg, shape, me, opts, t->formula);
    for (int i = 0; i < 3; i++) t->state_formula[i] = 0;
    for (int c = 0; c < v; c++) {
        const int k = pp_stage_of(pp_schedule_vshape(opts->schedule), shape.pp, me.pp, c);
        const gpt_shape s = stage_shape(cfg, shape, me, k, S, &opts->moe);
        double bytes[3];
        dp_grads_state_bytes(&s, zero, cfg->precision, cfg->grad_precision, group, group_rank,
                             bytes);
        for (int i = 0; i < 3; i++) t->state_formula[i] += bytes[i];
    }
    moe_state_formula(cfg, shape, me, zero, &opts->moe, t->state_formula);
}

/* The MoE blocks this rank's stages run. */
static int blocks_held(const pipeline_rank *r) {
    int n = 0;
    for (int c = 0; c < r->opts.chunks; c++)
        for (int l = r->chunks[c].shape.layer_begin; l < r->chunks[c].shape.layer_end; l++)
            n += moe_layer_index(&r->par.moe->shape, l) >= 0;
    return n;
}

/* The ep group's bytes per timed step: measured, and from the rows the routing sent
 * (moe_params.remote_rows, since the warm-up) with the counts of each block its stages
 * run, once a micro-batch. */
static void measure_alltoall(const pipeline_rank *r, comm *ep, int timed_steps,
                             mesh_rank_traffic *t) {
    const moe_params *p = r->par.moe;
    const moe_shape *s = &p->shape;
    const comm_stats st = comm_stats_get(ep);
    t->alltoall = (double)comm_stats_total_sent(&st) / timed_steps;
    const double counts = (double)blocks_held(r) * r->opts.micro * (s->ep_size - 1) *
                          s->experts_local * sizeof(double);
    t->alltoall_routed = p->remote_rows * s->dim * sizeof(float) / timed_steps +
                         (s->ep_size > 1 ? counts : 0);
    t->remote_fraction = p->exchanged_rows > 0 ? p->remote_rows / p->exchanged_rows : 0;
}

/* This rank's traffic per group kind and the model state it holds after the loop. */
static void measure_rank(const pipeline_rank *r, int timed_steps, mesh_rank_traffic *t) {
    const mesh *m = r->mesh;
    comm *groups[PIPELINE_ALL_KINDS] = {m->tp, m->pp, r->par.grads, m->embedding, m->cp,
                                        r->par.replicate, r->par.moe ? m->expert_dp : NULL};
    for (int k = 0; k < PIPELINE_ALL_KINDS; k++) {
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
    for (int i = 0; i < 3; i++) t->state_peak[i] = (double)mem->peak[MEM_PARAMS + i];
    t->activations = (double)mem->peak[MEM_ACTIVATIONS];
    if (r->par.moe) measure_alltoall(r, m->ep, timed_steps, t);
}

/* The largest |measured / formula - 1| over ranks and kinds; the row's bytes formula
 * is the largest rank's, as its bytes are. */
static void judge_bytes(mesh_extra *x, int world, run_result *row) {
    double worst = 0, largest = 0;
    x->alltoall_mismatch = 0;
    for (int w = 0; w < world; w++) {
        double total = 0;
        x->alltoall_mismatch = fmax(x->alltoall_mismatch,
                                    fabs(x->ranks[w].alltoall - x->ranks[w].alltoall_routed));
        for (int k = 0; k < PIPELINE_ALL_KINDS; k++) {
            const double f = x->ranks[w].formula[k], b = x->ranks[w].bytes[k];
            const double error = f > 0 ? fabs(b / f - 1) : b;
            if (error > worst) worst = error;
            total += f;
        }
        if (total > largest) largest = total;
    }
    x->worst_bytes_error = worst;
    row->bytes_formula = largest;
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    mesh_shape shape;
    const pipeline_options *opts;
    const char *name;   /* NULL: "3d" or "mesh" */
} mesh_launch_args;

/* Every rank's traffic next to its formula, gathered to every rank; world rank 0 keeps
 * them. */
static void mesh_measure(comm *world, pipeline_rank *r, void *ctx, strategy_outcome *out) {
    const mesh_launch_args *a = ctx;
    const int W = comm_size(world);
    mesh_rank_traffic mine = {0};
    measure_rank(r, out->result.timed_steps, &mine);
    mesh_traffic_formula(a->cfg, a->shape, r->mesh->me, a->opts, &mine);
    mesh_rank_traffic *gathered = mem_alloc(MEM_OTHER, (size_t)W * sizeof *gathered);
    /* a rank's traffic is doubles only (mesh_train.h) */
    const size_t doubles = sizeof mine / sizeof(double);
    comm_allgather(world, &mine, gathered, (size_t)W * doubles, COMM_F64);
    mesh_extra *x = strategy_outcome_keeps(out) ? out->extra : NULL;
    if (x) {
        memcpy(x->ranks, gathered, (size_t)W * sizeof *gathered);
        judge_bytes(x, W, &out->result);
    }
    mem_free(gathered);
    if (r->par.moe) {   /* after the bytes were read: this gather is no step's */
        const int keeps = x && x->moe_final_params;
        pipeline_moe_whole(r, 0, keeps ? x->moe_final_params : NULL);
        if (keeps)
            memcpy(x->moe_first_grads, r->moe_first_grads, x->moe_num_params * sizeof(float));
    }
}

static void mesh_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const mesh_launch_args *a = args;
    mesh m;
    mesh_create(&m, world, a->shape);
    /* chapter 5's name for TP x PP x DP; with CP, SP or replicas: the mesh */
    const int more = mesh_cp_size(&a->shape) > 1 || a->opts->sequence_parallel ||
                     mesh_dp_replicate_size(&a->shape) > 1 || mesh_ep_size(&a->shape) > 1;
    const char *name = a->opts->name ? a->opts->name : a->name ? a->name
                                                     : more ? "mesh" : "3d";
    const double drift = pp_train_on_mesh(world, &m, a->cfg, a->data, a->opts, name,
                                          mesh_measure, args, out);
    mesh_extra *x = strategy_outcome_keeps(out) ? out->extra : NULL;
    if (x) x->tied_drift = drift;
    mesh_free(&m);
}

/* The extra's arrays, before the ranks start (x NULL: none); the options the ranks
 * run, with the routing log where the extra has one. */
static pipeline_options extra_prepare(mesh_extra *x, const run_config *cfg, mesh_shape shape,
                                      const pipeline_options *opts) {
    pipeline_options o = *opts;
    if (!x) return o;
    *x = (mesh_extra){.shape = shape, .opts = *opts};
    x->ranks = calloc((size_t)mesh_world(&shape), sizeof *x->ranks);
    if (opts->moe.experts > 0) {
        const moe_shape ms = moe_shape_make(&opts->moe, &cfg->model, 1, 0);
        x->moe_num_params = moe_router_numel(&ms) + moe_local_experts_numel(&ms);
        x->moe_first_grads = calloc(x->moe_num_params, sizeof(float));
        x->moe_final_params = calloc(x->moe_num_params, sizeof(float));
        const size_t steps = cfg->steps, blocks = ms.moe_layers;
        x->moe_log = (moe_routing_log){
            .steps = cfg->steps, .aux = calloc(steps, sizeof(double)),
            .load = calloc(steps * blocks * ms.cfg.experts, sizeof(double)),
            .dropped = calloc(steps * blocks, sizeof(double))};
        o.moe_log = &x->moe_log;
    }
    return o;
}

/* The whole model's vector: the dense model's, less the MoE blocks' MLPs. */
static size_t whole_params(const run_config *cfg, const moe_config *moe) {
    const gpt_shape s = parallel_model_shape(cfg, 1, 0, moe);
    return gpt_num_params(&s);
}

int mesh_launch(const run_config *cfg, const dataset *data, mesh_shape shape,
                const pipeline_options *opts, strategy_outcome *rank0_out) {
    const pipeline_options o = extra_prepare(rank0_out->extra, cfg, shape, opts);
    mesh_launch_args a = {cfg, data, shape, &o, NULL};
    return strategy_launch_sized(cfg, whole_params(cfg, &o.moe), 0, mesh_rank_fn, &a,
                                 rank0_out);
}

int mesh_train_one_device(const run_config *cfg, const dataset *data,
                          const pipeline_options *opts, strategy_outcome *rank0_out) {
    run_config one = *cfg;
    one.comm.ranks = 1;
    const mesh_shape shape = {.tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1};
    pipeline_options o = *opts;
    o.zero_stage = 0;
    o.sequence_parallel = 0;
    /* MoE routes each micro-batch apart (moe.h): one device accumulates the same ones,
     * in order, on its one stage */
    if (o.moe.experts <= 0) o.micro = 1;
    o.schedule = PP_1F1B;
    o.chunks = 1;
    o = extra_prepare(rank0_out->extra, &one, shape, &o);
    mesh_launch_args a = {&one, data, shape, &o, "baseline"};
    return strategy_launch_sized(&one, whole_params(&one, &o.moe), 1, mesh_rank_fn, &a,
                                 rank0_out);
}

baseline_run mesh_outcome_as_baseline(const strategy_outcome *o) {
    return (baseline_run){.result = o->result, .loss = o->loss, .first_grads = o->first_grads,
                          .final_params = o->final_params, .num_params = o->num_params};
}

void mesh_extra_free(mesh_extra *x) {
    free(x->ranks);
    free(x->moe_first_grads);
    free(x->moe_final_params);
    free(x->moe_log.aux), free(x->moe_log.load), free(x->moe_log.dropped);
    memset(x, 0, sizeof *x);
}

double mesh_worst_fraction_of_tolerance(const run_result *r) {
    return run_worst_fraction_of_tolerance(r, MESH_TOL_GRADS, MESH_TOL_LOSS, MESH_TOL_PARAMS);
}

/* CP's attention sums its key blocks in another order (the online softmax) before the
 * one rounding to 16 bits that one device's attention makes too: up to a unit u per
 * block forward and backward, fewer than TP's four all-reduces a block, so TP's bound
 * (tolerances_for_tp) holds it. */
run_tolerances mesh_run_tolerances(const run_config *cfg, mesh_shape shape,
                                   const moe_config *moe, const baseline_run *b) {
    const int split = shape.tp > 1 ? shape.tp : mesh_cp_size(&shape) > 1 ? 2 : 1;
    const double G = baseline_largest_grad(b);
    const run_tolerances t = tolerances_with_grads16(tp_run_tolerances(cfg, split, b), cfg,
                                                     shape.dp * mesh_cp_size(&shape), G);
    const int moe_blocks = moe && moe->experts > 0
                               ? moe_shape_make(moe, &cfg->model, 1, 0).moe_layers : 0;
    return tolerances_with_moe_routing(tolerances_with_moe_rows(t, cfg, moe_blocks, G), cfg,
                                       moe_blocks);
}

double mesh_loss_bound_from_fp32(const run_config *cfg, const dataset *data,
                                 const pipeline_options *opts, const float *loss16) {
    if (cfg->precision == PRECISION_FP32 || cfg->steps <= TOL_STEPS) return 0;
    run_config fp32 = *cfg;
    fp32.precision = fp32.grad_precision = PRECISION_FP32;
    fp32.quiet = 1;
    fp32.comm.trace_path = NULL;
    double bound;
    if (opts->moe.experts > 0) {   /* the MoE model on one device */
        mesh_extra x = {0};
        strategy_outcome one = {.extra = &x};
        if (mesh_train_one_device(&fp32, data, opts, &one) != 0) return -1;
        bound = mixed_loss_tolerance(loss16, one.loss, cfg->steps);
        strategy_outcome_free(&one);
        mesh_extra_free(&x);
    } else {
        baseline_run *one = baseline_train(&fp32, data);
        bound = mixed_loss_tolerance(loss16, one->loss, cfg->steps);
        baseline_free(one);
    }
    return bound;
}
