/* The two-tier network (comm.h's comm_tier): 8 ranks as 2 nodes of 4. Bytes counted per
 * tier equal the ring's formula to the byte for all-reduce, all-gather and
 * reduce-scatter, on the world and on groups inside a node and across nodes; the link
 * time counted per tier equals alpha-beta of that tier's link for every transfer; a
 * negative control (the formula of 2 nodes of 4 against a run placed as 4 nodes of 2)
 * fails. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "comm.h"

enum { RANKS = 8, PER_NODE = 4, COUNT = 8 * 1024 };   /* 32 KiB of fp32, 4 KiB a shard */

typedef struct {
    comm_stats stats[RANKS][3];   /* [rank][all-reduce, all-gather, reduce-scatter] */
    comm_stats groups[RANKS][2];  /* [rank][in-node group all-reduce, cross-node one] */
} tier_record;

static comm_options tier_options(int per_node) {
    comm_options o = comm_options_default();
    o.ranks = RANKS;
    o.timeout_seconds = 30;
    o.link = LINK_NVLINK;
    o.link_inter = LINK_IB;
    o.ranks_per_node = per_node;
    return o;
}

static int tiers_main(comm *world, void *arg) {
    tier_record *rec = arg;
    const int r = comm_rank(world);
    float *x = mem_alloc(MEM_GRADS, COUNT * sizeof(float));
    float *y = mem_alloc(MEM_GRADS, COUNT * sizeof(float));
    for (int i = 0; i < COUNT; i++) x[i] = (float)(r + i % 7);
    for (int kind = 0; kind < 3; kind++) {
        comm_stats_reset(world);
        if (kind == 0) comm_allreduce(world, x, COUNT, COMM_F32, COMM_SUM);
        if (kind == 1) comm_allgather(world, x, y, COUNT, COMM_F32);
        if (kind == 2) comm_reduce_scatter(world, x, y, COUNT, COMM_F32, COMM_SUM);
        rec->stats[r][kind] = comm_stats_all(world);
    }
    comm *node = comm_split(world, r / PER_NODE, r, "node");       /* 4 ranks, one node */
    comm *across = comm_split(world, r % PER_NODE, r, "across");   /* 2 ranks, two nodes */
    comm *g[2] = {node, across};
    for (int k = 0; k < 2; k++) {
        comm_stats_reset(world);
        comm_allreduce(g[k], x, COUNT, COMM_F32, COMM_SUM);
        rec->groups[r][k] = comm_stats_all(world);
    }
    comm_free(node);
    comm_free(across);
    mem_free(x);
    mem_free(y);
    return 0;
}

/* The ring's formula: a rank of a ring of n takes in `factor` (n-1)/n of B bytes, all
 * from its left neighbour, so across the tier between the two. */
static uint64_t ring_bytes(int n, int factor) {
    return (uint64_t)factor * (uint64_t)(n - 1) * COUNT * sizeof(float) / (uint64_t)n;
}

/* Differences from the formula, in bytes, summed over ranks and tiers. */
static uint64_t tier_byte_errors(const tier_record *rec, int per_node, const char *label) {
    uint64_t wrong = 0;
    static const int factor[3] = {2, 1, 1};
    for (int r = 0; r < RANKS; r++) {
        const int left = (r + RANKS - 1) % RANKS;
        const int inter = left / per_node != r / per_node;
        for (int kind = 0; kind < 3; kind++) {
            const comm_stats *s = &rec->stats[r][kind];
            const uint64_t want = ring_bytes(RANKS, factor[kind]);
            const uint64_t want_inter = inter ? want : 0, want_intra = inter ? 0 : want;
            wrong += (uint64_t)llabs((long long)(s->tier_received[COMM_TIER_INTER] - want_inter));
            wrong += (uint64_t)llabs((long long)(s->tier_received[COMM_TIER_INTRA] - want_intra));
            if (r == 0 && kind == 0)
                printf("%s: rank 0 all-reduce took in %llu B intra-node, %llu B inter-node"
                       " (formula %llu, %llu)\n", label,
                       (unsigned long long)s->tier_received[COMM_TIER_INTRA],
                       (unsigned long long)s->tier_received[COMM_TIER_INTER],
                       (unsigned long long)want_intra, (unsigned long long)want_inter);
        }
    }
    return wrong;
}

