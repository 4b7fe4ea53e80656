/* Strategies on GPU ranks against the CPU, through launch() as the chapters use it.
 *
 *  1. The communicator on CUDA ranks: 1 rank (NCCL, a GPU of its own) and 2-4 ranks
 *     sharing the GPU (threads backend moving device buffers) run every collective on
 *     device buffers; the same program on CPU ranks (host buffers) is the reference.
 *     The shared-GPU path runs the same algorithms with reduction kernels that round
 *     like the host loops, so its results must be bit-identical to the CPU's; NCCL's
 *     world of one must leave the data as it is. Also checked: async calls issued right
 *     behind the kernels that produce their buffers, host buffers on CUDA ranks,
 *     send/recv, the 16- and 8-bit wire types.
 *  2. Data-parallel training (replica, gpt_forward/backward, all-reduce of gradients:
 *     DDP as chapter 1 builds it) on 1, 2 and 4 GPU ranks, blocking and with an async
 *     all-reduce per slab started during backward, against the single-device baseline
 *     trained on the CPU in the same process; and the baseline itself on the GPU, FP32
 *     and TF32.
 *
 * Tolerances against the CPU (cuBLAS and OpenBLAS add in different orders): loss 1e-4,
 * step-1 gradients 1e-4 of their largest magnitude. Parameters after a few AdamW steps:
 * where a gradient is within rounding of 0 its sign may differ, and AdamW moves such a
 * parameter by up to the learning rate the other way; so at most 1% of the parameters
 * may differ by more than 1e-5, and none by more than 3 x the sum of the learning
 * rates. TF32 (10-bit mantissas in the matmuls): loss 2e-3, gradients 5e-3, and only
 * the bound on the parameters, since its rounding flips many more small gradients.
 * Replicas must stay bit-identical across ranks.
 *  3. The baseline in 16 bits on the GPU against the same run on the CPU: bf16, fp16,
 *     and bf16 with 16-bit gradients (--grad-dtype). cuBLAS sums a product in another
 *     order than oneDNN, so any 16-bit output may round one unit u apart (2^-8 bf16,
 *     2^-11 fp16) from step 1 on: per block its 11 rounded outputs on the forward path
 *     (2 LayerNorms, QKV, the attention's probabilities and output, its projection, the
 *     residual, the MLP's two products, GELU, the residual), plus the final LayerNorm and
 *     the LM head, each moving the gradients by at most u G to first order (G the
 *     largest step-1 gradient): (11 L + 2) u G, one more u G for 16-bit gradients. Loss
 *     within MIXED_TOL_LOSS, parameters within AdamW's drift bound (tolerances.h).
 *
 * Without a GPU (or in a build without GPU=1) there is nothing to run: the program
 * prints "SKIP: <why>" and exits 77. With one it runs without fork: CUDA does not
 * survive a fork once used. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "device.h"
#include "floats.h"
#include "ops.h"
#include "rng.h"
#include "baseline.h"
#include "replica.h"
#include "tolerances.h"

enum { MAX_RANKS = 4 };

/* ---- 1. collectives on device buffers ----------------------------------------------- */

/* More than one slice of the threads backend (COMM_SLICE_ELEMENTS = 2^18), and a
 * multiple of no rank count from 2 to 4: uneven shards. */
#define COUNT ((size_t)300007)
enum { SEGMENTS = 16 };   /* results kept per rank, COUNT floats each */

typedef struct {
    device_kind device;
    int skip_send_recv;          /* NCCL pairs a blocking send with nothing: skip it */
    float *results[MAX_RANKS];   /* [SEGMENTS * COUNT] per rank, on the host */
    char backend[16];
} collective_run;

static float value(int rank, int segment, size_t i) {
    return (float)(2.0 * rng_uniform(77, (uint64_t)(100 * segment + rank), i) - 1.0);
}

/* A buffer of the rank's device holding its values for `segment`. */
static float *device_values(int rank, int segment, size_t n) {
    float *host = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = value(rank, segment, i);
    float *buf = mem_alloc_on(MEM_DEVICE, MEM_OTHER, n * sizeof(float));
    ops_upload(buf, host, n * sizeof(float));
    free(host);
    return buf;
}

