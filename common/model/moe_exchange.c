/* Expert parallelism's all-to-alls (moe.h): the kept pairs' rows, sorted by expert, go
 * to the ranks that hold their experts and come back in the same order.
 *
 *   sent order     this rank's rows by expert 0..E-1: EP rank r's share is experts
 *                  [r El, (r+1) El), one contiguous block, so one all-to-all-v sends all
 *   source order   what a rank receives: from EP rank 0 its rows for local experts
 *                  0..El-1, then from rank 1, ...
 *   expert order   the same rows regrouped by local expert (sources in rank order
 *                  within one): each expert's rows contiguous for its matmuls, and in
 *                  global token order, as on one device
 *
 * The counts differ per rank and per step, so a rank first learns how many rows each
 * peer sends for each of its experts (an all-to-all of El counts). With EP 1 the
 * exchanges are copies and source order is expert order. */
#include <string.h>

#include "moe_internal.h"

void moe_exchange_plan(moe_layer *m, moe_block_state *b) {
    const int EP = m->s.ep_size, El = m->s.experts_local;
    if (!m->opts.ep) {
        memcpy(b->recv_per_source, b->send_per_expert, (size_t)El * sizeof(size_t));
    } else {   /* counts as f64: exact up to 2^53 rows */
        double *counts = m->gathered, *received = m->gathered + EP * El;
        for (int e = 0; e < EP * El; e++) counts[e] = (double)b->send_per_expert[e];
        comm_alltoall(m->opts.ep, counts, received, (size_t)El, COMM_F64);
        for (int i = 0; i < EP * El; i++) b->recv_per_source[i] = (size_t)received[i];
    }
    b->rows_local = 0;
    for (int i = 0; i < EP * El; i++) b->rows_local += b->recv_per_source[i];
}

/* Rows to and from each EP rank in block b's exchanges. */
static void peer_rows(moe_layer *m, const moe_block_state *b) {
    const int EP = m->s.ep_size, El = m->s.experts_local;
    for (int r = 0; r < EP; r++) {
        m->send_rows[r] = m->recv_rows[r] = 0;
        for (int j = 0; j < El; j++) {
            m->send_rows[r] += b->send_per_expert[r * El + j];
            m->recv_rows[r] += b->recv_per_source[r * El + j];
        }
    }
}

/* src's rows, src_rows[r] of them for EP rank r, go to r, which receives them in
 * dst after those of the ranks before this one: one all-to-all-v of rows of C. */
static void exchange(moe_layer *m, const float *src, const size_t *src_rows, float *dst,
                     const size_t *dst_rows) {
    const int EP = m->s.ep_size, me = m->s.ep_rank;
    const size_t C = m->s.dim;
    for (int r = 0; r < EP; r++) m->exchanged_rows += (double)src_rows[r];
    if (!m->opts.ep) {
        memcpy(dst, src, src_rows[0] * C * sizeof(float));
        return;
    }
    size_t send_counts[EP], recv_counts[EP], send_at = 0, recv_at = 0;
    for (int r = 0; r < EP; r++) {
        send_counts[r] = src_rows[r] * C;
        recv_counts[r] = dst_rows[r] * C;
        m->send_offsets[r] = send_at;
        m->recv_offsets[r] = recv_at;
        send_at += send_counts[r];
        recv_at += recv_counts[r];
        if (r != me) m->remote_rows += (double)src_rows[r];
    }
    comm_alltoallv(m->opts.ep, src, send_counts, m->send_offsets, dst, recv_counts,
                   m->recv_offsets, COMM_F32);
}

/* Copies the rows of every (source, local expert) block between source order and
 * expert order (to_expert: source -> expert; else back). */
static void regroup(const moe_layer *m, const moe_block_state *b, const float *src, float *dst,
                    int to_expert) {
    const int EP = m->s.ep_size, El = m->s.experts_local;
    const size_t C = m->s.dim;
    size_t expert_at = 0;
    for (int j = 0; j < El; j++) {
        for (int s = 0; s < EP; s++) {
            size_t source_at = 0;   /* block (s, j) in source order */
            for (int i = 0; i < s * El + j; i++) source_at += b->recv_per_source[i];
            const size_t rows = b->recv_per_source[s * El + j];
            const float *from = src + (to_expert ? source_at : expert_at) * C;
            float *to = dst + (to_expert ? expert_at : source_at) * C;
            memcpy(to, from, rows * C * sizeof(float));
            expert_at += rows;
        }
    }
}

void moe_dispatch(moe_layer *m, moe_block_state *b, const float *send, float *rows) {
    peer_rows(m, b);
    exchange(m, send, m->send_rows, m->recv, m->recv_rows);
    regroup(m, b, m->recv, rows, 1);
}

void moe_combine(moe_layer *m, moe_block_state *b, const float *rows, float *out) {
    peer_rows(m, b);
    /* negative control: the rows go back in expert order, not regrouped by source (the
     * same on one device or with one expert a rank; wrong tokens otherwise) */
    if (m->opts.test_combine_misorder) {
        exchange(m, rows, m->recv_rows, out, m->send_rows);
        return;
    }
    regroup(m, b, rows, m->recv, 0);
    exchange(m, m->recv, m->recv_rows, out, m->send_rows);
}
