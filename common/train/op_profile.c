#include "op_profile.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "device.h"
#include "rng.h"

/* ---- watching ------------------------------------------------------------------- */

static void on_begin(void *ctx, op_kind kind) {
    op_profile *p = ctx;
    p->kind_in_flight = kind;   /* ops do not nest: the products inside are its */
    p->op_start = comm_now();
}

static void on_end(void *ctx, op_kind kind) {
    op_profile *p = ctx;
    if (p->on_gpu) ops_synchronize();   /* the op's time, not its launch's */
    p->seconds[kind] += comm_now() - p->op_start;
    p->calls[kind] += 1;
}

static void on_traffic(void *ctx, op_kind kind, double bytes) {
    ((op_profile *)ctx)->bytes[kind] += bytes;
}

static void note_shape(op_profile *p, op_kind kind, int ta, int tb, int M, int N, int K) {
    for (int i = 0; i < p->num_shapes; i++) {
        gemm_shape *s = &p->shapes[i];
        if (s->kind == kind && s->trans_a == ta && s->trans_b == tb && s->M == M &&
            s->N == N && s->K == K) {
            s->calls += 1;
            return;
        }
    }
    if (p->num_shapes == PROFILE_MAX_SHAPES) {
        p->unlisted_gemm_flops += 2.0 * M * N * K;
        return;
    }
    p->shapes[p->num_shapes++] =
        (gemm_shape){.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K, .kind = kind,
                     .calls = 1};
}

static void on_gemm_begin(void *ctx, int ta, int tb, int M, int N, int K) {
    op_profile *p = ctx;
    note_shape(p, p->kind_in_flight, ta, tb, M, N, K);
    p->gemm_flops[p->kind_in_flight] += 2.0 * M * N * K;
    p->gemm_start = comm_now();
}

static void on_gemm_end(void *ctx) {
    op_profile *p = ctx;
    p->gemm_seconds[p->kind_in_flight] += comm_now() - p->gemm_start;
}

void op_profile_clear(op_profile *p) {
    const ops_observer observer = p->observer;
    const int on_gpu = p->on_gpu;
    memset(p, 0, sizeof *p);
    p->observer = observer;
    p->on_gpu = on_gpu;
}

void op_profile_start(op_profile *p) {
    memset(p, 0, sizeof *p);
    p->on_gpu = device_current() != DEVICE_CPU;
    p->observer = (ops_observer){.begin = on_begin, .end = on_end, .traffic = on_traffic,
                                 .gemm_begin = on_gemm_begin, .gemm_end = on_gemm_end,
                                 .ctx = p};
    ops_profile(&p->observer);
}

void op_profile_stop(op_profile *p) {
    (void)p;
    ops_profile(NULL);
}

/* ---- the floor ---------------------------------------------------------------------- */

/* Operands with the bits of real data. The values matter to the time: on zeros, the same
 * sgemm measured 1-5% faster here (the multipliers switch less, and the core clocks
 * higher), which would set the floor below what any step can reach. */
static void fill_like_activations(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)   /* uniform in (-1, 1) */
        x[i] = (float)(2.0 * rng_uniform(12345, 0, i) - 1.0);
}

/* Best time of one cblas_sgemm at shape s, packed operands, over a few tries. */
static double best_sgemm_seconds(const gemm_shape *s, float *a, float *b, float *c) {
    const int lda = s->trans_a ? s->M : s->K, ldb = s->trans_b ? s->K : s->N;
    const enum CBLAS_TRANSPOSE ta = s->trans_a ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE tb = s->trans_b ? CblasTrans : CblasNoTrans;
    /* enough repeats for about a millisecond per try */
    const double flops = 2.0 * s->M * s->N * s->K;
    const int repeats = flops > 2e7 ? 1 : (int)(2e7 / (flops + 1.0)) + 1;
    /* the best of several: on a shared machine one try in a few is slowed by others
     * (with the best of 2, floors of one run were seen 50% high); big ones fewer, as
     * the floor costs steps */
    const int attempts = flops > 2e8 ? 5 : 6;
    double best = 1e30;
    for (int attempt = 0; attempt < attempts; attempt++) {
        const double start = comm_now();
        for (int r = 0; r < repeats; r++)
            cblas_sgemm(CblasRowMajor, ta, tb, s->M, s->N, s->K, 1.0f, a, lda, b, ldb, 1.0f,
                        c, s->N);
        const double each = (comm_now() - start) / repeats;
        if (attempt > 0 && each < best) best = each;   /* the first warms the caches */
    }
    return best;
}