static void keep(float *out, int segment, const float *buf, size_t offset, size_t n) {
    if (n) ops_download(out + (size_t)segment * COUNT + offset, buf, n * sizeof(float));
}

/* All-reduce in a wire type: host floats -> wire -> device, reduce, and back. */
static void wire_allreduce(comm *world, float *out, int segment, comm_dtype dt) {
    const int rank = comm_rank(world);
    const size_t bytes = COUNT * comm_dtype_size(dt);
    float *host = malloc(COUNT * sizeof(float));
    void *wire = malloc(bytes);
    for (size_t i = 0; i < COUNT; i++) host[i] = 0.25f * value(rank, segment, i);
    comm_convert(wire, dt, host, COMM_F32, COUNT);
    void *buf = mem_alloc_on(MEM_DEVICE, MEM_OTHER, bytes);
    ops_upload(buf, wire, bytes);
    comm_allreduce(world, buf, COUNT, dt, COMM_SUM);
    ops_download(wire, buf, bytes);
    comm_convert(out + (size_t)segment * COUNT, COMM_F32, wire, dt, COUNT);
    mem_free(buf);
    free(wire);
    free(host);
}

static int collectives_main(comm *world, void *arg) {
    collective_run *run = arg;
    const int rank = comm_rank(world), n = comm_size(world);
    float *out = calloc((size_t)SEGMENTS * COUNT, sizeof(float));
    size_t off, len = comm_shard(COUNT, n, rank, &off);
    int seg = 0;

    static const comm_op ops[3] = {COMM_SUM, COMM_AVG, COMM_MAX};
    for (int k = 0; k < 3; k++, seg++) {   /* 0-2: all-reduce sum, avg, max */
        float *buf = device_values(rank, seg, COUNT);
        comm_allreduce(world, buf, COUNT, COMM_F32, ops[k]);
        keep(out, seg, buf, 0, COUNT);
        mem_free(buf);
    }
    {   /* 3: reduce-scatter, out of place */
        float *send = device_values(rank, seg, COUNT);
        float *recv = mem_alloc_on(MEM_DEVICE, MEM_OTHER, (len + 1) * sizeof(float));
        comm_reduce_scatter(world, send, recv, COUNT, COMM_F32, COMM_SUM);
        keep(out, seg++, recv, off, len);
        mem_free(send);
        mem_free(recv);
    }
    {   /* 4: reduce-scatter, average, in place */
        float *buf = device_values(rank, seg, COUNT);
        comm_reduce_scatter(world, buf, buf + off, COUNT, COMM_F32, COMM_AVG);
        keep(out, seg++, buf + off, off, len);
        mem_free(buf);
    }
    {   /* 5: all-gather out of place; 6: in place */
        float *send = device_values(rank, seg, len + 1);
        float *recv = mem_alloc_on(MEM_DEVICE, MEM_OTHER, COUNT * sizeof(float));
        comm_allgather(world, send, recv, COUNT, COMM_F32);
        keep(out, seg++, recv, 0, COUNT);
        float *in_place = device_values(rank, seg, COUNT);
        comm_allgather(world, in_place + off, in_place, COUNT, COMM_F32);
        keep(out, seg++, in_place, 0, COUNT);
        mem_free(send);
        mem_free(recv);
        mem_free(in_place);
    }
    {   /* 7: broadcast from the last rank; 8: reduce (average) to rank 0 */
        float *buf = device_values(rank, seg, COUNT);
        comm_broadcast(world, buf, COUNT, COMM_F32, n - 1);
        keep(out, seg++, buf, 0, COUNT);
        mem_free(buf);
        buf = device_values(rank, seg, COUNT);
        comm_reduce(world, buf, COUNT, COMM_F32, COMM_AVG, 0);
        keep(out, seg++, buf, 0, COUNT);   /* non-roots: unchanged */
        mem_free(buf);
    }
    /* 9-11: the wire types */
    wire_allreduce(world, out, seg++, COMM_BF16);
    wire_allreduce(world, out, seg++, COMM_F16);
    wire_allreduce(world, out, seg++, COMM_F8E4M3);
    {   /* 12, 13: async calls queued right behind the kernels that make their data */
        float *a = device_values(rank, seg, COUNT);
        float *b = device_values(rank, seg + 1, len + 1);
        float *gathered = mem_alloc_on(MEM_DEVICE, MEM_OTHER, COUNT * sizeof(float));
        vec_scale(a, 3.0f, COUNT);
        comm_request *ra = comm_allreduce_start(world, a, COUNT, COMM_F32, COMM_SUM);
        vec_scale(b, -2.0f, len);
        comm_request *rb = comm_allgather_start(world, b, gathered, COUNT, COMM_F32);
        comm_wait(ra);
        comm_wait(rb);
        keep(out, seg++, a, 0, COUNT);
        keep(out, seg++, gathered, 0, COUNT);
        mem_free(a);
        mem_free(b);
        mem_free(gathered);
    }
    if (run->skip_send_recv) {
        seg++;
    } else {   /* 14: send to the right, receive from the left (both buffered) */
        const size_t m = COUNT / 7;
        float *mine = device_values(rank, seg, m);
        float *got = mem_alloc_on(MEM_DEVICE, MEM_OTHER, m * sizeof(float));
        vec_scale(mine, 0.5f, m);   /* queued compute, then a send of its result */
        comm_send(world, mine, m, COMM_F32, (rank + 1) % n, 3);
        comm_recv(world, got, m, COMM_F32, (rank + n - 1) % n, 3);
        keep(out, seg++, got, 0, m);
        mem_free(mine);
        mem_free(got);
    }
    {   /* 15: host memory on a CUDA rank (scalars, tables) */
        float host[5];
        for (int i = 0; i < 5; i++) host[i] = value(rank, seg, (size_t)i);
        comm_allreduce(world, host, 5, COMM_F32, COMM_SUM);
        comm_barrier(world);
        memcpy(out + (size_t)seg++ * COUNT, host, sizeof host);
    }
    /* (no ck_assert on a rank thread: Check's failure jump belongs to the test's) */
    if (seg != SEGMENTS) return 1;
    run->results[rank] = out;
    if (rank == 0) snprintf(run->backend, sizeof run->backend, "%s", comm_backend_name(world));
    return 0;
}

