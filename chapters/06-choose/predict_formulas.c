/* --predict-chapters' arithmetic: bytes per rank and step time of each strategy the
 * chapters run, from the model's shape alone (the why of each term: predict.h). */
#include "predict.h"

#include <math.h>

#include "plan_time.h"

/* The bytes of each kind of element in a precision, as the chapters store them:
 * fp32 4 + 4 + 8 with 4-byte activations; 16 bits: compute weights 2, fp32 gradients 4,
 * fp32 master, m, v 12, 2-byte activations (LayerNorm statistics, losses and token ids
 * stay 4 bytes in both). */
typedef struct {
    plan_precision bytes;
    int sixteen;   /* 16 bits: a vocab-parallel head widens its logits into fp32 */
} numerics;

static numerics numerics_of(precision dtype) {
    if (dtype == PRECISION_FP32) return (numerics){PLAN_FP32_ADAM, 0};
    return (numerics){PLAN_MIXED_FP32_GRADS, 1};
}

/* Elements of the embedding's vocabulary rows on one of tp ranks. */
static double vocab_rows(const gpt_config *c, int tp) {
    return ceil((double)c->vocab / tp);
}

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
    const double embed = vocab_rows(c, tp) * h + (double)c->ctx * h;
    return c->layers * block + embed + 2 * h;
}

double predict_tp_elements(const gpt_config *c, int tp, precision dtype) {
    (void)dtype;   /* the vocabulary is split in every precision */
    return tp_elements(c, tp);
}

static void predict_states(const gpt_config *c, int ranks, int tp, int stage, numerics n,
                           chapter_figures *f) {
    const slab_sizes s = slabs_of(c);
    const double whole = s.embed + c->layers * s.block + s.final_ln;
    const double mine = tp > 1 ? tp_elements(c, tp) : whole;
    const double shard = tp > 1 ? mine : shard_elements(c, ranks);
    const plan_precision *b = &n.bytes;
    f->params = b->params * mine;
    f->grads = b->grads * mine;
    /* the optimizer's elements, masters included, are sharded from stage 1 */
    f->optimizer = b->optimizer * (stage >= 1 ? shard : mine);
    /* backward holds one block's full gradient while the tied embedding's, written by
     * the head first, waits for the token embedding's share at the very end */
    if (stage >= 2) f->grads = b->grads * (shard + s.block + s.embed);
    /* forward and backward gather one slab of compute weights at a time */
    if (stage >= 3) f->params = b->params * (shard + fmax(s.block, s.embed));
}

/* A pipeline stage's elements: blocks [k L / p, (k+1) L / p) of the TP slice, the
 * embedding on the first, the final LayerNorm and the tied embedding's copy on the
 * last. */
static double stage_elements(const gpt_config *c, int tp, int pp, int k) {
    const double h = c->dim, t = tp, wte = vocab_rows(c, tp) * h;
    const double block = tp > 1 ? 12 * h * h / t + (3 * h + 4 * h) / t + 2 * h + 4 * h
                                : slabs_of(c).block;
    const int blocks = (int)((long)(k + 1) * c->layers / pp - (long)k * c->layers / pp);
    double elements = blocks * block;
    if (k == 0) elements += wte + (double)c->ctx * h;
    if (k == pp - 1) elements += 2 * h + (k > 0 ? wte : 0);
    return elements;
}

static void predict_pipeline_states(const gpt_config *c, int tp, int pp, numerics n,
                                    chapter_figures *f) {
    double largest = 0;
    for (int k = 0; k < pp; k++) largest = fmax(largest, stage_elements(c, tp, pp, k));
    f->params = n.bytes.params * largest;
    f->grads = n.bytes.grads * largest;
    f->optimizer = n.bytes.optimizer * largest;
}

/* ---- activations -------------------------------------------------------------------- */

/* A micro-batch of `tokens` tokens on one of tp ranks: elements in the activations'
 * precision (a) and 4-byte ones (fp32 statistics and losses, int token ids). */
typedef struct {
    double layer, layer_fp32;   /* one block's, kept for backward */
    double head, head_fp32;     /* final LayerNorm and logits; its statistics and losses */
    double workspace;           /* one layer's backward buffers, shared */
    double vocab_rows;          /* vocab-parallel loss: max, sum, target logit (fp32) */
    double logits32;            /* 16 bits, vocab-parallel: the slice's logits widened */
} activation_sizes;

static activation_sizes activation_sizes_of(const gpt_config *c, double tokens, int tp,
                                            numerics n) {
    const double h = c->dim, a = c->heads, s = c->ctx, t = tp;
    const double scores = a * s * tokens / t;   /* a s^2 b / t */
    const int split_vocab = tp > 1;
    /* the 4 h whole: layer input, LayerNorm outputs, residual; the 12 h / t split: q, k,
     * v, attention output, MLP input and GELU output; backward: the residual gradient,
     * its LayerNorm-side copy and the split buffers' and the softmax's gradients */
    return (activation_sizes){
        .layer = tokens * (4 * h + 12 * h / t) + scores, .layer_fp32 = 4 * tokens,
        .head = tokens * (h + vocab_rows(c, tp)), .head_fp32 = 3 * tokens,
        .workspace = tokens * (2 * h + 12 * h / t) + scores,
        .vocab_rows = split_vocab ? 3 * tokens : 0,
        .logits32 = split_vocab && n.sixteen ? tokens * vocab_rows(c, tp) : 0};
}

