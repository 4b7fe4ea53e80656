/* Context parallelism (x data parallelism) through the one training loop (cp_train.h). */
#include "cp_train.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "cp_attention_hook.h"
#include "ops.h"
#include "replica.h"
#include "tp_slices.h"
#include "train_loop.h"

/* ---- sizes ------------------------------------------------------------------------- */

int cp_check_sizes(const run_config *cfg, int world, int tp, int cp, const cp_options *opts,
                   char *err, size_t err_len) {
    const int T = cfg->model.ctx, H = cfg->model.heads;
    const int balanced = opts->kind == CP_RING && opts->split == CP_BALANCED;
    const int pieces = balanced ? 2 * cp : cp;
    if (cfg->comm.device == DEVICE_CUDA) {
        snprintf(err, err_len, "--device cuda: context parallelism runs on the CPU here (its"
                 " blockwise attention has no CUDA kernels yet): give --device cpu");
        return 0;
    }
    if (tp < 1 || H % tp) {
        snprintf(err, err_len, "--tp %d does not divide --heads %d", tp, H);
        return 0;
    }
    const mesh_config mesh = {.shape = {.tp = tp, .pp = 1, .cp = cp},
                              .world = world, .trains = 1};
    if (mesh_check(&mesh, err, err_len)) return 0;
    if (cp > CP_MAX_RANKS || world > CP_MAX_RANKS) {
        snprintf(err, err_len, "--cp %d on %d ranks: at most %d ranks here", cp, world,
                 CP_MAX_RANKS);
        return 0;
    }
    if (T % pieces) {
        snprintf(err, err_len, "--ctx %d does not split into %d equal chunks (--cp %d%s):"
                 " use a ctx that is a multiple of %d", T, pieces, cp,
                 balanced ? " balanced: 2 chunks per rank" : "", pieces);
        return 0;
    }
    if (opts->kind == CP_ULYSSES && H / tp % cp) {
        snprintf(err, err_len, "--cp %d does not divide --heads %d%s (Ulysses gives each rank"
                 " heads/cp whole heads): use a CP size that divides %d, or --cp-attention"
                 " ring", cp, H / tp, tp > 1 ? " / --tp" : "", H / tp);
        return 0;
    }
    if (opts->kind == CP_ULYSSES && opts->split == CP_BALANCED) {
        snprintf(err, err_len, "--cp-split balanced is for ring attention: Ulysses sees the"
                 " whole sequence on its heads, so no rank waits on the causal mask");
        return 0;
    }
    if (cfg->batch % (world / (tp * cp))) {
        snprintf(err, err_len, "--batch %d does not split over %d data-parallel groups (%d"
                 " ranks / --cp %d%s)", cfg->batch, world / (tp * cp), world, cp,
                 tp > 1 ? " / --tp" : "");
        return 0;
    }
    return 1;
}

/* ---- training ----------------------------------------------------------------------- */

typedef struct {
    comm *world, *grads_group;   /* grads_group: the mesh's dp_cp, gradients summed */
    const mesh *m;
    const run_config *cfg;
    const dataset *data;
    gpt_shape shape;             /* the whole model, or this rank's TP slice */
    replica rep;
    cp_attention *attention;
    cp_attention_hook *hook;     /* the model's attention core: the CP group's */
    position_span span;          /* this rank's positions of every sequence */
    gpt_model *model;            /* B sequences of the span's rows (Tc) each */
    int *batch;                  /* host staging: tokens and targets of B whole sequences */
    int B;
    strategy_outcome *out;
} cp_rank;

