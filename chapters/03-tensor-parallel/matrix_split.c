/* Part 1: y = W x split across ranks by hand, and the two split linear layers that
 * Megatron builds a transformer from.
 *
 * W is [out x in]. Splitting it by ROWS gives each rank some outputs: rank r computes
 * y[rows of r] = W[rows of r, :] x in full, and an all-gather concatenates the pieces.
 * Megatron writes the same layer as Y = X A with A = W^T and calls it column-parallel
 * (A's columns are W's rows); we keep its names. Splitting W by COLUMNS (and x to
 * match) gives each rank some inputs: rank r computes the partial sum
 * W[:, cols of r] x[cols of r], a full-length y that is only a share of the answer,
 * and an all-reduce adds the shares: row-parallel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "floats.h"
#include "ops.h"
#include "rng.h"
#include "tensor_parallel.h"

static int group_size(const comm *tp) { return tp ? comm_size(tp) : 1; }

/* ---- part 1 ----------------------------------------------------------------------------- */

enum { SPLIT_ROWS = 8, SPLIT_COLS = 12 };   /* small enough to read every number */

static double allgather_bytes(comm *tp) {
    comm_stats s = comm_stats_get(tp);
    return (double)s.bytes_sent[COMM_KIND_ALLGATHER];
}

static double allreduce_bytes(comm *tp) {
    comm_stats s = comm_stats_get(tp);
    return (double)s.bytes_sent[COMM_KIND_ALLREDUCE];
}

/* The largest value of x over the group, on every rank (x is small and non-negative). */
static double group_max(comm *tp, double x) {
    float v = (float)x;
    if (group_size(tp) > 1) comm_allreduce(tp, &v, 1, COMM_F32, COMM_MAX);
    return v;
}

/* With many ranks print the first few and the last: the pattern is the same. */
static int skip_to(int r, int t) {
    if (t > 8 && r == 6) {
        printf("     ... ranks 6 to %d alike\n", t - 2);
        return t - 1;
    }
    return r;
}

static void print_vector(const char *label, const float *y, int n) {
    printf("%s[", label);
    for (int i = 0; i < n; i++) printf("%s%7.3f", i ? " " : "", y[i]);
    printf(" ]\n");
}

/* n floats on the rank's device (host memory on a CPU rank), for the ops. */
static float *device_floats(size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_OTHER, sizeof(float) * (n ? n : 1));
}

static float *device_copy(const float *host, size_t n) {
    float *d = device_floats(n);
    ops_upload(d, host, sizeof(float) * n);
    return d;
}

/* Part 1's operands: W and x made on the host (h_) and uploaded; the ops and the
 * collectives work on the device copies, and results come back to host buffers to be
 * compared and printed. */
typedef struct {
    comm *tp;
    int t, me, rows, cols, talk;
    float *h_W, *h_x, *h_y_whole, *h_y;   /* host: [rows x cols], [cols], [rows], [rows] */
    float *W, *x, *y_whole, *y;           /* device copies */
} split_demo;

static void demo_init(split_demo *d, comm *tp, const run_config *cfg) {
    *d = (split_demo){.tp = tp, .t = group_size(tp), .me = tp ? comm_rank(tp) : 0,
                      .rows = SPLIT_ROWS, .cols = SPLIT_COLS,
                      .talk = comm_world_rank(tp) == 0 && !cfg->json};
    const int rows = d->rows, cols = d->cols;
    d->h_W = mem_alloc(MEM_OTHER, sizeof(float) * rows * cols);
    d->h_x = mem_alloc(MEM_OTHER, sizeof(float) * cols);
    d->h_y_whole = mem_alloc(MEM_OTHER, sizeof(float) * rows);
    d->h_y = mem_alloc(MEM_OTHER, sizeof(float) * rows);
    for (int i = 0; i < rows * cols; i++) d->h_W[i] = rng_normal(cfg->seed, 901, i);
    for (int j = 0; j < cols; j++) d->h_x[j] = rng_normal(cfg->seed, 902, j);
    d->W = device_copy(d->h_W, (size_t)rows * cols);
    d->x = device_copy(d->h_x, cols);
    d->y_whole = device_floats(rows);
    d->y = device_floats(rows);
    linear_forward(d->y_whole, d->x, d->W, NULL, 1, cols, rows);   /* y = W x, one row */
    ops_download(d->h_y_whole, d->y_whole, sizeof(float) * rows);
}

