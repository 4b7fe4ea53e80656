#include "dp_replica.h"

#include <stdlib.h>

#include "alloc.h"
#include "ops.h"

/* ---- the lock around each op --------------------------------------------------------- */

/* Python-level work: the whole op runs with the GIL held. */
#define LIGHT(t, call)            \
    do {                          \
        light_begin(t);           \
        call;                     \
        light_end(t);             \
    } while (0)
/* A C kernel: called with the GIL held (Python has to reach it), and with --gil
 * release run without it, like code between Py_BEGIN/END_ALLOW_THREADS. */
#define KERNEL(t, call)           \
    do {                          \
        kernel_begin(t);          \
        call;                     \
        kernel_end(t);            \
    } while (0)

static void light_begin(dp_thread *t) { gil_acquire(t->lock, &t->account); }
static void light_end(dp_thread *t) { gil_release(t->lock, &t->account); }

static void kernel_begin(dp_thread *t) {
    gil_acquire(t->lock, &t->account);
    if (t->release_in_kernels) gil_release(t->lock, &t->account);
}

static void kernel_end(dp_thread *t) {
    if (!t->release_in_kernels) gil_release(t->lock, &t->account);
}

/* ---- activations (the layout of common/model.c, tensor parallel size 1) --------------- */

typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *x_mid;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
} block_acts;

struct dp_replica {
    gpt_shape shape;
    int B, T;
    int *tokens, *targets;
    float **x;          /* x[l]: input of block l; x[L]: output of the last block */
    block_acts *acts;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
    float *dx, *d_x_mid, *d_ln, *d_atty, *d_qkv, *d_att, *d_fch, *d_fch_gelu;
};

static float *acts_alloc(size_t n) {
    return mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, n * sizeof(float));
}

/* Every activation buffer of the replica, for allocating and freeing in one loop. */
typedef struct {
    float **slot;
    size_t numel;
} buffer_ref;

/* x[0..L], 12 per block, 13 for the head and the backward scratch */
static size_t replica_buffer_count(int layers) { return 13 * (size_t)layers + 14; }

static int replica_buffers(dp_replica *r, buffer_ref *out) {
    const size_t N = (size_t)r->B * r->T, C = r->shape.cfg.dim, H = 4 * C;
    const size_t att = (size_t)r->B * r->shape.cfg.heads * r->T * r->T;
    const size_t V = r->shape.cfg.vocab;
    int n = 0;
    for (int l = 0; l <= r->shape.cfg.layers; l++) out[n++] = (buffer_ref){&r->x[l], N * C};
    for (int l = 0; l < r->shape.cfg.layers; l++) {
        block_acts *a = &r->acts[l];
        buffer_ref block[] = {
            {&a->ln1, N * C}, {&a->ln1_mean, N}, {&a->ln1_rstd, N}, {&a->qkv, 3 * N * C},
            {&a->att, att}, {&a->atty, N * C}, {&a->x_mid, N * C}, {&a->ln2, N * C},
            {&a->ln2_mean, N}, {&a->ln2_rstd, N}, {&a->fch, N * H}, {&a->fch_gelu, N * H}};
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++) out[n++] = block[i];
    }
    buffer_ref rest[] = {
        {&r->lnf, N * C}, {&r->lnf_mean, N}, {&r->lnf_rstd, N}, {&r->logits, N * V},
        {&r->losses, N}, {&r->dx, N * C}, {&r->d_x_mid, N * C}, {&r->d_ln, N * C},
        {&r->d_atty, N * C}, {&r->d_qkv, 3 * N * C}, {&r->d_att, att}, {&r->d_fch, N * H},
        {&r->d_fch_gelu, N * H}};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) out[n++] = rest[i];
    return n;
}

