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
 * The training in part 3 uses the model's own block (common/model.c), which does the
 * same; this one is written out so that f and g can be seen, and switched off. */
#include <stdio.h>
#include <stdlib.h>

#include "alloc.h"
#include "ops.h"
#include "rng.h"
#include "tensor_parallel.h"

struct megatron_block {
    gpt_shape shape;
    int B, T;
    comm *tp;
    megatron_block_options opts;
    /* kept from forward for backward */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *x_mid;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
    const float *x;
    /* backward scratch */
    float *d_x_mid, *d_ln, *d_atty, *d_qkv, *d_att, *d_fch, *d_fch_gelu;
};

static float *acts(size_t n) { return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * 4); }

megatron_block *megatron_block_create(const gpt_shape *s, int B, int T, comm *tp,
                                      const megatron_block_options *opts) {
    megatron_block *b = calloc(1, sizeof *b);
    b->shape = *s;
    b->B = B;
    b->T = T;
    b->tp = tp;
    if (opts) b->opts = *opts;
    const size_t N = (size_t)B * T, C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    const size_t att = (size_t)B * s->heads_local * T * T;
    b->ln1 = acts(N * C), b->ln1_mean = acts(N), b->ln1_rstd = acts(N);
    b->qkv = acts(N * 3 * Cl), b->att = acts(att), b->atty = acts(N * Cl);
    b->x_mid = acts(N * C);
    b->ln2 = acts(N * C), b->ln2_mean = acts(N), b->ln2_rstd = acts(N);
    b->fch = acts(N * Hl), b->fch_gelu = acts(N * Hl);
    b->d_x_mid = acts(N * C), b->d_ln = acts(N * C), b->d_atty = acts(N * Cl);
    b->d_qkv = acts(N * 3 * Cl), b->d_att = acts(att);
    b->d_fch = acts(N * Hl), b->d_fch_gelu = acts(N * Hl);
    return b;
}

void megatron_block_free(megatron_block *b) {
    if (!b) return;
    float *all[] = {b->ln1, b->ln1_mean, b->ln1_rstd, b->qkv, b->att, b->atty, b->x_mid,
                    b->ln2, b->ln2_mean, b->ln2_rstd, b->fch, b->fch_gelu, b->d_x_mid,
                    b->d_ln, b->d_atty, b->d_qkv, b->d_att, b->d_fch, b->d_fch_gelu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
    free(b);
}

void megatron_block_forward(megatron_block *b, float *out, const float *x,
                            const float *params) {
    const gpt_shape *s = &b->shape;
    const int N = b->B * b->T, C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    gpt_block_tensors p = gpt_block_view(s, (float *)params);
    b->x = x;

    /* attention: my heads */
    layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, x, p.ln1_w, p.ln1_b, N, C);
    column_parallel_forward(b->qkv, b->ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cl);
    attention_forward(b->atty, b->att, b->qkv, b->B, b->T, Cl, s->heads_local);
    row_parallel_forward(b->tp, b->x_mid, b->atty, p.proj_w, p.proj_b, N, Cl, C);
    vec_add(b->x_mid, x, (size_t)N * C);

    /* MLP: my hidden units */
    layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->x_mid, p.ln2_w, p.ln2_b, N, C);
    column_parallel_forward(b->fch, b->ln2, p.fc_w, p.fc_b, N, C, Hl);
    gelu_forward(b->fch_gelu, b->fch, (size_t)N * Hl);
    row_parallel_forward(b->tp, out, b->fch_gelu, p.fc2_w, p.fc2_b, N, Hl, C);
    vec_add(out, b->x_mid, (size_t)N * C);
}