START_TEST(bytes_per_tier_match_the_ring) {
    static tier_record rec;
    comm_options o = tier_options(PER_NODE);
    ck_assert_int_eq(launch_threads(&o, tiers_main, &rec), 0);
    const uint64_t wrong = tier_byte_errors(&rec, PER_NODE, "2 nodes of 4");
    printf("bytes per tier against the ring's formula: %llu B off in all (must be 0)\n",
           (unsigned long long)wrong);
    ck_assert_uint_eq(wrong, 0);
    /* groups: inside a node nothing crosses nodes; across, everything does */
    uint64_t stray = 0;
    for (int r = 0; r < RANKS; r++) {
        stray += rec.groups[r][0].tier_received[COMM_TIER_INTER];
        stray += rec.groups[r][1].tier_received[COMM_TIER_INTRA];
        ck_assert_uint_eq(rec.groups[r][0].tier_received[COMM_TIER_INTRA], ring_bytes(4, 2));
        ck_assert_uint_eq(rec.groups[r][1].tier_received[COMM_TIER_INTER], ring_bytes(2, 2));
        ck_assert_uint_eq(rec.groups[r][1].tier_sent[COMM_TIER_INTER], ring_bytes(2, 2));
    }
    printf("in-node group bytes across nodes + cross-node group bytes inside a node: %llu"
           " (must be 0)\n", (unsigned long long)stray);
    ck_assert_uint_eq(stray, 0);
}
END_TEST

START_TEST(bytes_per_tier_negative_control) {
    static tier_record rec;
    comm_options o = tier_options(2);   /* 4 nodes of 2: twice the ring's crossings */
    ck_assert_int_eq(launch_threads(&o, tiers_main, &rec), 0);
    const uint64_t wrong = tier_byte_errors(&rec, PER_NODE, "negative control, 4 nodes of 2");
    printf("negative control: 4 nodes of 2 against the formula of 2 nodes of 4: %llu B off"
           " (must be > 0)\n", (unsigned long long)wrong);
    ck_assert_uint_gt(wrong, 0);
}
END_TEST

/* Every transfer timed by its tier: rank 0 takes in all 2(n-1) shards of the ring
 * all-reduce from rank 7, across nodes (IB); rank 1 from rank 0, inside (NVLink). */
START_TEST(link_time_per_tier) {
    static tier_record rec;
    comm_options o = tier_options(PER_NODE);
    ck_assert_int_eq(launch_threads(&o, tiers_main, &rec), 0);
    const size_t shard = COUNT * sizeof(float) / RANKS;
    const double ib = 2 * (RANKS - 1) * comm_tier_seconds(&o, COMM_TIER_INTER, shard);
    const double nv = 2 * (RANKS - 1) * comm_tier_seconds(&o, COMM_TIER_INTRA, shard);
    const comm_stats *r0 = &rec.stats[0][0], *r1 = &rec.stats[1][0];
    const double d = fmax(fabs(r0->tier_link_seconds[COMM_TIER_INTER] - ib),
                          fabs(r1->tier_link_seconds[COMM_TIER_INTRA] - nv));
    printf("link time: rank 0 %.3f us on IB (model %.3f), rank 1 %.3f us on NVLink (model"
           " %.3f); largest difference %.3g s (tolerance 1e-7: 1 ns a transfer)\n",
           1e6 * r0->tier_link_seconds[COMM_TIER_INTER], 1e6 * ib,
           1e6 * r1->tier_link_seconds[COMM_TIER_INTRA], 1e6 * nv, d);
    ck_assert(d <= 1e-7);
    ck_assert(r0->tier_link_seconds[COMM_TIER_INTRA] == 0);
    ck_assert(ib > 2 * nv);   /* the tiers differ: IB is the slower (5 us to 2 us a message) */
}
END_TEST

int main(void) {
    Suite *s = suite_create("link_tiers");
    TCase *tc = tcase_create("tiers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bytes_per_tier_match_the_ring);
    tcase_add_test(tc, bytes_per_tier_negative_control);
    tcase_add_test(tc, link_time_per_tier);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
