/* Chapter 9's context-parallel part: its flags, and the runs (context.h). Tables and
 * JSON are in context_tables.c. */
#include "context.h"

#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "cli.h"
#include "tolerances.h"

const char *const context_attention_choices[] = {"both", "ring", "ulysses", NULL};
const char *const context_split_choices[] = {"both", "contiguous", "balanced", NULL};

/* The longest sequence of the long run: the s x s attention matrix of one device is
 * then 16 MB per head, what CP exists for, and a step still takes seconds on 2 cores. */
enum { LONG_CTX = 2048 };

/* The runs in table order, and whether the flags ask for each. */
static const cp_options run_options[CONTEXT_RUNS] = {
    {.kind = CP_RING, .split = CP_CONTIGUOUS},
    {.kind = CP_RING, .split = CP_BALANCED},
    {.kind = CP_ULYSSES, .split = CP_CONTIGUOUS}};

static int wanted(const context_flags *f, int run) {
    const cp_options *o = &run_options[run];
    if (f->attention == 1 && o->kind != CP_RING) return 0;
    if (f->attention == 2 && o->kind != CP_ULYSSES) return 0;
    if (o->kind == CP_RING && f->split == 1 && o->split != CP_CONTIGUOUS) return 0;
    if (o->kind == CP_RING && f->split == 2 && o->split != CP_BALANCED) return 0;
    return 1;
}

static int cp_size(const context_flags *f, int ranks) { return f->cp > 0 ? f->cp : ranks; }

/* The part's runs compute on the CPU, whatever --device the other parts use: the
 * blockwise attention kernels are CPU code (common/tensor/attention_block.c). In 16 bits
 * the model computes in --precision and the attention hook widens its q, k, v to fp32
 * (cp_attention_hook.h), so the ring's K/V and Ulysses' all-to-alls carry fp32. */
static run_config part_config(const run_config *cfg) {
    run_config c = *cfg;
    c.comm.device = DEVICE_CPU;
    return c;
}

/* The bounds of a CP run against one device in cfg's precision (test_cp_mixed's): the
 * hook's sums in another order, about as TP 2's roundings; with 16-bit gradients each
 * of the cp x dp ranks' partial gradients rounded, and their sum. */
static run_tolerances part_tolerances(const run_config *cfg, int ranks, const baseline_run *b) {
    const double g = baseline_largest_grad(b);
    return tolerances_with_grads16(tolerances_for_tp(cfg, 2, g), cfg, ranks, g);
}

void context_check_flags(const run_config *given, int ranks, const context_flags *f,
                         int alone) {
    const run_config part = part_config(given), *cfg = &part;
    if (f->attention == 2 && f->split != 0)
        cli_fail("--cp-split %s does nothing with --cp-attention ulysses (Ulysses sees the"
                 " whole sequence on its heads: no chunk order to balance)",
                 context_split_choices[f->split]);
    const char *asked = cli_given_text("device");   /* auto's GPU: the part runs on the CPU */
    if (alone && given->comm.device == DEVICE_CUDA && asked && strcmp(asked, "cuda") == 0)
        cli_fail("--device cuda: context parallelism runs on the CPU here (its blockwise"
                 " attention has no CUDA kernels yet): give --device cpu");
    const int cp = cp_size(f, ranks);
    char err[256];
    for (int i = 0; i < CONTEXT_RUNS; i++)
        if (wanted(f, i) &&
            !cp_check_sizes(cfg, ranks, 1, cp, &run_options[i], err, sizeof err))
            cli_fail("%s", err);
}

void context_refuse_flags(const char *mode) {
    static const char *const flags[] = {"cp", "cp-attention", "cp-split", NULL};
    cli_refuse_in_mode(mode, flags, "it runs no context parallelism");
}

/* ---- the runs ---------------------------------------------------------------------- */

/* One CP run compared with the baseline (world rank 0's process). */
static int run_one(const run_config *cfg, const dataset *data, int cp, const baseline_run *b,
                   context_run *run) {
    strategy_outcome out = {.extra = &run->extra};
    const int status = cp_launch(cfg, data, cp, &run->opts, &out);
    if (status == 0 && b && strategy_outcome_keeps(&out)) {
        strategy_outcome_compare(&out, b);
        run->result = out.result;
        run->loss = malloc((size_t)cfg->steps * sizeof *run->loss);
        memcpy(run->loss, out.loss, (size_t)cfg->steps * sizeof *run->loss);
        run->result.loss = run->loss;
        run->ran = 1;
    }
    strategy_outcome_free(&out);
    return status;
}

/* A long sequence: one layer, one sequence per data-parallel group, one step. One
 * device's activations (its s x s probabilities and their gradient per head) against
 * each CP rank's, from the allocator's tag. */
