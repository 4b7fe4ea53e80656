#include "pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ops.h"
#include "tp_slices.h"

const char *pipeline_strategy_name(pp_schedule_kind kind) {
    const pp_schedule_info *s = pp_schedule_about(kind);
    return s ? s->strategy : "pp-?";
}

/* This rank's slice of the whole model (TP), before the pipeline cuts it. */
static gpt_shape tp_whole_shape(const run_config *cfg, const mesh *m, const moe_config *moe) {
    return parallel_model_shape(cfg, m->shape.tp, m->me.tp, moe);
}

/* The stage's model reads the step's whole compute weights and writes its whole fp32
 * gradient, which dp_grads holds (NULL between steps where it keeps shards alone);
 * rep.params are the fp32 masters where the rank holds them whole, for checking. */
static void point_stage_at_step(pipeline_rank *r, int c) {
    const dp_grads *g = &r->dp[c];
    r->chunks[c].rep.compute = dp_grads_whole_params(g);
    r->chunks[c].rep.params = g->params_whole ? g->params : NULL;
    r->chunks[c].rep.grads = dp_grads_whole_grads(g);
    if (g->grads_whole && !g->step_grads_fp32) {   /* 16 bits, slab by slab (DDP's) */
        r->chunks[c].rep.grads16 = g->grads16;
        r->chunks[c].rep.grad_precision = g->grad_precision;
    }
}

/* Bookkeeping_aside: the allocations from here to aside_end on the aside account. */
static mem_stats *aside_begin(pipeline_rank *r) {
    mem_stats *own = mem_stats_current();
    if (r->opts.bookkeeping_aside) mem_stats_bind(&r->aside);
    return own;
}
static void aside_end(mem_stats *own) { mem_stats_bind(own); }

/* The per-step records and world rank 0's comparison copies. */
static void alloc_records(pipeline_rank *r, comm *world, const pipeline_options *opts) {
    mem_stats *own = aside_begin(r);
    r->busy = mem_alloc(MEM_OTHER, (size_t)r->cfg->steps * sizeof(double));
    r->finish = mem_alloc(MEM_OTHER, (size_t)r->cfg->steps * sizeof(double));
    const gpt_shape unsplit = parallel_model_shape(r->cfg, 1, 0, &opts->moe);
    if (comm_rank(world) == 0) r->first_grads = mem_alloc(MEM_OTHER, gpt_num_params(&unsplit) * sizeof(float));
    if (comm_rank(world) == 0 && r->par.moe) r->par.moe->log = opts->moe_log;
    if (comm_rank(world) == 0 && r->par.moe)
        r->moe_first_grads = mem_alloc(MEM_OTHER, moe_params_whole_numel(r->par.moe) *
                                                      sizeof(float));
    aside_end(own);
}

/* ZeRO's way (zero.h): the stage asked for on any group, stage 0 as DDP's one bucket
 * after backward, 16-bit gradients rounded as backward gives them, the slab layout's
 * arrays charged to the rank as plain ZeRO's always were. */
static void zero_way_options(dp_grads_options *o, const pipeline_options *opts) {
    o->zero = opts->zero_stage;
    o->step_grads_fp32 = o->overlap = o->quiet_alone = 0;
    o->first_bucket_bytes = o->bucket_bytes = 0;
    o->bookkeeping = NULL;
}

/* ZeRO's way drives one stage of the whole model through zero.h. */
static void zero_way_attach(pipeline_rank *r, comm *world) {
    const mesh_shape *s = &r->mesh->shape;
    if (s->pp > 1 || r->opts.chunks > 1 || s->tp > 1 || mesh_cp_size(s) > 1 || r->par.moe)
        comm_abort(world, "ZeRO's way runs on one whole-model stage, not tp %d x pp %d x %d"
                   " chunks x cp %d%s", s->tp, s->pp, r->opts.chunks, mesh_cp_size(s),
                   r->par.moe ? " with MoE" : "");
    zero_rank_attach(&r->zero, &r->dp[0], r->chunks[0].model, &r->opts.zero);
}

