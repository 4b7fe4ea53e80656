/* ZeRO++'s quantised collectives (quant_collectives.h) on 1..5 thread ranks, uneven
 * shards (1003 elements): qwZ's int8 all-gather and qgZ's int4 reduce-scatter equal a
 * serial reference (each shard or piece through the codec, summed in rank order) to the
 * bit, every element within the codec's per-block bound of the exact fp32 result (the
 * sum of the n pieces' bounds for the reduce-scatter), and the bytes each rank sends
 * equal (n-1) E; negative control: the reference with the wrong block size differs.
 * On 2 nodes of 2: the bytes across the nodes of qwZ and qgZ against fp16's, each equal
 * to its formula. qgZ in two hops likewise (qgz_in_two_hops_matches_the_reference). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "check_run.h"
#include "quant_collectives.h"

enum { COUNT = 1003 };

typedef struct {
    quant_wire w;
    size_t reference_block;   /* the reference's block: w.block, or not (the control) */
    double worst_bound, sent_error;   /* error / bound; |sent - (n-1) E| */
    int equal;
} qc_case;

/* Rank r's full vector (gradients) or its values at global index i (weights). */
static float value(int r, size_t i) {
    return 0.02f * sinf(0.31f * (float)i + (float)r) + (i % 89 == 0 ? 1.5f : 0.0f);
}

static float through_codec(quant_wire w, size_t block, const float *x, size_t len, size_t i) {
    static float back[COUNT];
    static unsigned char enc[COUNT * 8];
    quant_encode(w.bits, block, x, len, enc);
    quant_decode(w.bits, block, enc, len, back);
    return back[i];
}

static float block_absmax(const float *x, size_t len, size_t block, size_t i) {
    float m = 0;
    for (size_t j = i / block * block; j < len && j < i / block * block + block; j++)
        m = fmaxf(m, fabsf(x[j]));
    return m;
}

/* The reduce-scatter's reference for my element i: sum over ranks in order. */
static void check_reduce_scatter(comm *c, qc_case *q, const float *shard, size_t off,
                                 size_t len) {
    const int n = comm_size(c);
    float piece[COUNT];
    for (size_t i = 0; i < len; i++) {
        float sum = 0, exact = 0;
        double bound = 0;
        for (int r = 0; r < n; r++) {
            for (size_t j = 0; j < len; j++) piece[j] = value(r, off + j);
            sum += through_codec(q->w, q->reference_block, piece, len, i);
            exact += piece[i];
            bound += quant_block_bound(q->w.bits, block_absmax(piece, len, q->w.block, i));
        }
        q->equal &= shard[i] == sum;
        q->worst_bound = fmax(q->worst_bound, fabs(shard[i] - exact) / (bound + 1e-30));
    }
}

static int qc_main(comm *c, void *arg) {
    qc_case *q = arg;
    const int n = comm_size(c), me = comm_rank(c);
    float *full = mem_alloc(MEM_OTHER, COUNT * sizeof(float));
    float *shard = mem_alloc(MEM_OTHER, COUNT * sizeof(float));
    void *scratch = mem_alloc(MEM_OTHER, quant_scratch_bytes(c, COUNT, q->w));
    size_t off, len = comm_shard(COUNT, n, me, &off);
    for (size_t i = 0; i < len; i++) shard[i] = value(0, off + i);   /* weights: one copy */
    comm_stats_reset(c);
    quant_allgather(c, q->w, shard, full, COUNT, scratch);
    comm_stats st = comm_stats_get(c);
    const uint64_t sent = comm_stats_total_sent(&st);   /* the all-gather's */
    if (me == 0)
        for (int r = 0; r < n; r++) {   /* every shard through the codec, alone */
            size_t o, l = comm_shard(COUNT, n, r, &o);
            float piece[COUNT];
            for (size_t j = 0; j < l; j++) piece[j] = value(0, o + j);
            for (size_t j = 0; j < l; j++) {
                q->equal &= full[o + j] == through_codec(q->w, q->reference_block, piece, l, j);
                const double b = quant_block_bound(q->w.bits, block_absmax(piece, l, q->w.block, j));
                q->worst_bound = fmax(q->worst_bound, fabs(full[o + j] - piece[j]) / (b + 1e-30));
            }
        }
    for (size_t i = 0; i < COUNT; i++) full[i] = value(me, i);   /* gradients: one a rank */
    quant_reduce_scatter(c, q->w, full, shard, COUNT, scratch);
    st = comm_stats_get(c);
    const double E = (double)quant_shard_bytes(c, COUNT, q->w);
    if (me == 0) {
        check_reduce_scatter(c, q, shard, off, len);
        q->sent_error = fabs((double)comm_stats_total_sent(&st) - 2 * (n - 1) * E) +
                        fabs((double)sent - (n - 1) * E);
    }
    mem_free(scratch);
    mem_free(shard);
    mem_free(full);
    return 0;
}