double op_profile_sgemm_floor(const op_profile *p, double by_kind[OP_KINDS]) {
    size_t most_a = 1, most_b = 1, most_c = 1;
    for (int i = 0; i < p->num_shapes; i++) {
        const gemm_shape *s = &p->shapes[i];
        size_t a = (size_t)s->M * s->K, b = (size_t)s->K * s->N, c = (size_t)s->M * s->N;
        most_a = a > most_a ? a : most_a;
        most_b = b > most_b ? b : most_b;
        most_c = c > most_c ? c : most_c;
    }
    float *a = mem_alloc(MEM_OTHER, most_a * sizeof(float));
    float *b = mem_alloc(MEM_OTHER, most_b * sizeof(float));
    float *c = mem_alloc(MEM_OTHER, most_c * sizeof(float));
    fill_like_activations(a, most_a);
    fill_like_activations(b, most_b);
    if (by_kind) memset(by_kind, 0, OP_KINDS * sizeof(double));
    double floor = 0.0;
    for (int i = 0; i < p->num_shapes; i++) {
        const double t = p->shapes[i].calls * best_sgemm_seconds(&p->shapes[i], a, b, c);
        floor += t;
        if (by_kind) by_kind[p->shapes[i].kind] += t;
    }
    mem_free(a);
    mem_free(b);
    mem_free(c);
    return floor;
}

/* ---- the table ---------------------------------------------------------------------- */

/* A row is a whole op kind, or the sgemm part of one, or the rest of it (what the op
 * does around its products: bias, softmax and mask). */
typedef enum { PART_WHOLE, PART_SGEMM, PART_REST } row_part;
typedef struct {
    const char *name;
    op_kind kind;
    row_part part;
} row_def;

static const row_def rows[] = {
    {"linear fwd: sgemm", OP_LINEAR_FORWARD, PART_SGEMM},
    {"linear fwd: bias", OP_LINEAR_FORWARD, PART_REST},
    {"linear bwd: sgemm", OP_LINEAR_BACKWARD, PART_SGEMM},
    {"linear bwd: bias sums", OP_LINEAR_BACKWARD, PART_REST},
    {"attention fwd: sgemm", OP_ATTENTION_FORWARD, PART_SGEMM},
    {"attention fwd: softmax", OP_ATTENTION_FORWARD, PART_REST},
    {"attention bwd: sgemm", OP_ATTENTION_BACKWARD, PART_SGEMM},
    {"attention bwd: softmax", OP_ATTENTION_BACKWARD, PART_REST},
    {"layernorm", OP_LAYERNORM, PART_WHOLE},
    {"gelu", OP_GELU, PART_WHOLE},
    {"residual add", OP_RESIDUAL, PART_WHOLE},
    {"cross-entropy", OP_CROSSENTROPY, PART_WHOLE},
    {"adamw", OP_ADAMW, PART_WHOLE},
    {"embedding", OP_EMBEDDING, PART_WHOLE},
    {"copy, zero, scale, sum", OP_VECTOR, PART_WHOLE},
    {"host <-> device", OP_TRANSFER, PART_WHOLE},
};
#define OP_ROWS ((int)(sizeof rows / sizeof rows[0]))
/* then two rows that are not ops: blocked in communication, and outside every op */
#define ROWS (OP_ROWS + 2)
/* per row: seconds, calls, work (FLOPs or bytes), sgemm floor seconds; then the step,
 * its floor and the fastest step */