static void run_collectives(collective_run *run, device_kind device, int ranks) {
    memset(run, 0, sizeof *run);
    run->device = device;
    /* NCCL's send waits for its receive, which comm.h's buffered send does not */
    run->skip_send_recv = ranks <= device_gpu_count();
    comm_options opts = comm_options_default();
    opts.ranks = ranks;
    opts.device = device;
    opts.timeout_seconds = 60;
    ck_assert_int_eq(launch(&opts, collectives_main, run), 0);
}

static void free_run(collective_run *run) {
    for (int r = 0; r < MAX_RANKS; r++) free(run->results[r]);
}

START_TEST(collectives_on_gpu_match_cpu) {
    static const char *names[SEGMENTS] = {
        "allreduce sum", "allreduce avg", "allreduce max", "reduce_scatter",
        "reduce_scatter avg in place", "allgather", "allgather in place", "broadcast",
        "reduce avg", "allreduce bf16", "allreduce f16", "allreduce f8e4m3",
        "async allreduce", "async allgather", "send/recv", "host buffer allreduce"};
    for (int ranks = 1; ranks <= MAX_RANKS; ranks++) {
        collective_run cpu, gpu;
        run_collectives(&cpu, DEVICE_CPU, ranks);
        run_collectives(&gpu, DEVICE_CUDA, ranks);
        const int gpus = device_gpu_count();
        const char *expect = ranks <= gpus ? "nccl" : "threads";
        printf("%d rank%s on %d GPU%s: %s backend (%s)\n", ranks, ranks == 1 ? "" : "s",
               gpus, gpus == 1 ? "" : "s", gpu.backend,
               ranks <= gpus ? "a GPU per rank" : "ranks share the GPU");
        ck_assert_str_eq(gpu.backend, expect);
        ck_assert_str_eq(cpu.backend, "threads");
        /* NCCL sums in its own order; a world of one copies. The shared-GPU path runs the
         * threads backend's own algorithms: the same bits as on the CPU. */
        for (int s = 0; s < SEGMENTS; s++) {
            double worst = 0.0;
            int identical = 1;
            for (int r = 0; r < ranks; r++) {
                const float *a = gpu.results[r] + (size_t)s * COUNT;
                const float *b = cpu.results[r] + (size_t)s * COUNT;
                if (memcmp(a, b, COUNT * sizeof(float)) != 0) identical = 0;
                double d = max_abs_diff(a, b, COUNT);
                if (d > worst) worst = d;
            }
            printf("  %-28s max |gpu - cpu| %.3e%s\n", names[s], worst,
                   identical ? "  (bit-identical)" : "");
            ck_assert_msg(identical || (ranks <= gpus && ranks > 1 && worst < 1e-5),
                          "%s on %d ranks: GPU result differs from the CPU's by %.3e",
                          names[s], ranks, worst);
        }
        free_run(&cpu);
        free_run(&gpu);
    }
}
END_TEST

