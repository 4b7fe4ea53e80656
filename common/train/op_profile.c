#include "op_profile.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "device.h"
#include "matmul16.h"
#include "matmul_engine.h"
#include "matmul_f32.h"
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

/* Whether a product inside an op of this kind runs through matmul16: in a 16-bit run
 * ops_mixed.c sends the linears' products there and runs the attention in its fp32 twin
 * (widened copies, cblas_sgemm). */
static int product_in_16_bits(precision compute, op_kind kind) {
    return compute != PRECISION_FP32 &&
           (kind == OP_LINEAR_FORWARD || kind == OP_LINEAR_BACKWARD);
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
                     .in_16_bits = product_in_16_bits(p->compute, kind), .calls = 1};
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
    const precision compute = p->compute;
    memset(p, 0, sizeof *p);
    p->observer = observer;
    p->on_gpu = on_gpu;
    p->compute = compute;
}

void op_profile_start(op_profile *p, precision compute) {
    memset(p, 0, sizeof *p);
    p->on_gpu = device_current() != DEVICE_CPU;
    p->compute = compute;
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

/* The operands of the floor's products: fp32 for sgemm, and the same values rounded to
 * the run's 16-bit format for matmul16. */
typedef struct {
    float *a, *b, *c;
    uint16_t *a16, *b16;
    precision compute;
} floor_operands;

/* One product at shape s (packed) on the kernel it ran on in the step; C += A B, as
 * the accumulating products do. */
static void floor_product(const gemm_shape *s, const floor_operands *o) {
    const int lda = s->trans_a ? s->M : s->K, ldb = s->trans_b ? s->K : s->N;
    if (s->in_16_bits) {
        matmul16(o->compute, s->trans_a, s->trans_b, s->M, s->N, s->K, o->a16, lda, o->b16,
                 ldb, 1.0f, o->c, s->N);
        return;
    }
    cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans,
                s->trans_b ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1.0f, o->a, lda,
                o->b, ldb, 1.0f, o->c, s->N);
}

/* Best time of one product at shape s, packed operands, over a few tries. */
static double best_product_seconds(const gemm_shape *s, const floor_operands *o) {
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
        for (int r = 0; r < repeats; r++) floor_product(s, o);
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
    floor_operands o = {.a = mem_alloc(MEM_OTHER, most_a * sizeof(float)),
                        .b = mem_alloc(MEM_OTHER, most_b * sizeof(float)),
                        .c = mem_alloc(MEM_OTHER, most_c * sizeof(float)),
                        .a16 = mem_alloc(MEM_OTHER, most_a * sizeof(uint16_t)),
                        .b16 = mem_alloc(MEM_OTHER, most_b * sizeof(uint16_t)),
                        .compute = p->compute};
    fill_like_activations(o.a, most_a);
    fill_like_activations(o.b, most_b);
    if (p->compute != PRECISION_FP32) {
        precision_to16(p->compute, o.a16, o.a, most_a);
        precision_to16(p->compute, o.b16, o.b, most_b);
    }
    if (by_kind) memset(by_kind, 0, OP_KINDS * sizeof(double));
    double floor = 0.0;
    for (int i = 0; i < p->num_shapes; i++) {
        const double t = p->shapes[i].calls * best_product_seconds(&p->shapes[i], &o);
        floor += t;
        if (by_kind) by_kind[p->shapes[i].kind] += t;
    }
    void *buffers[] = {o.a, o.b, o.c, o.a16, o.b16};
    for (int i = 0; i < 5; i++) mem_free(buffers[i]);
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

/* A row's name; the products of a 16-bit run's linears are "linear fwd: bf16 matmul". */
static const char *row_name(int i, precision compute, char buf[32]) {
    if (i >= OP_ROWS) return i == OP_ROWS ? "communication wait" : "outside ops";
    const row_def *r = &rows[i];
    if (r->part != PART_SGEMM || !product_in_16_bits(compute, r->kind)) return r->name;
    const int stem = (int)(strchr(r->name, ':') - r->name);   /* "linear fwd" */
    snprintf(buf, 32, "%.*s: %s matmul", stem, r->name, precision_name(compute));
    return buf;
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
    const char *fallback = getenv("RUN_BLAS_DETECTED");   /* tools/blas-kernel.sh */
    if (forced && *forced && fallback)
        fprintf(out, " (chosen by the CPU's flags: OpenBLAS detected %s, its fallback for a"
                " CPU it does not know)", fallback);
    else if (forced && *forced) fprintf(out, " (chosen by OPENBLAS_CORETYPE=%s)", forced);
    else fprintf(out, " (detected for this CPU)");
    fprintf(out, "; %s\n", openblas_get_config());
}

/* ---- the kernels named -------------------------------------------------------------- */

static char matmul16_kernels[160];   /* of the last 16-bit table printed */

const char *op_profile_matmul16_kernel(void) { return matmul16_kernels; }

/* Whether list ("a, b, c") has name as one of its entries. */
static int list_has(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *at = list; (at = strstr(at, name)) != NULL; at += n)
        if ((at == list || at[-1] == ' ') && (at[n] == ',' || at[n] == 0)) return 1;
    return 0;
}

