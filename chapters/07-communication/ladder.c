/* Part 3: DDP's scaling efficiency, one optimisation at a time, on slow Ethernet.
 *
 *   basic       fp32, one bucket: a single all-reduce after backward, nothing hidden
 *   +overlap    buckets all-reduced as backward finishes them
 *   +accum K    K micro-batches per all-reduce (the global batch grows K times, so each
 *               micro-batch keeps its size and the wire carries 1/K of the bytes per token)
 *   +bf16/+fp8  the gradients travel in 2 or 1 bytes (on top of accum 4); with
 *               --grad-dtype bf16|fp16 they already do, and the ladder stops at accum 4
 *
 * In bf16 or fp16 every rung trains in that precision, and its reference is the
 * baseline in the same precision.
 *
 * Efficiency = the share of a rung's own step its ranks spent computing: step time
 * less the time blocked in communication, over step time, both from the same run, and
 * the prediction is made on that same compute time. It is at most 1 by construction,
 * and load from other programs stretches the compute it is measured against. (Against
 * a no-communication run made at another moment, a burst of load during either run
 * moved a rung by 10-20 points.) The blocked time is the least over ranks: the last
 * rank to finish computing does not wait for a peer, so it is the wire and the ring's
 * own copies and additions; the first to finish (on fewer cores than ranks, half a
 * step early) would count the others' compute as communication.
 * The wire: Ethernet slowed down link_scale times, chosen by default so that the basic
 * rung's predicted efficiency is the course text's starting point (30%) at the compute
 * time of the basic rung run with no wire: this CPU computes ~10^3 times slower than a
 * GPU, so the real 25 Gb/s would look almost free. */
#include "communication.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "ddp.h"
#include "baseline.h"
#include "replica.h"

typedef struct {
    const char *name;
    int overlap, grad_accum;
    comm_dtype wire;
} rung_spec;

static const rung_spec rung_specs[LADDER_RUNGS] = {
    {"basic", 0, 1, COMM_F32},     {"+overlap", 1, 1, COMM_F32},
    {"+accum 2", 1, 2, COMM_F32},  {"+accum 4", 1, 4, COMM_F32},
    {"+bf16", 1, 4, COMM_BF16},    {"+fp8", 1, 4, COMM_F8E4M3},
};

/* Overlap buckets: a quarter of the gradients each, so that three of four can hide
 * under backward while each still carries enough bytes to amortise its latency. */
enum { OVERLAP_BUCKETS = 4 };

/* One DDP run's figures, copied out of the job. */
typedef struct {
    double tokens_per_s, comm_fraction, ms_per_step;
    double least_blocked;   /* share of a step, on the rank blocked least */
    float *loss;            /* [steps], malloc'd */
    double diff_loss;       /* against the baseline given (-1: none) */
    int buckets;
    double bucket_bytes[64];
} ddp_figures;

static int run_ddp_once(const run_config *base, const dataset *data, const rung_spec *spec,
                        int allreduce, comm_link link, double link_scale,
                        size_t gradient_bytes, const baseline_run *baseline,
                        ddp_figures *out) {
    run_config cfg = *base;
    cfg.batch = base->batch * spec->grad_accum;
    cfg.comm.link = link;
    cfg.comm.link_scale = link_scale;
    cfg.comm.trace_path = NULL;
    cfg.quiet = 1;
    ddp_options opts = ddp_options_default();
    opts.grad_accum = spec->grad_accum;
    opts.wire = spec->wire;
    opts.allreduce = allreduce;
    size_t cap = spec->overlap ? (gradient_bytes + OVERLAP_BUCKETS - 1) / OVERLAP_BUCKETS
                               : SIZE_MAX;
    opts.bucket_bytes = opts.first_bucket_bytes = cap;
    ddp_extra x;
    strategy_outcome job = {.extra = &x};
    int status = ddp_launch(&cfg, data, &opts, &job);
    if (status == 0) {
        *out = (ddp_figures){.tokens_per_s = run_tokens_per_second(&job.result),
                             .comm_fraction = run_comm_fraction(&job.result),
                             .ms_per_step = run_ms_per_step(&job.result), .diff_loss = -1,
                             .least_blocked = job.result.seconds > 0
                                 ? job.result.comm_seconds_least / job.result.seconds : 0};
        out->loss = malloc((size_t)cfg.steps * sizeof(float));
        memcpy(out->loss, job.loss, (size_t)cfg.steps * sizeof(float));
        if (baseline) {
            compare_to_baseline(&job.result, baseline, job.loss, NULL, NULL);
            out->diff_loss = job.result.diff_loss;
        }
        out->buckets = x.num_buckets < 64 ? x.num_buckets : 64;
        /* an uncompressed wire carries the gradients in their own type */
        const size_t element = spec->wire == COMM_F32 ? precision_bytes(cfg.grad_precision)
                                                      : comm_dtype_size(spec->wire);
        for (int i = 0; i < out->buckets; i++)
            out->bucket_bytes[i] = (double)x.bucket_numel[i] * element;
    }
    strategy_outcome_free(&job);
    ddp_extra_free(&x);
    return status;
}

