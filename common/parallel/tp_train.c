/* The whole model trained with tensor parallelism (times data parallelism when there
 * are more ranks than the TP size).
 *
 *   every TP rank: the same batch, its slice of every block (heads, MLP units) and of
 *                  the vocabulary (embedding rows = LM head rows); the blocks all-reduce
 *                  inside (g forward, f backward), the loss is assembled from per-token
 *                  maxima and sums (common/vocab_parallel.c)
 *   every DP group of TP ranks: its share of the batch; gradients summed over groups
 *   optimizer: plain AdamW on the slice; replicated tensors get identical gradients
 *              on every TP rank, so their copies stay identical
 *
 * Mixed precision (bf16, fp16): the slice's fp32 masters and their 16-bit compute copy
 * (replica.h), rounded at every step's start; f and g all-reduce 16-bit activations,
 * the DP buckets fp32 gradients (16-bit ones with --grad-dtype). The vocabulary is split
 * in every precision: in 16 bits the slice's logits are 16-bit and the vocab-parallel
 * softmax widens them to fp32 (vocab_parallel.h), as one device's loss does. */
#include "tp_train.h"

#include "grads16.h"
#include "ops_mixed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "grad_buckets.h"
#include "ops.h"
#include "replica.h"
#include "tolerances.h"
#include "tp_slices.h"
#include "train_loop.h"

/* ---- sizes ------------------------------------------------------------------------- */

/* TP sizes that divide the heads (hence the width) and the ranks, with a batch that
 * splits over the remaining data-parallel groups. */
static void sizes_that_work(const run_config *cfg, int world, char *buf, size_t len) {
    buf[0] = '\0';
    for (int t = 1; t <= cfg->model.heads && t <= world; t++) {
        if (cfg->model.heads % t || world % t || cfg->batch % (world / t)) continue;
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%d", buf[0] ? ", " : "", t);
    }
    if (!buf[0]) snprintf(buf, len, "none with %d ranks", world);
}

int tp_check_sizes(const run_config *cfg, int world, int tp, char *err, size_t err_len) {
    const gpt_config *m = &cfg->model;
    const int explicit_tp = tp > 0;
    if (!explicit_tp) tp = world;
    char works[128], what[64];
    sizes_that_work(cfg, world, works, sizeof works);
    if (explicit_tp) snprintf(what, sizeof what, "--tp %d", tp);
    else snprintf(what, sizeof what, "tensor-parallel size %d (the rank count)", tp);
    if (m->heads % tp != 0 || m->dim % tp != 0) {
        /* Only sizes that pass every check here are offered: dividing the heads is not
         * enough when they do not divide the ranks too. */
        char hint[192] = "";
        if (!explicit_tp)   /* TP came from the ranks */
            snprintf(hint, sizeof hint, " (%sor ./run a multiple of a divisor of the %d"
                     " heads)", strncmp(works, "none", 4) ? "give --tp, " : "", m->heads);
        snprintf(err, err_len, "%s does not divide --heads %d (each rank takes heads/tp"
                 " whole heads and dim/tp of --dim %d): TP sizes that work on %d ranks: %s%s",
                 what, m->heads, m->dim, world, works, hint);
        return 0;
    }
    if (world % tp != 0) {
        snprintf(err, err_len, "%s does not divide the %d ranks (ranks = tp x dp): TP"
                 " sizes that work: %s", what, world, works);
        return 0;
    }
    const int dp = world / tp;
    if (cfg->batch % dp != 0) {
        const int some_work = strncmp(works, "none", 4) != 0;
        snprintf(err, err_len, "--batch %d does not split over %d data-parallel groups"
                 " (%d ranks / TP %d): use a batch that is a multiple of %d%s%s",
                 cfg->batch, dp, world, tp, dp, some_work ? ", or TP sizes " : "",
                 some_work ? works : "");
        return 0;
    }
    return 1;
}

void tp_split_vocab(gpt_shape *s, int tp) {
    if (tp > 1) gpt_shape_split_vocab(s);
}

