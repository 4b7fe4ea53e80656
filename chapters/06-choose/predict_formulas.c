/* --predict-chapters' arithmetic: bytes per rank and step time of each strategy the
 * chapters run, from the model's shape alone (the why of each term: predict.h). */
#include "predict.h"

#include <math.h>

#include "plan_time.h"

/* ---- model states, as this project stores them ----------------------------------- */

typedef struct {
    double embed, block, final_ln;   /* elements of each slab */
} slab_sizes;

static slab_sizes slabs_of(const gpt_config *c) {
    const double h = c->dim;
    return (slab_sizes){.embed = (double)c->vocab * h + (double)c->ctx * h,
                        .block = 12 * h * h + 13 * h, .final_ln = 2 * h};
}

/* The largest rank's share of a slab: comm_shard gives the first numel % N ranks one
 * element more. */
static double piece(double numel, int ranks) { return ceil(numel / ranks); }

static double shard_elements(const gpt_config *c, int ranks) {
    slab_sizes s = slabs_of(c);
    return piece(s.embed, ranks) + c->layers * piece(s.block, ranks) + piece(s.final_ln, ranks);
}

/* Tensor parallel: q, k, v, the MLP's first layer and the vocabulary split t ways (one
 * vocabulary slice rounded up), the rest of every block whole. */
static double tp_elements(const gpt_config *c, int tp) {
    const double h = c->dim, t = tp;
    const double block = 12 * h * h / t + (3 * h + 4 * h) / t + 2 * h + 4 * h;
    const double embed = ceil((double)c->vocab / t) * h + (double)c->ctx * h;
    return c->layers * block + embed + 2 * h;
}

static void predict_states(const gpt_config *c, int ranks, int tp, int stage,
                           chapter_figures *f) {
    const slab_sizes s = slabs_of(c);
    const double whole = s.embed + c->layers * s.block + s.final_ln;
    const double mine = tp > 1 ? tp_elements(c, tp) : whole;
    const double shard = tp > 1 ? mine : shard_elements(c, ranks);
    f->params = 4 * mine;
    f->grads = 4 * mine;
    f->optimizer = 8 * (stage >= 1 ? shard : mine);
    /* backward holds one block's full gradient while the tied embedding's, written by
     * the head first, waits for the token embedding's share at the very end */
    if (stage >= 2) f->grads = 4 * (shard + s.block + s.embed);
    /* forward and backward gather one slab at a time */
    if (stage >= 3) f->params = 4 * (shard + fmax(s.block, s.embed));
}

/* A pipeline stage's elements: blocks [k L / p, (k+1) L / p) of the TP slice, the
 * embedding on the first, the final LayerNorm and the tied embedding's copy on the
 * last. */
static double stage_elements(const gpt_config *c, int tp, int pp, int k) {
    const double h = c->dim, t = tp, wte = ceil((double)c->vocab / t) * h;
    const double block = tp > 1 ? 12 * h * h / t + (3 * h + 4 * h) / t + 2 * h + 4 * h
                                : slabs_of(c).block;
    const int blocks = (int)((long)(k + 1) * c->layers / pp - (long)k * c->layers / pp);
    double n = blocks * block;
    if (k == 0) n += wte + (double)c->ctx * h;
    if (k == pp - 1) n += 2 * h + (k > 0 ? wte : 0);
    return n;
}

static void predict_pipeline_states(const gpt_config *c, int tp, int pp, chapter_figures *f) {
    double largest = 0;
    for (int k = 0; k < pp; k++) largest = fmax(largest, stage_elements(c, tp, pp, k));
    f->params = f->grads = 4 * largest;
    f->optimizer = 8 * largest;
}

/* ---- activations -------------------------------------------------------------------- */

static double predict_activations(const gpt_config *c, int B, int tp) {
    const double s = c->ctx, b = B, h = c->dim, a = c->heads, t = tp, L = c->layers;
    const double tokens = s * b, scores = a * s * s * b / t;
    const double layer = tokens * (4 * h + 12 * h / t + 4) + scores;
    const double head = tokens * (h + 2) + tokens * ceil(c->vocab / t) + tokens;
    const double last_output = tokens * h, token_ids = 2 * tokens;
    /* backward workspace: the residual gradient, its LayerNorm-side copy, and the
     * gradients of the split buffers and of the softmax, one layer at a time */
    const double workspace = tokens * (2 * h + 12 * h / t) + scores;
    const double vocab_rows = tp > 1 ? 3 * tokens : 0;   /* max, sum, target logit */
    return 4 * (L * layer + head + last_output + token_ids + workspace + vocab_rows);
}

