/* Ring attention (cp_attention.h): K/V blocks around the CP ring, an online softmax on
 * each rank, dK/dV sent back around in backward.
 *
 *   forward, rank r of P:                     backward:
 *     kv = my K, V; O, m, l = 0, -inf, 0        kv = my K, V; dkv = 0; D = rowsum(dO O)
 *     for s = 0 .. P-1:                         for s = 0 .. P-1:
 *         (kv is chunk (r - s) mod P's)             send kv to r+1 (s < P-1)
 *         send kv to r+1 (s < P-1)                  dQ, dkv += block's gradients
 *         O, m, l += block(my Q, kv)                send dkv to r+1, receive the next
 *         receive kv from r-1 (s < P-1)             receive kv from r-1 (s < P-1)
 *     O /= l; lse = m + log l                   dkv is now mine (its last hop took it home)
 *
 * Even ranks send before they compute and receive, odd ranks after they receive: with
 * buffered sends (comm.h's default) the block travels while both compute, and with
 * sends that wait for their receiver (NCCL's, --send-mode rendezvous) the ring still
 * cannot deadlock. Blocks after a query's chunk are skipped (the causal mask), the
 * chunk's own block is masked inside. In 16 bits the K/V blocks travel in the model's
 * precision (exact), dK/dV in fp32 (cp_options.wire). */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "cp_attention.h"
#include "ops.h"
#include "ops_mixed.h"

enum { TAG_KV = 4101, TAG_DKV = 4102 };

struct cp_ring {
    comm *cp;
    cp_options opts;
    int P, me, B, T, C, NH, hs, Tc;
    position_span *spans;            /* [P]: each rank's positions */
    float *kv, *kv_next, *kv_stale;  /* [B, Tc, 2C]: a K/V block (K | V per row) */
    float *dkv, *dkv_next;           /* its gradient, travelling with it in backward */
    void *wire_out, *wire_in;        /* 16-bit wire: a K/V block sent, one received */
    float *m, *l, *delta;            /* [B, NH, Tc] per query row */
    float *scores, *dscores;         /* one pair's q x k */
    uint64_t work;
};

/* The K/V (or dK/dV) block that travels: [B, Tc, 2C]. */
static size_t ring_block_numel(const cp_ring *r) { return (size_t)r->B * r->Tc * 2 * r->C; }

cp_ring *cp_ring_create(comm *cp, const cp_options *opts, int B, int T, int C, int NH) {
    cp_ring *r = mem_alloc(MEM_OTHER, sizeof *r);
    r->cp = cp;
    r->opts = *opts;
    r->P = cp ? comm_size(cp) : 1;
    r->me = cp ? comm_rank(cp) : 0;
    r->B = B, r->T = T, r->C = C, r->NH = NH, r->hs = C / NH, r->Tc = T / r->P;
    r->spans = mem_alloc(MEM_OTHER, (size_t)r->P * sizeof *r->spans);
    int longest_piece = 0;
    for (int i = 0; i < r->P; i++) {
        r->spans[i] = cp_span_of(T, r->P, i, opts->split);
        for (int k = 0; k < r->spans[i].pieces; k++)
            if (r->spans[i].len[k] > longest_piece) longest_piece = r->spans[i].len[k];
    }
    const size_t block = ring_block_numel(r), rows = (size_t)B * NH * r->Tc;
    float **blocks[] = {&r->kv, &r->kv_next, &r->dkv, &r->dkv_next};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        *blocks[i] = mem_alloc(MEM_ACTIVATIONS, block * sizeof(float));
    if (opts->test_stale_kv) r->kv_stale = mem_alloc(MEM_ACTIVATIONS, block * sizeof(float));
    if (opts->wire != PRECISION_FP32) {
        r->wire_out = mem_alloc(MEM_ACTIVATIONS, block * precision_bytes(opts->wire));
        r->wire_in = mem_alloc(MEM_ACTIVATIONS, block * precision_bytes(opts->wire));
    }
    r->m = mem_alloc(MEM_ACTIVATIONS, rows * sizeof(float));
    r->l = mem_alloc(MEM_ACTIVATIONS, rows * sizeof(float));
    r->delta = mem_alloc(MEM_ACTIVATIONS, rows * sizeof(float));
    const size_t tile = (size_t)longest_piece * longest_piece;
    r->scores = mem_alloc(MEM_ACTIVATIONS, tile * sizeof(float));
    r->dscores = mem_alloc(MEM_ACTIVATIONS, tile * sizeof(float));
    return r;
}