static qc_case run_case(int ranks, quant_wire w, size_t reference_block) {
    qc_case q = {.w = w, .reference_block = reference_block, .equal = 1};
    comm_options o = comm_options_default();
    o.ranks = ranks;
    o.timeout_seconds = 30;
    ck_assert_int_eq(launch_threads(&o, qc_main, &q), 0);
    return q;
}

START_TEST(qwz_and_qgz_match_the_reference) {
    const quant_wire wires[2] = {{QUANT_INT8, 64, 0}, {QUANT_INT4, 32, 0}};
    for (int k = 0; k < 2; k++) {
        const qc_case q = run_case(_i, wires[k], wires[k].block);
        printf("%d ranks, int%d blocks of %zu: all-gather and reduce-scatter %s the serial"
               " reference; worst error %.3f of the bound; bytes sent off (n-1) E by %.0f\n",
               _i, wires[k].bits == QUANT_INT4 ? 4 : 8, wires[k].block,
               q.equal ? "equal" : "DIFFER FROM", q.worst_bound, q.sent_error);
        ck_assert(q.equal);
        ck_assert(q.worst_bound <= 1);
        ck_assert(q.sent_error == 0);
    }
}
END_TEST

START_TEST(wrong_block_reference_differs) {
    const qc_case q = run_case(3, (quant_wire){QUANT_INT8, 64, 0}, 32);
    printf("negative control: the reference in blocks of 32 against a wire of 64: %s\n",
           q.equal ? "equal (the check is blind)" : "differs");
    ck_assert(!q.equal);
}
END_TEST

/* Bytes across the nodes (2 nodes of 2): qwZ's int8 all-gather against fp16's, and
 * qgZ's int4 all-to-all against fp16's ring reduce-scatter, summed over the ranks, each
 * next to its formula: the ring of 4 crosses the nodes on 2 of its 4 links, each
 * carrying (n-1) pieces; the all-to-all sends each rank's 2 pieces for the other node
 * across. ZeRO++ reports qwZ at 0.5 of fp16's weights' bytes (its int8 with scales). */
typedef struct {
    double inter[4];   /* fp16 gather, qwZ gather, fp16 reduce-scatter, qgZ */
} tier_bytes;

static double inter_sent(comm *c) {
    comm_stats st = comm_stats_get(c);
    double mine = (double)st.tier_sent[COMM_TIER_INTER];
    comm_allreduce(c, &mine, 1, COMM_F64, COMM_SUM);
    return mine;
}

