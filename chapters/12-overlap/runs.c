/* Whole training runs on two tiers: TP + SP (tp = one node, dp across the nodes) with
 * and without the collective matmul; FSDP (ZeRO-3) across the nodes and inside one;
 * HSDP (ZeRO-3 inside each node, each gradient piece all-reduced across); ZeRO++'s qwZ,
 * hpZ and qgZ, each alone and all three (zeropp.h). Each is compared with the
 * single-device baseline (the lossy ones, qwZ and qgZ, by their loss against the band of
 * tolerances.h), and next to its predictions:
 *   bytes per tier, largest rank: TP's collectives stay inside a node, the data-parallel
 *     all-reduce crosses (tp_sequence_bytes_formula without and with the dp term); the
 *     ZeRO-3 rows by zeropp_tier_bytes, each call's pieces as the threads backend moves
 *     them, to the byte;
 *   wire time: alpha-beta of those bytes on their tiers plus alpha per transfer (TP: per
 *     ring step of the calls measured; ZeRO-3: zeropp_step_predict), nothing hidden;
 *   tokens/s: the same run with no link model (the compute, measured) + the wire; the
 *     overlapped row less the hidden share of forward's SP collectives, (n-1)/n of them
 *     (exposed.c's formula). */
#include "overlap.h"

#include <math.h>
#include <stdio.h>

#include "compare.h"
#include "tp_train.h"
#include "zero_train.h"

static const char *const row_names[ROWS] = {
    "TP + SP", "TP + SP, overlap", "FSDP 2 nodes", "FSDP 1 node", "HSDP", "ZeRO++ qwZ",
    "ZeRO++ hpZ", "ZeRO++ qgZ", "ZeRO++ all"};
/* The ZeRO-3 rows' options (from ROW_FSDP on). */
static const zero_options row_zero[ROWS] = {
    [ROW_FSDP] = {.stage = 3}, [ROW_FSDP_NODE] = {.stage = 3},
    [ROW_HSDP] = {.stage = 3, .hsdp = 1}, [ROW_QWZ] = {.stage = 3, .zeropp = ZEROPP_QWZ},
    [ROW_HPZ] = {.stage = 3, .zeropp = ZEROPP_HPZ}, [ROW_QGZ] = {.stage = 3, .zeropp = ZEROPP_QGZ},
    [ROW_ZEROPP] = {.stage = 3, .zeropp = ZEROPP_ALL}};

static double hpz_extra_measured(const tier_table *t);
static void print_against_paper(const run_config *cfg, const tier_table *t);

typedef struct {
    strategy_outcome o;
    tp_extra x;
} row_run;

/* Row `row` on cfg (its tiers, or none): into rr, compared with b when given. */
static int run_row(const run_config *cfg, const dataset *data, int row, int chunks,
                   row_run *rr) {
    *rr = (row_run){0};
    rr->o.extra = row <= ROW_TP_OVERLAP ? &rr->x : NULL;
    if (row <= ROW_TP_OVERLAP) {
        const tp_options opts = {.sequence_parallel = 1,
                                 .tp_overlap_chunks = row == ROW_TP_OVERLAP ? chunks : 0};
        return tp_launch(cfg, data, cfg->comm.ranks_per_node, &opts, &rr->o);
    }
    return zero_launch(cfg, data, &row_zero[row], &rr->o);
}

static run_config row_config(const run_config *cfg, int row, int with_links) {
    run_config c = *cfg;
    c.quiet = 1;
    c.comm.trace_path = NULL;
    if (row == ROW_FSDP_NODE) c.comm.ranks = cfg->comm.ranks_per_node;
    if (!with_links) c.comm.link = c.comm.link_inter = LINK_NONE;
    return c;
}

/* TP's calls per step x ring steps x alpha: a TP group's inside a node, the data-parallel
 * all-reduce's across. */
static double latency_seconds(const run_config *c, const row_run *rr) {
    const comm_options *o = &c->comm;
    const int n = c->comm.ranks, t = o->ranks_per_node, d = n / t;
    const double a_in = comm_tier_seconds(o, COMM_TIER_INTRA, 0);
    const double a_out = comm_tier_seconds(o, COMM_TIER_INTER, 0);
    const tp_extra *x = &rr->x;
    return a_in * (t - 1) * (2 * x->allreduces_per_step + x->gathers_per_step) +
           a_out * 2 * (d - 1) * x->dp_allreduces_per_step;
}

/* A ZeRO-3 row's bytes per tier (largest rank) and alpha-beta seconds per step. */
static double zero_predict(const run_config *c, int row, double out[2]) {
    const gpt_shape shape = gpt_shape_make(&c->model, 1, 0);
    const int n = c->comm.ranks, K = row == ROW_FSDP_NODE ? n : c->comm.ranks_per_node;
    const zeropp_links links = zeropp_links_of(&c->comm);
    return zeropp_step_predict(&shape, row_zero[row].zeropp, row_zero[row].hsdp, n, K, &links,
                               out);
}

