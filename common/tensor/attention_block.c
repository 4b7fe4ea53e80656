/* Causal attention block by block with an online softmax (attention_block.h). The
 * products go through sgemm; the softmax bookkeeping is per row. */
#include "attention_block.h"

#include <cblas.h>
#include <math.h>

int position_span_rows(const position_span *s) {
    int rows = 0;
    for (int i = 0; i < s->pieces; i++) rows += s->len[i];
    return rows;
}

position_span position_span_slice(const position_span *s, int first, int rows) {
    position_span out = {0};
    for (int i = 0, row = 0; i < s->pieces && rows > 0; row += s->len[i], i++) {
        if (first >= row + s->len[i]) continue;   /* the slice starts after this piece */
        const int skip = first > row ? first - row : 0;
        const int take = s->len[i] - skip < rows ? s->len[i] - skip : rows;
        out.start[out.pieces] = s->start[i] + skip;
        out.len[out.pieces++] = take;
        first += take;
        rows -= take;
    }
    return out;
}

block_kind block_kind_of(int q_start, int q_len, int k_start, int k_len) {
    if (k_start > q_start + q_len - 1) return BLOCK_SKIPPED;
    if (k_start + k_len - 1 <= q_start) return BLOCK_FULL;
    return BLOCK_DIAGONAL;
}

/* scores[q_len, k_len] = scale * Q K^T, and -inf where the key comes after the query
 * (on a diagonal pair, unless the negative control forgets it). */
static void block_scores(const attention_pair *p, float *scores, int masked) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p->q_len, p->k_len, p->hs, p->scale,
                p->q, p->ldq, p->k, p->ldkv, 0.0f, scores, p->k_len);
    if (!masked) return;
    for (int i = 0; i < p->q_len; i++) {
        const int last_seen = p->q_start + i - p->k_start;   /* keys [0, last_seen] */
        for (int j = last_seen + 1 < 0 ? 0 : last_seen + 1; j < p->k_len; j++)
            scores[(size_t)i * p->k_len + j] = -INFINITY;
    }
}

static int masked_pair(const attention_pair *p, int unmasked) {
    return !unmasked && block_kind_of(p->q_start, p->q_len, p->k_start, p->k_len) ==
                            BLOCK_DIAGONAL;
}

uint64_t attention_block_forward(const attention_pair *p, float *o, int ldo, float *m,
                                 float *l, float *scores, int unmasked) {
    if (block_kind_of(p->q_start, p->q_len, p->k_start, p->k_len) == BLOCK_SKIPPED) return 0;
    block_scores(p, scores, masked_pair(p, unmasked));
    for (int i = 0; i < p->q_len; i++) {
        float *row = scores + (size_t)i * p->k_len;
        float row_max = m[i];
        for (int j = 0; j < p->k_len; j++) row_max = row[j] > row_max ? row[j] : row_max;
        if (row_max == -INFINITY) {   /* nothing seen yet, nothing in this block */
            for (int j = 0; j < p->k_len; j++) row[j] = 0.0f;
            continue;
        }
        /* what is there was summed against the old maximum: rescale it to the new one */
        const float rescale = m[i] == -INFINITY ? 0.0f : expf(m[i] - row_max);
        float sum = 0.0f;
        for (int j = 0; j < p->k_len; j++) sum += row[j] = expf(row[j] - row_max);
        l[i] = l[i] * rescale + sum;
        m[i] = row_max;
        cblas_sscal(p->hs, rescale, o + (size_t)i * ldo, 1);
    }
    /* O += exp(S - m) V: the rows of a block with nothing seen are zero */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p->q_len, p->hs, p->k_len, 1.0f,
                scores, p->k_len, p->v, p->ldkv, 1.0f, o, ldo);
    return (uint64_t)p->q_len * p->k_len;
}

void attention_block_finish(float *o, int ldo, const float *m, const float *l, float *lse,
                            int rows, int hs) {
    for (int i = 0; i < rows; i++) {
        cblas_sscal(hs, 1.0f / l[i], o + (size_t)i * ldo, 1);
        lse[i] = m[i] + logf(l[i]);
    }
}

void attention_block_delta(float *delta, const float *dout, int lddo, const float *o, int ldo,
                           int rows, int hs) {
    for (int i = 0; i < rows; i++)
        delta[i] = cblas_sdot(hs, dout + (size_t)i * lddo, 1, o + (size_t)i * ldo, 1);
}

uint64_t attention_block_backward(const attention_pair *p, const attention_pair_grads *g,
                                  float *scores, float *dscores, int unmasked) {
    if (block_kind_of(p->q_start, p->q_len, p->k_start, p->k_len) == BLOCK_SKIPPED) return 0;
    const int nq = p->q_len, nk = p->k_len, hs = p->hs;
    /* P = exp(S - lse): the forward's probabilities, recomputed (masked ones 0) */
    block_scores(p, scores, masked_pair(p, unmasked));
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            scores[(size_t)i * nk + j] = expf(scores[(size_t)i * nk + j] - g->lse[i]);
    /* dV += P^T dO;  dP = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, scores, nk,
                g->dout, g->lddo, 1.0f, g->dv, g->lddkv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, g->dout, g->lddo,
                p->v, p->ldkv, 0.0f, dscores, nk);
    /* through the softmax: dS = P (dP - D) */
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            const size_t at = (size_t)i * nk + j;
            dscores[at] = scores[at] * (dscores[at] - g->delta[i]);
        }
    /* dQ += scale dS K;  dK += scale dS^T Q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, p->scale, dscores, nk,
                p->k, p->ldkv, 1.0f, g->dq, g->lddq);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, p->scale, dscores, nk,
                p->q, p->ldq, 1.0f, g->dk, g->lddkv);
    return (uint64_t)nq * nk;
}