dp_replica *dp_replica_create(const gpt_shape *s, int B, int T) {
    dp_replica *r = calloc(1, sizeof *r);
    r->shape = *s;
    r->B = B;
    r->T = T;
    const int L = s->cfg.layers;
    r->x = calloc((size_t)L + 1, sizeof *r->x);
    r->acts = calloc((size_t)L, sizeof *r->acts);
    r->tokens = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, (size_t)B * T * sizeof(int));
    r->targets = mem_alloc_on(MEM_DEVICE, MEM_ACTIVATIONS, (size_t)B * T * sizeof(int));
    buffer_ref *buffers = malloc(sizeof *buffers * replica_buffer_count(L));
    int n = replica_buffers(r, buffers);
    for (int i = 0; i < n; i++) *buffers[i].slot = acts_alloc(buffers[i].numel);
    free(buffers);
    return r;
}

void dp_replica_free(dp_replica *r) {
    if (!r) return;
    buffer_ref *buffers = malloc(sizeof *buffers * replica_buffer_count(r->shape.cfg.layers));
    int n = replica_buffers(r, buffers);
    for (int i = 0; i < n; i++) mem_free(*buffers[i].slot);
    free(buffers);
    mem_free(r->tokens);
    mem_free(r->targets);
    free(r->x);
    free(r->acts);
    free(r);
}

void dp_replica_set_batch(dp_replica *r, const int *tokens, const int *targets) {
    size_t bytes = (size_t)r->B * r->T * sizeof(int);
    ops_upload(r->tokens, tokens, bytes);
    ops_upload(r->targets, targets, bytes);
}

/* ---- forward ------------------------------------------------------------------------ */

static void block_forward(dp_replica *r, int l, const float *block, dp_thread *t) {
    const int B = r->B, T = r->T, N = B * T, C = r->shape.cfg.dim, H = 4 * C;
    const int NH = r->shape.cfg.heads;
    gpt_block_tensors p = gpt_block_view(&r->shape, (float *)block);
    block_acts *a = &r->acts[l];
    const float *x_in = r->x[l];
    float *x_out = r->x[l + 1];

    LIGHT(t, layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x_in, p.ln1_w, p.ln1_b, N, C));
    KERNEL(t, linear_forward(a->qkv, a->ln1, p.qkv_w, p.qkv_b, N, C, 3 * C));
    KERNEL(t, attention_forward(a->atty, a->att, a->qkv, B, T, C, NH));
    KERNEL(t, linear_forward(a->x_mid, a->atty, p.proj_w, p.proj_b, N, C, C));
    LIGHT(t, vec_add(a->x_mid, x_in, (size_t)N * C));

    LIGHT(t, layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, p.ln2_w, p.ln2_b, N, C));
    KERNEL(t, linear_forward(a->fch, a->ln2, p.fc_w, p.fc_b, N, C, H));
    LIGHT(t, gelu_forward(a->fch_gelu, a->fch, (size_t)N * H));
    KERNEL(t, linear_forward(x_out, a->fch_gelu, p.fc2_w, p.fc2_b, N, H, C));
    LIGHT(t, vec_add(x_out, a->x_mid, (size_t)N * C));
}

float dp_replica_forward(dp_replica *r, const float *params, dp_thread *t) {
    const gpt_shape *s = &r->shape;
    const int N = r->B * r->T, C = s->cfg.dim, V = s->cfg.vocab, L = s->cfg.layers;
    const float *wte = params, *wpe = params + (size_t)V * C;
    LIGHT(t, embedding_forward(r->x[0], r->tokens, wte, N, C, 0, V));
    LIGHT(t, position_forward(r->x[0], wpe, r->B, r->T, C));
    for (int l = 0; l < L; l++)
        block_forward(r, l, params + gpt_slab_offset(s, gpt_block_slab(s, l)), t);
    const float *final_ln = params + gpt_slab_offset(s, gpt_final_slab(s));
    LIGHT(t, layernorm_forward(r->lnf, r->lnf_mean, r->lnf_rstd, r->x[L], final_ln,
                               final_ln + C, N, C));
    KERNEL(t, linear_forward(r->logits, r->lnf, wte, NULL, N, C, V));   /* tied head */
    double loss_sum = 0.0;
    LIGHT(t, crossentropy_forward(r->losses, r->logits, r->logits, r->targets, N, V);
             loss_sum = vec_sum(r->losses, (size_t)N));
    return (float)(loss_sum / N);
}

