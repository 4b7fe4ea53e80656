/* All-to-all on any backend (tests/test_comm.c: threads; tests/test_mpi_comm.c: MPI):
 * comm_alltoall and comm_alltoallv against a serial reference, in every wire type.
 * Element i of the block rank s sends to rank d holds a code of (s, d, i) in all its
 * bytes, so a block that lands on the wrong rank, at the wrong offset or shifted by
 * one element is seen; the receive buffer starts filled with a sentinel, so a write
 * outside the blocks is seen too. The -v form uses uneven counts with empty blocks,
 * send blocks in reverse peer order and gaps on both sides. Bytes sent and received
 * per rank must equal the formula exactly (comm.h: the blocks to the other ranks), as
 * this backend counts them and as the textbook model counts them (MPI's and NCCL's
 * numbers, checked on every backend), and on 3 ranks the counts by hand.
 * Tolerance 0: elements that differ, and bytes off the formula. The negative control
 * checks against a reference that delivers each block one rank too far (the bug of a
 * pairwise step off by one) and must fail. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "comm_internal.h"

int comm_check_alltoall(comm *c, int rotated_reference, const char *label);

#define SENTINEL 0xa5

static uint32_t code(int src, int dst, size_t i) {
    uint32_t h = (uint32_t)(src * 64 + dst) * 0x9e3779b1u ^ (uint32_t)i * 0x85ebca77u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    return h ^ (h >> 12);
}

/* The element's bytes: its code, repeated for 8-byte types. */
static void put(char *at, size_t es, int src, int dst, size_t i) {
    uint32_t h = code(src, dst, i);
    for (size_t b = 0; b < es; b++) at[b] = (char)(h >> (8 * (b % 4)) ^ (b / 4) * 0x3c);
}

/* Elements rank s sends to rank d: uneven, some blocks empty, times `scale`. */
static size_t block_count(int s, int d, size_t scale) {
    return (s + 2 * d + 1) % 3 == 0 ? 0 : (1 + (size_t)(3 * s + 5 * d) % 7) * scale;
}

typedef struct {
    size_t send_counts[8], send_offsets[8], recv_counts[8], recv_offsets[8];
    size_t send_extent, recv_extent;   /* elements, gaps included */
} layout;

/* Even form: `count` per peer, back to back. -v form: the uneven counts, send blocks in
 * reverse peer order with one element of gap after each, receive blocks in peer order
 * after two elements of gap and one after each. */
static layout make_layout(int n, int r, size_t count, int uneven) {
    layout l = {0};
    for (int j = 0; j < n; j++) {
        l.send_counts[j] = uneven ? block_count(r, j, count) : count;
        l.recv_counts[j] = uneven ? block_count(j, r, count) : count;
    }
    size_t at = 0;
    for (int j = n - 1; j >= 0; j--) {
        l.send_offsets[j] = uneven ? at : (size_t)j * count;
        at += l.send_counts[j] + (uneven ? 1 : 0);
    }
    l.send_extent = at;
    at = uneven ? 2 : 0;
    for (int j = 0; j < n; j++) {
        l.recv_offsets[j] = at;
        at += l.recv_counts[j] + (uneven ? 1 : 0);
    }
    l.recv_extent = at;
    return l;
}

/* The serial reference: every element of the receive buffer as it must end. With
 * `rotated`, block j of rank s is expected at rank j+1 instead (the negative control). */
static void expected_recv(char *want, const layout *l, int n, int r, size_t es, int rotated) {
    memset(want, SENTINEL, l->recv_extent * es);
    for (int s = 0; s < n; s++) {
        int dst = rotated ? (r + n - 1) % n : r;
        for (size_t i = 0; i < l->recv_counts[s]; i++)
            put(want + (l->recv_offsets[s] + i) * es, es, s, dst, i);
    }
}

typedef struct {
    uint64_t sent, received;
} byte_counts;

/* The formula: the blocks this rank sends to, and receives from, the other ranks. */
static byte_counts formula_bytes(const layout *l, int n, int r, size_t es) {
    byte_counts b = {0, 0};
    for (int j = 0; j < n; j++)
        if (j != r) {
            b.sent += l->send_counts[j] * es;
            b.received += l->recv_counts[j] * es;
        }
    return b;
}

/* What this backend's counters added since `before`. */
static byte_counts counted_bytes(comm *c, const comm_stats *before) {
    comm_stats after = comm_stats_get(c);
    return (byte_counts){
        after.bytes_sent[COMM_KIND_ALLTOALL] - before->bytes_sent[COMM_KIND_ALLTOALL],
        after.bytes_received[COMM_KIND_ALLTOALL] - before->bytes_received[COMM_KIND_ALLTOALL]};
}

/* The textbook count of the same call (comm_count_modelled: what MPI and NCCL report),
 * on a twin of c whose backend says its bytes are modelled. The threads backend counts
 * its real copies instead, so without the twin a threads-only run never reaches it. */
static byte_counts modelled_bytes(comm *c, const comm_call *call) {
    static const comm_backend modelled = {.name = "modelled", .bytes_modelled = 1};
    comm twin = {.backend = &modelled, .job = c->job, .rs = c->rs, .rank = comm_rank(c),
                 .size = comm_size(c), .world_ranks = c->world_ranks};   /* its tiers: c's */
    comm_count_modelled(&twin, call);
    comm_stats none = {0};
    return counted_bytes(&twin, &none);
}

static double bytes_apart(byte_counts a, byte_counts b) {
    return fmax(fabs((double)a.sent - (double)b.sent),
                fabs((double)a.received - (double)b.received));
}