/* Bytes per tier per step of the largest rank, by the formulas above. */
static void tier_formula(const run_config *c, int row, const row_run *rr, double out[2]) {
    const int n = c->comm.ranks, t = c->comm.ranks_per_node, d = n / t;
    if (row >= ROW_FSDP) {
        zero_predict(c, row, out);
        return;
    }
    const int B = c->batch / d;
    out[COMM_TIER_INTRA] = tp_sequence_bytes_formula(&c->model, c->precision, B, c->model.ctx,
                                                     t, 1, 0);
    out[COMM_TIER_INTER] = tp_sequence_bytes_formula(&c->model, c->precision, B, c->model.ctx,
                                                     t, d, rr->x.params_per_rank) -
                           out[COMM_TIER_INTRA];
}

/* The wire's alpha-beta seconds per step for the row, nothing hidden. */
static double wire_seconds(const run_config *c, int row, const row_run *rr,
                           const double bytes[2]) {
    const comm_options *o = &c->comm;
    const double beta_in = comm_link_spec(o->link).bandwidth / o->link_scale;
    const double beta_out = comm_link_spec(o->link_inter).bandwidth / o->link_scale;
    if (row >= ROW_FSDP) return zero_predict(c, row, (double[2]){0});
    return bytes[COMM_TIER_INTRA] / beta_in + bytes[COMM_TIER_INTER] / beta_out +
           latency_seconds(c, rr);
}

/* SP collectives of one step that the collective matmul hides, by exposed.c's
 * formulas: (n-1)/n of each layer's four in forward, of its six in backward all but two
 * chunks. */
static double hidden_seconds(const run_config *c, int chunks) {
    const int t = c->comm.ranks_per_node;
    const exposed_setup s = {.t = t, .chunks = chunks, .B = c->batch / (c->comm.ranks / t),
                             .T = c->model.ctx, .C = c->model.dim, .p = c->precision,
                             .comm = c->comm};
    return c->model.layers * (exposed_formula_seconds(&s, 1) - exposed_formula_seconds(&s, chunks) +
                              exposed_backward_formula_seconds(&s, 1) -
                              exposed_backward_formula_seconds(&s, chunks));
}

static void fill_row(const run_config *c, int row, int chunks, const row_run *rr,
                     double reference_ms, const baseline_run *b, tier_row *out) {
    const run_result *r = &rr->o.result;
    *out = (tier_row){.name = row_names[row], .ranks = c->comm.ranks,
                      .tokens_per_s = run_tokens_per_second(r), .reference_ms = reference_ms};
    out->exposed_ms = r->timed_steps > 0 ? 1e3 * r->comm_seconds / r->timed_steps : 0;
    for (int t = 0; t < COMM_NTIERS; t++) out->tier_bytes[t] = r->tier_bytes_per_step[t];
    tier_formula(c, row, rr, out->tier_formula);
    double wire = wire_seconds(c, row, rr, out->tier_formula);
    out->wire_ms = 1e3 * wire;
    if (row == ROW_TP_OVERLAP) wire -= hidden_seconds(c, chunks);
    out->predicted_tokens_per_s = r->tokens_per_step / (1e-3 * reference_ms + wire);
    out->state_params = rr->o.state[0];
    if (!b) return;
    if (row_zero[row].zeropp & (ZEROPP_QWZ | ZEROPP_QGZ)) {   /* lossy: the loss band */
        out->lossy = 1;
        out->worst = zeropp_loss_band_fraction(rr->o.loss, b->loss, c->steps);
        return;
    }
    const int tp = row <= ROW_TP_OVERLAP ? c->comm.ranks_per_node : 1;
    const run_tolerances tol = row <= ROW_TP_OVERLAP ? tp_run_tolerances(c, tp, b)
                                                      : tolerances_for(c);
    run_result cmp = *r;
    compare_to_baseline(&cmp, b, rr->o.loss, rr->o.first_grads, rr->o.final_params);
    out->worst = run_worst_fraction_of_tolerance(&cmp, tol.grads, tol.loss, tol.params);
}

int tier_table_run(const run_config *cfg, const dataset *data, int chunks, comm_link inter,
                   tier_table *out) {
    *out = (tier_table){.inter = inter};
    run_config linked = *cfg;
    linked.comm.link_inter = inter;
    baseline_run *b = NULL;
    if (process_hosts_rank0()) {
        run_config quiet = row_config(cfg, ROW_TP, 0);
        quiet.comm.ranks = 1;
        b = baseline_reference(&quiet, data);
    }
    int status = 0;
    for (int row = 0; row < ROWS && !status; row++) {
        row_run ref, run;
        const run_config bare = row_config(&linked, row, 0), wired = row_config(&linked, row, 1);
        status = run_row(&bare, data, row, chunks, &ref);
        const double reference_ms = run_ms_per_step(&ref.o.result);
        strategy_outcome_free(&ref.o);
        if (!status) status = run_row(&wired, data, row, chunks, &run);
        if (!status) fill_row(&wired, row, chunks, &run, reference_ms, b, &out->rows[row]);
        if (!status) strategy_outcome_free(&run.o);
    }
    baseline_free(b);
    return status;
}