static int tiers_main(comm *c, void *arg) {
    tier_bytes *t = arg;
    const quant_wire w8 = {QUANT_INT8, 64, 0}, w4 = {QUANT_INT4, 32, 0};
    float *full = mem_alloc(MEM_OTHER, COUNT * sizeof(float));
    float *shard = mem_alloc(MEM_OTHER, COUNT * sizeof(float));
    uint16_t *half = mem_alloc(MEM_OTHER, 4 * COUNT * sizeof(uint16_t));
    void *scratch = mem_alloc(MEM_OTHER, quant_scratch_bytes(c, COUNT, w8) +
                                             quant_scratch_bytes(c, COUNT, w4));
    const size_t per = COUNT / 4;   /* 1000 of the 1003: even shards for the fp16 pair */
    memset(full, 0, COUNT * sizeof(float));
    memset(shard, 0, COUNT * sizeof(float));
    memset(half, 0, 4 * COUNT * sizeof(uint16_t));
    double v[4];
    comm_stats_reset(c);
    comm_allgather(c, half, half + COUNT, 4 * per, COMM_BF16);
    v[0] = inter_sent(c);
    comm_stats_reset(c);
    quant_allgather(c, w8, shard, full, 4 * per, scratch);
    v[1] = inter_sent(c);
    comm_stats_reset(c);
    comm_reduce_scatter(c, half, half + 2 * COUNT, 4 * per, COMM_BF16, COMM_SUM);
    v[2] = inter_sent(c);
    comm_stats_reset(c);
    quant_reduce_scatter(c, w4, full, shard, 4 * per, scratch);
    v[3] = inter_sent(c);
    if (comm_rank(c) == 0)
        for (int k = 0; k < 4; k++) t->inter[k] = v[k];
    mem_free(scratch);
    mem_free(half);
    mem_free(shard);
    mem_free(full);
    return 0;
}

START_TEST(bytes_across_nodes) {
    tier_bytes t = {0};
    comm_options o = comm_options_default();
    o.ranks = 4;
    o.link = LINK_NVLINK;
    o.link_inter = LINK_IB;
    o.ranks_per_node = 2;
    ck_assert_int_eq(launch_threads(&o, tiers_main, &t), 0);
    const double per = COUNT / 4, E8 = (double)quant_encoded_bytes(QUANT_INT8, 250, 64);
    const double E4 = (double)quant_encoded_bytes(QUANT_INT4, 250, 32);
    const double want[4] = {2 * 3 * per * 2, 2 * 3 * E8, 2 * 3 * per * 2, 4 * 2 * E4};
    printf("bytes across the nodes, 4 ranks as 2 nodes of 2, 1000 floats: fp16 all-gather"
           " %.0f (formula %.0f), qwZ %.0f (%.0f) = %.2f of fp16's; fp16 reduce-scatter %.0f"
           " (%.0f), qgZ's all-to-all %.0f (%.0f) = %.2f of fp16's\n", t.inter[0], want[0],
           t.inter[1], want[1], t.inter[1] / t.inter[0], t.inter[2], want[2], t.inter[3],
           want[3], t.inter[3] / t.inter[2]);
    for (int k = 0; k < 4; k++) ck_assert(t.inter[k] == want[k]);
}
END_TEST

/* qgZ in two hops (quant_reduce_scatter_hier) on d nodes of K: equal to the serial
 * reference to the bit (each rank's piece of my shard through the codec, summed in local
 * order inside each node; each node's sum through the codec, summed in node order),
 * every element within the sum of the N + d encodings' bounds of the exact sum, bytes
 * (K-1) d E inside a node and (d-1) E across; negative control: a doubled scale
 * differs. */
typedef struct {
    int K, wrong_scale, equal;
    double worst_bound, sent_error;
} hier_case;

static void check_hier(const hier_case *h, int d, const float *shard, size_t off,
                       size_t len, hier_case *out) {
    const quant_wire w = {QUANT_INT4, 32, 0};
    float piece[COUNT], partial[COUNT], sum[COUNT] = {0};
    double bound[COUNT] = {0}, exact[COUNT] = {0};
    for (int j = 0; j < d; j++) {
        memset(partial, 0, sizeof partial);
        for (int l = 0; l < h->K; l++) {
            const int r = j * h->K + l;
            for (size_t i = 0; i < len; i++) piece[i] = value(r, off + i);
            for (size_t i = 0; i < len; i++) {
                partial[i] += through_codec(w, w.block, piece, len, i);
                exact[i] += piece[i];
                bound[i] += quant_block_bound(w.bits, block_absmax(piece, len, w.block, i));
            }
        }
        for (size_t i = 0; i < len; i++) {
            sum[i] += through_codec(w, w.block, partial, len, i);
            bound[i] += quant_block_bound(w.bits, block_absmax(partial, len, w.block, i));
        }
    }
    for (size_t i = 0; i < len; i++) {
        out->equal &= shard[i] == sum[i];
        out->worst_bound = fmax(out->worst_bound, fabs(shard[i] - exact[i]) / (bound[i] + 1e-30));
    }
}