void pipeline_rank_init(pipeline_rank *r, comm *world, const mesh *m, const run_config *cfg,
                        const dataset *data, const pipeline_options *opts) {
    const int p = m->shape.pp, d = m->shape.dp, v = opts->chunks;
    const int per_pipeline = cfg->batch / d;
    memset(r, 0, sizeof *r);
    /* ZeRO's way: this rank's sequences, uneven where d does not divide the batch */
    size_t first = 0;
    if (opts->zero_way) r->count = (int)comm_shard((size_t)cfg->batch, d, m->me.dp, &first);
    r->first = (int)first;
    const int micro_batch = opts->zero_way ? r->count : per_pipeline / opts->micro;
    r->cfg = cfg;
    r->mesh = m;
    r->opts = *opts;
    mem_stats *own = aside_begin(r);
    r->schedule = pp_schedule_make(opts->schedule, p, opts->micro, v, PP_COMM_ORDERED);
    aside_end(own);
    if (!r->schedule) comm_abort(world, "no %s schedule for pp %d, micro %d, virtual %d",
                                 pp_schedule_name(opts->schedule), p, opts->micro, v);
    const gpt_shape whole = tp_whole_shape(cfg, m, &opts->moe);
    const parallel_options par = pipeline_parallel_options(opts);
    parallelize(&r->par, m, cfg, &par, micro_batch);
    gpt_model_options model_opts = r->par.model;
    model_opts.drop_f_backward = opts->fault == PIPELINE_FAULT_DROP_F_BACKWARD;
    model_opts.sp_copy_not_reduce = opts->fault == PIPELINE_FAULT_SP_OWN_PARTIAL;
    model_opts.sp_mlp_summed = opts->fault == PIPELINE_FAULT_SP_MOE_SUMMED;
    own = aside_begin(r);
    r->chunks = mem_alloc(MEM_OTHER, (size_t)v * sizeof *r->chunks);
    r->dp = mem_alloc(MEM_OTHER, (size_t)v * sizeof *r->dp);
    aside_end(own);
    for (int c = 0; c < v; c++) {
        const int stage = pp_virtual_stage(r->schedule, m->me.pp, c);
        pp_stage_init(&r->chunks[c], m->pp, &whole, stage, v * p, micro_batch,
                      cfg->model.ctx, opts->ddp_buckets ? 1 : opts->micro, cfg->seed,
                      &model_opts, 0);
        r->chunks[c].vshape = pp_schedule_vshape(opts->schedule);
        r->chunks[c].drop_input_grad = opts->fault == PIPELINE_FAULT_DROP_INPUT_GRAD &&
                                       stage == v * p - 1;
    }
    const float dloss = 1.0f / ((float)cfg->batch * (float)cfg->model.ctx);
    /* a pipeline's micro-batches: its share of the batch cut in m; with MoE as
     * Megatron's sampler, micro-batch j of every pipeline together the sequences [j B/m,
     * (j+1) B/m), which one device's micro-batch j routes the same way (moe.h) */
    const int moe = opts->moe.experts > 0;
    own = aside_begin(r);
    pp_executor_init(&r->exec, r->schedule, m->me.pp, r->chunks, cfg, data,
                     m->me.dp * (moe ? micro_batch : per_pipeline),
                     moe ? micro_batch * d : micro_batch, dloss, opts->stage_seconds);
    aside_end(own);
    r->exec.drop_weight_pass = opts->fault == PIPELINE_FAULT_DROP_WEIGHT_PASS && m->me.pp == 0;
    /* each dp group shards its own stage's TP slice; without DP nothing is sharded */
    const dp_fault fault = opts->fault == PIPELINE_FAULT_SKIP_DP_REDUCE ? DP_FAULT_SKIP_GRAD_REDUCE
                           : opts->fault == PIPELINE_FAULT_SKIP_DP_PARAM_GATHER
                               ? DP_FAULT_SKIP_PARAM_ALLGATHER
                           : opts->fault == PIPELINE_FAULT_SKIP_REPLICATE_REDUCE
                               ? DP_FAULT_SKIP_REPLICATE_REDUCE
                               : DP_FAULT_NONE;
    dp_grads_options dp_opts = {
        .zero = r->par.zero, .precision = cfg->precision,
        .grad_precision = cfg->grad_precision, .step_grads_fp32 = !opts->ddp_buckets,
        .first_bucket_bytes = opts->first_bucket_bytes ? opts->first_bucket_bytes : 1u << 20,
        .bucket_bytes = opts->bucket_bytes ? opts->bucket_bytes : 25u << 20,
        .wire = opts->wire, .overlap = opts->ddp_buckets, .quiet_alone = !opts->ddp_buckets,
        .replicate = r->par.replicate,
        .bookkeeping = opts->bookkeeping_aside ? &r->aside : NULL, .fault = fault};
    if (opts->zero_way) zero_way_options(&dp_opts, opts);
    for (int c = 0; c < v; c++) {
        dp_grads_init(&r->dp[c], r->par.grads, &r->chunks[c].shape, cfg->seed, &dp_opts);
        point_stage_at_step(r, c);
    }
    if (opts->zero_way) zero_way_attach(r, world);
    if (opts->ddp_buckets && (p > 1 || v > 1))
        comm_abort(world, "DDP's buckets run on one stage, not pp %d x %d chunks", p, v);
    if (opts->ddp_buckets) {   /* one stage: its last backward starts the buckets */
        r->exec.last_backward_slab_ready = dp_grads_slab_ready;
        r->exec.slab_ctx = &r->dp[0];
    }
    r->metrics = comm_split(world, mesh_group_index(&m->shape, MESH_PP, comm_rank(world)),
                            m->me.pp, "pp-metrics");
    alloc_records(r, world, opts);
}

