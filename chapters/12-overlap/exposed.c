/* TP's collective matmul layer by layer: the four edges of a block's sequence-parallel
 * region (qkv and fc after an all-gather, proj and fc2 before a reduce-scatter) run on
 * a modelled two-tier network, without chunks and with them. Exposed communication is
 * what the rank spent blocked on the SP group's all-gathers and reduce-scatters (comm
 * statistics), per layer, the slowest rank's.
 *
 * The formula, alpha-beta on the tier the group's ring crosses (its slowest link gates
 * every step): a collective of P = B T / t x C elements per rank takes t - 1 steps of
 * alpha + (P / n) e / beta for a chunk of n; without overlap all of a layer's four are
 * exposed (n = 1); with it, one chunk of each: the first all-gather (the products wait
 * for it) and the last reduce-scatter (nothing is left to hide it), as long as a
 * chunk's product takes at least as long as a chunk's collective, which the layer
 * times printed beside them show. */
#include "overlap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "tp_overlap.h"
#include "tp_sequence.h"

typedef struct {
    const exposed_setup *s;
    double exposed[2], layer[2];   /* per layer, slowest rank: plain, overlapped */
} exposed_job;

typedef struct {
    void *inp_rows, *out_rows, *wide, *narrow;   /* [R, C], [R, C], [N, 4C/t], [N, C/t] */
    void *w_qkv, *w_proj, *w_fc, *w_fc2, *b_qkv, *b_fc, *bias;
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
        .b_qkv = filled(p, 3 * C / t, 0), .b_fc = filled(p, 4 * C / t, 0), .bias = filled(p, C, 0)};
}

static void buffers_free(layer_buffers *b) {
    void *all[] = {b->inp_rows, b->out_rows, b->wide, b->narrow, b->w_qkv, b->w_proj,
                   b->w_fc, b->w_fc2, b->b_qkv, b->b_fc, b->bias};
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

/* Layers timed with `chunks` (0: plain SP): exposed and whole seconds of the best
 * layer (the model is a floor: a busy machine only adds time); exposed on the rank
 * blocked least (the last to arrive, which waits for the wire alone, not for a peer
 * held up by a busy machine: chapter 7's comm_seconds_least), whole on the slowest. */
static void time_layers(comm *world, tp_sequence *sp, const exposed_setup *s,
                        layer_buffers *b, int chunks, double out[2]) {
    tp_sequence_overlap(sp)->model_flops = 0;   /* warm-up: first touches, unmodelled */
    tp_sequence_set_overlap(sp, chunks, 0);
    layer(sp, world, s, b);
    tp_sequence_overlap(sp)->model_flops = s->model_flops;
    double mine[2] = {1e30, 1e30};
    for (int l = 0; l < s->layers; l++) {
        comm_barrier(world);
        const double before = comm_so_far(world), t0 = comm_now();
        layer(sp, world, s, b);
        const double whole = comm_now() - t0, exposed = comm_so_far(world) - before;
        if (exposed < mine[0]) mine[0] = exposed;
        if (whole < mine[1]) mine[1] = whole;
    }
    mine[0] = -mine[0];   /* the largest of minus: the least */
    comm_allreduce(world, mine, 2, COMM_F64, COMM_MAX);
    out[0] = -mine[0];
    out[1] = mine[1];
}

static int exposed_rank(comm *world, void *arg) {
    exposed_job *job = arg;
    const exposed_setup *s = job->s;
    const gpt_config cfg = {.vocab = 256, .ctx = s->T, .layers = 1, .heads = s->t, .dim = s->C};
    const gpt_shape shape = gpt_shape_make(&cfg, s->t, comm_rank(world));
    tp_sequence *sp = tp_sequence_create(&shape, world, s->p, s->B, s->T, 0);
    layer_buffers b;
    buffers_alloc(s, &b);
    double plain[2], chunked[2];
    time_layers(world, sp, s, &b, 0, plain);
    time_layers(world, sp, s, &b, s->chunks, chunked);
    if (comm_rank(world) == 0)
        *job = (exposed_job){s, {plain[0], chunked[0]}, {plain[1], chunked[1]}};
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
    *out = (exposed_result){.plain_ms = 1e3 * job.exposed[0], .overlap_ms = 1e3 * job.exposed[1],
                            .plain_formula_ms = 1e3 * exposed_formula_seconds(s, 1),
                            .overlap_formula_ms = 1e3 * exposed_formula_seconds(s, s->chunks),
                            .layer_ms = {1e3 * job.layer[0], 1e3 * job.layer[1]},
                            .tier = ring_tier(s)};
    return status;
}

int exposed_within(const exposed_result *r, double band) {
    return fabs(r->plain_ms / r->plain_formula_ms - 1) <= band &&
           fabs(r->overlap_ms / r->overlap_formula_ms - 1) <= band;
}

int exposed_at_least(const exposed_result *r, double band) {
    return r->plain_ms >= (1 - band) * r->plain_formula_ms &&
           r->overlap_ms >= (1 - band) * r->overlap_formula_ms;
}

void exposed_print(const exposed_setup *s, const exposed_result *r) {
    const comm_link link = comm_tier_link(&s->comm, r->tier);
    printf("\nTP's collective matmul, one block's four SP edges (tp %d, %d x %d rows of %d,"
           " %s, ring on %s x %g; compute modelled at %.3g GFLOP/s a rank):\n", s->t, s->B,
           s->T, s->C, precision_name(s->p), comm_link_spec(link).title,
           s->comm.link_scale > 0 ? s->comm.link_scale : 1, 1e-9 * s->model_flops);
    printf("  %-22s %14s %14s %8s %14s\n", "", "exposed ms", "alpha-beta ms", "off",
           "layer ms");
    printf("  %-22s %14.3f %14.3f %7.1f%% %14.3f\n", "no overlap", r->plain_ms,
           r->plain_formula_ms, 100 * (r->plain_ms / r->plain_formula_ms - 1), r->layer_ms[0]);
    char name[32];
    snprintf(name, sizeof name, "%d chunks", s->chunks);
    printf("  %-22s %14.3f %14.3f %7.1f%% %14.3f\n", name, r->overlap_ms,
           r->overlap_formula_ms, 100 * (r->overlap_ms / r->overlap_formula_ms - 1),
           r->layer_ms[1]);
    printf("  exposed: %.2f of the plain layer's (formula: one chunk of %d, %.2f)\n",
           r->overlap_ms / r->plain_ms, s->chunks, r->overlap_formula_ms / r->plain_formula_ms);
}
