/* TP's collective matmul layer by layer: the four edges of a block's sequence-parallel
 * region (qkv and fc after an all-gather, proj and fc2 before a reduce-scatter), forward
 * then backward, run on a modelled two-tier network, without chunks and with them.
 * Exposed communication is what the rank spent blocked on the SP group's all-gathers
 * and reduce-scatters (comm statistics), per layer and pass.
 *
 * The formula, alpha-beta on the tier the group's ring crosses (its slowest link gates
 * every step): a collective of P = B T / t x C elements per rank takes t - 1 steps of
 * alpha + (P / n) e / beta for a chunk of n; without overlap all of a layer's four are
 * exposed (n = 1); with it, one chunk of each: the first all-gather (the products wait
 * for it) and the last reduce-scatter (nothing is left to hide it), as long as a
 * chunk's product takes at least as long as a chunk's collective, which the layer
 * times printed beside them show. Backward has six collectives without overlap (the
 * column layers' input gathered again and their dX reduce-scattered, the row layers' dY
 * gathered); with it, one chunk of each row layer's dY gather (nothing precedes it to
 * hide it), the column layers' hidden whole under their dX and dW products
 * (tp_overlap.h). */
#include "overlap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "tp_overlap.h"
#include "tp_sequence.h"

enum { FORWARD_EXPOSED, FORWARD_LAYER, BACKWARD_EXPOSED, BACKWARD_LAYER, TIMES };

typedef struct {
    const exposed_setup *s;
    double plain[TIMES], overlapped[TIMES];   /* seconds per layer */
} exposed_job;

typedef struct {
    void *inp_rows, *out_rows, *wide, *narrow;   /* [R, C], [R, C], [N, 4C/t], [N, C/t] */
    void *w_qkv, *w_proj, *w_fc, *w_fc2, *b_qkv, *b_fc, *bias;
    void *d_rows, *d_wide;   /* backward's input gradients: [R, C], [N, 4C/t] */
    float *dw, *db;          /* [4C/t, C], [4C]: every layer's, accumulated, never read */
} layer_buffers;