/* ---- 2. data-parallel training on GPU ranks -------------------------------------------- */

typedef struct {
    const run_config *cfg;
    const dataset *data;
    int async;                   /* all-reduce each slab as backward finishes it */
    float *loss;                 /* [steps], rank 0 */
    float *first_grads;          /* rank 0, host */
    float *final_params[MAX_RANKS];
    size_t num_params;
    char backend[16];
} ddp_run;

typedef struct {
    comm *world;
    replica *rep;
    comm_request *pending[64];
    int count;
} slab_sync;

static void slab_ready(void *ctx, int slab) {
    slab_sync *s = ctx;
    const gpt_shape *shape = &s->rep->shape;
    if (s->count == 64) comm_abort(s->world, "more than 64 slabs");
    s->pending[s->count++] = comm_allreduce_start(
        s->world, s->rep->grads + gpt_slab_offset(shape, slab), gpt_slab_numel(shape, slab),
        COMM_F32, COMM_SUM);
}

static int ddp_main(comm *world, void *arg) {
    ddp_run *run = arg;
    const run_config *cfg = run->cfg;
    const int n = comm_size(world), rank = comm_rank(world);
    const int per_rank = cfg->batch / n, T = cfg->model.ctx;
    const float dloss = 1.0f / ((float)cfg->batch * (float)T);   /* the sum is the mean */
    gpt_shape shape = gpt_shape_make(&cfg->model, 1, 0);
    replica rep;
    replica_init(&rep, &shape, cfg->seed, 1);
    gpt_model *model = gpt_model_create(&shape, per_rank, T, NULL);
    if (rank == 0) {
        run->num_params = rep.num_params;
        run->first_grads = malloc(rep.num_params * sizeof(float));
        snprintf(run->backend, sizeof run->backend, "%s", comm_backend_name(world));
    }
    for (int step = 1; step <= cfg->steps; step++) {
        load_batch(model, run->data, cfg, step, rank * per_rank, per_rank);
        vec_zero(rep.grads, rep.num_params);
        float loss = gpt_forward(model, rep.params);
        slab_sync sync = {.world = world, .rep = &rep};
        gpt_backward(model, rep.params, rep.grads, dloss, run->async ? slab_ready : NULL,
                     &sync);
        if (run->async)
            for (int i = 0; i < sync.count; i++) comm_wait(sync.pending[i]);
        else
            comm_allreduce(world, rep.grads, rep.num_params, COMM_F32, COMM_SUM);
        if (step == 1 && rank == 0)
            ops_download(run->first_grads, rep.grads, rep.num_params * sizeof(float));
        replica_adamw(&rep, &cfg->adamw);
        comm_allreduce(world, &loss, 1, COMM_F32, COMM_AVG);   /* host scalar */
        if (rank == 0) run->loss[step - 1] = loss;
    }
    run->final_params[rank] = malloc(rep.num_params * sizeof(float));
    ops_download(run->final_params[rank], rep.params, rep.num_params * sizeof(float));
    gpt_model_free(model);
    replica_free(&rep);
    return 0;
}

