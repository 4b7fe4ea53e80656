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
#include "ops.h"

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
        char divisors[128] = "", hint[192] = "";
        for (int t = 1; t <= m->heads; t++)
            if (m->heads % t == 0)
                snprintf(divisors + strlen(divisors), sizeof divisors - strlen(divisors),
                         "%s%d", divisors[0] ? ", " : "", t);
        if (!explicit_tp && strncmp(works, "none", 4) == 0)   /* TP came from the ranks */
            snprintf(hint, sizeof hint, " (./run that many ranks)");
        else if (!explicit_tp)
            snprintf(hint, sizeof hint, " (./run that many ranks, or keep %d ranks with --tp"
                     " one of %s)", world, works);
        snprintf(err, err_len, "%s does not divide --heads %d (each rank takes heads/tp"
                 " whole heads and dim/tp of --dim %d): TP sizes that work: %s%s", what,
                 m->heads, m->dim, divisors, hint);
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
    /* data parallel: every gradient of the slice, and the step's loss */
    double dp_floats = (double)params_per_rank + 1.0;
    return 4.0 * (ring_tp * tp_floats + ring_dp * dp_floats);
}

/* ---- training ----------------------------------------------------------------------- */

void tp_mesh_split(comm *world, int t, comm **tp, comm **dp) {
    const int rank = comm_rank(world);
    *tp = comm_split(world, rank / t, rank % t, "tp");
    *dp = comm_split(world, rank % t, rank / t, "dp");
}

void tp_train(comm *world, comm *tp, comm *dp, const run_config *cfg,
              const dataset *data, const baseline_run *baseline, tp_train_run *out) {
    const int t = comm_size(tp), d = comm_size(dp);
    const int tp_rank = comm_rank(tp), dp_rank = comm_rank(dp);
    const int root = comm_world_rank(world) == 0;
    const int B = cfg->batch / d, T = cfg->model.ctx, steps = cfg->steps;
    const double tokens = (double)cfg->batch * T;
    memset(out, 0, sizeof *out);
    out->tp = t;
    out->dp = d;

    gpt_shape shape = gpt_shape_make(&cfg->model, t, tp_rank);
    gpt_shape_split_vocab(&shape);
    out->vocab_local = shape.vocab_local;
    out->vocab_padding = shape.vocab_local * t - cfg->model.vocab;
    mem_stats *stats = mem_stats_current();
    mem_stats_reset_peaks(stats);
    replica rep;
    replica_init(&rep, &shape, cfg->seed, 1);
    out->params_per_rank = rep.num_params;
    gpt_model_options opts = {.tp = t > 1 ? tp : NULL};
    gpt_model *model = gpt_model_create(&shape, B, T, &opts);

    /* The unsplit copies for the comparison are charged to a side account, so the
     * memory table shows what TP itself needs. */
    mem_stats side = {0};
    gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    const size_t n_whole = gpt_num_params(&whole);
    mem_stats_bind(&side);
    out->loss = mem_alloc(MEM_OTHER, (size_t)steps * sizeof(float));
    if (root) {
        out->first_grads = mem_alloc(MEM_OTHER, n_whole * sizeof(float));
        out->final_params = mem_alloc(MEM_OTHER, n_whole * sizeof(float));
    }
    mem_stats_bind(stats);

    double timed = 0.0, drift = 0.0;
    int timed_steps = 0;
    comm_barrier(world);
    for (int step = 1; step <= steps; step++) {
        double start = comm_now();
        load_batch(model, data, cfg, step, dp_rank * B, B);
        vec_zero(rep.grads, rep.num_params);
        trace_begin(world, "forward");
        float loss = gpt_forward(model, rep.params);
        trace_end(world);
        trace_begin(world, "backward");
        gpt_backward(model, rep.params, rep.grads, (float)(1.0 / tokens), NULL, NULL);
        trace_end(world);
        if (d > 1) {   /* data parallel over the groups: sum the slices' gradients */
            trace_begin(world, "dp all-reduce");
            comm_allreduce(dp, rep.grads, rep.num_params, COMM_F32, COMM_SUM);
            comm_allreduce(dp, &loss, 1, COMM_F32, COMM_AVG);
            trace_end(world);
        }
        if (step == 1 && dp_rank == 0) {   /* for the comparison; not timed */
            mem_stats_bind(&side);
            double d1 = tp_gather_whole(tp, &shape, rep.grads, out->first_grads);
            mem_stats_bind(stats);
            if (d1 > drift) drift = d1;
        }
        trace_begin(world, "optimizer");
        replica_adamw(&rep, &cfg->adamw);
        trace_end(world);
        ops_synchronize();
        double seconds = comm_now() - start;
        out->loss[step - 1] = loss;
        if (step > 1 || steps == 1) {   /* step 1 pays for warm-up: time the rest */
            timed += seconds;
            timed_steps++;
        }
        if (step == 1 && steps > 1) comm_stats_reset(world);
        if (root) report_step(cfg, d > 1 ? "tp+dp" : "tp", step, loss, seconds, tokens);
    }

    run_result *r = &out->result;
    *r = (run_result){.strategy = d > 1 ? "tp+dp" : "tp", .steps = steps, .loss = out->loss,
                      .seconds = timed, .timed_steps = timed_steps,
                      .tokens_per_step = tokens, .memory = *stats};
    run_result_add_comm(r, world, timed_steps);
    comm_stats tp_stats = comm_stats_get(tp), dp_stats = comm_stats_get(dp);
    out->allreduces_per_step = (double)tp_stats.calls[COMM_KIND_ALLREDUCE] / timed_steps;
    out->bytes_tp_per_step = (double)comm_stats_total_sent(&tp_stats) / timed_steps;
    out->bytes_dp_per_step = (double)comm_stats_total_sent(&dp_stats) / timed_steps;
    r->bytes_formula = cfg->comm.allreduce == ALLREDUCE_RING
                           ? tp_bytes_formula(&cfg->model, B, T, t, d, rep.num_params)
                           : -1;

    if (dp_rank == 0) {
        mem_stats_bind(&side);
        double d2 = tp_gather_whole(tp, &shape, rep.params, out->final_params);
        mem_stats_bind(stats);
        if (d2 > drift) drift = d2;
    }
    out->replica_drift = drift;
    run_result_take_max(world, r);
    if (root && baseline)
        compare_to_baseline(r, baseline, out->loss, out->first_grads, out->final_params);

    gpt_model_free(model);
    replica_free(&rep);
}

void tp_train_run_free(tp_train_run *r) {
    mem_free(r->loss);
    mem_free(r->first_grads);
    mem_free(r->final_params);
    memset(r, 0, sizeof *r);
}
