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

void part1_matrix_split(comm *tp, const run_config *cfg, split_report *out) {
    const int t = group_size(tp), me = tp ? comm_rank(tp) : 0;
    const int rows = SPLIT_ROWS, cols = SPLIT_COLS;
    const int talk = comm_world_rank(tp) == 0 && !cfg->json;
    /* W and x are made on the host (h_) and uploaded; the ops and the collectives work
     * on the device copies (no prefix), and results come back to host buffers to be
     * compared and printed */
    float *h_W = mem_alloc(MEM_OTHER, sizeof(float) * rows * cols);
    float *h_x = mem_alloc(MEM_OTHER, sizeof(float) * cols);
    float *h_y_whole = mem_alloc(MEM_OTHER, sizeof(float) * rows);
    float *h_y = mem_alloc(MEM_OTHER, sizeof(float) * rows);
    for (int i = 0; i < rows * cols; i++) h_W[i] = rng_normal(cfg->seed, 901, i);
    for (int j = 0; j < cols; j++) h_x[j] = rng_normal(cfg->seed, 902, j);
    float *W = device_copy(h_W, (size_t)rows * cols), *x = device_copy(h_x, cols);
    float *y_whole = device_floats(rows), *y = device_floats(rows);
    linear_forward(y_whole, x, W, NULL, 1, cols, rows);   /* y = W x, one row of inputs */
    ops_download(h_y_whole, y_whole, sizeof(float) * rows);

    out->rows = rows;
    out->cols = cols;
    if (talk) {
        printf("Part 1. y = W x, split by hand: W is %d x %d, x has %d entries, %d ranks\n",
               rows, cols, cols, t);
        print_vector("  whole, on one rank:   y = ", h_y_whole, rows);
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

    /* a) by rows: my outputs in full, then all-gather the pieces */
    size_t row_off, row_len = comm_shard(rows, t, me, &row_off);
    float *y_piece = device_floats(row_len);
    column_parallel_forward(y_piece, x, W + row_off * cols, NULL, 1, cols, (int)row_len);
    double before = allgather_bytes(tp);
    if (t > 1) comm_allgather(tp, y_piece, y, rows, COMM_F32);
    else vec_copy(y, y_piece, rows);
    out->bytes_gather = group_max(tp, allgather_bytes(tp) - before);
    out->formula_gather = (double)(t - 1) / t * rows * sizeof(float);
    ops_download(h_y, y, sizeof(float) * rows);
    out->diff_column = group_max(tp, max_abs_diff(h_y, h_y_whole, rows));
    if (talk) {
        printf("     all-gather y: %.0f bytes sent per rank (ring: (t-1)/t x %d floats x 4 B"
               " = %.0f)\n", out->bytes_gather, rows, out->formula_gather);
        print_vector("     gathered y = ", h_y, rows);
        printf("     largest difference from the whole product: %.2e (each y[i] is the"
               " very same dot product)\n", out->diff_column);
    }

    /* b) by columns: my inputs, a partial y of full length, then all-reduce the shares */
    size_t col_off, col_len = comm_shard(cols, t, me, &col_off);
    float *h_W_cols = mem_alloc(MEM_OTHER, sizeof(float) * rows * (col_len ? col_len : 1));
    for (int i = 0; i < rows; i++)
        memcpy(h_W_cols + i * col_len, h_W + (size_t)i * cols + col_off,
               col_len * sizeof(float));
    float *W_cols = device_copy(h_W_cols, (size_t)rows * col_len);
    float *partial = device_floats((size_t)rows * t);
    float *h_partial = mem_alloc(MEM_OTHER, sizeof(float) * rows * t);
    /* the shares themselves, to print them (this gather is not part of the method) */
    if (col_len > 0) linear_forward(y, x + col_off, W_cols, NULL, 1, (int)col_len, rows);
    else vec_zero(y, rows);
    if (t > 1) comm_allgather(tp, y, partial, (size_t)rows * t, COMM_F32);
    else vec_copy(partial, y, rows);
    ops_download(h_partial, partial, sizeof(float) * rows * t);
    before = allreduce_bytes(tp);
    row_parallel_forward(tp, y, x + col_off, W_cols, NULL, 1, (int)col_len, rows);
    out->bytes_reduce = group_max(tp, allreduce_bytes(tp) - before);
    out->formula_reduce = 2.0 * (t - 1) / t * rows * sizeof(float);
    ops_download(h_y, y, sizeof(float) * rows);
    out->diff_row = group_max(tp, max_abs_diff(h_y, h_y_whole, rows));
    if (talk) {
        printf("\n  b) W split by columns and x to match: each rank owns some INPUTS"
               " (row-parallel)\n");
        for (int r = 0; r < t; r++) {
            r = skip_to(r, t);
            size_t off, len = comm_shard(cols, t, r, &off);
            char label[160];
            snprintf(label, sizeof label, "     rank %d holds W[:, %zu:%zu] = %d x %zu floats"
                     " and x[%zu:%zu]; its share of y = ", r, off, off + len, rows, len, off,
                     off + len);
            print_vector(label, h_partial + (size_t)r * rows, rows);
        }
        printf("     all-reduce (sum) y: %.0f bytes sent per rank (ring: 2(t-1)/t x %d floats"
               " x 4 B = %.0f)\n", out->bytes_reduce, rows, out->formula_reduce);
        print_vector("     summed y   = ", h_y, rows);
        printf("     largest difference from the whole product: %.2e (the same products,"
               " added in another order)\n\n", out->diff_row);
        fflush(stdout);
    }
    float *all[] = {partial, W_cols, y_piece, y, y_whole, x, W,
                    h_partial, h_W_cols, h_y, h_y_whole, h_x, h_W};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}