void cp_ring_free(cp_ring *r) {
    if (!r) return;
    void *all[] = {r->spans, r->kv, r->kv_next, r->kv_stale, r->dkv, r->dkv_next,
                   r->wire_out, r->wire_in, r->m, r->l, r->delta, r->scores, r->dscores};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
    mem_free(r);
}

uint64_t cp_ring_work(const cp_ring *r) { return r->work; }
int cp_ring_size(const cp_ring *r) { return r->P; }

/* kv[row] = qkv[row]'s K and V columns */
static void pack_kv(const cp_ring *r, float *kv, const float *qkv) {
    const size_t rows = (size_t)r->B * r->Tc, C = r->C;
    for (size_t i = 0; i < rows; i++) memcpy(kv + i * 2 * C, qkv + i * 3 * C + C, 2 * C * 4);
}

static void swap(float **a, float **b) {
    float *t = *a;
    *a = *b;
    *b = t;
}

/* The pair of this rank's piece qi and the owner's piece ki, for sequence b, head h. */
static attention_pair pair_of(const cp_ring *r, const float *qkv, const float *kv, int owner,
                              int b, int h, int qi, int ki, int *q_row) {
    const position_span *mine = &r->spans[r->me], *theirs = &r->spans[owner];
    int q0 = 0, k0 = 0;
    for (int i = 0; i < qi; i++) q0 += mine->len[i];
    for (int i = 0; i < ki; i++) k0 += theirs->len[i];
    *q_row = q0;
    const size_t qrow = (size_t)b * r->Tc + q0, krow = (size_t)b * r->Tc + k0;
    const float *k = kv + krow * 2 * r->C + (size_t)h * r->hs;
    return (attention_pair){.q = qkv + qrow * 3 * r->C + (size_t)h * r->hs, .ldq = 3 * r->C,
                            .k = k, .v = k + r->C, .ldkv = 2 * r->C,
                            .q_start = mine->start[qi], .q_len = mine->len[qi],
                            .k_start = theirs->start[ki], .k_len = theirs->len[ki],
                            .hs = r->hs, .scale = (float)(1.0 / sqrt((double)r->hs))};
}

/* Every pair of (my piece, the owner's piece), every sequence and head, forward. */
static void block_forward(cp_ring *r, float *out, const float *qkv, const float *kv,
                          int owner) {
    const int mine = r->spans[r->me].pieces, theirs = r->spans[owner].pieces;
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->NH; h++)
            for (int qi = 0; qi < mine; qi++)
                for (int ki = 0; ki < theirs; ki++) {
                    int q_row;
                    attention_pair p = pair_of(r, qkv, kv, owner, b, h, qi, ki, &q_row);
                    const size_t row = ((size_t)b * r->NH + h) * r->Tc + q_row;
                    float *o = out + ((size_t)b * r->Tc + q_row) * r->C + (size_t)h * r->hs;
                    r->work += attention_block_forward(&p, o, r->C, r->m + row, r->l + row,
                                                       r->scores,
                                                       r->opts.test_unmasked_diagonal);
                }
}

/* A block to the next rank: K/V in the wire's precision where it is 16 bits (their
 * values are 16-bit ones, so rounding them is exact), dK/dV in fp32. */
static void send_block(cp_ring *r, const float *block, int tag) {
    const size_t n = ring_block_numel(r);
    const int next = (r->me + 1) % r->P;
    if (tag == TAG_KV && r->wire_out) {
        mixed_round(r->opts.wire, r->wire_out, block, n);
        comm_send(r->cp, r->wire_out, n, comm_dtype_of(r->opts.wire), next, tag);
    } else {
        comm_send(r->cp, block, n, COMM_F32, next, tag);
    }
}

static void recv_block(cp_ring *r, float *block, int tag) {
    const size_t n = ring_block_numel(r);
    const int previous = (r->me + r->P - 1) % r->P;
    if (tag == TAG_KV && r->wire_in) {
        comm_recv(r->cp, r->wire_in, n, comm_dtype_of(r->opts.wire), previous, tag);
        mixed_widen(r->opts.wire, block, r->wire_in, n);
    } else {
        comm_recv(r->cp, block, n, COMM_F32, previous, tag);
    }
}

/* Even ranks start their send before the block's compute. */
static void send_early(cp_ring *r, const float *cur, int tag) {
    if (r->me % 2 == 0) send_block(r, cur, tag);
}

/* One hop of a buffer around the ring: send *cur to the next rank, receive the
 * previous rank's into *next, swap. sent_already: an even rank sent before computing. */