static run_config small_config(void) {
    run_config cfg = run_config_default();   /* 4 layers, dim 128, ctx 64, batch 8 */
    cfg.steps = 3;
    cfg.quiet = 1;
    cfg.comm.device = DEVICE_CPU;
    cfg.comm.timeout_seconds = 120;
    return cfg;
}

/* Largest |a - b| over n, relative to the largest |b|. */
static double relative_diff(const float *a, const float *b, size_t n) {
    double scale = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    double d = max_abs_diff(a, b, n);
    return scale > 0 ? d / scale : d;
}

/* Checks loss, step-1 gradients and final parameters against the CPU baseline. */
static void expect_near_baseline(const char *what, const run_config *cfg,
                                 const baseline_run *base, const float *loss,
                                 const float *grads, const float *params, int tf32) {
    const double loss_tol = tf32 ? 2e-3 : 1e-4, grad_tol = tf32 ? 5e-3 : 1e-4;
    const size_t P = base->num_params;
    double lr_sum = 0.0;
    for (int s = 1; s <= cfg->steps; s++)
        lr_sum += cfg->adamw.lr * (s < cfg->adamw.warmup_steps
                                       ? (double)s / cfg->adamw.warmup_steps
                                       : 1.0);
    size_t moved = 0;
    for (size_t i = 0; i < P; i++)
        if (fabs((double)params[i] - (double)base->final_params[i]) > 1e-5) moved++;
    const double d_loss = max_abs_diff(loss, base->loss, (size_t)cfg->steps);
    const double d_grads = relative_diff(grads, base->first_grads, P);
    const double d_params = max_abs_diff(params, base->final_params, P);
    printf("  %-38s vs CPU baseline: loss %.2e, grads (rel) %.2e, params %.2e"
           " (%zu of %zu beyond 1e-5)\n", what, d_loss, d_grads, d_params, moved, P);
    ck_assert_msg(d_loss <= loss_tol, "%s: loss differs by %.3e", what, d_loss);
    ck_assert_msg(d_grads <= grad_tol, "%s: gradients differ by %.3e of their largest",
                  what, d_grads);
    ck_assert_msg(d_params <= 3.0 * lr_sum, "%s: parameters differ by %.3e", what, d_params);
    ck_assert_msg(tf32 || moved <= P / 100, "%s: %zu parameters differ by more than 1e-5",
                  what, moved);
}

START_TEST(ddp_on_gpu_matches_cpu_baseline) {
    run_config cfg = small_config();
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);   /* on the CPU */
    cfg.comm.device = DEVICE_CUDA;
    static const int rank_counts[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        for (int async = 0; async <= 1; async++) {
            ddp_run run = {.cfg = &cfg, .data = data, .async = async};
            run.loss = calloc((size_t)cfg.steps, sizeof(float));
            cfg.comm.ranks = rank_counts[k];
            ck_assert_int_eq(launch(&cfg.comm, ddp_main, &run), 0);
            char what[64];
            snprintf(what, sizeof what, "ddp %d rank%s, %s, %s", rank_counts[k],
                     rank_counts[k] == 1 ? "" : "s", run.backend,
                     async ? "async per slab" : "blocking");
            expect_near_baseline(what, &cfg, base, run.loss, run.first_grads,
                                 run.final_params[0], 0);
            for (int r = 1; r < rank_counts[k]; r++) {   /* replicas stay one model */
                double d = max_abs_diff(run.final_params[r], run.final_params[0],
                                        run.num_params);
                ck_assert_msg(d == 0.0, "%s: rank %d's replica differs by %.3e", what, r, d);
            }
            for (int r = 0; r < rank_counts[k]; r++) free(run.final_params[r]);
            free(run.first_grads);
            free(run.loss);
        }
    }
    baseline_free(base);
    dataset_free(data);
}
END_TEST