void pipeline_rank_free(pipeline_rank *r) {
    zero_rank_detach(&r->zero);
    for (int c = 0; c < r->opts.chunks; c++) {
        dp_grads_free(&r->dp[c]);
        pp_stage_free(&r->chunks[c]);
    }
    pp_executor_free(&r->exec);
    pp_schedule_free(r->schedule);
    parallel_rank_free(&r->par);
    comm_free(r->metrics);
    mem_free(r->dp);
    mem_free(r->chunks);
    mem_free(r->busy);
    mem_free(r->finish);
    mem_free(r->first_grads);
    mem_free(r->moe_first_grads);
    memset(r, 0, sizeof *r);
}

/* The first virtual stage is chunk 0 of pipeline rank 0; the last, chunk v-1 of the
 * last rank: they hold the tied embedding. In a V both are on rank 0 (chunks 0 and 1),
 * whose two gradients are summed in place. */
static void reduce_tied_grads(pipeline_rank *r) {
    const mesh *m = r->mesh;
    if (r->opts.fault == PIPELINE_FAULT_SKIP_TIED_REDUCE) return;
    if (pp_schedule_vshape(r->opts.schedule)) {
        if (m->me.pp != 0) return;
        const gpt_shape *s = &r->chunks[0].shape;
        float *first = gpt_tied_weight(s, r->chunks[0].rep.grads);
        float *last = gpt_tied_weight(&r->chunks[1].shape, r->chunks[1].rep.grads);
        vec_add(first, last, gpt_tied_weight_numel(s));
        vec_copy(last, first, gpt_tied_weight_numel(s));
        return;
    }
    if (m->me.pp == 0) pp_stage_reduce_tied_grads(&r->chunks[0], m->embedding);
    if (m->me.pp == m->shape.pp - 1 && m->shape.pp > 1)
        pp_stage_reduce_tied_grads(&r->chunks[r->opts.chunks - 1], m->embedding);
}

/* ZeRO's way: this rank's sequences in one pass, each slab reduced as zero.h does. Each
 * rank's gradient is d(sum of its tokens' losses)/(B T): summed over the ranks, the
 * global batch's mean gradient, as one device's; its loss is weighted so alike. */
static float zero_way_compute_grads(pipeline_rank *r, int step, float loss_scale) {
    const run_config *cfg = r->cfg;
    const double global_tokens = (double)cfg->batch * cfg->model.ctx;
    load_batch(r->zero.model, r->exec.data, cfg, step, r->first, r->count);
    const float loss = zero_forward_backward(&r->zero, (float)(loss_scale / global_tokens));
    point_stage_at_step(r, 0);
    return (float)(loss * r->count * cfg->model.ctx / global_tokens);
}