static double predict_activations(const gpt_config *c, int B, int tp, numerics n) {
    const double tokens = (double)c->ctx * B, h = c->dim, L = c->layers;
    const activation_sizes z = activation_sizes_of(c, tokens, tp, n);
    const double last_output = tokens * h, token_ids = 2 * tokens;
    return n.bytes.activation * (L * z.layer + z.head + last_output + z.workspace) +
           4 * (L * z.layer_fp32 + z.head_fp32 + token_ids + z.vocab_rows + z.logits32);
}

/* 1F1B on stage k holds min(p - k, m) micro-batches of B/m sequences; each keeps its
 * blocks' activations, its input (and output) and tokens, the gradients it trades with
 * its neighbours and, on the last stage, the head; one backward workspace serves all.
 * The largest stage. */
static double predict_pipeline_activations(const gpt_config *c, int batch, int tp, int pp,
                                           int micro, numerics n) {
    const double tokens = (double)c->ctx * batch / micro, h = c->dim;
    const activation_sizes z = activation_sizes_of(c, tokens, tp, n);
    double largest = 0;
    for (int k = 0; k < pp; k++) {
        const int blocks = (int)((long)(k + 1) * c->layers / pp - (long)k * c->layers / pp);
        double slot = blocks * z.layer + tokens * h;   /* + its output */
        double slot_fp32 = blocks * z.layer_fp32 + 2 * tokens;   /* + the tokens */
        if (k == pp - 1) {
            slot += z.head;
            slot_fp32 += z.head_fp32;
        } else {
            slot += tokens * h;   /* the gradient received from the next stage */
        }
        if (k > 0) slot += tokens * h;   /* the gradient for the previous one */
        const int held = pp - k < micro ? pp - k : micro;
        const double rows = k == pp - 1 ? z.vocab_rows + z.logits32 : 0;
        const double bytes = n.bytes.activation * (held * slot + z.workspace) +
                             4 * (held * slot_fp32 + rows);
        largest = fmax(largest, bytes);
    }
    return largest;
}

/* ---- time ------------------------------------------------------------------------- */

/* Messages in their precision: gradients reduced in fp32 (both precisions), ZeRO-3's
 * gathers of weights in the compute precision, TP's all-reduces of activations too. */
static double predict_ms(const gpt_config *c, int batch, int ranks, int tp, int stage,
                         double gflops, int cores, comm_link link, double link_scale,
                         numerics n) {
    const int dp = ranks / tp;
    const double flops = gpt_flops_per_step(c, batch / dp, c->ctx) / tp;
    const double sharing = ranks > cores ? (double)ranks / cores : 1.0;
    double seconds = flops / (gflops * 1e9) * sharing;
    const plan_link wire = plan_link_of(link);
    const slab_sizes s = slabs_of(c);
    const double elements = s.embed + c->layers * s.block + s.final_ln;
    const double grads = n.bytes.grads * elements, weights = n.bytes.params * elements;
    double comm = 0;
    if (tp > 1) {
        const double activation_bytes = n.bytes.activation * (batch / dp) * c->ctx * c->dim;
        comm = 4.0 * c->layers * plan_allreduce_seconds(wire, tp, activation_bytes);
    } else if (stage < 3) {
        comm = plan_allreduce_seconds(wire, dp, grads);
    } else {
        comm = 2 * plan_gather_seconds(wire, dp, weights) + plan_gather_seconds(wire, dp, grads);
    }
    seconds += comm * link_scale;
    return 1e3 * seconds;
}

/* A pipeline's step: each stage's share of the FLOPs, stretched by 1F1B's
 * (m + p - 1) / m, plus its TP all-reduces on the link model. */
static double predict_pipeline_ms(const gpt_config *c, int batch, int ranks, int tp, int pp,
                                  int micro, double gflops, int cores, comm_link link,
                                  double link_scale, numerics n) {
    const double flops = gpt_flops_per_step(c, batch, c->ctx) / (tp * pp);
    const double sharing = ranks > cores ? (double)ranks / cores : 1.0;
    double seconds = flops / (gflops * 1e9) * sharing * (micro + pp - 1) / micro;
    if (tp > 1) {
        const double activation_bytes = n.bytes.activation * batch * c->ctx * c->dim;
        seconds += 4.0 * c->layers / pp *
                   plan_allreduce_seconds(plan_link_of(link), tp, activation_bytes) * link_scale;
    }
    return 1e3 * seconds;
}

chapter_figures predict_chapter_run(const gpt_config *cfg, int batch, int ranks,
                                    const chapter_strategy *st, double gflops, int cores,
                                    comm_link link, double link_scale, precision dtype) {
    chapter_figures f = {0};
    const numerics n = numerics_of(dtype);
    if (st->pp != 0) {
        const int pp = st->pp > 0 ? st->pp : ranks, tp = st->tp;
        predict_pipeline_states(cfg, tp, pp, n, &f);
        f.activations = predict_pipeline_activations(cfg, batch, tp, pp, st->micro, n);
        f.ms_per_step = predict_pipeline_ms(cfg, batch, ranks, tp, pp, st->micro, gflops, cores,
                                            link, link_scale, n);
        return f;
    }
    const int tp = st->tp ? st->tp : ranks;
    predict_states(cfg, ranks, tp, st->zero_stage, n, &f);
    f.activations = predict_activations(cfg, batch / (ranks / tp), tp, n);
    f.ms_per_step = predict_ms(cfg, batch, ranks, tp, st->zero_stage, gflops, cores, link,
                               link_scale, n);
    return f;
}