typedef struct {
    int allreduce;
    comm_link link;
    double link_scale;
    size_t gradient_bytes;
    int repeats;
} ddp_wire;

/* The fastest of w->repeats runs. */
static int run_ddp(const run_config *base, const dataset *data, const rung_spec *spec,
                   const ddp_wire *w, const baseline_run *baseline, ddp_figures *out) {
    int status = 0;
    for (int k = 0; k < w->repeats && !status; k++) {
        ddp_figures f = {0};
        status = run_ddp_once(base, data, spec, w->allreduce, w->link, w->link_scale,
                              w->gradient_bytes, baseline, &f);
        if (status) break;
        if (k == 0 || f.tokens_per_s > out->tokens_per_s) {
            if (k) free(out->loss);
            *out = f;
        } else free(f.loss);
    }
    return status;
}

double ladder_predicted_exposed(plan_link link, int ranks, const double *bucket_bytes,
                                int buckets, int overlapped, double compute_s,
                                int grad_accum) {
    double all_bytes = 0;
    for (int i = 0; i < buckets; i++) all_bytes += bucket_bytes[i];
    /* bucket i is ready once backward has produced its share of the gradients; the
     * all-reduces then run one after the other */
    const double backward = overlapped ? 2.0 / 3.0 * compute_s / grad_accum : 0;
    double produced = 0, wire_free = 0;
    for (int i = 0; i < buckets; i++) {
        produced += bucket_bytes[i];
        const double ready = all_bytes > 0 ? backward * produced / all_bytes : backward;
        wire_free = fmax(wire_free, ready) + plan_allreduce_seconds(link, ranks, bucket_bytes[i]);
    }
    /* the loss's all-reduce comes after the timed step (train_loop), so it is left out */
    return fmax(0, wire_free - backward);
}