static float pipeline_compute_grads(void *arg, int step, float loss_scale) {
    pipeline_rank *r = arg;
    const mesh *m = r->mesh;
    if (r->opts.zero_way) return zero_way_compute_grads(r, step, loss_scale);
    /* d(objective)/d(one token's loss), times fp16's loss scale */
    r->exec.dloss = loss_scale / ((float)r->cfg->batch * (float)r->cfg->model.ctx);
    for (int c = 0; c < r->opts.chunks; c++) {
        dp_grads_begin_step_compute(&r->dp[c]);   /* mixed precision: 16-bit weights */
        dp_grads_step_begin(&r->dp[c]);   /* ZeRO-3: the stage's parameters gathered */
        point_stage_at_step(r, c);
    }
    if (r->par.moe) moe_params_step_begin(r->par.moe, r->exec.dloss);
    comm_barrier(m->pp);   /* the pipeline starts together: its timeline has one origin */
    const double start = comm_now();
    trace_begin(m->pp, "pipeline schedule");
    float loss = pp_execute_step(&r->exec, step, start);
    trace_end(m->pp);
    r->busy[step - 1] = r->exec.busy_seconds;
    r->finish[step - 1] = r->exec.finish_seconds;
    trace_begin(m->pp, "tied embedding + dp gradients");
    reduce_tied_grads(r);
    for (int c = 0; c < r->opts.chunks; c++) {
        dp_grads_after_backward(&r->dp[c]);
        point_stage_at_step(r, c);
    }
    if (r->par.moe) moe_params_reduce(r->par.moe);
    if (r->par.moe) moe_params_record(r->par.moe, step);
    trace_end(m->pp);
    /* the loss lives on the last stage, the same on its TP ranks: one of them counts it;
     * a CP rank's is its chunk's mean, of equal chunks */
    const int last = pp_virtual_stage(r->schedule, m->me.pp, r->opts.chunks - 1);
    const int counts = last == r->opts.chunks * m->shape.pp - 1 && m->me.tp == 0;
    /* MoE's auxiliary loss is the global batch's, the same on every rank of a stage:
     * each stage's own blocks', summed over the pipeline apart from its traffic */
    if (r->par.moe) {
        double aux = moe_layer_aux_loss(r->par.moe->layer);
        if (m->shape.pp > 1) comm_allreduce(r->metrics, &aux, 1, COMM_F64, COMM_SUM);
        loss += (float)aux;
    }
    return counts ? loss / (float)(m->shape.dp * mesh_cp_size(&m->shape)) : 0.0f;
}

/* The whole model's vector from every rank's stages and slices, on world rank 0 (only
 * the ranks of data-parallel replica 0 take part; the others hold the same). Returns
 * the largest difference between copies that must agree (tied weight, TP-replicated
 * tensors), as seen on world rank 0. */
static double gather_whole(pipeline_rank *r, pp_vector which, float *whole) {
    const mesh *m = r->mesh;
    if (m->me.dp != 0 || m->me.cp != 0) return 0;
    const gpt_shape mine = tp_whole_shape(r->cfg, m, &r->opts.moe);
    float *slice = malloc(gpt_num_params(&mine) * sizeof(float));
    double drift = pp_gather_whole(m->pp, r->chunks, r->opts.chunks, which, slice);
    /* every stage now holds its TP slice of the whole model: stage 0's TP group, whose
     * first rank is world rank 0, puts the slices together */
    if (m->me.pp != 0) {
        free(slice);
        return drift;
    }
    if (m->shape.tp > 1) {
        double tp_drift = tp_gather_whole(m->tp, &mine, slice, whole);
        if (tp_drift > drift) drift = tp_drift;
    } else if (whole) {
        memcpy(whole, slice, gpt_num_params(&mine) * sizeof(float));
    }
    free(slice);
    return drift;
}

/* The whole model's vector gathered as gather_whole does, after each stage's whole
 * vector is assembled over the dp group where the rank holds a shard (collective over
 * world: every dp rank takes part in its group's gathers). */
static double gather_whole_over_dp(pipeline_rank *r, pp_vector which, float *whole) {
    const dp_vector kind = which == PP_PARAMS ? DP_PARAMS : DP_GRADS;
    float **wholes = mem_alloc(MEM_OTHER, (size_t)r->opts.chunks * sizeof *wholes);
    for (int c = 0; c < r->opts.chunks; c++) {
        wholes[c] = dp_grads_gather_whole(&r->dp[c], kind);
        if (which == PP_PARAMS) r->chunks[c].rep.params = wholes[c];
        else r->chunks[c].rep.grads = wholes[c];
    }
    double drift = gather_whole(r, which, whole);
    for (int c = 0; c < r->opts.chunks; c++) {
        dp_grads_whole_free(&r->dp[c], wholes[c]);
        point_stage_at_step(r, c);
    }
    mem_free(wholes);
    return drift;
}

/* Whether one of this rank's chunks holds the layer. */
static int holds_layer(const pipeline_rank *r, int layer) {
    for (int c = 0; c < r->opts.chunks; c++)
        if (layer >= r->chunks[c].shape.layer_begin && layer < r->chunks[c].shape.layer_end)
            return 1;
    return 0;
}

/* The MoE blocks of the other stages zeroed in a whole MoE vector (the routers, then
 * every expert of every block): their copies here were never used, only decayed. */