double tp_bytes_formula(const gpt_config *m, precision p, int B_local, int T, int tp, int dp,
                        size_t params_per_rank) {
    const double N = (double)B_local * T, ring_tp = 2.0 * (tp - 1) / tp;
    const double ring_dp = 2.0 * (dp - 1) / dp;
    const double act = (double)precision_bytes(p), f32 = sizeof(float);
    /* all-reduces of N x C activations: 2 per block forward, 2 backward; with the
     * vocabulary split (tp > 1) also the embedding (forward) and the LM head's f
     * (backward), and of N and 2N fp32 numbers the loss */
    double tp_bytes = 4.0 * m->layers * N * m->dim * act;
    if (tp > 1) tp_bytes += 2.0 * N * m->dim * act + 3.0 * N * f32;
    /* data parallel: every fp32 gradient of the slice (the loss travels on a group of
     * the training loop's own) */
    const double dp_bytes = (double)params_per_rank * f32;
    return ring_tp * tp_bytes + ring_dp * dp_bytes;
}

/* 2 all-gathers of the tokens' N x C inputs per block, again in backward */
static double gathered_again(const gpt_config *m, precision p, double tokens, int layers,
                             int tp) {
    return (tp - 1.0) / tp * 2.0 * layers * tokens * m->dim * precision_bytes(p);
}

/* 2 C numbers per LayerNorm: 2 per block and the final one, all-reduced */
static double layernorm_grads(const gpt_config *m, int layers, int final_ln, int tp) {
    return 2.0 * (tp - 1) / tp * (2.0 * layers + final_ln) * 2 * m->dim * sizeof(float);
}

double tp_sequence_bytes_gathered_again(const gpt_config *m, precision p, int B_local, int T,
                                        int tp) {
    return gathered_again(m, p, (double)B_local * T, m->layers, tp);
}

double tp_sequence_bytes_layernorm_grads(const gpt_config *m, int tp) {
    return layernorm_grads(m, m->layers, 1, tp);
}

double tp_sequence_bytes_added(const gpt_config *m, precision p, int B_local, int T, int tp) {
    return tp_sequence_stage_bytes_added(m, p, (double)B_local * T, m->layers, 1, tp);
}

double tp_sequence_stage_bytes_added(const gpt_config *m, precision p, double tokens,
                                     int layers, int final_ln, int tp) {
    return gathered_again(m, p, tokens, layers, tp) + layernorm_grads(m, layers, final_ln, tp);
}

double tp_sequence_bytes_formula(const gpt_config *m, precision p, int B_local, int T, int tp,
                                 int dp, size_t params_per_rank) {
    return tp_bytes_formula(m, p, B_local, T, tp, dp, params_per_rank) +
           tp_sequence_bytes_added(m, p, B_local, T, tp);
}

double tp_recompute_bytes(const gpt_config *m, precision p, int B_local, int T, int tp) {
    const double N = (double)B_local * T;
    return 2.0 * (tp - 1) / tp * 2.0 * m->layers * N * m->dim * precision_bytes(p);
}

int tp_sequence_check(const run_config *cfg, int tp, char *err, size_t err_len) {
    if (tp < 2) {
        snprintf(err, err_len, "sequence parallelism splits the sequence over the"
                 " tensor-parallel ranks: it needs --tp 2 or more, not %d", tp);
        return 0;
    }
    if (cfg->model.ctx % tp != 0) {
        snprintf(err, err_len, "sequence parallelism with TP %d: --ctx %d does not split"
                 " into %d equal parts of the sequence (use a --ctx that is a multiple of %d)",
                 tp, cfg->model.ctx, tp, tp);
        return 0;
    }
    return 1;
}

/* ---- training ----------------------------------------------------------------------- */

/* One rank's TP (x DP) state for the training loop. */
typedef struct {
    comm *world;
    const mesh *m;
    const run_config *cfg;
    const dataset *data;
    gpt_shape shape;
    replica rep;
    float *step_grads;       /* 16-bit gradients: the step's fp32 sums, during backward */
    gpt_model *model;
    grad_buckets *buckets;   /* DP across the TP groups; NULL without DP */
    int B;                   /* sequences per TP group */
    strategy_outcome *out;   /* buffers on world rank 0 only */
    mem_stats *stats, side;  /* the comparison's copies are charged to `side` */
    double drift;
} tp_rank;

