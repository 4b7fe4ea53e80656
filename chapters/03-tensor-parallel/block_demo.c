/* Part 2: one transformer block, Megatron style, built from part 1's split layers.
 *
 *   attention:  ln1 -> f -> QKV (column-parallel: my heads) -> attention on my heads
 *               -> proj (row-parallel) -> g -> + x
 *   MLP:        ln2 -> f -> fc (column-parallel: my hidden units) -> GELU (local)
 *               -> fc2 (row-parallel) -> g -> + x_mid
 *
 * A column split followed by a row split needs nothing in between: the column layer
 * leaves each rank with whole heads (whole hidden units), which is exactly the input
 * slice the row layer wants. So each half of the block costs one all-reduce forward
 * (g) and one backward (f), where two unpaired split layers would cost two each.
 *
 * The block is the model's own (gpt_block_forward in common/model.c, written with the
 * split layers of common/model/tp_linear.c), the very code part 3 trains with: here
 * it runs alone, as a one-block pipeline stage, against the same block unsplit. */
#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "floats.h"
#include "ops.h"
#include "rng.h"
#include "tensor_parallel.h"

/* One block as a stage of its own: block 1 of a three-block model holds neither the
 * embedding nor the head, so its boundary is the block's input and output. */
enum { DEMO_LAYERS = 3, DEMO_LAYER = 1 };

static gpt_shape block_stage(const gpt_config *cfg, int t, int r) {
    gpt_config three = *cfg;
    three.layers = DEMO_LAYERS;
    gpt_shape s = gpt_shape_make(&three, t, r);
    gpt_shape_set_stage(&s, DEMO_LAYER, DEMO_LAYER + 1);
    return s;
}

static gpt_model *block_model(const gpt_shape *s, int B, int T, comm *tp,
                              const megatron_block_options *opts) {
    gpt_model_options o = {.tp = tp, .drop_f_backward = opts && opts->drop_f_backward};
    return gpt_model_create(s, B, T, &o);
}

/* out[N, C] = block(x), through the stage's boundary. */
static void block_forward(gpt_model *m, float *out, const float *x, const float *params,
                          size_t n) {
    vec_copy(gpt_stage_input(m), x, n);
    gpt_forward(m, params);
    vec_copy(out, gpt_stage_output(m), n);
}

/* dx[N, C] = d(block input) for d(block output) = dout; grads accumulate. */
static void block_backward(gpt_model *m, float *dx, const float *dout, const float *params,
                           float *grads, size_t n) {
    vec_copy(gpt_stage_output_grad(m), dout, n);
    gpt_backward(m, params, grads, 0.0f, NULL, NULL);   /* no head: dloss unused */
    vec_copy(dx, gpt_stage_input_grad(m), n);
}

/* ---- comparing with the unsplit block ---------------------------------------------- */

/* Host buffers (h_) hold what is made, sliced and compared here; the device buffers
 * (no prefix) are what the ops and the collectives work on (host memory too on a CPU
 * rank). */
static float *floats(size_t n) { return mem_alloc(MEM_OTHER, n * sizeof(float)); }
static float *device_floats(size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_OTHER, n * sizeof(float));
}
static float *device_copy(const float *host, size_t n) {
    float *d = device_floats(n);
    ops_upload(d, host, n * sizeof(float));
    return d;
}
static void download(float *host, const float *device, size_t n) {
    ops_download(host, device, n * sizeof(float));
}

static double group_max(comm *tp, double x) {
    float v = (float)x;
    if (comm_size(tp) > 1) comm_allreduce(tp, &v, 1, COMM_F32, COMM_MAX);
    return v;
}

static comm_stats stats_of(comm *tp) { return comm_stats_get(tp); }