#define ROW_VALUES 4
#define RANK_VALUES (ROWS * ROW_VALUES + 3)

/* This rank's values, per timed step: rows, then step seconds, its floor and the
 * fastest step. */
static void rank_values(const op_profile *p, int steps, double step_seconds,
                        double fastest_step, double comm_seconds, float *v) {
    double floor_by_kind[OP_KINDS];
    const double floor = op_profile_sgemm_floor(p, floor_by_kind);
    const double per_step = steps > 0 ? 1.0 / steps : 0.0;
    double in_ops = 0.0;
    memset(v, 0, RANK_VALUES * sizeof(float));
    for (int i = 0; i < OP_ROWS; i++) {
        const row_def *r = &rows[i];
        const op_kind k = r->kind;
        double seconds = p->seconds[k], work = p->bytes[k], floor_s = 0.0;
        if (r->part == PART_SGEMM) {
            seconds = p->gemm_seconds[k];
            work = p->gemm_flops[k];
            floor_s = floor_by_kind[k];
        } else if (r->part == PART_REST) {
            seconds -= p->gemm_seconds[k];
            work = 0.0;
        }
        in_ops += seconds;
        float *row = v + i * ROW_VALUES;
        row[0] = (float)(seconds * per_step);
        row[1] = (float)((r->part == PART_SGEMM ? 0.0 : p->calls[k]) * per_step);
        row[2] = (float)(work * per_step);
        row[3] = (float)(floor_s * per_step);
    }
    for (int i = 0; i < p->num_shapes; i++)   /* an sgemm row counts products */
        for (int r = 0; r < OP_ROWS; r++)
            if (rows[r].part == PART_SGEMM && rows[r].kind == p->shapes[i].kind)
                v[r * ROW_VALUES + 1] += (float)(p->shapes[i].calls * per_step);
    v[OP_ROWS * ROW_VALUES] = (float)(comm_seconds * per_step);
    v[(OP_ROWS + 1) * ROW_VALUES] = (float)((step_seconds - in_ops - comm_seconds) * per_step);
    v[ROWS * ROW_VALUES] = (float)(step_seconds * per_step);
    v[ROWS * ROW_VALUES + 1] = (float)(floor * per_step);
    v[ROWS * ROW_VALUES + 2] = (float)fastest_step;
}

static const char *row_name(int i) {
    if (i < OP_ROWS) return rows[i].name;
    return i == OP_ROWS ? "communication wait" : "outside ops";
}

/* "12.3 GFLOP/s" or "4.5 GB/s", or "" where the row has no work of its own. */
static void format_rate(int i, const float *row, char buf[24]) {
    buf[0] = 0;
    if (i >= OP_ROWS || row[2] <= 0 || row[0] <= 0) return;
    const int flops = rows[i].part == PART_SGEMM;
    snprintf(buf, 24, "%.1f %s", row[2] / row[0] / 1e9, flops ? "GFLOP/s" : "GB/s");
}

static void print_floor(FILE *out, const float *row, int i) {
    if (i < OP_ROWS && rows[i].part == PART_SGEMM) fprintf(out, " %8.2f", 1e3 * row[3]);
    else fprintf(out, " %8s", "");
}

const char *op_profile_blas_kernel(void) {
    return openblas_get_corename();
}

static void print_blas_kernel(FILE *out) {
    const char *forced = getenv("OPENBLAS_CORETYPE");
    fprintf(out, "sgemm: OpenBLAS, %s kernels", op_profile_blas_kernel());
    if (forced && *forced) fprintf(out, " (chosen by OPENBLAS_CORETYPE=%s)", forced);
    else fprintf(out, " (detected for this CPU)");
    fprintf(out, "; %s\n", openblas_get_config());
}