/* 1F1B on stage k holds min(p - k, m) micro-batches of B/m sequences; each keeps its
 * blocks' activations, its input (and output) and tokens, the gradients it trades with
 * its neighbours and, on the last stage, the head; one backward workspace serves all.
 * The largest stage. */
static double predict_pipeline_activations(const gpt_config *c, int batch, int tp, int pp,
                                           int micro) {
    const double s = c->ctx, b = (double)batch / micro, h = c->dim, a = c->heads, t = tp;
    const double tokens = s * b, scores = a * s * s * b / t;
    const double layer = tokens * (4 * h + 12 * h / t + 4) + scores;
    const double head = tokens * (h + 2) + tokens * ceil(c->vocab / t) + tokens;
    const double workspace = tokens * (2 * h + 12 * h / t) + scores;
    double largest = 0;
    for (int k = 0; k < pp; k++) {
        const int blocks = (int)((long)(k + 1) * c->layers / pp - (long)k * c->layers / pp);
        double slot = blocks * layer + tokens * h + 2 * tokens;   /* + its output, tokens */
        if (k == pp - 1) slot += head;
        else slot += tokens * h;   /* the gradient received from the next stage */
        if (k > 0) slot += tokens * h;   /* the gradient for the previous one */
        const int held = pp - k < micro ? pp - k : micro;
        double bytes = held * slot + workspace + (k == pp - 1 && tp > 1 ? 3 * tokens : 0);
        largest = fmax(largest, 4 * bytes);
    }
    return largest;
}

/* ---- time ------------------------------------------------------------------------- */

static double predict_ms(const gpt_config *c, int batch, int ranks, int tp, int stage,
                         double gflops, int cores, comm_link link, double link_scale) {
    const int dp = ranks / tp;
    const double flops = gpt_flops_per_step(c, batch / dp, c->ctx) / tp;
    const double sharing = ranks > cores ? (double)ranks / cores : 1.0;
    double seconds = flops / (gflops * 1e9) * sharing;
    const plan_link wire = plan_link_of(link);
    const slab_sizes s = slabs_of(c);
    const double model_bytes = 4 * (s.embed + c->layers * s.block + s.final_ln);
    double comm = 0;
    if (tp > 1) {
        const double activation_bytes = 4.0 * (batch / dp) * c->ctx * c->dim;
        comm = 4.0 * c->layers * plan_allreduce_seconds(wire, tp, activation_bytes);
    } else if (stage < 3) {
        comm = plan_allreduce_seconds(wire, dp, model_bytes);
    } else {
        comm = 3 * plan_gather_seconds(wire, dp, model_bytes);
    }
    seconds += comm * link_scale;
    return 1e3 * seconds;
}

/* A pipeline's step: each stage's share of the FLOPs, stretched by 1F1B's
 * (m + p - 1) / m, plus its TP all-reduces on the link model. */
static double predict_pipeline_ms(const gpt_config *c, int batch, int ranks, int tp, int pp,
                                  int micro, double gflops, int cores, comm_link link,
                                  double link_scale) {
    const double flops = gpt_flops_per_step(c, batch, c->ctx) / (tp * pp);
    const double sharing = ranks > cores ? (double)ranks / cores : 1.0;
    double seconds = flops / (gflops * 1e9) * sharing * (micro + pp - 1) / micro;
    if (tp > 1) {
        const double activation_bytes = 4.0 * batch * c->ctx * c->dim;
        seconds += 4.0 * c->layers / pp *
                   plan_allreduce_seconds(plan_link_of(link), tp, activation_bytes) * link_scale;
    }
    return 1e3 * seconds;
}

chapter_figures predict_chapter_run(const gpt_config *cfg, int batch, int ranks,
                                    const chapter_strategy *st, double gflops, int cores,
                                    comm_link link, double link_scale) {
    chapter_figures f = {0};
    if (st->pp != 0) {
        const int pp = st->pp > 0 ? st->pp : ranks, tp = st->tp;
        predict_pipeline_states(cfg, tp, pp, &f);
        f.activations = predict_pipeline_activations(cfg, batch, tp, pp, st->micro);
        f.ms_per_step = predict_pipeline_ms(cfg, batch, ranks, tp, pp, st->micro, gflops, cores,
                                            link, link_scale);
        return f;
    }
    const int tp = st->tp ? st->tp : ranks;
    predict_states(cfg, ranks, tp, st->zero_stage, &f);
    f.activations = predict_activations(cfg, batch / (ranks / tp), tp);
    f.ms_per_step = predict_ms(cfg, batch, ranks, tp, st->zero_stage, gflops, cores, link,
                               link_scale);
    return f;
}