void megatron_block_backward(megatron_block *b, float *dx, const float *dout,
                             const float *params, float *grads) {
    const gpt_shape *s = &b->shape;
    const int N = b->B * b->T, C = s->cfg.dim, Cl = s->dim_local, Hl = s->hidden_local;
    gpt_block_tensors p = gpt_block_view(s, (float *)params);
    gpt_block_tensors g = gpt_block_view(s, grads);
    comm *f_group = b->opts.drop_f_backward ? NULL : b->tp;   /* negative control */

    /* MLP: out = x_mid + fc2(gelu(fc(ln2(x_mid)))) */
    vec_copy(b->d_x_mid, dout, (size_t)N * C);
    row_parallel_backward(b->d_fch_gelu, g.fc2_w, g.fc2_b, dout, b->fch_gelu, p.fc2_w, N,
                          Hl, C);
    gelu_backward(b->d_fch, b->fch, b->d_fch_gelu, (size_t)N * Hl);
    column_parallel_backward(f_group, b->d_ln, g.fc_w, g.fc_b, b->d_fch, b->ln2, p.fc_w, N,
                             C, Hl);
    layernorm_backward(b->d_x_mid, g.ln2_w, g.ln2_b, b->d_ln, b->x_mid, p.ln2_w,
                       b->ln2_mean, b->ln2_rstd, N, C);

    /* attention: x_mid = x + proj(attention(qkv(ln1(x)))) */
    vec_copy(dx, b->d_x_mid, (size_t)N * C);
    row_parallel_backward(b->d_atty, g.proj_w, g.proj_b, b->d_x_mid, b->atty, p.proj_w, N,
                          Cl, C);
    attention_backward(b->d_qkv, b->d_att, b->d_atty, b->qkv, b->att, b->B, b->T, Cl,
                       s->heads_local);
    column_parallel_backward(f_group, b->d_ln, g.qkv_w, g.qkv_b, b->d_qkv, b->ln1, p.qkv_w,
                             N, C, 3 * Cl);
    layernorm_backward(dx, g.ln1_w, g.ln1_b, b->d_ln, b->x, p.ln1_w, b->ln1_mean,
                       b->ln1_rstd, N, C);
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
    gpt_config one = *cfg;
    one.layers = 1;
    gpt_shape whole = gpt_shape_make(&one, 1, 0), mine = gpt_shape_make(&one, t, r);
    const size_t n_whole = gpt_slab_numel(&whole, 1), n_mine = gpt_slab_numel(&mine, 1);

    /* The unsplit block: the model's initial values, plus noise so that biases and
     * LayerNorms are not 0 and 1 (a bias added twice must show). */
    float *h_w_params = floats(n_whole), *h_w_grads = floats(n_whole);
    gpt_init_params(&whole, seed, gpt_slab_offset(&whole, 1),
                    gpt_slab_offset(&whole, 1) + n_whole, h_w_params);
    for (size_t i = 0; i < n_whole; i++) h_w_params[i] += 0.05f * rng_normal(seed, 911, i);
    float *h_x = floats(N * C), *h_dout = floats(N * C);
    for (size_t i = 0; i < N * C; i++) {
        h_x[i] = rng_normal(seed, 912, i);
        h_dout[i] = rng_normal(seed, 913, i) / (float)N;
    }
    float *w_params = device_copy(h_w_params, n_whole), *w_grads = device_floats(n_whole);
    float *x = device_copy(h_x, N * C), *dout = device_copy(h_dout, N * C);
    float *w_out = device_floats(N * C), *w_dx = device_floats(N * C);
    megatron_block *unsplit = megatron_block_create(&whole, B, T, NULL, NULL);
    megatron_block_forward(unsplit, w_out, x, w_params);
    megatron_block_backward(unsplit, w_dx, dout, w_params, w_grads);

    /* My slice of the same block, run with the tp group. */
    float *h_params = floats(n_mine), *h_grads = floats(n_mine), *h_expect = floats(n_mine);
    tp_slice_block(&mine, h_w_params, h_params, SLICE_TAKE, 1);
    float *params = device_copy(h_params, n_mine), *grads = device_floats(n_mine);
    float *y = device_floats(N * C), *dx = device_floats(N * C);
    megatron_block *split = megatron_block_create(&mine, B, T, tp, opts);
    comm_barrier(tp);
    comm_stats s0 = stats_of(tp);
    trace_begin(tp, "block forward");
    megatron_block_forward(split, y, x, params);
    trace_end(tp);
    comm_stats s1 = stats_of(tp);
    trace_begin(tp, "block backward");
    megatron_block_backward(split, dx, dout, params, grads);
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

    megatron_block_free(split);
    megatron_block_free(unsplit);
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