static void hop(cp_ring *r, float **cur, float **next, int tag, int sent_already) {
    if (!sent_already) send_early(r, *cur, tag);
    recv_block(r, *next, tag);
    if (r->me % 2) send_block(r, *cur, tag);
    swap(cur, next);
}

void cp_ring_forward(cp_ring *r, float *out, float *lse, const float *qkv) {
    const size_t rows = (size_t)r->B * r->NH * r->Tc;
    pack_kv(r, r->kv, qkv);
    vec_zero(out, (size_t)r->B * r->Tc * r->C);
    for (size_t i = 0; i < rows; i++) r->m[i] = -INFINITY, r->l[i] = 0.0f;
    for (int s = 0; s < r->P; s++) {
        const int more = s < r->P - 1;
        if (more) send_early(r, r->kv, TAG_KV);
        block_forward(r, out, qkv, r->kv, (r->me - s + r->P) % r->P);
        if (more) hop(r, &r->kv, &r->kv_next, TAG_KV, 1);
    }
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->NH; h++) {
            const size_t row = ((size_t)b * r->NH + h) * r->Tc;
            attention_block_finish(out + (size_t)b * r->Tc * r->C + (size_t)h * r->hs, r->C,
                                   r->m + row, r->l + row, lse + row, r->Tc, r->hs);
        }
}

/* Every pair, backward: dQ into dqkv's Q columns, dK and dV into the block's dkv. */
static void block_backward(cp_ring *r, float *dqkv, const float *dout, const float *qkv,
                           const float *lse, const float *kv, float *dkv, int owner) {
    const int mine = r->spans[r->me].pieces, theirs = r->spans[owner].pieces;
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->NH; h++)
            for (int qi = 0; qi < mine; qi++)
                for (int ki = 0; ki < theirs; ki++) {
                    int q_row;
                    attention_pair p = pair_of(r, qkv, kv, owner, b, h, qi, ki, &q_row);
                    const size_t row = ((size_t)b * r->NH + h) * r->Tc + q_row;
                    const size_t q_at = ((size_t)b * r->Tc + q_row), k_at = p.k - kv;
                    attention_pair_grads g = {
                        .dout = dout + q_at * r->C + (size_t)h * r->hs, .lddo = r->C,
                        .lse = lse + row, .delta = r->delta + row,
                        .dq = dqkv + q_at * 3 * r->C + (size_t)h * r->hs, .lddq = 3 * r->C,
                        .dk = dkv + k_at, .dv = dkv + k_at + r->C, .lddkv = 2 * r->C};
                    r->work += attention_block_backward(&p, &g, r->scores, r->dscores,
                                                        r->opts.test_unmasked_diagonal);
                }
}

void cp_ring_backward(cp_ring *r, float *dqkv, const float *dout, const float *qkv,
                      const float *out, const float *lse) {
    const size_t rows = (size_t)r->B * r->Tc;
    for (int b = 0; b < r->B; b++)
        for (int h = 0; h < r->NH; h++) {
            const size_t at = (size_t)b * r->Tc * r->C + (size_t)h * r->hs;
            attention_block_delta(r->delta + ((size_t)b * r->NH + h) * r->Tc, dout + at, r->C,
                                  out + at, r->C, r->Tc, r->hs);
        }
    pack_kv(r, r->kv, qkv);
    vec_zero(r->dkv, ring_block_numel(r));
    vec_zero(dqkv, rows * 3 * r->C);
    for (int s = 0; s < r->P; s++) {
        const int more = s < r->P - 1;
        if (more) send_early(r, r->kv, TAG_KV);
        /* the negative control computes with the block of the step before */
        const float *kv = r->opts.test_stale_kv && s > 0 ? r->kv_stale : r->kv;
        block_backward(r, dqkv, dout, qkv, lse, kv, r->dkv, (r->me - s + r->P) % r->P);
        if (more) {
            if (r->kv_stale) memcpy(r->kv_stale, r->kv, ring_block_numel(r) * sizeof(float));
            hop(r, &r->kv, &r->kv_next, TAG_KV, 1);
        }
        if (r->P > 1) hop(r, &r->dkv, &r->dkv_next, TAG_DKV, 0);   /* the last hop: home */
    }
    /* dkv is my own block's gradient now: into dqkv's K and V columns */
    for (size_t i = 0; i < rows; i++)
        memcpy(dqkv + i * 3 * r->C + r->C, r->dkv + i * 2 * r->C, 2 * (size_t)r->C * 4);
}
