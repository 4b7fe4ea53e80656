/* Part 3: the whole model trained with tensor parallelism (times data parallelism when
 * there are more ranks than the TP size).
 *
 *   every TP rank: the same batch, its slice of every block (heads, MLP units) and of
 *                  the vocabulary (embedding rows = LM head rows); the blocks all-reduce
 *                  inside (g forward, f backward), the loss is assembled from per-token
 *                  maxima and sums (common/vocab_parallel.c)
 *   every DP group of TP ranks: its share of the batch; gradients summed over groups
 *   optimizer: plain AdamW on the slice; replicated tensors get identical gradients
 *              on every TP rank, so their copies stay identical */
#include "tensor_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "grad_buckets.h"
#include "ops.h"
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

double tp_bytes_formula(const gpt_config *m, int B_local, int T, int tp, int dp,
                        size_t params_per_rank) {
    const double N = (double)B_local * T, ring_tp = 2.0 * (tp - 1) / tp;
    const double ring_dp = 2.0 * (dp - 1) / dp;
    /* all-reduces of N x C floats: 2 per block forward, 2 backward, the vocab-parallel
     * embedding (forward) and the LM head's f (backward); of N and 2N floats: the loss */
    double tp_floats = (4.0 * m->layers + 2.0) * N * m->dim + 3.0 * N;
    /* data parallel: every gradient of the slice (the loss travels on a group of the
     * training loop's own) */
    double dp_floats = (double)params_per_rank;
    return 4.0 * (ring_tp * tp_floats + ring_dp * dp_floats);
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
    gpt_model *model;
    grad_buckets *buckets;   /* DP across the TP groups; NULL without DP */
    int B;                   /* sequences per TP group */
    tp_train_run *out;
    mem_stats *stats, side;  /* the comparison's copies are charged to `side` */
    double drift;
} tp_rank;

/* One data-parallel replica of each TP slice is saved. */
static void tp_checkpoint_state(void *arg, ckpt_state *out) {
    tp_rank *r = arg;
    replica_checkpoint_state(&r->rep, r->m->me.dp == 0, out);
}

static float tp_compute_grads(void *arg, int step) {
    tp_rank *r = arg;
    const double tokens = (double)r->cfg->batch * r->cfg->model.ctx;
    load_batch(r->model, r->data, r->cfg, step, r->m->me.dp * r->B, r->B);
    vec_zero(r->rep.grads, r->rep.num_params);
    trace_begin(r->world, "forward");
    float loss = gpt_forward(r->model, r->rep.params);
    trace_end(r->world);
    /* data parallel over the groups: each slab's gradient is summed over the groups
     * while backward goes on (DDP's buckets on the dp group) */
    trace_begin(r->world, "backward");
    gpt_backward(r->model, r->rep.params, r->rep.grads, (float)(1.0 / tokens),
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
    double d = tp_gather_whole(r->m->tp, &r->shape, r->rep.grads, r->out->first_grads);
    mem_stats_bind(r->stats);
    if (d > r->drift) r->drift = d;
}

static void tp_update(void *arg, int step) {
    (void)step;
    tp_rank *r = arg;
    trace_begin(r->world, "optimizer");
    replica_adamw(&r->rep, &r->cfg->adamw);
    trace_end(r->world);
}

void tp_train(comm *world, const mesh *m, const run_config *cfg, const tp_options *opts,
              const dataset *data, const baseline_run *baseline, tp_train_run *out) {
    const int t = m->shape.tp, d = m->shape.dp;
    const int root = comm_world_rank(world) == 0;
    const int T = cfg->model.ctx;
    memset(out, 0, sizeof *out);
    out->tp = t;
    out->dp = d;
    tp_rank r = {.world = world, .m = m, .cfg = cfg, .data = data, .B = cfg->batch / d,
                 .out = out, .stats = mem_stats_current()};
    r.shape = gpt_shape_make(&cfg->model, t, m->me.tp);
    gpt_shape_split_vocab(&r.shape);
    out->vocab_local = r.shape.vocab_local;
    out->vocab_padding = r.shape.vocab_local * t - cfg->model.vocab;
    mem_stats_reset_peaks(r.stats);
    replica_init(&r.rep, &r.shape, cfg->seed, 1);
    out->params_per_rank = r.rep.num_params;
    gpt_model_options model_opts = {.tp = t > 1 ? m->tp : NULL,
                                     .drop_f_backward = opts && opts->drop_f_backward};
    r.model = gpt_model_create(&r.shape, r.B, T, &model_opts);
    if (d > 1)
        r.buckets = grad_buckets_create(m->dp, &r.shape, r.rep.grads, 1u << 20, 25u << 20,
                                        COMM_F32);

    /* The unsplit copies for the comparison are charged to a side account, so the
     * memory table shows what TP itself needs. */
    gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    const size_t n_whole = gpt_num_params(&whole);
    mem_stats_bind(&r.side);
    if (root) {
        out->first_grads = mem_alloc(MEM_OTHER, n_whole * sizeof(float));
        out->final_params = mem_alloc(MEM_OTHER, n_whole * sizeof(float));
    }
    mem_stats_bind(r.stats);

    const char *name = d > 1 ? "tp+dp" : "tp";
    train_strategy strategy = {.name = name, .ctx = &r, .compute_grads = tp_compute_grads,
                               .keep_first_grads = tp_keep_first_grads, .update = tp_update,
                               .checkpoint_state = tp_checkpoint_state};
    train_outcome run;
    train_loop(world, cfg, (double)cfg->batch * T, &strategy, &run);
    out->result = run.result;
    out->loss = train_outcome_take_loss(&run);
    out->result.loss = out->loss;
    const int timed_steps = run.result.timed_steps;
    train_outcome_free(&run);

    comm_stats tp_stats = comm_stats_get(m->tp);
    comm_stats dp_stats = grad_buckets_stats(r.buckets);
    out->allreduces_per_step = (double)tp_stats.calls[COMM_KIND_ALLREDUCE] / timed_steps;
    out->bytes_tp_per_step = (double)comm_stats_total_sent(&tp_stats) / timed_steps;
    out->bytes_dp_per_step = (double)comm_stats_total_sent(&dp_stats) / timed_steps;
    out->result.bytes_formula = cfg->comm.allreduce == ALLREDUCE_RING
                                    ? tp_bytes_formula(&cfg->model, r.B, T, t, d, r.rep.num_params)
                                    : -1;

    if (m->me.dp == 0) {
        mem_stats_bind(&r.side);
        double d2 = tp_gather_whole(m->tp, &r.shape, r.rep.params, out->final_params);
        mem_stats_bind(r.stats);
        if (d2 > r.drift) r.drift = d2;
    }
    out->replica_drift = r.drift;
    if (root && baseline)
        compare_to_baseline(&out->result, baseline, out->loss, out->first_grads,
                            out->final_params);

    grad_buckets_free(r.buckets);
    gpt_model_free(r.model);
    replica_free(&r.rep);
}

void tp_train_run_free(tp_train_run *r) {
    free(r->loss);
    mem_free(r->first_grads);
    mem_free(r->final_params);
    memset(r, 0, sizeof *r);
}