/* One data-parallel replica of each TP slice is saved. */
static void tp_checkpoint_state(void *arg, ckpt_state *out) {
    tp_rank *r = arg;
    replica_checkpoint_state(&r->rep, r->m->me.dp == 0, out);
}

/* 16-bit gradients: a slab finished in the step's fp32 vector is rounded once into the
 * 16-bit gradients and handed to dp's buckets, which all-reduce it in 16 bits while
 * backward goes on. */
static void slab_done16(void *arg, int slab) {
    tp_rank *r = arg;
    const precision gp = r->rep.grad_precision;
    const size_t at = gpt_slab_offset(&r->shape, slab);
    mixed_round(gp, precision_at(gp, r->rep.grads16, at), r->step_grads + at,
                gpt_slab_numel(&r->shape, slab));
    if (r->buckets) grad_buckets_slab_ready(r->buckets, slab);
}

/* Backward into an fp32 vector that lives for the step (TP's backward takes no slab
 * buffers), each slab rounded into grads16 as it is done. */
static void backward_grads16(tp_rank *r, const void *weights, float dloss) {
    r->step_grads = mem_alloc_on(MEM_DEVICE, MEM_GRADS, r->rep.num_params * sizeof(float));
    vec_zero(r->step_grads, r->rep.num_params);
    gpt_backward(r->model, weights, r->step_grads, dloss, slab_done16, r);
    mem_free(r->step_grads);
    r->step_grads = NULL;
}

static float tp_compute_grads(void *arg, int step, float loss_scale) {
    tp_rank *r = arg;
    const double tokens = (double)r->cfg->batch * r->cfg->model.ctx;
    load_batch(r->model, r->data, r->cfg, step, r->m->me.dp * r->B, r->B);
    if (!r->rep.grads16) vec_zero(r->rep.grads, r->rep.num_params);
    const void *weights = replica_compute_params(&r->rep);   /* 16 bits: fresh copy */
    trace_begin(r->world, "forward");
    float loss = gpt_forward(r->model, weights);
    trace_end(r->world);
    /* data parallel over the groups: each slab's gradient is summed over the groups
     * while backward goes on (DDP's buckets on the dp group) */
    trace_begin(r->world, "backward");
    if (r->rep.grads16)
        backward_grads16(r, weights, (float)(loss_scale / tokens));
    else
        gpt_backward(r->model, weights, r->rep.grads, (float)(loss_scale / tokens),
                     r->buckets ? grad_buckets_slab_ready : NULL, r->buckets);
    trace_end(r->world);
    if (r->buckets) {
        trace_begin(r->world, "wait for dp gradients");
        grad_buckets_wait(r->buckets);
        trace_end(r->world);
    }
    /* the TP ranks of a group share one loss: its first rank counts it */
    return r->m->me.tp == 0 ? loss / (float)r->m->shape.dp : 0.0f;
}

/* The unsplit gradients of step 1, for the comparison; not timed. */
static void tp_keep_first_grads(void *arg) {
    tp_rank *r = arg;
    if (r->m->me.dp != 0) return;
    mem_stats_bind(&r->side);
    float *grads = r->rep.grads;   /* 16 bits: as AdamW reads them, widened and unscaled */
    if (r->rep.grads16) {
        grads = mem_alloc_on(MEM_DEVICE, MEM_OTHER, r->rep.num_params * sizeof(float));
        grads16_widen_unscaled(r->rep.grad_precision, grads, r->rep.grads16,
                               r->rep.grads16_unscale, r->rep.num_params);
    }
    double d = tp_gather_whole(r->m->tp, &r->shape, grads, r->out->first_grads);
    if (grads != r->rep.grads) mem_free(grads);
    mem_stats_bind(r->stats);
    if (d > r->drift) r->drift = d;
}