static void print_table(FILE *out, const char *strategy, int steps, int ranks,
                        const float *first, const float *slow, int slow_rank) {
    const double step0 = first[ROWS * ROW_VALUES], slow_step = slow[ROWS * ROW_VALUES];
    fprintf(out, "\nprofile of %s, per timed step (mean of %d): rank 0", strategy, steps);
    if (slow != first) fprintf(out, " | the slowest rank, %d", slow_rank);
    else if (ranks > 1) fprintf(out, ", the slowest of %d ranks", ranks);
    fprintf(out, "\n%-24s %7s %9s %7s %14s %8s", "op", "calls", "ms", "share", "rate",
            "floor ms");
    if (slow != first) fprintf(out, " | %9s %7s %8s", "ms", "share", "floor ms");
    fprintf(out, "\n");
    for (int i = 0; i < ROWS; i++) {
        const float *a = first + i * ROW_VALUES, *b = slow + i * ROW_VALUES;
        if (a[1] == 0 && b[1] == 0 && i < OP_ROWS) continue;   /* never ran */
        char rate[24];
        format_rate(i, a, rate);
        fprintf(out, "%-24s %7.0f %9.2f %6.1f%% %14s", row_name(i), a[1], 1e3 * a[0],
                step0 > 0 ? 100.0 * a[0] / step0 : 0.0, rate);
        print_floor(out, a, i);
        if (slow != first) {
            fprintf(out, " | %9.2f %6.1f%%", 1e3 * b[0],
                    slow_step > 0 ? 100.0 * b[0] / slow_step : 0.0);
            print_floor(out, b, i);
        }
        fprintf(out, "\n");
    }
    const double floor0 = first[ROWS * ROW_VALUES + 1], slow_floor = slow[ROWS * ROW_VALUES + 1];
    fprintf(out, "%-24s %7s %9.2f %6.1f%% %14s %8.2f", "step", "", 1e3 * step0, 100.0, "",
            1e3 * floor0);
    if (slow != first) fprintf(out, " | %9.2f %6.1f%% %8.2f", 1e3 * slow_step, 100.0,
                               1e3 * slow_floor);
    if (floor0 <= 0) {   /* a GPU's ops do not tell their shapes */
        fprintf(out, "\nno sgemm floor: these ops reported no matrix products\n");
        return;
    }
    fprintf(out, "\nstep / sgemm floor of its own shapes: %.2f on rank 0", step0 / floor0);
    if (slow != first && slow_floor > 0)
        fprintf(out, ", %.2f on rank %d", slow_step / slow_floor, slow_rank);
    fprintf(out, "; rank 0's fastest step / floor: %.2f\n",
            first[ROWS * ROW_VALUES + 2] / floor0);
    fprintf(out, "(floor: one cblas_sgemm per product, packed operands, best of 4-5 tries)\n");
    print_blas_kernel(out);
}

double op_profile_report(const op_profile *p, comm *group, const char *strategy,
                         int steps, double step_seconds, double fastest_step,
                         double comm_seconds, FILE *out) {
    const int size = group ? comm_size(group) : 1;
    float *all = mem_alloc(MEM_OTHER, (size_t)size * RANK_VALUES * sizeof(float));
    rank_values(p, steps, step_seconds, fastest_step, comm_seconds,
                all + (size_t)(group ? comm_rank(group) : 0) * RANK_VALUES);
    if (group)
        comm_allgather(group, all + (size_t)comm_rank(group) * RANK_VALUES, all,
                       (size_t)size * RANK_VALUES, COMM_F32);
    int slowest = 0;
    for (int r = 1; r < size; r++)
        if (all[r * RANK_VALUES + ROWS * ROW_VALUES] >
            all[slowest * RANK_VALUES + ROWS * ROW_VALUES])
            slowest = r;
    const float *slow = all + (size_t)slowest * RANK_VALUES;
    if (!group || comm_world_rank(group) == 0) {
        print_table(out, strategy, steps, size, all, slow, slowest);
        fflush(out);
    }
    const double slowest_floor = slow[ROWS * ROW_VALUES + 1];
    mem_free(all);
    return slowest_floor;
}