void block_compare(comm *tp, const gpt_config *cfg, int B, int T, uint64_t seed,
                   const megatron_block_options *opts, block_report *out) {
    const int t = comm_size(tp), r = comm_rank(tp);
    const size_t N = (size_t)B * T, C = cfg->dim;
    gpt_shape whole = block_stage(cfg, 1, 0), mine = block_stage(cfg, t, r);
    const size_t n_whole = gpt_slab_numel(&whole, 0), n_mine = gpt_slab_numel(&mine, 0);

    /* The unsplit block: the model's initial values, plus noise so that biases and
     * LayerNorms are not 0 and 1 (a bias added twice must show). */
    float *h_w_params = floats(n_whole), *h_w_grads = floats(n_whole);
    gpt_init_params(&whole, seed, 0, n_whole, h_w_params);
    for (size_t i = 0; i < n_whole; i++) h_w_params[i] += 0.05f * rng_normal(seed, 911, i);
    float *h_x = floats(N * C), *h_dout = floats(N * C);
    for (size_t i = 0; i < N * C; i++) {
        h_x[i] = rng_normal(seed, 912, i);
        h_dout[i] = rng_normal(seed, 913, i) / (float)N;
    }
    float *w_params = device_copy(h_w_params, n_whole), *w_grads = device_floats(n_whole);
    float *x = device_copy(h_x, N * C), *dout = device_copy(h_dout, N * C);
    float *w_out = device_floats(N * C), *w_dx = device_floats(N * C);
    gpt_model *unsplit = block_model(&whole, B, T, NULL, NULL);
    block_forward(unsplit, w_out, x, w_params, N * C);
    block_backward(unsplit, w_dx, dout, w_params, w_grads, N * C);

    /* My slice of the same block, run with the tp group. */
    float *h_params = floats(n_mine), *h_grads = floats(n_mine), *h_expect = floats(n_mine);
    tp_slice_block(&mine, h_w_params, h_params, SLICE_TAKE, 1);
    float *params = device_copy(h_params, n_mine), *grads = device_floats(n_mine);
    float *y = device_floats(N * C), *dx = device_floats(N * C);
    gpt_model *split = block_model(&mine, B, T, tp, opts);
    comm_barrier(tp);
    comm_stats s0 = stats_of(tp);
    trace_begin(tp, "block forward");
    block_forward(split, y, x, params, N * C);
    trace_end(tp);
    comm_stats s1 = stats_of(tp);
    trace_begin(tp, "block backward");
    block_backward(split, dx, dout, params, grads, N * C);
    trace_end(tp);
    comm_stats s2 = stats_of(tp);

    /* every rank compares its own slice of the gradients with the same slice of the
     * unsplit ones (replicated tensors included: each rank's copy must be right) */
    download(h_w_grads, w_grads, n_whole);
    tp_slice_block(&mine, h_w_grads, h_expect, SLICE_TAKE, 1);
    download(h_grads, grads, n_mine);
    out->tp = t;
    out->B = B;
    out->T = T;
    out->allreduces_forward = (int)(s1.calls[COMM_KIND_ALLREDUCE] - s0.calls[COMM_KIND_ALLREDUCE]);
    out->allreduces_backward = (int)(s2.calls[COMM_KIND_ALLREDUCE] - s1.calls[COMM_KIND_ALLREDUCE]);
    out->bytes_forward = (double)(s1.bytes_sent[COMM_KIND_ALLREDUCE] - s0.bytes_sent[COMM_KIND_ALLREDUCE]);
    out->bytes_backward = (double)(s2.bytes_sent[COMM_KIND_ALLREDUCE] - s1.bytes_sent[COMM_KIND_ALLREDUCE]);
    out->formula_per_allreduce = 2.0 * (t - 1) / t * (double)(N * C * sizeof(float));
    out->params_per_rank = n_mine;
    out->params_whole = n_whole;
    out->replicated_per_rank = 6 * C;
    float *h_y = floats(N * C), *h_dx = floats(N * C);
    float *h_w_out = floats(N * C), *h_w_dx = floats(N * C);
    download(h_y, y, N * C);
    download(h_dx, dx, N * C);
    download(h_w_out, w_out, N * C);
    download(h_w_dx, w_dx, N * C);
    out->diff_out = group_max(tp, max_abs_diff(h_y, h_w_out, N * C));
    out->diff_dx = group_max(tp, max_abs_diff(h_dx, h_w_dx, N * C));
    out->diff_grads = group_max(tp, max_abs_diff(h_grads, h_expect, n_mine));
    /* bytes: the largest rank's (they are equal for the ring) */
    out->bytes_forward = group_max(tp, out->bytes_forward);
    out->bytes_backward = group_max(tp, out->bytes_backward);

    gpt_model_free(split);
    gpt_model_free(unsplit);
    float *all[] = {w_params, w_grads, x, dout, w_out, w_dx, params, grads, y, dx,
                    h_w_params, h_w_grads, h_x, h_dout, h_params, h_grads, h_expect, h_y,
                    h_dx, h_w_out, h_w_dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
}

void part2_block(comm *tp, const run_config *cfg, block_report *out) {
    const gpt_config *m = &cfg->model;
    const int t = comm_size(tp);
    block_compare(tp, m, cfg->batch, m->ctx, cfg->seed, NULL, out);
    if (comm_world_rank(tp) != 0 || cfg->json) return;
    const gpt_shape s = gpt_shape_make(m, t, 0);
    char a[32], b[32], c[32];
    printf("Part 2. One transformer block, Megatron style (dim %d, %d heads, batch %d x %d"
           " tokens, %d ranks)\n", m->dim, m->heads, cfg->batch, m->ctx, t);
    printf("  attention: %d of %d heads per rank. QKV column-parallel (%d of %d rows of"
           " W_qkv), proj row-parallel (%d of %d columns)\n", s.heads_local, m->heads,
           3 * s.dim_local, 3 * m->dim, s.dim_local, m->dim);
    printf("  MLP:       %d of %d hidden units per rank. fc column-parallel, GELU local,"
           " fc2 row-parallel\n", s.hidden_local, 4 * m->dim);
    printf("  f = identity forward, all-reduce backward (where ln1, ln2 enter the split"
           " layers)\n");
    printf("  g = all-reduce forward, identity backward (where proj, fc2 leave them)\n");
    printf("  all-reduces per block: forward %d, backward %d (one per f or g; Megatron: 2"
           " and 2)\n", out->allreduces_forward, out->allreduces_backward);
    printf("  bytes sent per rank per block: forward %s, backward %s; formula"
           " 2 x 2(t-1)/t x B*T*C x 4 B = %s each way\n",
           report_bytes(out->bytes_forward, a), report_bytes(out->bytes_backward, b),
           report_bytes(2 * out->formula_per_allreduce, c));
    printf("  parameters per rank: %zu of %zu (%.1f%%; 1/t = %.1f%%, plus %zu replicated"
           " LayerNorm and row-parallel bias values)\n", out->params_per_rank,
           out->params_whole, 100.0 * out->params_per_rank / out->params_whole, 100.0 / t,
           out->replicated_per_rank);
    printf("  largest difference from the unsplit block: output %.2e, d input %.2e,"
           " d parameters %.2e\n\n", out->diff_out, out->diff_dx, out->diff_grads);
    fflush(stdout);
}