static float cp_compute_grads(void *arg, int step, float loss_scale) {
    cp_rank *r = arg;
    const int T = r->cfg->model.ctx;
    const double tokens = (double)r->cfg->batch * T;
    dataset_batch(r->data, r->cfg->seed, step, r->m->me.dp * r->B, r->B, T, r->batch,
                  r->batch + (size_t)r->B * T);
    const size_t rows = (size_t)r->B * position_span_rows(&r->span);   /* B x Tc */
    int *chunk = gpt_host_batch(r->model);
    cp_span_rows(&r->span, r->B, T, r->batch, chunk);
    cp_span_rows(&r->span, r->B, T, r->batch + (size_t)r->B * T, chunk + rows);
    gpt_set_batch(r->model, chunk, chunk + rows);
    vec_zero(r->rep.grads, r->rep.num_params);
    trace_begin(r->world, "forward");
    const float chunk_mean = gpt_forward(r->model, r->rep.params);   /* over B x Tc tokens */
    trace_end(r->world);
    trace_begin(r->world, "backward");
    gpt_backward(r->model, r->rep.params, r->rep.grads, (float)(loss_scale / tokens), NULL,
                 NULL);
    trace_end(r->world);
    if (comm_size(r->grads_group) > 1) {
        trace_begin(r->world, "cp+dp gradients");
        comm_allreduce(r->grads_group, r->rep.grads, r->rep.num_params, COMM_F32, COMM_SUM);
        trace_end(r->world);
    }
    /* this chunk's share of the global mean; the TP ranks of a chunk share one loss */
    return r->m->me.tp == 0 ? (float)(chunk_mean * (double)rows / tokens) : 0.0f;
}

/* The unsplit vector into world rank 0's `whole` (NULL elsewhere), from one CP and DP
 * index's TP ranks. */
static void whole_vector(const cp_rank *r, const float *mine, float *whole) {
    if (r->m->me.cp != 0 || r->m->me.dp != 0) return;
    if (r->m->shape.tp > 1) tp_gather_whole(r->m->tp, &r->shape, mine, whole);
    else if (whole) ops_download(whole, mine, r->rep.num_params * sizeof(float));
}

static void cp_keep_first_grads(void *arg) {
    cp_rank *r = arg;
    whole_vector(r, r->rep.grads, r->out->first_grads);
}

static void cp_update(void *arg, int step) {
    (void)step;
    cp_rank *r = arg;
    trace_begin(r->world, "optimizer");
    replica_adamw(&r->rep, &r->cfg->adamw);
    trace_end(r->world);
}

static int cp_optimizer_grads(void *arg, grad_vector *vectors) {
    return replica_optimizer_grads(&((cp_rank *)arg)->rep, vectors);
}

static const char *strategy_name(const cp_options *o) {
    if (o->kind == CP_ULYSSES) return "cp-ulysses";
    return o->split == CP_BALANCED ? "cp-ring-balanced" : "cp-ring";
}

/* Every rank's numbers per step, gathered into world rank 0's extra (collective). */
static void cp_measure(const cp_rank *r, comm *metrics, const run_config *cfg,
                       const cp_options *opts, int timed_steps) {
    const int world = comm_size(r->world), L = cfg->model.layers;
    comm_stats cp_stats = comm_stats_get(r->m->cp), grad_stats = comm_stats_get(r->grads_group);
    cp_rank_numbers mine = {
        .attention_work = (double)cp_attention_work(r->attention) / cfg->steps,
        .cp_bytes = (double)comm_stats_total_sent(&cp_stats) / timed_steps,
        .grad_bytes = (double)comm_stats_total_sent(&grad_stats) / timed_steps,
        .activations = (double)mem_stats_current()->peak[MEM_ACTIVATIONS]};
    enum { K = sizeof(cp_rank_numbers) / sizeof(double) };
    double *all = mem_alloc(MEM_OTHER, (size_t)world * K * sizeof(double));
    comm_allgather(metrics, &mine, all, (size_t)world * K, COMM_F64);
    cp_extra *x = strategy_outcome_keeps(r->out) ? r->out->extra : NULL;
    if (x) {
        *x = (cp_extra){.tp = r->m->shape.tp, .cp = r->m->shape.cp, .dp = r->m->shape.dp,
                        .opts = *opts};
        memcpy(x->ranks, all, (size_t)world * sizeof *x->ranks);
        double most_work = 0, total_work = 0;
        for (int i = 0; i < world; i++) {
            const cp_rank_numbers *n = &x->ranks[i];
            if (n->cp_bytes / L > x->cp_bytes_per_layer) x->cp_bytes_per_layer = n->cp_bytes / L;
            if (n->attention_work > most_work) most_work = n->attention_work;
            total_work += n->attention_work;
        }
        x->work_imbalance = total_work > 0 ? most_work / (total_work / world) : 1.0;
        x->cp_bytes_per_layer_formula = cp_attention_bytes_formula(
            opts->kind, x->cp, r->B, cfg->model.ctx, r->shape.dim_local);
    }
    mem_free(all);
}