static int long_sequence(const run_config *cfg, const dataset *data, context_report *r) {
    run_config lc = *cfg;
    lc.model.ctx = LONG_CTX - LONG_CTX % (2 * r->cp);
    lc.model.layers = 1;
    lc.batch = r->dp;
    lc.steps = 1;
    lc.quiet = 1;
    r->long_ctx = lc.model.ctx;
    r->long_layers = lc.model.layers;
    baseline_run *b = process_hosts_rank0() ? baseline_train(&lc, data) : NULL;
    if (b) r->long_baseline_activations = (double)b->result.memory.peak[MEM_ACTIVATIONS];
    if (b) r->long_tol_loss = part_tolerances(&lc, r->world, b).loss;
    int status = 0;
    for (int i = 1; i < CONTEXT_RUNS && status == 0; i++) {   /* balanced ring, Ulysses */
        char err[200];
        if (!wanted(&r->flags, i) || !cp_check_sizes(&lc, r->world, 1, r->cp, &run_options[i],
                                                     err, sizeof err))
            continue;   /* the same on every process */
        context_run run = {.opts = run_options[i]};
        status = run_one(&lc, data, r->cp, b, &run);
        if (!run.ran) continue;
        r->long_ran[i] = 1;
        r->long_diff_loss[i] = run.result.diff_loss;
        for (int k = 0; k < r->world; k++)
            if (run.extra.ranks[k].activations > r->long_activations[i])
                r->long_activations[i] = run.extra.ranks[k].activations;
        free(run.loss);
    }
    baseline_free(b);
    return status;
}

/* Megatron-SP on t = cp ranks, per layer: an all-gather before each column-parallel
 * linear (QKV, fc) and a reduce-scatter after each row-parallel one (proj, fc2) in
 * forward, the conjugates in backward: 8 collectives of the whole B x T x C sequence,
 * each sending (t-1)/t of it. */
static double sp_bytes_per_layer(int t, int B, int T, int C, precision p) {
    return 8.0 * (t - 1) / t * (double)B * T * C * precision_bytes(p);
}

int context_launches(const run_config *given, const dataset *data, context_report *r) {
    const run_config part = part_config(given), *cfg = &part;
    const int ranks = launch_mpi_world_size() > 0 ? launch_mpi_world_size() : cfg->comm.ranks;
    r->world = ranks;
    r->cp = cp_size(&r->flags, ranks);
    r->dp = ranks / r->cp;
    r->B = cfg->batch / r->dp, r->T = cfg->model.ctx, r->C = cfg->model.dim;
    r->H = cfg->model.heads, r->L = cfg->model.layers;
    r->sp_bytes_per_layer = sp_bytes_per_layer(r->cp, r->B, r->T, r->C, cfg->precision);
    r->precision = cfg->precision;
    r->grad_precision = cfg->grad_precision;
    baseline_run *b = process_hosts_rank0() ? baseline_reference(cfg, data) : NULL;
    if (b) {
        r->baseline = b->result;
        r->baseline_loss = malloc((size_t)cfg->steps * sizeof *r->baseline_loss);
        memcpy(r->baseline_loss, b->loss, (size_t)cfg->steps * sizeof *r->baseline_loss);
        r->baseline.loss = r->baseline_loss;
        r->tol = part_tolerances(cfg, ranks, b);
    }
    int status = 0;
    for (int i = 0; i < CONTEXT_RUNS && status == 0; i++) {
        context_run *run = &r->runs[i];
        run->opts = run_options[i];
        if (!wanted(&r->flags, i)) continue;
        if (cp_check_sizes(cfg, ranks, 1, r->cp, &run->opts, run->skipped, sizeof run->skipped))
            status = run_one(cfg, data, r->cp, b, run);
    }
    baseline_free(b);
    if (status == 0 && r->cp > 1) status = long_sequence(cfg, data, r);
    return status;
}

int context_passed(const context_report *r) {
    int ok = 1;
    for (int i = 0; i < CONTEXT_RUNS; i++) {
        const context_run *c = &r->runs[i];
        if (!c->ran) continue;
        ok &= c->result.diff_loss <= r->tol.loss && c->result.diff_grads <= r->tol.grads &&
              c->result.diff_params <= r->tol.params;
        ok &= c->extra.cp_bytes_per_layer == c->extra.cp_bytes_per_layer_formula;
        if (c->opts.kind == CP_RING && c->opts.split == CP_BALANCED)
            ok &= c->extra.work_imbalance == 1.0;
    }
    for (int i = 0; i < CONTEXT_RUNS; i++)
        if (r->long_ran[i]) ok &= r->long_diff_loss[i] <= r->long_tol_loss;
    return ok;
}

void context_report_free(context_report *r) {
    free(r->baseline_loss);
    for (int i = 0; i < CONTEXT_RUNS; i++) free(r->runs[i].loss);
    memset(r, 0, sizeof *r);
}