static int hier_main(comm *c, void *arg) {
    hier_case *h = arg;
    const int n = comm_size(c), me = comm_rank(c), d = n / h->K;
    const quant_wire w = {QUANT_INT4, 32, h->wrong_scale};
    comm *node = comm_split(c, me / h->K, me, "node");
    comm *cross = comm_split(c, me % h->K, me, "cross");
    float *full = mem_alloc(MEM_OTHER, COUNT * sizeof(float));
    float *shard = mem_alloc(MEM_OTHER, COUNT * sizeof(float));
    void *scratch = mem_alloc(MEM_OTHER, quant_hier_scratch_bytes(node, cross, COUNT, w));
    for (size_t i = 0; i < COUNT; i++) full[i] = value(me, i);
    comm_stats_reset(c);
    quant_reduce_scatter_hier(node, cross, w, full, shard, COUNT, scratch);
    const comm_stats st = comm_stats_all(c);
    size_t off, len = comm_shard(COUNT, n, me, &off);
    hier_case mine = {.equal = 1};
    for (int r = 0; r < n; r++) {   /* one rank at a time: through_codec's buffers are shared */
        if (r == me) check_hier(h, d, shard, off, len, &mine);
        comm_barrier(c);
    }
    const double E = (double)quant_encoded_bytes(QUANT_INT4, (COUNT + n - 1) / n, 32);
    mine.sent_error = fabs((double)st.tier_sent[COMM_TIER_INTRA] - (h->K - 1) * d * E) +
                      fabs((double)st.tier_sent[COMM_TIER_INTER] - (d - 1) * E);
    double v[3] = {mine.equal ? 0 : 1, mine.worst_bound, mine.sent_error};
    comm_allreduce(c, v, 3, COMM_F64, COMM_MAX);
    if (me == 0) *h = (hier_case){h->K, h->wrong_scale, v[0] == 0, v[1], v[2]};
    mem_free(scratch);
    mem_free(shard);
    mem_free(full);
    comm_free(cross);
    comm_free(node);
    return 0;
}

static hier_case run_hier(int ranks, int K, int wrong_scale) {
    hier_case h = {.K = K, .wrong_scale = wrong_scale};
    comm_options o = comm_options_default();
    o.ranks = ranks;
    o.ranks_per_node = K;
    o.timeout_seconds = 30;
    ck_assert_int_eq(launch_threads(&o, hier_main, &h), 0);
    return h;
}

START_TEST(qgz_in_two_hops_matches_the_reference) {
    const int shapes[4][2] = {{4, 2}, {6, 2}, {6, 3}, {2, 1}};   /* ranks, K */
    for (int k = 0; k < 4; k++) {
        const hier_case h = run_hier(shapes[k][0], shapes[k][1], 0);
        printf("qgZ in two hops, %d nodes of %d: %s the serial reference; worst error %.3f of"
               " the bound; bytes per tier off the formula by %.0f\n",
               shapes[k][0] / shapes[k][1], shapes[k][1], h.equal ? "equal" : "DIFFER FROM",
               h.worst_bound, h.sent_error);
        ck_assert(h.equal);
        ck_assert(h.worst_bound <= 1);
        ck_assert(h.sent_error == 0);
    }
    const hier_case bad = run_hier(4, 2, 1);
    printf("negative control: a doubled scale on the wire: %s\n",
           bad.equal ? "equal (the check is blind)" : "differs");
    ck_assert(!bad.equal);
}
END_TEST

int main(void) {
    Suite *s = suite_create("quant_collectives");
    TCase *tc = tcase_create("collectives");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, qwz_and_qgz_match_the_reference, 1, 6);
    tcase_add_test(tc, wrong_block_reference_differs);
    tcase_add_test(tc, bytes_across_nodes);
    tcase_add_test(tc, qgz_in_two_hops_matches_the_reference);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