/* ---- backward ----------------------------------------------------------------------- */

static void block_backward(dp_replica *r, int l, const float *block, float *block_grad,
                           dp_thread *t) {
    const int B = r->B, T = r->T, N = B * T, C = r->shape.cfg.dim, H = 4 * C;
    const int NH = r->shape.cfg.heads;
    gpt_block_tensors p = gpt_block_view(&r->shape, (float *)block);
    gpt_block_tensors g = gpt_block_view(&r->shape, block_grad);
    block_acts *a = &r->acts[l];
    float *dx = r->dx;   /* in: d(block output); out: d(block input) */

    LIGHT(t, vec_copy(r->d_x_mid, dx, (size_t)N * C));
    KERNEL(t, linear_backward(r->d_fch_gelu, g.fc2_w, g.fc2_b, dx, a->fch_gelu, p.fc2_w, N, H, C));
    LIGHT(t, gelu_backward(r->d_fch, a->fch, r->d_fch_gelu, (size_t)N * H));
    KERNEL(t, linear_backward(r->d_ln, g.fc_w, g.fc_b, r->d_fch, a->ln2, p.fc_w, N, C, H));
    LIGHT(t, layernorm_backward(r->d_x_mid, g.ln2_w, g.ln2_b, r->d_ln, a->x_mid, p.ln2_w,
                                a->ln2_mean, a->ln2_rstd, N, C));

    LIGHT(t, vec_copy(dx, r->d_x_mid, (size_t)N * C));
    KERNEL(t, linear_backward(r->d_atty, g.proj_w, g.proj_b, r->d_x_mid, a->atty, p.proj_w,
                              N, C, C));
    KERNEL(t, attention_backward(r->d_qkv, r->d_att, r->d_atty, a->qkv, a->att, B, T, C, NH));
    KERNEL(t, linear_backward(r->d_ln, g.qkv_w, g.qkv_b, r->d_qkv, a->ln1, p.qkv_w, N, C, 3 * C));
    LIGHT(t, layernorm_backward(dx, g.ln1_w, g.ln1_b, r->d_ln, r->x[l], p.ln1_w, a->ln1_mean,
                                a->ln1_rstd, N, C));
}

void dp_replica_backward(dp_replica *r, const float *params, float *grads, float dloss,
                         dp_thread *t) {
    const gpt_shape *s = &r->shape;
    const int N = r->B * r->T, C = s->cfg.dim, V = s->cfg.vocab, L = s->cfg.layers;
    const size_t final_offset = gpt_slab_offset(s, gpt_final_slab(s));
    const float *final_ln = params + final_offset;
    float *final_ln_grad = grads + final_offset;

    LIGHT(t, crossentropy_backward(r->logits, r->logits, r->targets, dloss, N, V));
    KERNEL(t, linear_backward(r->d_ln, grads, NULL, r->logits, r->lnf, params, N, C, V));
    LIGHT(t, vec_zero(r->dx, (size_t)N * C));
    LIGHT(t, layernorm_backward(r->dx, final_ln_grad, final_ln_grad + C, r->d_ln, r->x[L],
                                final_ln, r->lnf_mean, r->lnf_rstd, N, C));
    for (int l = L - 1; l >= 0; l--) {
        size_t offset = gpt_slab_offset(s, gpt_block_slab(s, l));
        block_backward(r, l, params + offset, grads + offset, t);
    }
    LIGHT(t, embedding_backward(grads, r->dx, r->tokens, N, C, 0, V));
    LIGHT(t, position_backward(grads + (size_t)V * C, r->dx, r->B, r->T, C));
}
