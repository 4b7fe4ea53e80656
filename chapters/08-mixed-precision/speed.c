/* Part 3: speed. The matmul rate of fp32's cblas_sgemm against matmul16 in bf16 and
 * fp16 at the step's own linear shapes (one core), the kernels each runs on, and the
 * step time of each precision on one rank (the baseline) and on the run's ranks (DDP). */
#include "mixed.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "ddp.h"
#include "matmul16.h"
#include "op_profile.h"

#define SPEED_STEPS 6

typedef struct {
    int M, N, K;
    float *a, *b, *c;
    uint16_t *a16, *b16;
} operands;

/* out[M,N] = in[M,K] weight[N,K]^T, as linear_forward multiplies */
static void product(const operands *o, precision p) {
    if (p == PRECISION_FP32)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, o->M, o->N, o->K, 1.0f, o->a,
                    o->K, o->b, o->K, 0.0f, o->c, o->N);
    else
        matmul16(p, 0, 1, o->M, o->N, o->K, o->a16, o->K, o->b16, o->K, 0.0f, o->c, o->N);
}

/* GFLOP/s, the best of 3 timings of about 20 ms each (the first call, which creates
 * oneDNN's primitive, is not timed). */
static double gflops(const operands *o, precision p) {
    product(o, p);
    double start = comm_now();
    product(o, p);
    const double one = comm_now() - start;
    const int iters = one > 0 ? (int)(0.02 / one) + 1 : 100;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        start = comm_now();
        for (int i = 0; i < iters; i++) product(o, p);
        const double t = (comm_now() - start) / iters;
        if (t < best) best = t;
    }
    return 2.0 * o->M * o->N * o->K / best / 1e9;
}

static void measure_shape(speed_shape *s, precision p16) {
    operands o = {.M = s->M, .N = s->N, .K = s->K};
    const size_t na = (size_t)s->M * s->K, nb = (size_t)s->N * s->K;
    o.a = malloc(na * sizeof(float));
    o.b = malloc(nb * sizeof(float));
    o.c = malloc((size_t)s->M * s->N * sizeof(float));
    o.a16 = malloc(na * sizeof(uint16_t));
    o.b16 = malloc(nb * sizeof(uint16_t));
    if (!o.a || !o.b || !o.c || !o.a16 || !o.b16) abort();
    for (size_t i = 0; i < na; i++) o.a[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (size_t i = 0; i < nb; i++) o.b[i] = (float)((i * 53) % 97) / 97.0f - 0.5f;
    precision_to16(p16, o.a16, o.a, na);
    precision_to16(p16, o.b16, o.b, nb);
    s->gflops[p16] = gflops(&o, p16);
    if (p16 == PRECISION_BF16) s->gflops[PRECISION_FP32] = gflops(&o, PRECISION_FP32);
    free(o.a); free(o.b); free(o.c); free(o.a16); free(o.b16);
}

/* The linears of one step on one rank: [B T, C] times qkv, proj, fc, fc-proj, head. */
static void step_shapes(const run_config *cfg, speed_shape out[SPEED_SHAPES]) {
    const int BT = cfg->batch * cfg->model.ctx, C = cfg->model.dim;
    const int dims[SPEED_SHAPES][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C},
                                       {cfg->model.vocab, C}};
    static const char *const names[SPEED_SHAPES] = {"qkv", "attn proj", "fc", "fc proj",
                                                    "head"};
    for (int i = 0; i < SPEED_SHAPES; i++)
        out[i] = (speed_shape){.M = BT, .N = dims[i][0], .K = dims[i][1], .what = names[i]};
}

void speed_kernels(speed_report *r) {
    r->blas_kernel = op_profile_blas_kernel();
    const speed_shape *s = &r->shapes[0];
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++)
        snprintf(r->kernel16[p], sizeof r->kernel16[p], "%s",
                 matmul16_impl((precision)p, 0, 1, s->M, s->N, s->K));
    snprintf(r->kernel16[PRECISION_FP32], sizeof r->kernel16[0], "sgemm (%s)", r->blas_kernel);
    /* native: oneDNN multiplies bf16 here (avx512_core_bf16, amx) and matmul16 does not
     * widen it; the name is no test, the widened kernel's says "fp32 from bf16" */
    r->native_bf16 = !matmul16_widens(PRECISION_BF16);
    matmul16_release_thread();
}

void speed_local(const run_config *cfg, const dataset *data, speed_report *r) {
    step_shapes(cfg, r->shapes);
    for (int i = 0; i < SPEED_SHAPES; i++) {
        measure_shape(&r->shapes[i], PRECISION_BF16);
        measure_shape(&r->shapes[i], PRECISION_FP16);
    }
    speed_kernels(r);
    for (int p = 0; p < PRECISION_COUNT; p++) {
        const precision_case c = {precision_name((precision)p), (precision)p,
                                  PRECISION_FP32, 0};
        run_config rc = mixed_case_config(cfg, &c, SPEED_STEPS);
        rc.comm.ranks = 1;
        baseline_run *b = baseline_train(&rc, data);
        r->step_ms[0][p] = run_ms_per_step(&b->result);
        baseline_free(b);
    }
}