/* The call comm_alltoall or comm_alltoallv hands the backend (comm_api.c). */
static comm_call alltoall_call(const char *send, char *recv, const layout *l, size_t count,
                               int uneven, comm_dtype dt) {
    comm_call call = {.kind = COMM_KIND_ALLTOALL, .send = send, .recv = recv,
                      .count = uneven ? 0 : count, .dt = dt, .op = uneven, .root = -1};
    if (uneven) {
        call.send_counts = l->send_counts;
        call.send_offsets = l->send_offsets;
        call.recv_counts = l->recv_counts;
        call.recv_offsets = l->recv_offsets;
    }
    return call;
}

typedef struct {
    double differ;                            /* elements unlike the reference */
    byte_counts formula, counted, modelled;   /* this rank's bytes */
} exchange_result;

/* One exchange on this rank: its elements against the reference, and its bytes. */
static exchange_result exchange_once(comm *c, comm_dtype dt, size_t count, int uneven,
                                     int rotated) {
    int n = comm_size(c), r = comm_rank(c);
    size_t es = comm_dtype_size(dt);
    layout l = make_layout(n, r, count, uneven);
    char *send = mem_alloc(MEM_OTHER, l.send_extent * es + 1);
    char *recv = mem_alloc(MEM_OTHER, l.recv_extent * es + 1);
    char *want = mem_alloc(MEM_OTHER, l.recv_extent * es + 1);
    memset(send, 0, l.send_extent * es);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < l.send_counts[j]; i++)
            put(send + (l.send_offsets[j] + i) * es, es, r, j, i);
    memset(recv, SENTINEL, l.recv_extent * es);
    expected_recv(want, &l, n, r, es, rotated);
    comm_stats before = comm_stats_get(c);
    if (uneven)
        comm_alltoallv(c, send, l.send_counts, l.send_offsets, recv, l.recv_counts,
                       l.recv_offsets, dt);
    else comm_alltoall(c, send, recv, count, dt);
    const comm_call call = alltoall_call(send, recv, &l, count, uneven, dt);
    exchange_result x = {.formula = formula_bytes(&l, n, r, es),
                         .counted = counted_bytes(c, &before),
                         .modelled = modelled_bytes(c, &call)};
    for (size_t i = 0; i < l.recv_extent; i++)
        x.differ += memcmp(recv + i * es, want + i * es, es) != 0;
    mem_free(send);
    mem_free(recv);
    mem_free(want);
    return x;
}

/* The -v form at scale 1 on 3 ranks in f32, by hand from block_count: elements rank s
 * sends rank d
 *                  to  0  1  2
 *         from 0:        1  0  4
 *              1:        4  2  0
 *              2:        0  5  3
 * Its own block left out, rank 0 sends 0 + 4 and receives 4 + 0, rank 1 sends 4 + 0 and
 * receives 0 + 5, rank 2 sends 0 + 5 and receives 4 + 0: x 4 bytes. Ranks 1 and 2
 * receive a count other than they send, so a received count taken from the send side
 * is seen. Returns the bytes this backend's count and the model's are off it. */
static double bytes_off_by_hand(comm *c) {
    static const byte_counts by_hand[3] = {{16, 16}, {16, 20}, {20, 16}};
    const exchange_result x = exchange_once(c, COMM_F32, 1, 1, 0);
    return fmax(bytes_apart(x.counted, by_hand[comm_rank(c)]),
                bytes_apart(x.modelled, by_hand[comm_rank(c)]));
}

/* Every wire type, the even form at 0, 1, 7 and 1000 elements per peer and the -v form
 * at two scales. Rank 0 prints the worst over all ranks; returns the failures. */
int comm_check_alltoall(comm *c, int rotated_reference, const char *label) {
    static const size_t even_counts[] = {0, 1, 7, 1000}, uneven_scales[] = {1, 100};
    /* elements that differ, bytes off the formula, bytes off the counts by hand */
    double worst[3] = {0, 0, 0};
    if (comm_size(c) > 8) {
        fprintf(stderr, "comm_check_alltoall: at most 8 ranks\n");
        return 1;
    }
    for (int dt = 0; dt < COMM_NDTYPES; dt++)
        for (int form = 0; form < 6; form++) {
            int uneven = form >= 4;
            size_t count = uneven ? uneven_scales[form - 4] : even_counts[form];
            exchange_result x = exchange_once(c, (comm_dtype)dt, count, uneven,
                                              rotated_reference);
            const double off = fmax(bytes_apart(x.counted, x.formula),
                                    bytes_apart(x.modelled, x.formula));
            if (x.differ > worst[0]) worst[0] = x.differ;
            if (off > worst[1]) worst[1] = off;
        }
    if (comm_size(c) == 3) worst[2] = bytes_off_by_hand(c);
    comm_allreduce(c, worst, 3, COMM_F64, COMM_MAX);
    if (comm_rank(c) == 0)
        printf("%s, %d ranks: alltoall and alltoallv in %d wire types: elements that "
               "differ from the reference: %.0f (tolerance 0); bytes sent/received off "
               "the formula, counted and modelled: %.0f (tolerance 0)\n", label,
               comm_size(c), (int)COMM_NDTYPES, worst[0], worst[1]);
    if (comm_rank(c) == 0 && comm_size(c) == 3)
        printf("  -v form, f32, bytes off the counts by hand: %.0f (tolerance 0)\n", worst[2]);
    fflush(stdout);   /* a failing test's forked child leaves without flushing */
    return (worst[0] > 0) + (worst[1] > 0) + (worst[2] > 0);
}