/* The extra blocking all-reduce of fp16 / fp8 buckets: the ranks agree on a scale. */
static double scale_agreements(plan_link link, int ranks, comm_dtype wire, int buckets) {
    if (wire != COMM_F16 && wire != COMM_F8E4M3) return 0;
    return buckets * plan_allreduce_seconds(link, ranks, sizeof(float));
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* The wire slow-down that puts the basic rung's prediction at target efficiency: the
 * exposed time at scale s is s times the one at scale 1 (latency and bandwidth both). */
static double calibrated_scale(int ranks, size_t gradient_bytes, double compute_s,
                               double target) {
    const double one_bucket = (double)gradient_bytes;
    const double at_one = ladder_predicted_exposed(plan_link_of(LINK_ETHERNET), ranks,
                                                   &one_bucket, 1, 0, compute_s, 1);
    return compute_s * (1 / target - 1) / at_one;
}

/* A rung from its own run: compute = step - blocked in communication on the rank
 * blocked least, the last to finish computing, whose compute is the step's critical
 * path; the prediction puts the model's exposed wire time on that same compute time. */
static void fill_rung(ladder_rung *rung, const rung_spec *spec, int batch,
                      const ddp_figures *run, plan_link link, int ranks, int steps) {
    const double step_s = 1e-3 * run->ms_per_step;
    const double compute_s = step_s * (1 - run->least_blocked);
    double exposed = ladder_predicted_exposed(link, ranks, run->bucket_bytes, run->buckets,
                                              spec->overlap, compute_s, spec->grad_accum) +
                     scale_agreements(link, ranks, spec->wire, run->buckets);
    *rung = (ladder_rung){
        .name = spec->name, .overlap = spec->overlap, .grad_accum = spec->grad_accum,
        .wire = spec->wire, .batch = batch, .tokens_per_s = run->tokens_per_s,
        .compute_ms = 1e3 * compute_s, .exposed_ms = 1e3 * (step_s - compute_s),
        .efficiency = step_s > 0 ? compute_s / step_s : 0,
        .predicted_efficiency = compute_s / (compute_s + exposed),
        .comm_fraction = run->least_blocked, .loss = run->loss[steps - 1],
        .diff_loss = run->diff_loss, .reference = "baseline",
        .predicted_exposed_ms = 1e3 * exposed};
}

static void free_figures(ddp_figures *f, int n) {
    for (int i = 0; i < n; i++) {
        free(f[i].loss);
        f[i].loss = NULL;
    }
}

int ladder_run(const run_config *cfg, const dataset *data, double link_scale,
               double target_start, int max_rungs, int repeats, ladder_report *out) {
    const int ranks = cfg->comm.ranks, steps = cfg->steps;
    int rungs = max_rungs > 0 && max_rungs < LADDER_RUNGS ? max_rungs : LADDER_RUNGS;
    /* 16-bit gradients travel as they are: no compressed rung on top */
    while (cfg->grad_precision != PRECISION_FP32 && rungs > 0 &&
           rung_specs[rungs - 1].wire != COMM_F32)
        rungs--;
    memset(out, 0, sizeof *out);
    out->grad_precision = cfg->grad_precision;
    run_config quiet = *cfg;
    quiet.quiet = 1;
    baseline_run *baseline = baseline_train(&quiet, data);
    out->gradient_bytes = baseline->num_params * precision_bytes(cfg->grad_precision);
    out->baseline_tokens_per_s = run_tokens_per_second(&baseline->result);
    baseline_free(baseline);

    /* The slow-down is chosen on the basic rung with no wire, its compute measured as
     * the rungs' will be (step less the time blocked, on the rank blocked least). */
    ddp_figures nowire = {0}, run[LADDER_RUNGS] = {{0}};
    const ddp_wire none = {1, LINK_NONE, 1, out->gradient_bytes, repeats};
    int status = run_ddp(cfg, data, &rung_specs[0], &none, NULL, &nowire);
    if (status) return status;
    out->compute_ms = nowire.ms_per_step * (1 - nowire.least_blocked);
    free(nowire.loss);
    out->target_start = link_scale > 0 ? 0 : target_start;   /* 0: given, not chosen */
    out->link_scale = link_scale > 0 ? link_scale
                                     : calibrated_scale(ranks, out->gradient_bytes,
                                                        1e-3 * out->compute_ms, target_start);
    /* a tiny target on a slow model would ask for a wire slower than comm allows */
    out->scale_capped = out->link_scale > LINK_SCALE_MAX;
    if (out->scale_capped) out->link_scale = LINK_SCALE_MAX;
    const plan_link link = plan_link_scaled(plan_link_of(LINK_ETHERNET), out->link_scale);

    int fp32_rung = 0;   /* the compressed rungs' reference: the last fp32 one */
    for (int i = 0; i < rungs && !status; i++) {
        const rung_spec *spec = &rung_specs[i];
        run_config bigger = *cfg;
        bigger.batch = cfg->batch * spec->grad_accum;
        bigger.quiet = 1;
        baseline_run *b = spec->wire == COMM_F32 ? baseline_train(&bigger, data) : NULL;
        ddp_wire ethernet = {1, LINK_ETHERNET, out->link_scale, out->gradient_bytes, repeats};
        status = run_ddp(cfg, data, spec, &ethernet, b, &run[i]);
        if (b) baseline_free(b);
        if (status) break;
        fill_rung(&out->rungs[i], spec, bigger.batch, &run[i], link, ranks, steps);
        if (spec->wire == COMM_F32) fp32_rung = i;
        else {
            out->rungs[i].diff_loss = max_diff(run[i].loss, run[fp32_rung].loss, steps);
            out->rungs[i].reference = rung_specs[fp32_rung].name;
        }
        out->count = i + 1;
    }
    free_figures(run, LADDER_RUNGS);
    return status;
}

void ladder_print(const ladder_report *r, int ranks) {
    char size[32];
    printf("\nThe efficiency ladder: DDP on %d ranks, gradients %s %s, Ethernet slowed %.3g"
           "x (= 25 Gb/s next to compute %.3gx faster than this CPU's)\n", ranks,
           report_bytes((double)r->gradient_bytes, size), precision_name(r->grad_precision),
           r->link_scale, r->link_scale);
    if (r->scale_capped)
        printf("  the slow-down is capped at %.3gx (comm's most); the basic rung is predicted"
               " above the %.0f%% asked for\n", r->link_scale, 100 * r->target_start);
    else if (r->target_start > 0)
        printf("  chosen so that a basic rung computing %.1f ms a step (as it did with no wire)"
               " is predicted at\n  %.0f%%, the course text's starting point\n",
               r->compute_ms, 100 * r->target_start);
    printf("  efficiency: compute / step of the rung's own run (compute = step less the time"
           " blocked in\n  communication); predicted: the alpha-beta model on that compute"
           " time\n");
    printf("  rung        batch   tok/s  compute ms  exposed ms (pred)  efficiency (pred)"
           "  loss     d loss (vs)\n");
    for (int i = 0; i < r->count; i++) {
        const ladder_rung *g = &r->rungs[i];
        printf("  %-9s %7d %7.0f %11.1f %11.1f (%5.1f) %9.1f%% (%4.1f%%)  %.4f  %.1e (%s)\n",
               g->name, g->batch, g->tokens_per_s, g->compute_ms, g->exposed_ms,
               g->predicted_exposed_ms, 100 * g->efficiency, 100 * g->predicted_efficiency,
               g->loss, g->diff_loss, g->reference);
    }
    if (r->count > 0) {
        const ladder_rung *first = &r->rungs[0], *last = &r->rungs[r->count - 1];
        const ladder_rung *best_rung = first;
        for (int i = 0; i < r->count; i++)
            if (r->rungs[i].efficiency > best_rung->efficiency) best_rung = &r->rungs[i];
        const double best = best_rung->efficiency;
        printf("  course text: about 30%% -> 60-70%%; here %.0f%% -> %.0f%% (best %.0f%%, %.0f%%"
               " short of the compute-bound limit)\n", 100 * first->efficiency,
               100 * last->efficiency, 100 * best, 100 * (1 - best));
        printf("  against N x one rank alone (%.0f tok/s x %d; %d ranks share this machine's"
               " cores): best rung %.0f%%\n", r->baseline_tokens_per_s, ranks, ranks,
               100 * best_rung->tokens_per_s / (ranks * r->baseline_tokens_per_s));
    }
}
