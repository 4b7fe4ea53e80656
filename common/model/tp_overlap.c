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

/* out rows of chunk k (read from chunk `from`'s region: k itself unless swapped). */
static void column_product(const tp_overlap *o, int k, int from, void *out_local,
                           const void *w_local, const void *b_local, int IC, int OC_local) {
    size_t j0, j1, f0, f1;
    chunk_rows(o, k, &j0, &j1);
    chunk_rows(o, from, &f0, &f1);
    const size_t t = (size_t)o->t, rows = f1 - f0;
    const double t0 = comm_now();
    for (int r = 0; r < o->t; r++)
        for (size_t j = j0, g; j < j1;) {
            const size_t len = run_length(o, j, j1, &g, r), at = j - j0;
            if (at + len > rows) break;   /* swapped into a shorter chunk: rows left out */
            const void *in = precision_at(o->p, o->gathered,
                                          (t * f0 + (size_t)r * rows + at) * (size_t)IC);
            column_parallel_forward(o->p, precision_at(o->p, out_local, g * (size_t)OC_local),
                                    in, w_local, b_local, (int)len, IC, OC_local);
            j += len;
        }
    tp_overlap_hold(o, t0, 2.0 * (double)(t * (j1 - j0)) * IC * OC_local);
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
    size_t j0, j1;
    chunk_rows(o, k, &j0, &j1);
    const size_t t = (size_t)o->t, rows = j1 - j0;
    const double t0 = comm_now();
    for (int r = 0; r < o->t; r++)
        for (size_t j = j0, g; j < j1;) {
            const size_t len = run_length(o, j, j1, &g, r);
            void *dst = precision_at(o->p, o->partial, (t * j0 + (size_t)r * rows + j - j0) * OC);
            mixed_linear_forward(o->p, dst, precision_at(o->p, (void *)inp_local, g * IC_local),
                                 w_local, o->rank == 0 ? bias : NULL, (int)len, IC_local, OC);
            j += len;
        }
    tp_overlap_hold(o, t0, 2.0 * (double)(t * rows) * IC_local * OC);
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
