/* Collective matmuls: SP's all-gather + column-parallel product and row-parallel
 * product + reduce-scatter in chunks, each chunk's product beside the next chunk's
 * collective (tp_overlap.h). */
#include "tp_overlap.h"

#include <stdio.h>
#include <time.h>

#include "ops_mixed.h"
#include "tp_linear.h"

const char *tp_overlap_check(int chunks, int T, int t, char *why, size_t len) {
    const long positions = t > 0 ? (long)T / t : 0;
    if (chunks >= 1 && chunks <= positions) return NULL;
    snprintf(why, len, "%d chunks: a rank holds %ld positions of each sequence (--ctx %d /"
             " tp %d); valid: 1 to %ld chunks", chunks, positions, T, t, positions);
    return why;
}

void tp_overlap_hold(const tp_overlap *o, double t0, double flops) {
    if (o->model_flops <= 0) return;
    const double until = t0 + flops / o->model_flops;
    if (until <= comm_now()) return;
    struct timespec ts = {.tv_sec = (time_t)until, .tv_nsec = (long)((until - (time_t)until) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {}
}

/* Rows [j0, j1) of every rank's part: chunk k of n. */
static void chunk_rows(const tp_overlap *o, int k, size_t *j0, size_t *j1) {
    const size_t R = (size_t)o->B * o->T / o->t;
    *j0 = R * (size_t)k / (size_t)o->chunks;
    *j1 = R * (size_t)(k + 1) / (size_t)o->chunks;
}

/* One run of rank r's local rows [j, j + len) that are consecutive positions of one
 * sequence: where they sit in the whole [B, T] order. */
static size_t run_length(const tp_overlap *o, size_t j, size_t j1, size_t *global_row,
                         int r) {
    const size_t Tl = (size_t)o->T / o->t, b = j / Tl, pos = j % Tl;
    const size_t end = (b + 1) * Tl < j1 ? (b + 1) * Tl : j1;
    *global_row = b * (size_t)o->T + (size_t)r * Tl + pos;
    return end - j;
}

/* ---- column: gather chunk k+1 while chunk k's product runs --------------------------- */
static comm_request *gather_start(const tp_overlap *o, int k, const void *inp_rows) {
    size_t j0, j1;
    chunk_rows(o, k, &j0, &j1);
    const size_t C = (size_t)o->C, t = (size_t)o->t;
    return comm_allgather_start(o->tp, precision_at(o->p, (void *)inp_rows, j0 * C),
                                precision_at(o->p, o->gathered, t * j0 * C),
                                t * (j1 - j0) * C, comm_dtype_of(o->p));
}

/* ---- runs: a chunk's rows, rank-major in its region and where they sit in [B, T] ---- */
typedef struct {
    void *out;
    const void *in, *w, *b;
    int IC, OC;
} run_args;
/* Rows [rm, rm + len) of the rank-major buffers are rows [g, g + len) of [B, T]. */
typedef void (*run_visit)(const tp_overlap *o, const run_args *a, size_t rm, size_t g,
                          size_t len);

/* Every run of chunk k's rows, rank-major positions read from chunk `from`'s region (k
 * itself unless swapped; a shorter chunk: the rows that fit). */
static void each_run(const tp_overlap *o, int k, int from, run_visit visit, const run_args *a) {
    size_t j0, j1, f0, f1;
    chunk_rows(o, k, &j0, &j1);
    chunk_rows(o, from, &f0, &f1);
    const size_t t = (size_t)o->t, rows = f1 - f0;
    for (int r = 0; r < o->t; r++)
        for (size_t j = j0, g; j < j1;) {
            const size_t len = run_length(o, j, j1, &g, r), at = j - j0;
            if (at + len > rows) break;   /* swapped into a shorter chunk: rows left out */
            visit(o, a, t * f0 + (size_t)r * rows + at, g, len);
            j += len;
        }
}

/* FLOPs of a product of chunk k's rows (every rank's) by an [OC, IC] weight. */
static double chunk_flops(const tp_overlap *o, int k, int IC, int OC) {
    size_t j0, j1;
    chunk_rows(o, k, &j0, &j1);
    return 2.0 * (double)((size_t)o->t * (j1 - j0)) * IC * OC;
}

static void *row_at(const tp_overlap *o, const void *x, size_t row, int width) {
    return precision_at(o->p, (void *)x, row * (size_t)width);
}

/* column forward: out[g] = gathered[rm] @ w^T + b */
static void column_forward_run(const tp_overlap *o, const run_args *a, size_t rm, size_t g,
                               size_t len) {
    column_parallel_forward(o->p, row_at(o, a->out, g, a->OC), row_at(o, o->gathered, rm, a->IC),
                            a->w, a->b, (int)len, a->IC, a->OC);
}

/* row forward: partial[rm] = in[g] @ w^T, the bias on tp rank 0 */
static void row_forward_run(const tp_overlap *o, const run_args *a, size_t rm, size_t g,
                            size_t len) {
    mixed_linear_forward(o->p, row_at(o, o->partial, rm, a->OC), row_at(o, a->in, g, a->IC),
                         a->w, o->rank == 0 ? a->b : NULL, (int)len, a->IC, a->OC);
}

/* row backward: out[g] = gathered dY[rm] @ w (w [OC, IC]) */
static void row_dinp_run(const tp_overlap *o, const run_args *a, size_t rm, size_t g,
                         size_t len) {
    mixed_linear_backward(o->p, row_at(o, a->out, g, a->IC), NULL, NULL,
                          row_at(o, o->gathered, rm, a->OC), NULL, a->w, (int)len, a->IC, a->OC);
}

/* column backward: partial[rm] = dout[g] @ w (w [OC, IC]) */
static void column_dinp_run(const tp_overlap *o, const run_args *a, size_t rm, size_t g,
                            size_t len) {
    mixed_linear_backward(o->p, row_at(o, o->partial, rm, a->IC), NULL, NULL,
                          row_at(o, a->in, g, a->OC), NULL, a->w, (int)len, a->IC, a->OC);
}

/* out[g] = gathered[rm], rows of C: back into sequence order */
static void to_sequence_run(const tp_overlap *o, const run_args *a, size_t rm, size_t g,
                            size_t len) {
    mixed_vec_copy(o->p, row_at(o, a->out, g, o->C), row_at(o, o->gathered, rm, o->C),
                   len * (size_t)o->C);
}

/* out rows of chunk k (read from chunk `from`'s region: k itself unless swapped). */
static void column_product(const tp_overlap *o, int k, int from, void *out_local,
                           const void *w_local, const void *b_local, int IC, int OC_local) {
    const double t0 = comm_now();
    const run_args a = {.out = out_local, .w = w_local, .b = b_local, .IC = IC, .OC = OC_local};
    each_run(o, k, from, column_forward_run, &a);
    tp_overlap_hold(o, t0, chunk_flops(o, k, IC, OC_local));
}

void tp_overlap_column_forward(const tp_overlap *o, void *out_local, const void *inp_rows,
                               const void *w_local, const void *b_local, int IC,
                               int OC_local) {
    const int n = o->chunks;
    comm_request *next = gather_start(o, 0, inp_rows);
    for (int k = 0; k < n; k++) {
        comm_request *mine = next;
        if (o->control != TP_OVERLAP_EARLY) comm_wait(mine);
        next = k + 1 < n ? gather_start(o, k + 1, inp_rows) : NULL;
        const int from = o->control == TP_OVERLAP_SWAPPED ? n - 1 - k : k;
        column_product(o, k, from, out_local, w_local, b_local, IC, OC_local);
        if (o->control == TP_OVERLAP_EARLY) comm_wait(mine);   /* too late: the bug */
    }
}

/* ---- row: reduce-scatter chunk k while chunk k+1's product runs ---------------------- */
/* Chunk k's partial products, rank-major [t][R_k, OC] in its region of `partial`. */
static void row_product(const tp_overlap *o, int k, const void *inp_local,
                        const void *w_local, const void *bias, int IC_local, int OC) {
    const double t0 = comm_now();
    const run_args a = {.in = inp_local, .w = w_local, .b = bias, .IC = IC_local, .OC = OC};
    each_run(o, k, k, row_forward_run, &a);
    tp_overlap_hold(o, t0, chunk_flops(o, k, IC_local, OC));
}

/* Chunk k's reduce-scatter: its partial products into this rank's rows of chunk `to`
 * (k itself unless swapped; a shorter chunk takes what fits). */
static comm_request *scatter_start(const tp_overlap *o, int k, int to, void *out_rows,
                                   int OC) {
    size_t j0, j1, d0, d1;
    chunk_rows(o, k, &j0, &j1);
    chunk_rows(o, to, &d0, &d1);
    const size_t t = (size_t)o->t, rows = d1 - d0 < j1 - j0 ? d1 - d0 : j1 - j0;
    return comm_reduce_scatter_start(o->tp, precision_at(o->p, o->partial, t * j0 * OC),
                                     precision_at(o->p, out_rows, d0 * OC), t * rows * OC,
                                     comm_dtype_of(o->p), COMM_SUM);
}

void tp_overlap_row_forward(const tp_overlap *o, void *out_rows, const void *inp_local,
                            const void *w_local, const void *bias, int IC_local, int OC) {
    const int n = o->chunks;
    comm_request *flying[n];   /* started in order, completed in order */
    for (int k = 0; k < n; k++) {
        const int to = o->control == TP_OVERLAP_SWAPPED ? n - 1 - k : k;
        if (o->control == TP_OVERLAP_EARLY)   /* the bug: sent before it is computed */
            flying[k] = scatter_start(o, k, to, out_rows, OC);
        row_product(o, k, inp_local, w_local, bias, IC_local, OC);
        if (o->control != TP_OVERLAP_EARLY) flying[k] = scatter_start(o, k, to, out_rows, OC);
    }
    for (int k = 0; k < n; k++) comm_wait(flying[k]);
}

/* ---- backward ----------------------------------------------------------------------- */
static int early_backward(const tp_overlap *o) {
    return o->control == TP_OVERLAP_EARLY || o->control == TP_OVERLAP_EARLY_BACKWARD;
}

static int backward_source(const tp_overlap *o, int k) {
    const int swapped = o->control == TP_OVERLAP_SWAPPED ||
                        o->control == TP_OVERLAP_SWAPPED_BACKWARD;
    return swapped ? o->chunks - 1 - k : k;
}

void tp_overlap_row_backward(const tp_overlap *o, void *dinp_local, float *dw, float *db,
                             const void *dout_rows, const void *inp_local,
                             const void *w_local, int IC_local, int OC) {
    const int n = o->chunks, N = o->B * o->T;
    const run_args dinp = {.out = dinp_local, .w = w_local, .IC = IC_local, .OC = OC};
    const run_args sequence = {.out = o->partial};
    comm_request *next = gather_start(o, 0, dout_rows);
    for (int k = 0; k < n; k++) {
        comm_request *mine = next;
        if (!early_backward(o)) comm_wait(mine);
        next = k + 1 < n ? gather_start(o, k + 1, dout_rows) : NULL;
        if (dinp_local) {   /* chunk k's rows of dX while chunk k+1 is on the wire */
            const double t0 = comm_now();
            each_run(o, k, backward_source(o, k), row_dinp_run, &dinp);
            tp_overlap_hold(o, t0, chunk_flops(o, k, IC_local, OC));
        }
        if (early_backward(o)) comm_wait(mine);   /* too late: the bug */
        each_run(o, k, k, to_sequence_run, &sequence);
    }
    /* dW and db over every row at once: the plain layer's sums, in its order */
    const double t0 = comm_now();
    row_parallel_backward(o->p, NULL, dw, db, o->partial, inp_local, w_local, N, IC_local, OC);
    if (dw) tp_overlap_hold(o, t0, 2.0 * N * IC_local * OC);
}

void tp_overlap_column_backward(const tp_overlap *o, void *dinp_rows, float *dw, float *db,
                                const void *dout_local, const void *inp_rows,
                                const void *w_local, int IC, int OC_local) {
    const int n = o->chunks, N = o->B * o->T;
    const run_args dinp = {.in = dout_local, .w = w_local, .IC = IC, .OC = OC_local};
    const run_args sequence = {.out = o->sequence};
    comm_request *flying[n], *next = dw ? gather_start(o, 0, inp_rows) : NULL;
    for (int k = 0; k < n; k++) {
        if (dinp_rows) {   /* hides chunk k's gather (and the reduce-scatters before) */
            const double t0 = comm_now();
            each_run(o, k, k, column_dinp_run, &dinp);
            tp_overlap_hold(o, t0, chunk_flops(o, k, IC, OC_local));
        }
        if (dw) {   /* chunk k of the input, in sequence order for dW */
            comm_request *mine = next;
            if (!early_backward(o)) comm_wait(mine);
            each_run(o, k, backward_source(o, k), to_sequence_run, &sequence);
            if (early_backward(o)) comm_wait(mine);   /* too late: the bug */
            next = k + 1 < n ? gather_start(o, k + 1, inp_rows) : NULL;
        }
        if (dinp_rows) flying[k] = scatter_start(o, k, k, dinp_rows, IC);
    }
    /* dW and db over every row at once (the plain layer's sums), under the last
     * reduce-scatters */
    const double t0 = comm_now();
    if (dw || db)
        mixed_linear_backward(o->p, NULL, dw, db, dout_local, o->sequence, w_local, N, IC,
                              OC_local);
    if (dw) tp_overlap_hold(o, t0, 2.0 * N * IC * OC_local);
    for (int k = 0; k < n && dinp_rows; k++) comm_wait(flying[k]);
}