static int tp_optimizer_grads(void *arg, grad_vector *vectors) {
    return replica_optimizer_grads(&((tp_rank *)arg)->rep, vectors);
}

static void tp_update(void *arg, int step) {
    (void)step;
    tp_rank *r = arg;
    trace_begin(r->world, "optimizer");
    replica_adamw(&r->rep, &r->cfg->adamw);
    trace_end(r->world);
}

/* The run's TP numbers (tp_extra), from the groups' statistics after the loop. */
static void tp_measure(const tp_rank *r, int timed_steps, tp_extra *x) {
    comm_stats tp_stats = comm_stats_get(r->m->tp);
    comm_stats dp_stats = grad_buckets_stats(r->buckets);
    x->allreduces_per_step = (double)tp_stats.calls[COMM_KIND_ALLREDUCE] / timed_steps;
    x->gathers_per_step = (double)(tp_stats.calls[COMM_KIND_ALLGATHER] +
                                   tp_stats.calls[COMM_KIND_REDUCE_SCATTER]) / timed_steps;
    x->dp_allreduces_per_step = (double)dp_stats.calls[COMM_KIND_ALLREDUCE] / timed_steps;
    x->bytes_tp_per_step = (double)comm_stats_total_sent(&tp_stats) / timed_steps;
    x->tp_allreduce_bytes = (double)tp_stats.bytes_sent[COMM_KIND_ALLREDUCE] / timed_steps;
    x->tp_reduce_scatter_bytes =
        (double)tp_stats.bytes_sent[COMM_KIND_REDUCE_SCATTER] / timed_steps;
    x->tp_allgather_bytes = (double)tp_stats.bytes_sent[COMM_KIND_ALLGATHER] / timed_steps;
    x->bytes_dp_per_step = (double)comm_stats_total_sent(&dp_stats) / timed_steps;
}

/* tp_bytes_formula counts dp's all-reduce at 4 B a gradient; 16-bit gradients
 * (--grad-dtype) move 2: what they leave off, 2 (d-1)/d x 2 B per parameter. */
static double grads16_bytes_saved(const run_config *cfg, int d, const replica *rep) {
    const double saved = sizeof(float) - (double)precision_bytes(cfg->grad_precision);
    return 2.0 * (d - 1) / d * (double)rep->num_params * saved;
}

/* One rank's model, replica and gradient buckets on the mesh. */
static void tp_rank_init(tp_rank *r, const tp_options *opts) {
    const mesh *m = r->m;
    const int t = m->shape.tp, d = m->shape.dp;
    r->shape = gpt_shape_make(&r->cfg->model, t, m->me.tp);
    tp_split_vocab(&r->shape, t);
    mem_stats_reset_peaks(r->stats);
    replica_init(&r->rep, &r->shape, r->cfg->seed, 1);
    replica_set_precision(&r->rep, r->cfg->precision);
    replica_set_grad_precision(&r->rep, r->cfg->grad_precision);
    const tp_options none = {0}, *o = opts ? opts : &none;
    gpt_model_options model_opts = {.tp = t > 1 ? m->tp : NULL,
                                    .precision = r->cfg->precision,
                                    .drop_f_backward = o->drop_f_backward,
                                    .sequence_parallel = o->sequence_parallel,
                                    .sp_copy_not_reduce = o->sp_copy_not_reduce,
                                    .tp_overlap_chunks = o->tp_overlap_chunks,
                                    .tp_overlap_control = o->tp_overlap_control,
                                    .recompute_attention = o->recompute_attention,
                                    .checkpoint_activations = o->checkpoint_activations};
    r->model = gpt_model_create(&r->shape, r->B, r->cfg->model.ctx, &model_opts);
    if (d > 1)
        r->buckets = grad_buckets_create_held(
            o->grads_over_tp ? m->tp : m->dp, &r->shape, r->rep.grads16 ? r->rep.grads16 : (void *)r->rep.grads,
            comm_dtype_of(r->rep.grad_precision), 1u << 20, 25u << 20, COMM_F32);
}