START_TEST(baseline_on_gpu_matches_cpu) {
    run_config cfg = small_config();
    dataset *data = dataset_builtin();
    baseline_run *cpu = baseline_train(&cfg, data);
    for (int tf32 = 0; tf32 <= 1; tf32++) {
        run_config on_gpu = cfg;
        on_gpu.comm.device = DEVICE_CUDA;
        on_gpu.comm.tf32 = tf32;
        baseline_run *gpu = baseline_train(&on_gpu, data);
        expect_near_baseline(tf32 ? "baseline on the GPU, TF32" : "baseline on the GPU, FP32",
                             &cfg, cpu, gpu->loss, gpu->first_grads, gpu->final_params,
                             tf32);
        baseline_free(gpu);
    }
    /* the calling thread computes on the CPU again afterwards */
    ck_assert_int_eq(device_current(), DEVICE_CPU);
    baseline_free(cpu);
    dataset_free(data);
}
END_TEST

START_TEST(baseline_16bit_on_gpu_matches_cpu) {
    const precision compute[] = {PRECISION_BF16, PRECISION_FP16, PRECISION_BF16};
    const precision grads[] = {PRECISION_FP32, PRECISION_FP32, PRECISION_BF16};
    dataset *data = dataset_builtin();
    for (int k = 0; k < 3; k++) {
        run_config cfg = small_config();
        cfg.precision = compute[k];
        cfg.grad_precision = grads[k];
        baseline_run *cpu = baseline_train(&cfg, data);
        run_config on_gpu = cfg;
        on_gpu.comm.device = DEVICE_CUDA;
        baseline_run *gpu = baseline_train(&on_gpu, data);
        const size_t P = cpu->num_params;
        double G = 0.0;
        for (size_t i = 0; i < P; i++)
            if (fabs((double)cpu->first_grads[i]) > G) G = fabs((double)cpu->first_grads[i]);
        const double u = compute[k] == PRECISION_BF16 ? 0x1p-8 : 0x1p-11;
        const double grad_tol = (11.0 * cfg.model.layers + 2 + (grads[k] != PRECISION_FP32)) * u * G;
        const double param_tol = adamw_drift_bound(&cfg.adamw, cfg.steps);
        const double d_loss = max_abs_diff(gpu->loss, cpu->loss, (size_t)cfg.steps);
        const double d_grads = max_abs_diff(gpu->first_grads, cpu->first_grads, P);
        const double d_params = max_abs_diff(gpu->final_params, cpu->final_params, P);
        printf("  baseline %s, %s gradients, GPU vs CPU: loss %.2e (tol %.0e), grads %.2e"
               " (tol %.2e), params %.2e (tol %.2e)\n", precision_name(compute[k]),
               precision_name(grads[k]), d_loss, MIXED_TOL_LOSS, d_grads, grad_tol, d_params,
               param_tol);
        ck_assert_msg(d_loss <= MIXED_TOL_LOSS, "loss differs by %.3e", d_loss);
        ck_assert_msg(d_grads <= grad_tol, "grads differ by %.3e (tol %.3e)", d_grads, grad_tol);
        ck_assert_msg(d_params <= param_tol, "params differ by %.3e", d_params);
        baseline_free(gpu);
        baseline_free(cpu);
    }
    ck_assert_int_eq(device_current(), DEVICE_CPU);
    dataset_free(data);
}
END_TEST

int main(void) {
    char why[160];
    if (device_gpu_count() == 0) {   /* always 0 in a build without GPU=1 */
        printf("SKIP: no GPU to train on: %s\n", device_no_gpu_reason(why, sizeof why));
        return 77;
    }
    Suite *suite = suite_create("gpu_strategies");
    TCase *tc = tcase_create("gpu_vs_cpu");
    suite_add_tcase(suite, tc);
    printf("strategies on GPU ranks vs the CPU\n");
    tcase_add_test(tc, collectives_on_gpu_match_cpu);
    tcase_add_test(tc, baseline_on_gpu_matches_cpu);
    tcase_add_test(tc, ddp_on_gpu_matches_cpu_baseline);
    tcase_add_test(tc, baseline_16bit_on_gpu_matches_cpu);
    SRunner *sr = srunner_create(suite);
    /* CUDA does not survive fork() once initialised in the parent */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