static void zero_other_stages_blocks(const pipeline_rank *r, float *whole) {
    const moe_shape *s = &r->par.moe->shape;
    const size_t router = (size_t)s->cfg.experts * s->dim;
    const size_t experts = (size_t)s->cfg.experts * moe_expert_numel(s);
    float *expert_part = whole + r->par.moe->routers.n;
    for (int layer = 0; layer < r->cfg->model.layers; layer++) {
        const int i = moe_layer_index(s, layer);
        if (i < 0 || holds_layer(r, layer)) continue;
        vec_zero(whole + (size_t)i * router, router);
        vec_zero(expert_part + (size_t)i * experts, experts);
    }
}

void pipeline_moe_whole(pipeline_rank *r, int grads, float *out) {
    moe_params *p = r->par.moe;
    if (r->mesh->shape.pp == 1) {
        moe_params_whole(p, r->mesh->ep, grads, out);
        return;
    }
    const size_t n = moe_params_whole_numel(p);
    float *all = mem_alloc(MEM_OTHER, n * sizeof(float));
    moe_params_whole(p, r->mesh->ep, grads, all);
    zero_other_stages_blocks(r, all);
    /* one stage holds each block: the sum is its copy, exactly */
    comm_allreduce(r->metrics, all, n, COMM_F32, COMM_SUM);
    if (out) memcpy(out, all, n * sizeof(float));
    mem_free(all);
}

/* The fp32 gradient AdamW reads, one vector per chunk, for fp16's loss scale. */
static int pipeline_optimizer_grads(void *arg, grad_vector *vectors) {
    pipeline_rank *r = arg;
    int count = 0;
    for (int c = 0; c < r->opts.chunks && count < TRAIN_MAX_GRAD_VECTORS; c++)
        count += dp_grads_optimizer_grads(&r->dp[c], vectors + count);
    if (r->par.moe) count += moe_params_grad_vectors(r->par.moe, vectors + count);
    return count;
}

static void pipeline_keep_first_grads(void *arg) {
    pipeline_rank *r = arg;
    gather_whole_over_dp(r, PP_GRADS, r->first_grads);
    /* the experts: every EP group gathers its own; world rank 0 keeps its group's */
    if (r->par.moe) pipeline_moe_whole(r, 1, r->moe_first_grads);
}

static void pipeline_update(void *arg, int step) {
    (void)step;
    pipeline_rank *r = arg;
    trace_begin(r->mesh->pp, "optimizer");
    for (int c = 0; c < r->opts.chunks; c++) {
        dp_grads_optimizer_step(&r->dp[c], &r->cfg->adamw);
        point_stage_at_step(r, c);
    }
    if (r->par.moe) moe_params_adamw(r->par.moe, &r->cfg->adamw);
    trace_end(r->mesh->pp);
}

/* Every chunk is a part: from ZeRO-1 on each dp rank saves its pieces, else dp rank 0's
 * copy of the stage is saved. */
static void pipeline_checkpoint_state(void *arg, ckpt_state *out) {
    pipeline_rank *r = arg;
    memset(out, 0, sizeof *out);
    for (int c = 0; c < r->opts.chunks && c < CKPT_MAX_PARTS; c++) {
        out->parts[out->count++] = dp_grads_checkpoint_part(
            &r->dp[c], r->mesh->me.dp == 0 && r->mesh->me.cp == 0);
        out->adam_steps[c] = &r->dp[c].adam_step;
    }
}

/* MoE's rows sent, counted from the first timed step as the groups' bytes are. */
static void pipeline_after_warmup(void *arg) {
    pipeline_rank *r = arg;
    if (r->par.moe) r->par.moe->remote_rows = r->par.moe->exchanged_rows = 0;
}

train_strategy pipeline_strategy(pipeline_rank *r) {
    return (train_strategy){.name = pipeline_strategy_name(r->opts.schedule), .ctx = r,
                            .compute_grads = pipeline_compute_grads,
                            .optimizer_grads = pipeline_optimizer_grads,
                            .keep_first_grads = pipeline_keep_first_grads,
                            .update = pipeline_update,
                            .after_warmup = pipeline_after_warmup,
                            .checkpoint_state = pipeline_checkpoint_state};
}

double pipeline_gather_params(pipeline_rank *r, float *whole) {
    return gather_whole_over_dp(r, PP_PARAMS, whole);
}