static void demo_free(split_demo *d) {
    float *all[] = {d->y, d->y_whole, d->x, d->W, d->h_y, d->h_y_whole, d->h_x, d->h_W};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

/* a) W by rows: each rank computes its outputs in full, then all-gathers the pieces. */
static void split_by_rows(split_demo *d, split_report *out) {
    const int t = d->t, rows = d->rows, cols = d->cols;
    if (d->talk) {
        printf("Part 1. y = W x, split by hand: W is %d x %d, x has %d entries, %d ranks\n",
               rows, cols, cols, t);
        print_vector("  whole, on one rank:   y = ", d->h_y_whole, rows);
        printf("\n  a) W split by rows: each rank owns some OUTPUTS (Megatron: column-parallel,"
               " as Y = X A with A = W^T)\n");
        for (int r = 0; r < t; r++) {
            r = skip_to(r, t);
            size_t off, len = comm_shard(rows, t, r, &off);
            printf("     rank %d holds W[%zu:%zu, :] = %zu x %d = %zu floats and all of x;"
                   " computes y[%zu:%zu]\n", r, off, off + len, len, cols, len * cols, off,
                   off + len);
        }
    }
    size_t row_off, row_len = comm_shard(rows, t, d->me, &row_off);
    float *y_piece = device_floats(row_len);
    column_parallel_forward(PRECISION_FP32, y_piece, d->x, d->W + row_off * cols, NULL, 1, cols,
                            (int)row_len);
    const double before = allgather_bytes(d->tp);
    if (t > 1) comm_allgather(d->tp, y_piece, d->y, rows, COMM_F32);
    else vec_copy(d->y, y_piece, rows);
    out->bytes_gather = group_max(d->tp, allgather_bytes(d->tp) - before);
    out->formula_gather = (double)(t - 1) / t * rows * sizeof(float);
    ops_download(d->h_y, d->y, sizeof(float) * rows);
    out->diff_column = group_max(d->tp, max_abs_diff(d->h_y, d->h_y_whole, rows));
    if (d->talk) {
        printf("     all-gather y: %.0f bytes sent per rank (ring: (t-1)/t x %d floats x 4 B"
               " = %.0f)\n", out->bytes_gather, rows, out->formula_gather);
        print_vector("     gathered y = ", d->h_y, rows);
        printf("     largest difference from the whole product: %.2e (each y[i] is the"
               " very same dot product)\n", out->diff_column);
    }
    mem_free(y_piece);
}

static void print_column_shares(const split_demo *d, const float *h_partial,
                                const split_report *out) {
    const int t = d->t, rows = d->rows;
    printf("\n  b) W split by columns and x to match: each rank owns some INPUTS"
           " (row-parallel)\n");
    for (int r = 0; r < t; r++) {
        r = skip_to(r, t);
        size_t off, len = comm_shard(d->cols, t, r, &off);
        char label[160];
        snprintf(label, sizeof label, "     rank %d holds W[:, %zu:%zu] = %d x %zu floats"
                 " and x[%zu:%zu]; its share of y = ", r, off, off + len, rows, len, off,
                 off + len);
        print_vector(label, h_partial + (size_t)r * rows, rows);
    }
    printf("     all-reduce (sum) y: %.0f bytes sent per rank (ring: 2(t-1)/t x %d floats"
           " x 4 B = %.0f)\n", out->bytes_reduce, rows, out->formula_reduce);
    print_vector("     summed y   = ", d->h_y, rows);
    printf("     largest difference from the whole product: %.2e (the same products,"
           " added in another order)\n\n", out->diff_row);
    fflush(stdout);
}

/* b) W by columns and x to match: each rank a partial y of full length, then an
 * all-reduce adds the shares. */
static void split_by_columns(split_demo *d, split_report *out) {
    const int t = d->t, rows = d->rows, cols = d->cols;
    size_t col_off, col_len = comm_shard(cols, t, d->me, &col_off);
    float *h_W_cols = mem_alloc(MEM_OTHER, sizeof(float) * rows * (col_len ? col_len : 1));
    for (int i = 0; i < rows; i++)
        memcpy(h_W_cols + i * col_len, d->h_W + (size_t)i * cols + col_off,
               col_len * sizeof(float));
    float *W_cols = device_copy(h_W_cols, (size_t)rows * col_len);
    float *partial = device_floats((size_t)rows * t);
    float *h_partial = mem_alloc(MEM_OTHER, sizeof(float) * rows * t);
    /* the shares themselves, to print them (this gather is not part of the method) */
    if (col_len > 0) linear_forward(d->y, d->x + col_off, W_cols, NULL, 1, (int)col_len, rows);
    else vec_zero(d->y, rows);
    if (t > 1) comm_allgather(d->tp, d->y, partial, (size_t)rows * t, COMM_F32);
    else vec_copy(partial, d->y, rows);
    ops_download(h_partial, partial, sizeof(float) * rows * t);
    const double before = allreduce_bytes(d->tp);
    row_parallel_forward(d->tp, PRECISION_FP32, d->y, d->x + col_off, W_cols, NULL, 1,
                         (int)col_len, rows);
    out->bytes_reduce = group_max(d->tp, allreduce_bytes(d->tp) - before);
    out->formula_reduce = 2.0 * (t - 1) / t * rows * sizeof(float);
    ops_download(d->h_y, d->y, sizeof(float) * rows);
    out->diff_row = group_max(d->tp, max_abs_diff(d->h_y, d->h_y_whole, rows));
    if (d->talk) print_column_shares(d, h_partial, out);
    float *all[] = {partial, W_cols, h_partial, h_W_cols};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

void part1_matrix_split(comm *tp, const run_config *cfg, split_report *out) {
    split_demo d;
    demo_init(&d, tp, cfg);
    out->rows = d.rows;
    out->cols = d.cols;
    split_by_rows(&d, out);
    split_by_columns(&d, out);
    demo_free(&d);
}