static void cp_rank_init(cp_rank *r, const cp_options *opts) {
    const gpt_config *g = &r->cfg->model;
    const int t = r->m->shape.tp;
    r->shape = gpt_shape_make(g, t, r->m->me.tp);
    mem_stats_reset_peaks(mem_stats_current());
    replica_init(&r->rep, &r->shape, r->cfg->seed, 1);
    r->attention = cp_attention_create(r->m->shape.cp > 1 ? r->m->cp : NULL, opts, r->B,
                                       g->ctx, r->shape.dim_local, r->shape.heads_local);
    r->span = cp_span_of(g->ctx, mesh_cp_size(&r->m->shape), r->m->me.cp, opts->split);
    r->hook = cp_attention_hook_create(r->attention, g->layers);
    /* the one model on the chunk: every per-token op on its rows, attention the group's */
    const gpt_model_options model_opts = {.tp = t > 1 ? r->m->tp : NULL,
                                          .attention = cp_attention_hook_of(r->hook),
                                          .positions = &r->span};
    r->model = gpt_model_create(&r->shape, r->B, position_span_rows(&r->span), &model_opts);
    r->batch = mem_alloc(MEM_OTHER, 2 * (size_t)r->B * g->ctx * sizeof(int));
}

/* Bytes one rank sends per step: its layers' CP traffic (over its heads), Megatron's 4
 * all-reduces per layer of the chunk's activations on the TP group (the vocabulary is
 * not split), and the ring all-reduce of its gradients over the cp x dp ranks. */
static double cp_bytes_formula(const cp_rank *r, const run_config *cfg,
                               const cp_options *opts) {
    const mesh_shape *s = &r->m->shape;
    const int t = s->tp, n = comm_size(r->grads_group), L = cfg->model.layers;
    const double rows = (double)r->B * cfg->model.ctx / mesh_cp_size(s);
    const double tp_bytes = 2.0 * (t - 1) / t * 4.0 * L * rows * cfg->model.dim * sizeof(float);
    return L * cp_attention_bytes_formula(opts->kind, mesh_cp_size(s), r->B, cfg->model.ctx,
                                          r->shape.dim_local) +
           tp_bytes + 2.0 * (n - 1) / n * (double)r->rep.num_params * sizeof(float);
}

void cp_train(comm *world, const mesh *m, const run_config *cfg, const cp_options *opts,
              const dataset *data, strategy_outcome *out) {
    const int rank = comm_rank(world);
    comm *metrics = comm_split(world, 0, rank, "metrics");
    out->world_size = comm_size(world);
    cp_rank r = {.world = world, .m = m, .cfg = cfg, .data = data, .out = out,
                 .B = cfg->batch / m->shape.dp, .grads_group = m->dp_cp};
    cp_rank_init(&r, opts);
    train_strategy strategy = {.name = strategy_name(opts), .ctx = &r,
                               .compute_grads = cp_compute_grads,
                               .keep_first_grads = cp_keep_first_grads, .update = cp_update,
                               .optimizer_grads = cp_optimizer_grads};
    strategy_outcome_train(world, cfg, &strategy, out);
    out->result.bytes_formula = cp_bytes_formula(&r, cfg, opts);
    cp_measure(&r, metrics, cfg, opts, out->result.timed_steps > 0 ? out->result.timed_steps : 1);
    whole_vector(&r, r.rep.params, out->final_params);

    mem_free(r.batch);
    gpt_model_free(r.model);
    cp_attention_hook_free(r.hook);
    cp_attention_free(r.attention);
    replica_free(&r.rep);
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
    cp_train(world, &m, a->cfg, a->opts, a->data, out);
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