/* The matmul16 implementations of p's 16-bit shapes, distinct, into matmul16_kernels
 * ("" where there are none). Creates the primitives this thread lacks. */
static void note_matmul16_kernels(const op_profile *p) {
    char *list = matmul16_kernels;
    const size_t size = sizeof matmul16_kernels;
    list[0] = 0;
    for (int i = 0; i < p->num_shapes; i++) {
        const gemm_shape *s = &p->shapes[i];
        if (!s->in_16_bits) continue;
        const char *name = matmul16_impl(p->compute, s->trans_a, s->trans_b, s->M, s->N, s->K);
        if (list_has(list, name)) continue;
        const size_t used = strlen(list);
        snprintf(list + used, size - used, "%s%s", used ? ", " : "", name);
    }
}

/* Which engine ran the fp32 linears' products, and why that one (matmul_engine.h). */
static void print_matmul_engine(FILE *out) {
    const matmul_engine e = matmul_engine_current();
    fprintf(out, "fp32 linears: %s", e == MATMUL_ONEDNN ? "oneDNN" : "OpenBLAS");
    if (e == MATMUL_ONEDNN)   /* bench256's forward shape names the kernel */
        fprintf(out, " %s, weights kept in its layout between updates",
                matmul_f32_impl(0, 1, 512, 256, 256));
    if (matmul_engine_chosen()) fprintf(out, " (--matmul %s)\n", matmul_engine_names[e]);
    else fprintf(out, " (%s)\n", matmul_engine_default_reason());
}

/* The kernels under the table: the 16-bit linears' (oneDNN's, or the fp16 fallback's)
 * or the fp32 linears' engine, and OpenBLAS's. */
static void print_kernels(FILE *out, precision compute) {
    if (compute != PRECISION_FP32 && matmul16_kernels[0]) {
        fprintf(out, "%s matmul (the linears' products): %s\n", precision_name(compute),
                matmul16_kernels);
    }
    if (compute == PRECISION_FP32) print_matmul_engine(out);
    print_blas_kernel(out);
}

/* The step against its floor, under the table; fp32 names it the sgemm floor. */
static void print_floor_summary(FILE *out, precision compute, const float *first,
                                const float *slow, int slow_rank) {
    const double step0 = first[ROWS * ROW_VALUES], slow_step = slow[ROWS * ROW_VALUES];
    const double floor0 = first[ROWS * ROW_VALUES + 1], slow_floor = slow[ROWS * ROW_VALUES + 1];
    const int mixed = compute != PRECISION_FP32;
    if (floor0 <= 0) {   /* a GPU's ops do not tell their shapes */
        fprintf(out, "\nno sgemm floor: these ops reported no matrix products\n");
        return;
    }
    fprintf(out, "\nstep / %s floor of its own shapes: %.2f on rank 0",
            mixed ? "product" : "sgemm", step0 / floor0);
    if (slow != first && slow_floor > 0)
        fprintf(out, ", %.2f on rank %d", slow_step / slow_floor, slow_rank);
    fprintf(out, "; rank 0's fastest step / floor: %.2f\n",
            first[ROWS * ROW_VALUES + 2] / floor0);
    if (mixed)
        fprintf(out, "(floor: one %s matmul16 per linear product, one cblas_sgemm per"
                     " attention product, packed operands, best of 4-5 tries)\n",
                precision_name(compute));
    else
        fprintf(out, "(floor: one cblas_sgemm per product, packed operands, best of 4-5"
                     " tries)\n");
    print_kernels(out, compute);
}

static void print_table(FILE *out, const char *strategy, int steps, int ranks,
                        precision compute, const float *first, const float *slow,
                        int slow_rank) {
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
        char rate[24], name[32];
        format_rate(i, a, rate);
        fprintf(out, "%-24s %7.0f %9.2f %6.1f%% %14s", row_name(i, compute, name), a[1],
                1e3 * a[0],
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
    print_floor_summary(out, compute, first, slow, slow_rank);
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
        note_matmul16_kernels(p);
        print_table(out, strategy, steps, size, p->compute, all, slow, slowest);
        fflush(out);
    }
    const double slowest_floor = slow[ROWS * ROW_VALUES + 1];
    mem_free(all);
    return slowest_floor;
}