int speed_launches(const run_config *cfg, const dataset *data, speed_report *r) {
    r->ranks = cfg->comm.ranks;
    const ddp_options opts = ddp_options_default();
    int status = 0;
    for (int p = 0; p < PRECISION_COUNT && !status; p++) {
        const precision_case c = {precision_name((precision)p), (precision)p,
                                  PRECISION_FP32, 0};
        const run_config rc = mixed_case_config(cfg, &c, SPEED_STEPS);
        strategy_outcome o = {0};
        status = ddp_launch(&rc, data, &opts, &o);
        r->step_ms[1][p] = run_ms_per_step(&o.result);
        strategy_outcome_free(&o);
    }
    return status;
}

static void print_verdict(const speed_report *r) {
    const double *one = r->step_ms[0];
    const int slower = one[PRECISION_BF16] > one[PRECISION_FP32];
    if (!r->native_bf16)
        printf("No native bf16 here (%s: the CPU lacks AVX512_BF16 and AMX, or"
               " ONEDNN_MAX_CPU_ISA\nkeeps oneDNN from them): it converts bf16 to fp32 inside"
               " its kernels, so a bf16 matmul is\nno faster than sgemm%s.\n",
               r->kernel16[PRECISION_BF16],
               slower ? ", and the bf16 step is slower than fp32's for it" : "");
    else
        printf("This CPU multiplies bf16 natively (%s).\n", r->kernel16[PRECISION_BF16]);
    if (r->native_bf16 && slower)
        printf("The bf16 step is %.2fx fp32's on one rank: at this size the step is not its"
               " matmuls alone; each\n16-bit op widens its inputs, computes in fp32 and rounds"
               " its output, passes fp32 never makes.\n", one[PRECISION_BF16] /
               one[PRECISION_FP32]);
    printf("fp16: %s.\n", r->kernel16[PRECISION_FP16]);
}

void speed_print(const speed_report *r) {
    printf("\n3. Speed: GFLOP/s on one core at the step's linear shapes (out = in W^T)\n");
    printf("%-10s %16s %10s %10s %10s %8s\n", "linear", "[M x N x K]", "fp32", "bf16",
           "fp16", "bf16/fp32");
    for (int i = 0; i < SPEED_SHAPES; i++) {
        const speed_shape *s = &r->shapes[i];
        char dims[40];
        snprintf(dims, sizeof dims, "%d x %d x %d", s->M, s->N, s->K);
        printf("%-10s %16s %10.1f %10.1f %10.1f %7.2fx\n", s->what, dims,
               s->gflops[PRECISION_FP32], s->gflops[PRECISION_BF16], s->gflops[PRECISION_FP16],
               s->gflops[PRECISION_BF16] / s->gflops[PRECISION_FP32]);
    }
    printf("kernels: fp32 %s; bf16 %s; fp16 %s\n", r->kernel16[PRECISION_FP32],
           r->kernel16[PRECISION_BF16], r->kernel16[PRECISION_FP16]);
    printf("\nms per step          %10s %10s %10s\n", "fp32", "bf16", "fp16");
    printf("1 rank (baseline)    %10.2f %10.2f %10.2f\n", r->step_ms[0][0], r->step_ms[0][1],
           r->step_ms[0][2]);
    printf("%d ranks (DDP)        %10.2f %10.2f %10.2f\n", r->ranks, r->step_ms[1][0],
           r->step_ms[1][1], r->step_ms[1][2]);
    print_verdict(r);
}

void speed_json(FILE *o, const speed_report *r) {
    fprintf(o, "\"matmul\": [");
    for (int i = 0; i < SPEED_SHAPES; i++) {
        const speed_shape *s = &r->shapes[i];
        fprintf(o, "%s{\"linear\": \"%s\", \"M\": %d, \"N\": %d, \"K\": %d,"
                   " \"gflops\": {\"fp32\": %.2f, \"bf16\": %.2f, \"fp16\": %.2f}}",
                i ? ", " : "", s->what, s->M, s->N, s->K, s->gflops[0], s->gflops[1],
                s->gflops[2]);
    }
    fprintf(o, "],\n \"kernels\": {\"fp32\": \"%s\", \"bf16\": \"%s\", \"fp16\": \"%s\"},"
               " \"native_bf16\": %s,\n \"step_ms\": {", r->kernel16[0], r->kernel16[1],
            r->kernel16[2], r->native_bf16 ? "true" : "false");
    for (int p = 0; p < PRECISION_COUNT; p++)
        fprintf(o, "%s\"%s\": {\"one_rank\": %.3f, \"ranks\": %.3f}", p ? ", " : "",
                precision_name((precision)p), r->step_ms[0][p], r->step_ms[1][p]);
    fprintf(o, "}, \"speed_ranks\": %d", r->ranks);
}