void tier_table_print(const run_config *cfg, const tier_table *t) {
    char in[32], out[32], fin[32], fout[32];
    printf("\n%s inside a node, %s between nodes (x %g), %d ranks as nodes of %d:\n",
           comm_link_spec(cfg->comm.link).title, comm_link_spec(t->inter).title,
           cfg->comm.link_scale, cfg->comm.ranks, cfg->comm.ranks_per_node);
    printf("  %-17s %5s %10s %10s %10s %10s %21s %21s %6s\n", "run", "ranks", "tok/s",
           "predicted", "exposed ms", "wire ms", "intra B/step (formula)",
           "inter B/step (formula)", "tol");
    for (int i = 0; i < ROWS; i++) {
        const tier_row *r = &t->rows[i];
        printf("  %-17s %5d %10.0f %10.0f %10.2f %10.2f %10s (%8s) %10s (%8s) %6.2f\n",
               r->name, r->ranks, r->tokens_per_s, r->predicted_tokens_per_s, r->exposed_ms,
               r->wire_ms, report_bytes(r->tier_bytes[COMM_TIER_INTRA], in),
               report_bytes(r->tier_formula[COMM_TIER_INTRA], fin),
               report_bytes(r->tier_bytes[COMM_TIER_INTER], out),
               report_bytes(r->tier_formula[COMM_TIER_INTER], fout), r->worst);
    }
    printf("  (tol: of the run's tolerance against the baseline; ZeRO++ qwZ, qgZ and all three"
           " quantise on purpose:\n   of the loss band, %.0e of the baseline's loss at every"
           " step up to %d steps, %.0e of its mean beyond)\n", ZEROPP_LOSS_BAND,
           ZEROPP_BAND_STEPS, ZEROPP_MEAN_BAND);
    print_against_paper(cfg, t);
}

/* ZeRO++ against the paper's cross-node bytes per step (Wang et al. 2023, fp16, M the
 * model's bytes in fp16): FSDP 3M, qwZ 2M (both gathers in int8), hpZ 2M (backward's
 * gather inside the node), qgZ 2.25M (the gradient in int4), all three 0.75M. Measured:
 * the largest rank's, in the same M = 2P; this run gathers fp32, so its FSDP is 6M x
 * (N-1)/N, and the ratios to FSDP are the comparable figures. And hpZ's memory. */
static void print_against_paper(const run_config *cfg, const tier_table *t) {
    static const int rows[5] = {ROW_FSDP, ROW_QWZ, ROW_HPZ, ROW_QGZ, ROW_ZEROPP};
    static const double paper[5] = {3, 2, 2, 2.25, 0.75};
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    const double M = 2.0 * (double)gpt_num_params(&s);
    const double fsdp = t->rows[ROW_FSDP].tier_bytes[COMM_TIER_INTER];
    printf("  cross-node bytes per step against ZeRO++'s paper (M = the model in fp16, %.0f B):\n",
           M);
    for (int i = 0; i < 5; i++) {
        const double inter = t->rows[rows[i]].tier_bytes[COMM_TIER_INTER];
        printf("    %-12s measured %5.2fM (%.2f of FSDP's)   paper %4.2fM (%.2f of 3M)\n",
               row_names[rows[i]], inter / M, inter / fsdp, paper[i], paper[i] / 3);
    }
    printf("  hpZ's secondary shards: %.0f B a rank measured (parameters at rest beyond FSDP's),"
           " formula %.0f B\n", hpz_extra_measured(t), zeropp_hpz_extra_bytes(&s, cfg->comm.ranks_per_node));
}

/* TP's rows within 1e-3 of their formula; the ZeRO-3 rows to the byte. */
static double hpz_extra_measured(const tier_table *t) {
    return t->rows[ROW_HPZ].state_params - t->rows[ROW_FSDP].state_params;
}

static int near(int row, double measured, double formula) {
    if (row >= ROW_FSDP) return measured == formula;
    return formula == 0 ? measured == 0 : fabs(measured / formula - 1) <= 1e-3;
}

int tier_table_passed(const run_config *cfg, const tier_table *t) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    int ok = hpz_extra_measured(t) == zeropp_hpz_extra_bytes(&s, cfg->comm.ranks_per_node);
    for (int i = 0; i < ROWS; i++) {
        const tier_row *r = &t->rows[i];
        ok &= r->worst <= 1;
        for (int k = 0; k < COMM_NTIERS; k++) ok &= near(i, r->tier_bytes[k], r->tier_formula[k]);
    }
    return ok;
}