void tp_train(comm *world, const mesh *m, const run_config *cfg, const tp_options *opts,
              const dataset *data, strategy_outcome *out) {
    const int t = m->shape.tp, d = m->shape.dp;
    const int T = cfg->model.ctx;
    out->world_size = comm_size(world);
    tp_rank r = {.world = world, .m = m, .cfg = cfg, .data = data, .B = cfg->batch / d,
                 .out = out, .stats = mem_stats_current()};
    tp_rank_init(&r, opts);

    const int sp = opts && opts->sequence_parallel;
    const char *name = d > 1 ? (sp ? "tp+sp+dp" : "tp+dp") : (sp ? "tp+sp" : "tp");
    train_strategy strategy = {.name = name, .ctx = &r, .compute_grads = tp_compute_grads,
                               .optimizer_grads = tp_optimizer_grads,
                               .keep_first_grads = tp_keep_first_grads, .update = tp_update,
                               .checkpoint_state = tp_checkpoint_state};
    strategy_outcome_train(world, cfg, &strategy, out);
    tp_extra x = {.tp = t, .dp = d, .vocab_parallel = r.shape.vocab_parallel,
                  .vocab_local = r.shape.vocab_local,
                  .vocab_padding = r.shape.vocab_local * t - cfg->model.vocab,
                  .params_per_rank = r.rep.num_params, .sequence_parallel = sp};
    tp_measure(&r, out->result.timed_steps, &x);
    const double formula = sp ? tp_sequence_bytes_formula(&cfg->model, cfg->precision, r.B, T,
                                                          t, d, r.rep.num_params)
                              : tp_bytes_formula(&cfg->model, cfg->precision, r.B, T, t, d,
                                                 r.rep.num_params);
    const double again = opts && opts->checkpoint_activations
                             ? tp_recompute_bytes(&cfg->model, cfg->precision, r.B, T, t) : 0;
    out->result.bytes_formula = cfg->comm.allreduce == ALLREDUCE_RING
                                    ? formula + again - grads16_bytes_saved(cfg, d, &r.rep)
                                    : -1;

    /* the unsplit parameters for the comparison, charged to the side account */
    if (m->me.dp == 0) {
        mem_stats_bind(&r.side);
        double d2 = tp_gather_whole(m->tp, &r.shape, r.rep.params, out->final_params);
        mem_stats_bind(r.stats);
        if (d2 > r.drift) r.drift = d2;
    }
    x.replica_drift = r.drift;
    if (out->extra && strategy_outcome_keeps(out)) *(tp_extra *)out->extra = x;

    grad_buckets_free(r.buckets);
    gpt_model_free(r.model);
    replica_free(&r.rep);
}

typedef struct {
    const run_config *cfg;
    const dataset *data;
    int tp;
    const tp_options *opts;
} tp_launch_args;

static void tp_rank_fn(comm *world, void *args, strategy_outcome *out) {
    const tp_launch_args *a = args;
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = a->tp, .pp = 1, .dp = comm_size(world) / a->tp});
    tp_train(world, &m, a->cfg, a->opts, a->data, out);
    mesh_free(&m);
}

int tp_launch(const run_config *cfg, const dataset *data, int tp, const tp_options *opts,
              strategy_outcome *rank0_out) {
    tp_launch_args args = {cfg, data, tp > 0 ? tp : cfg->comm.ranks, opts};
    return strategy_launch(cfg, tp_rank_fn, &args, rank0_out);
}

int tp_largest_size(const run_config *cfg) {
    char err[256];
    for (int t = cfg->comm.ranks; t > 1; t--)
        if (tp_check_sizes(cfg, cfg->comm.ranks, t, err, sizeof err)) return t;
    return 1;
}

double tp_worst_fraction_of_tolerance(const run_result *r) {
    return run_worst_fraction_of_tolerance(r, TOL_GRADS, TOL_LOSS, TOL_PARAMS);
}

/* ---- bounds in mixed precision -------------------------------------------------------- */


run_tolerances tp_run_tolerances(const run_config *cfg, int tp, const baseline_run *b) {
    return tolerances_for_tp(cfg, tp, b ? baseline_largest_grad(b) : 1.0);
}