parallel_options pipeline_parallel_options(const pipeline_options *opts) {
    return (parallel_options){
        .zero = opts->zero_stage, .sequence_parallel = opts->sequence_parallel,
        .cp = opts->cp, .micro = opts->micro, .moe = opts->moe, .layers = opts->layers,
        .split_backward = pp_schedule_about(opts->schedule)->split_backward,
        .grads_over_tp = opts->fault == PIPELINE_FAULT_GRADS_OVER_TP,
        .grads_over_dp_only = opts->fault == PIPELINE_FAULT_GRADS_OVER_DP_ONLY,
        .expert_grads_over_ep = opts->fault == PIPELINE_FAULT_EXPERT_GRADS_OVER_EP,
        .combine_misorder = opts->fault == PIPELINE_FAULT_COMBINE_MISORDER,
        .moe_skip_param_gather = opts->fault == PIPELINE_FAULT_MOE_SKIP_PARAM_GATHER};
}

/* ---- what was measured ---------------------------------------------------------------- */

void pipeline_measures_alloc(pipeline_measures *pm, int stages) {
    memset(pm, 0, sizeof *pm);
    pm->busy_ms = calloc((size_t)stages, sizeof(double));
    pm->idle_ms = calloc((size_t)stages, sizeof(double));
    pm->peak_activations = calloc((size_t)stages, sizeof(double));
    pm->in_flight = calloc((size_t)stages, sizeof(int));
    pm->bytes_sent = calloc((size_t)stages, sizeof(double));
}

void pipeline_measures_free(pipeline_measures *pm) {
    free(pm->busy_ms);
    free(pm->idle_ms);
    free(pm->peak_activations);
    free(pm->in_flight);
    free(pm->bytes_sent);
    memset(pm, 0, sizeof *pm);
}

/* Per stage: busy, finish-time sum (for the makespan), activations, in flight, bytes. */
enum { M_BUSY, M_ACTIVATIONS, M_IN_FLIGHT, M_BYTES, M_OVERRUN, M_COUNT };

void pipeline_measure(pipeline_rank *r, pipeline_measures *pm) {
    const int p = r->mesh->shape.pp, steps = r->cfg->steps;
    const int first = steps > 1 ? 1 : 0, timed = steps - first;   /* step 1 warms up */
    /* the makespan of each step: its last rank's finish */
    double *finish = mem_alloc(MEM_OTHER, sizeof(double) * (size_t)steps * p);
    comm_allgather(r->metrics, r->finish, finish, (size_t)steps * p, COMM_F64);
    double makespan = 0;
    for (int s = first; s < steps; s++) {
        double latest = 0;
        for (int k = 0; k < p; k++)
            if (finish[k * steps + s] > latest) latest = finish[k * steps + s];
        makespan += latest;
    }
    mem_free(finish);
    double mine[M_COUNT] = {0};
    for (int s = first; s < steps; s++) mine[M_BUSY] += r->busy[s];
    mine[M_ACTIVATIONS] = (double)mem_stats_current()->peak[MEM_ACTIVATIONS];
    mine[M_IN_FLIGHT] = r->exec.in_flight_peak;
    comm_stats pp_stats = comm_stats_get(r->mesh->pp);
    mine[M_BYTES] = (double)comm_stats_total_sent(&pp_stats) / (timed > 0 ? timed : 1);
    mine[M_OVERRUN] = r->exec.overrun_seconds;
    double *all = mem_alloc(MEM_OTHER, sizeof mine * (size_t)p);
    comm_allgather(r->metrics, mine, all, (size_t)p * M_COUNT, COMM_F64);
    double busy = 0, idle = 0;
    for (int k = 0; k < p; k++) {
        const double *them = all + k * M_COUNT;
        if (pm->busy_ms) {   /* arrays NULL: the scalars alone */
            pm->busy_ms[k] = 1e3 * them[M_BUSY] / (timed > 0 ? timed : 1);
            pm->idle_ms[k] = 1e3 * (makespan - them[M_BUSY]) / (timed > 0 ? timed : 1);
            pm->peak_activations[k] = them[M_ACTIVATIONS];
            pm->in_flight[k] = (int)them[M_IN_FLIGHT];
            pm->bytes_sent[k] = them[M_BYTES];
        }
        pm->overrun_ms = fmax(pm->overrun_ms, 1e3 * them[M_OVERRUN] / steps);
        busy += them[M_BUSY];
        idle += makespan - them[M_BUSY];
    }
    mem_free(all);
    pm->bubble_fraction = busy + idle > 0 ? idle / (busy + idle) : 0;
    pm->bubble_over_ideal = busy > 0 ? idle / busy : 0;
}