static void *filled(precision p, size_t n, float value) {
    void *x = mem_alloc(MEM_ACTIVATIONS, n * precision_bytes(p));
    float *f = mem_alloc(MEM_OTHER, n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = value * (float)(1 + i % 5);
    comm_convert(x, comm_dtype_of(p), f, COMM_F32, n);
    mem_free(f);
    return x;
}

static void buffers_alloc(const exposed_setup *s, layer_buffers *b) {
    const size_t C = (size_t)s->C, N = (size_t)s->B * s->T, t = (size_t)s->t;
    const precision p = s->p;
    *b = (layer_buffers){
        .inp_rows = filled(p, N / t * C, 0.01f), .out_rows = filled(p, N / t * C, 0),
        .wide = filled(p, N * 4 * C / t, 0), .narrow = filled(p, N * C / t, 0.01f),
        .w_qkv = filled(p, 3 * C / t * C, 0.001f), .w_proj = filled(p, C * (C / t), 0.001f),
        .w_fc = filled(p, 4 * C / t * C, 0.001f), .w_fc2 = filled(p, C * (4 * C / t), 0.001f),
        .b_qkv = filled(p, 3 * C / t, 0), .b_fc = filled(p, 4 * C / t, 0), .bias = filled(p, C, 0),
        .d_rows = filled(p, N / t * C, 0), .d_wide = filled(p, N * 4 * C / t, 0),
        .dw = mem_alloc(MEM_OTHER, 4 * C / t * C * sizeof(float)),
        .db = mem_alloc(MEM_OTHER, 4 * C * sizeof(float))};
}

static void buffers_free(layer_buffers *b) {
    void *all[] = {b->inp_rows, b->out_rows, b->wide, b->narrow, b->w_qkv, b->w_proj,
                   b->w_fc, b->w_fc2, b->b_qkv, b->b_fc, b->bias, b->d_rows, b->d_wide,
                   b->dw, b->db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) mem_free(all[i]);
}

/* Without chunks the compute model holds the rank after the call for its product's
 * modelled time (the collective's own time measured); with chunks tp_overlap holds it
 * chunk by chunk. */
static void hold_plain(tp_sequence *sp, comm *tp, double t0, double comm_before,
                       double flops) {
    const tp_overlap *o = tp_sequence_overlap(sp);
    if (o->chunks > 0) return;
    const comm_stats st = comm_stats_get(tp);
    const double in_comm = st.seconds[COMM_KIND_ALLGATHER] +
                           st.seconds[COMM_KIND_REDUCE_SCATTER] - comm_before;
    tp_overlap_hold(o, t0 + in_comm, flops);
}

static double comm_so_far(comm *tp) {
    const comm_stats st = comm_stats_get(tp);
    return st.seconds[COMM_KIND_ALLGATHER] + st.seconds[COMM_KIND_REDUCE_SCATTER];
}

/* One block's four linears at the SP region's edges. */
static void layer(tp_sequence *sp, comm *tp, const exposed_setup *s, layer_buffers *b) {
    const int N = s->B * s->T, C = s->C, t = s->t;
    const double f = 2.0 * N * C * (C / t);   /* a product of C/t outputs per rank */
    double t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_column_forward(sp, s->p, b->wide, b->inp_rows, b->w_qkv, b->b_qkv, N, C,
                               3 * C / t);
    hold_plain(sp, tp, t0, before, 3 * f);
    t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_row_forward(sp, tp, s->p, b->out_rows, b->narrow, b->w_proj, b->bias, N,
                            C / t, C);
    hold_plain(sp, tp, t0, before, f);
    t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_column_forward(sp, s->p, b->wide, b->out_rows, b->w_fc, b->b_fc, N, C,
                               4 * C / t);
    hold_plain(sp, tp, t0, before, 4 * f);
    t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_row_forward(sp, tp, s->p, b->out_rows, b->wide, b->w_fc2, b->bias, N,
                            4 * C / t, C);
    hold_plain(sp, tp, t0, before, 4 * f);
}

/* Their backward, in backward's order: dX and dW of each (2 products of the forward's
 * FLOPs); dY of fc2 and proj is the forward's output rows, of fc and qkv [N, OC_local]. */
static void layer_backward(tp_sequence *sp, comm *tp, const exposed_setup *s,
                           layer_buffers *b) {
    const int N = s->B * s->T, C = s->C, t = s->t;
    const double f = 2.0 * 2.0 * N * C * (C / t);
    double t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_row_backward(sp, s->p, b->d_wide, b->dw, b->db, b->out_rows, b->wide,
                             b->w_fc2, N, 4 * C / t, C);
    hold_plain(sp, tp, t0, before, 4 * f);
    t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_column_backward(sp, NULL, s->p, b->d_rows, b->dw, b->db, b->wide, b->inp_rows,
                                b->w_fc, N, C, 4 * C / t);
    hold_plain(sp, tp, t0, before, 4 * f);
    t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_row_backward(sp, s->p, b->d_wide, b->dw, b->db, b->out_rows, b->narrow,
                             b->w_proj, N, C / t, C);
    hold_plain(sp, tp, t0, before, f);
    t0 = comm_now(), before = comm_so_far(tp);
    tp_sequence_column_backward(sp, NULL, s->p, b->d_rows, b->dw, b->db, b->wide, b->inp_rows,
                                b->w_qkv, N, C, 3 * C / t);
    hold_plain(sp, tp, t0, before, 3 * f);
}

/* Layers timed with `chunks` (0: plain SP), forward and backward (one layer: its
 * products take twice the forward's time, and tests wait for every modelled second):
 * exposed and whole seconds of the best layer (the model is a floor: a busy machine only
 * adds time);
 * exposed on the rank blocked least (the last to arrive, which waits for the wire alone,
 * not for a peer held up by a busy machine: chapter 7's comm_seconds_least), whole on
 * the slowest. */
static void time_layers(comm *world, tp_sequence *sp, const exposed_setup *s,
                        layer_buffers *b, int chunks, double out[TIMES]) {
    tp_sequence_overlap(sp)->model_flops = 0;   /* warm-up: first touches, unmodelled */
    tp_sequence_set_overlap(sp, chunks, 0);
    layer(sp, world, s, b);
    layer_backward(sp, world, s, b);
    tp_sequence_overlap(sp)->model_flops = s->model_flops;
    double mine[TIMES] = {1e30, 1e30, 1e30, 1e30};
    for (int l = 0; l < s->layers; l++)
        for (int pass = 0; pass < 2 && !(pass == 1 && l > 0); pass++) {
            comm_barrier(world);
            const double before = comm_so_far(world), t0 = comm_now();
            if (pass == 0) layer(sp, world, s, b);
            else layer_backward(sp, world, s, b);
            const double whole = comm_now() - t0, exposed = comm_so_far(world) - before;
            mine[2 * pass] = fmin(mine[2 * pass], exposed);
            mine[2 * pass + 1] = fmin(mine[2 * pass + 1], whole);
        }
    for (int i = 0; i < TIMES; i += 2) mine[i] = -mine[i];   /* the largest of minus: the least */
    comm_allreduce(world, mine, TIMES, COMM_F64, COMM_MAX);
    for (int i = 0; i < TIMES; i++) out[i] = i % 2 ? mine[i] : -mine[i];
}

static int exposed_rank(comm *world, void *arg) {
    exposed_job *job = arg;
    const exposed_setup *s = job->s;
    const gpt_config cfg = {.vocab = 256, .ctx = s->T, .layers = 1, .heads = s->t, .dim = s->C};
    const gpt_shape shape = gpt_shape_make(&cfg, s->t, comm_rank(world));
    tp_sequence *sp = tp_sequence_create(&shape, world, s->p, s->B, s->T, 0);
    layer_buffers b;
    buffers_alloc(s, &b);
    double plain[TIMES], chunked[TIMES];
    time_layers(world, sp, s, &b, 0, plain);
    time_layers(world, sp, s, &b, s->chunks, chunked);
    if (comm_rank(world) == 0) {
        memcpy(job->plain, plain, sizeof plain);
        memcpy(job->overlapped, chunked, sizeof chunked);
    }
    buffers_free(&b);
    tp_sequence_free(sp);
    return 0;
}

static comm_tier ring_tier(const exposed_setup *s) {
    comm_tier worst = COMM_TIER_INTRA;
    for (int r = 0; r < s->t; r++)
        if (comm_tier_between(&s->comm, r, (r + 1) % s->t) == COMM_TIER_INTER) worst = COMM_TIER_INTER;
    return worst;
}

double exposed_formula_seconds(const exposed_setup *s, int chunks) {
    const size_t piece = (size_t)s->B * s->T / s->t * s->C * precision_bytes(s->p) / chunks;
    return 4.0 * (s->t - 1) * comm_tier_seconds(&s->comm, ring_tier(s), piece);
}

double exposed_backward_formula_seconds(const exposed_setup *s, int chunks) {
    const size_t piece = (size_t)s->B * s->T / s->t * s->C * precision_bytes(s->p) / chunks;
    const double collectives = chunks == 1 ? 6 : 2;   /* all six; the row layers' first chunks */
    return collectives * (s->t - 1) * comm_tier_seconds(&s->comm, ring_tier(s), piece);
}

/* The compute model's rate at which the smallest of a layer's products (proj: N C C/t
 * FLOPs x 2), chunk by chunk, takes `ratio` times its chunk's collective. */
double exposed_rate_for(const exposed_setup *s, double ratio) {
    const double flops = 2.0 * s->B * s->T * s->C * (s->C / s->t) / s->chunks;
    return flops / (ratio * exposed_formula_seconds(s, s->chunks) / 4);
}

void exposed_slow_links(exposed_setup *s, double step_seconds) {
    s->comm.link_scale = 1;
    s->comm.link_scale = step_seconds / (exposed_formula_seconds(s, 1) / (4.0 * (s->t - 1)));
}

int exposed_measure(const exposed_setup *s, exposed_result *out) {
    comm_options o = s->comm;
    o.ranks = s->t;
    exposed_job job = {.s = s};
    const int status = launch(&o, exposed_rank, &job);
    for (int pass = 0; pass < 2; pass++) {
        exposed_times *x = pass ? &out->backward : &out->forward;
        double (*formula)(const exposed_setup *, int) =
            pass ? exposed_backward_formula_seconds : exposed_formula_seconds;
        *x = (exposed_times){.plain_ms = 1e3 * job.plain[2 * pass],
                             .overlap_ms = 1e3 * job.overlapped[2 * pass],
                             .plain_formula_ms = 1e3 * formula(s, 1),
                             .overlap_formula_ms = 1e3 * formula(s, s->chunks),
                             .layer_ms = {1e3 * job.plain[2 * pass + 1],
                                          1e3 * job.overlapped[2 * pass + 1]}};
    }
    out->tier = ring_tier(s);
    return status;
}

static int times_within(const exposed_times *x, double band) {
    return fabs(x->plain_ms / x->plain_formula_ms - 1) <= band &&
           fabs(x->overlap_ms / x->overlap_formula_ms - 1) <= band;
}

int exposed_within(const exposed_result *r, double band) {
    return times_within(&r->forward, band) && times_within(&r->backward, band);
}

static int times_at_least(const exposed_times *x, double band) {
    return x->plain_ms >= (1 - band) * x->plain_formula_ms &&
           x->overlap_ms >= (1 - band) * x->overlap_formula_ms;
}

int exposed_at_least(const exposed_result *r, double band) {
    return times_at_least(&r->forward, band) && times_at_least(&r->backward, band);
}

static void print_times(const char *pass, const char *name, double ms, double formula_ms,
                        double layer_ms) {
    char label[64];
    snprintf(label, sizeof label, "%s, %s", pass, name);
    printf("  %-22s %14.3f %14.3f %7.1f%% %14.3f\n", label, ms, formula_ms,
           100 * (ms / formula_ms - 1), layer_ms);
}

void exposed_print(const exposed_setup *s, const exposed_result *r) {
    const comm_link link = comm_tier_link(&s->comm, r->tier);
    printf("\nTP's collective matmul, one block's four SP edges (tp %d, %d x %d rows of %d,"
           " %s, ring on %s x %g; compute modelled at %.3g GFLOP/s a rank):\n", s->t, s->B,
           s->T, s->C, precision_name(s->p), comm_link_spec(link).title,
           s->comm.link_scale > 0 ? s->comm.link_scale : 1, 1e-9 * s->model_flops);
    printf("  %-22s %14s %14s %8s %14s\n", "", "exposed ms", "alpha-beta ms", "off",
           "layer ms");
    char name[32];
    snprintf(name, sizeof name, "%d chunks", s->chunks);
    for (int pass = 0; pass < 2; pass++) {
        const exposed_times *x = pass ? &r->backward : &r->forward;
        const char *p = pass ? "backward" : "forward";
        print_times(p, "no overlap", x->plain_ms, x->plain_formula_ms, x->layer_ms[0]);
        print_times(p, name, x->overlap_ms, x->overlap_formula_ms, x->layer_ms[1]);
    }
    printf("  exposed: forward %.2f of the plain layer's (formula: one chunk of %d, %.2f),"
           " backward %.2f (formula: 2 chunks of %d out of 6 collectives, %.2f)\n",
           r->forward.overlap_ms / r->forward.plain_ms, s->chunks,
           r->forward.overlap_formula_ms / r->forward.plain_formula_ms,
           r->backward.overlap_ms / r->backward.plain_ms, s->chunks,
           r->backward.overlap_formula_ms / r->backward.plain_formula_ms);
}
