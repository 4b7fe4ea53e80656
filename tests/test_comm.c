/* The communicator, threads backend: every operation against a serial reference
 * (world sizes 1..5, counts 0, 1, 7, 1000003, fp32 exact and 16/8-bit rounding), groups,
 * async overlap, send/recv order, accounting, link model, trace, and the faults
 * (mismatch, timeout, abort), which run in a child process and must end with a message;
 * buffered and rendezvous sends (a send-before-recv cycle completes only buffered).
 *
 *   test_comm                         the Check suite
 *   test_comm SCENARIO [ranks] [s]    run one fault scenario (see tests/comm_faults.c) */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "check_run.h"

/* tests/comm_faults.c */
int comm_fault_main(comm *world, void *scenario);
int comm_check_collectives(comm *c, size_t count, int order, const char *label);
int comm_test_split_main(comm *world, void *arg);
int comm_test_async_main(comm *world, void *arg);
int comm_test_p2p_main(comm *world, void *arg);
extern const char *const comm_fault_scenarios[];

static comm_options options(int ranks) {
    comm_options o = comm_options_default();
    o.ranks = ranks;
    o.timeout_seconds = 30;
    return o;
}

/* ---- shard math and conversions ----------------------------------------------- */
START_TEST(test_shard) {
    static const size_t counts[] = {0, 1, 7, 10, 1000003};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        for (int size = 1; size <= 7; size++) {
            size_t next = 0;
            for (int r = 0; r < size; r++) {
                size_t off, len = comm_shard(counts[c], size, r, &off);
                ck_assert_uint_eq(off, next);
                ck_assert_uint_eq(len, counts[c] / size + ((size_t)r < counts[c] % size));
                next = off + len;
            }
            ck_assert_uint_eq(next, counts[c]);
        }
}
END_TEST

typedef struct {
    comm_dtype dt;
    unsigned codes;           /* 2^bits */
    unsigned max_finite;      /* largest finite positive code */
    int saturates;            /* overflow gives max_finite (e4m3) instead of infinity */
} format;

static const format formats[] = {
    {COMM_BF16, 65536, 0x7f7f, 0}, {COMM_F16, 65536, 0x7bff, 0}, {COMM_F8E4M3, 256, 0x7e, 1}};

static float decode(comm_dtype dt, unsigned code) {
    uint16_t h = (uint16_t)code;
    uint8_t b = (uint8_t)code;
    return dt == COMM_BF16 ? comm_bf16_to_f32(h) : dt == COMM_F16 ? comm_f16_to_f32(h)
                                                                    : comm_f8e4m3_to_f32(b);
}
static unsigned encode(comm_dtype dt, float x) {
    return dt == COMM_BF16 ? comm_f32_to_bf16(x) : dt == COMM_F16 ? comm_f32_to_f16(x)
                                                                   : comm_f32_to_f8e4m3(x);
}

/* The reference: the nearest of all positive finite codes (ties to the even code),
 * by bisection over the codes, which are ordered like their values. */
static unsigned reference_round(const format *f, double x) {
    unsigned sign = x < 0 ? f->codes / 2 : 0;
    double a = fabs(x);
    double top = decode(f->dt, f->max_finite), ulp = top - decode(f->dt, f->max_finite - 1);
    if (a >= top + ulp / 2 && !(a == top + ulp / 2 && f->saturates))
        return sign | (f->saturates ? f->max_finite : f->max_finite + 1);   /* +1: inf */
    if (a >= top) return sign | f->max_finite;
    unsigned lo = 0, hi = f->max_finite;   /* decode(lo) <= a < decode(hi) */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (decode(f->dt, mid) <= a) lo = mid; else hi = mid;
    }
    double dlo = a - decode(f->dt, lo), dhi = decode(f->dt, hi) - a;
    unsigned code = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | code;
}

START_TEST(test_conversions) {
    for (int k = 0; k < 3; k++) {
        const format *f = &formats[k];
        /* every code survives the round trip (NaNs stay NaN) */
        for (unsigned code = 0; code < f->codes; code++) {
            float v = decode(f->dt, code);
            if (isnan(v)) ck_assert(isnan(decode(f->dt, encode(f->dt, v))));
            else ck_assert_uint_eq(encode(f->dt, v), code);
        }
        /* random fp32 values across the whole range, and exact midpoints (ties) */
        unsigned wrong = 0;
        uint32_t state = 12345;
        for (int i = 0; i < 200000; i++) {
            state = state * 1664525u + 1013904223u;
            float x;
            if (i % 2) {
                unsigned code = (state >> 8) % f->max_finite;
                x = (decode(f->dt, code) + decode(f->dt, code + 1)) / 2;   /* a tie */
            } else {
                x = ldexpf((float)(state >> 8) / (float)(1 << 24), (int)(state % 60) - 30);
            }
            if (state & 1) x = -x;
            if (encode(f->dt, x) != reference_round(f, x)) wrong++;
        }
        printf("conversion %-7s: %u of 200000 random values and ties differ from the "
               "nearest-even reference\n", comm_dtype_name(f->dt), wrong);
        ck_assert_uint_eq(wrong, 0);
    }
    ck_assert_float_eq(comm_bf16_to_f32(comm_f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
    ck_assert_float_eq(comm_bf16_to_f32(comm_f32_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
    ck_assert(isinf(comm_f16_to_f32(comm_f32_to_f16(65520.0f))));
    ck_assert_float_eq(comm_f16_to_f32(comm_f32_to_f16(65519.0f)), 65504.0f);
    ck_assert_float_eq(comm_f16_to_f32(comm_f32_to_f16(0x1p-25f)), 0.0f);
    ck_assert_float_eq(comm_f16_to_f32(comm_f32_to_f16(3 * 0x1p-25f)), 0x1p-23f);
    ck_assert_float_eq(comm_f8e4m3_to_f32(comm_f32_to_f8e4m3(1000.0f)), 448.0f);
    ck_assert_float_eq(comm_f8e4m3_to_f32(comm_f32_to_f8e4m3(-INFINITY)), -448.0f);
    ck_assert(isnan(comm_f8e4m3_to_f32(comm_f32_to_f8e4m3(NAN))));
    ck_assert_float_eq(comm_f8e4m3_to_f32(comm_f32_to_f8e4m3(0.3f)), 0.3125f);
    ck_assert_float_eq(comm_f8e4m3_to_f32(comm_f32_to_f8e4m3(0x1p-10f)), 0.0f);
    float in[3] = {1.5f, -2.25f, 100.0f}, out[3];
    uint16_t mid[3];
    comm_convert(mid, COMM_BF16, in, COMM_F32, 3);
    comm_convert(out, COMM_F32, mid, COMM_BF16, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(out[i], in[i]);
}
END_TEST

/* ---- every collective vs the serial reference -------------------------------------- */
typedef struct {
    size_t count;
    int order;   /* the all-reduce: 0 ring, 1 naive, 2 recursive doubling */
    const char *label;
} collectives_args;

static const comm_allreduce_algo algo_of_order[] = {ALLREDUCE_RING, ALLREDUCE_NAIVE,
                                                    ALLREDUCE_DOUBLING};
static const char *const algo_labels[] = {"threads ring", "threads naive",
                                          "threads doubling"};

static int collectives_main(comm *world, void *arg) {
    collectives_args *a = arg;
    return comm_check_collectives(world, a->count, a->order, a->label) ? 1 : 0;
}

/* The large count: past the threads ring's slab of N x COMM_SLICE_ELEMENTS (2^18) at
 * N = 2 and 3. From N = 4 on one slab holds a million elements anyway, so there 3 x
 * 2^17 + 3 take the same paths (two slices of the chained broadcast and gather, uneven
 * shards) at under half the cost of the references, which every rank computes over
 * all N inputs of every element. The sanitizers run each access several times slower
 * (ThreadSanitizer ~10x): there the two-slab case runs at N = 2 alone, which has the
 * same races and the same slab edges to find, and other sizes one slab (so do the
 * accounting and the doubling's negative control, whose sums the plain build checks at
 * the larger count). */
static size_t large_count(int ranks) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    return ranks == 2 ? (size_t)2 * (1 << 18) + 3 : 100003;
#else
    return ranks <= 3 ? 1000003 : (size_t)3 * (1 << 17) + 3;
#endif
}

static void check_collectives(int ranks, int order) {
    const size_t counts[] = {0, 1, 7, large_count(ranks)};
    for (size_t c = 0; c < 4; c++) {
        comm_options o = options(ranks);
        o.allreduce = algo_of_order[order];
        collectives_args a = {counts[c], order, algo_labels[order]};
        ck_assert_int_eq(launch_threads(&o, collectives_main, &a), 0);
    }
}

START_TEST(test_collectives) {
    for (int order = 0; order < 2; order++) check_collectives(_i, order);
}
END_TEST

/* Recursive doubling at 1..8 ranks: powers of two and the folded sizes between. */
START_TEST(test_collectives_doubling) {
    check_collectives(_i, 2);
}
END_TEST

/* ---- groups, async, send/recv: the rank programs live in tests/comm_faults.c ------- */
START_TEST(test_split) {
    comm_options o = options(4);
    ck_assert_int_eq(launch_threads(&o, comm_test_split_main, NULL), 0);
}
END_TEST

START_TEST(test_async) {
    for (int ranks = 1; ranks <= 3; ranks++) {
        comm_options o = options(ranks);
        ck_assert_int_eq(launch_threads(&o, comm_test_async_main, NULL), 0);
    }
}
END_TEST

START_TEST(test_send_recv) {
    for (int ranks = 1; ranks <= 3; ranks++) {
        comm_options o = options(ranks);
        ck_assert_int_eq(launch_threads(&o, comm_test_p2p_main, NULL), 0);
    }
}
END_TEST

/* ---- accounting: measured bytes equal the ring's volume, up to chunk rounding ------- */
/* Recursive doubling's bytes per rank: log2 P whole buffers, one more each way for a
 * rank that takes in a folded neighbour (P = 2^floor(log2 N), E = N - P), and one
 * each way for a folded rank. */
static uint64_t doubling_bytes(int n, int r, uint64_t bytes) {
    int p = 1, rounds = 0;
    while (2 * p <= n) { p *= 2; rounds++; }
    int extra = n - p;
    if (r < 2 * extra) return r % 2 ? bytes : (uint64_t)(rounds + 1) * bytes;
    return (uint64_t)rounds * bytes;
}

static int accounting_main(comm *world, void *arg) {
    int order = *(int *)arg, naive = order == 1;
    int n = comm_size(world), r = comm_rank(world), failures = 0;
    size_t count = large_count(n), es = 4, bytes = count * es;
    float *x = mem_alloc(MEM_GRADS, bytes), *shard = mem_alloc(MEM_GRADS, bytes);
    size_t len_r = comm_shard(count, n, r, NULL), len_next = comm_shard(count, n, (r + 1) % n, NULL);
    size_t len_prev = comm_shard(count, n, (r + n - 1) % n, NULL);
    comm_stats_reset(world);
    comm_allreduce(world, x, count, COMM_F32, COMM_SUM);
    comm_stats s = comm_stats_get(world);
    uint64_t sent = s.bytes_sent[COMM_KIND_ALLREDUCE], received = s.bytes_received[COMM_KIND_ALLREDUCE];
    double textbook = 2.0 * (n - 1) / n * (double)bytes;
    if (naive) {
        uint64_t want = r == 0 ? (uint64_t)(n - 1) * bytes : bytes;
        if (n > 1 && (sent != want || received != want)) failures++;
    } else if (order == 2) {
        uint64_t want = doubling_bytes(n, r, bytes);
        if (sent != want || received != want) failures++;
        if (r <= 1)   /* rank 1 is the folded one when N is not a power of two */
            printf("doubling all-reduce of %zu bytes, %d ranks: rank %d sent %llu, received "
                   "%llu bytes (formula %llu)\n", bytes, n, r, (unsigned long long)sent,
                   (unsigned long long)received, (unsigned long long)want);
    } else {
        if (sent != 2 * bytes - es * (len_r + len_next) || received != 2 * bytes - es * (len_r + len_prev))
            failures++;
        if (fabs((double)sent - textbook) > 2.0 * (double)es) failures++;
    }
    if (r == 0 && order != 2)
        printf("%s all-reduce of %zu bytes, %d ranks: rank 0 sent %llu, received %llu bytes "
               "(2(N-1)/N x bytes = %.0f)\n", naive ? "naive" : "ring", bytes, n,
               (unsigned long long)sent, (unsigned long long)received, textbook);
    if (s.calls[COMM_KIND_ALLREDUCE] != 1 || !(s.seconds[COMM_KIND_ALLREDUCE] > 0)) failures++;

    comm_reduce_scatter(world, x, shard, count, COMM_F32, COMM_SUM);
    comm_allgather(world, shard, x, count, COMM_F32);
    comm_broadcast(world, x, count, COMM_F32, 0);
    comm_barrier(world);
    s = comm_stats_get(world);
    if (s.bytes_sent[COMM_KIND_REDUCE_SCATTER] != bytes - es * len_r ||
        s.bytes_received[COMM_KIND_REDUCE_SCATTER] != bytes - es * len_prev ||
        s.bytes_sent[COMM_KIND_ALLGATHER] != bytes - es * len_next ||
        s.bytes_received[COMM_KIND_ALLGATHER] != bytes - es * len_r)
        failures++;
    if (s.bytes_received[COMM_KIND_BROADCAST] != (r == 0 ? 0 : bytes) ||
        s.bytes_sent[COMM_KIND_BROADCAST] != (r == n - 1 ? 0 : bytes) ||
        s.calls[COMM_KIND_BARRIER] != 1)
        failures++;
    /* scratch for reduce-scatter (3+ ranks) and doubling's all-reduce (2+) is charged
     * to this rank as comm memory */
    if (comm_mem_stats(world) != mem_stats_current()) failures++;
    if (n >= 3 && comm_mem_stats(world)->current[MEM_COMM] == 0) failures++;
    if (order == 2 && n >= 2 && comm_mem_stats(world)->peak[MEM_COMM] < bytes) failures++;

    /* totals over groups, and reset */
    comm *pair = comm_split(world, r / 2, r, "pair");
    comm_allreduce(pair, x, 1000, COMM_F32, COMM_SUM);
    comm_stats all = comm_stats_all(world), w = comm_stats_get(world), p = comm_stats_get(pair);
    if (all.bytes_sent[COMM_KIND_ALLREDUCE] !=
            w.bytes_sent[COMM_KIND_ALLREDUCE] + p.bytes_sent[COMM_KIND_ALLREDUCE] ||
        all.calls[COMM_KIND_ALLREDUCE] != 2 ||
        comm_stats_total_sent(&all) != comm_stats_total_sent(&w) + comm_stats_total_sent(&p) ||
        !(comm_stats_total_seconds(&all) > 0))
        failures++;
    comm_stats_reset(world);
    all = comm_stats_all(world);
    if (comm_stats_total_sent(&all) != 0 || all.calls[COMM_KIND_ALLREDUCE] != 0) failures++;
    if (comm_bytes_are_modelled(world) || strcmp(comm_backend_name(world), "threads")) failures++;

    /* paused: nothing counted in any group (collectives, sends, an async all-reduce);
     * then counting goes on */
    comm_stats_pause(world, 1);
    comm_allreduce(pair, x, 1000, COMM_F32, COMM_SUM);
    comm_allgather(world, shard, x, count, COMM_F32);
    comm_wait(comm_allreduce_start(world, x, count, COMM_F32, COMM_SUM));
    if (n > 1 && r < 2) {
        if (r == 0) comm_send(world, x, 100, COMM_F32, 1, 7);
        else comm_recv(world, x, 100, COMM_F32, 0, 7);
    }
    comm_stats_pause(world, 0);
    all = comm_stats_all(world);
    if (comm_stats_total_sent(&all) != 0 || comm_stats_total_seconds(&all) != 0) failures++;
    for (int k = 0; k < COMM_NKINDS; k++) failures += all.calls[k] != 0;
    comm_allreduce(world, x, count, COMM_F32, COMM_SUM);
    all = comm_stats_all(world);
    if (all.calls[COMM_KIND_ALLREDUCE] != 1 || (n > 1 && comm_stats_total_sent(&all) == 0))
        failures++;
    comm_free(pair);
    mem_free(x);
    mem_free(shard);
    if (failures) fprintf(stderr, "rank %d: %d accounting failures\n", r, failures);
    return failures ? 1 : 0;
}

START_TEST(test_accounting) {
    for (int order = 0; order < 3; order++)
        for (int ranks = 1; ranks <= (order == 2 ? 8 : 5); ranks++) {
            comm_options o = options(ranks);
            o.allreduce = algo_of_order[order];
            ck_assert_int_eq(launch_threads(&o, accounting_main, &order), 0);
        }
}
END_TEST

/* Negative control: doubling's 16-bit sums checked against the ring's rounding order
 * must fail (at 4 ranks the two orders round differently), so the same-order check
 * really tells the algorithms apart. */
START_TEST(test_doubling_order_negative) {
    comm_options o = options(4);
    o.allreduce = ALLREDUCE_DOUBLING;
    collectives_args a = {large_count(4), 0, "negative control: doubling checked in ring order"};
    int status = launch_threads(&o, collectives_main, &a);
    printf("negative control: doubling against the ring's rounding order -> status %d "
           "(must be non-zero)\n", status);
    ck_assert_int_ne(status, 0);
}
END_TEST

/* ---- COMM_F64: every collective exactly, on every algorithm (tests/comm_f64.c) ---- */
int comm_check_f64(comm *c, size_t count, const char *label);
double comm_f64_sum_through(comm *c, size_t count, comm_dtype wire);

static int f64_main(comm *world, void *arg) {
    const collectives_args *a = arg;
    return comm_check_f64(world, a->count, a->label) ? 1 : 0;
}

START_TEST(test_f64) {
    const size_t counts[] = {0, 7, large_count(_i)};
    for (int order = 0; order < 3; order++)
        for (size_t c = 0; c < 3; c++) {
            comm_options o = options(_i);
            o.allreduce = algo_of_order[order];
            collectives_args a = {counts[c], order, algo_labels[order]};
            ck_assert_int_eq(launch_threads(&o, f64_main, &a), 0);
        }
}
END_TEST

/* Negative control: the same doubles sent as fp32 lose their low bits, and the check
 * that passes f64 at tolerance 0 sees it. */
static int f64_through_main(comm *world, void *arg) {
    const double as_f64 = comm_f64_sum_through(world, 1000, COMM_F64);
    const double as_f32 = comm_f64_sum_through(world, 1000, COMM_F32);
    if (comm_rank(world) == 0) {   /* one writer: every rank got the same reduced sums */
        double *diffs = arg;
        diffs[0] = as_f64;
        diffs[1] = as_f32;
    }
    return 0;
}

START_TEST(test_f64_negative) {
    double diffs[2] = {-1, -1};
    comm_options o = options(4);
    ck_assert_int_eq(launch_threads(&o, f64_through_main, diffs), 0);
    printf("f64 all-reduce sum: largest |diff| %g as f64, %g as fp32 (negative control: "
           "must be > 0)\n", diffs[0], diffs[1]);
    ck_assert(diffs[0] == 0);
    ck_assert(diffs[1] > 0);
}
END_TEST

/* ---- all-to-all against a serial reference (tests/comm_alltoall.c) ------------------ */
int comm_check_alltoall(comm *c, int rotated_reference, const char *label);

static int alltoall_main(comm *world, void *rotated) {
    return comm_check_alltoall(world, rotated != NULL,
                               rotated ? "negative control (blocks one rank too far)"
                                       : "threads pairwise") ? 1 : 0;
}

START_TEST(test_alltoall) {
    comm_options o = options(_i);
    ck_assert_int_eq(launch_threads(&o, alltoall_main, NULL), 0);
}
END_TEST

START_TEST(test_alltoall_negative) {
    comm_options o = options(3);
    int status = launch_threads(&o, alltoall_main, "rotated");
    printf("negative control: all-to-all against a reference one rank off -> status %d "
           "(must be non-zero)\n", status);
    ck_assert_int_ne(status, 0);
}
END_TEST

/* ---- the link model: a transfer takes at least latency + bytes / bandwidth --------- */
static int link_main(comm *world, void *arg) {
    double *seconds = arg;
    float *x = mem_alloc(MEM_GRADS, 1 << 20);   /* 1 MiB: two 512 KiB steps on 2 ranks */
    comm_barrier(world);
    double t0 = comm_now();
    comm_allreduce(world, x, (1 << 20) / 4, COMM_F32, COMM_SUM);
    if (comm_rank(world) == 0) *seconds = comm_now() - t0;
    mem_free(x);
    return 0;
}

START_TEST(test_link_model) {
    static const comm_link links[] = {LINK_NVLINK, LINK_IB, LINK_ETHERNET, LINK_ETHERNET};
    static const double scales[] = {1, 1, 1, 10}, bandwidth[] = {900e9, 50e9, 3.125e9, 3.125e9};
    static const double latency[] = {2e-6, 5e-6, 30e-6, 30e-6};
    for (int i = 0; i < 4; i++) {
        comm_options o = options(2);
        o.link = links[i];
        o.link_scale = scales[i];
        double seconds = 0, model = 2 * scales[i] * (latency[i] + (1 << 19) / bandwidth[i]);
        ck_assert_int_eq(launch_threads(&o, link_main, &seconds), 0);
        printf("link %d scale %g: 1 MiB ring all-reduce on 2 ranks took %.3f ms, model >= %.3f ms\n",
               (int)links[i], scales[i], 1e3 * seconds, 1e3 * model);
        ck_assert(seconds >= model);
    }
}
END_TEST

/* ---- trace --------------------------------------------------------------------------- */
static int trace_main(comm *world, void *arg) {
    (void)arg;
    float x[1024] = {0};
    trace_begin(world, "forward \"block\" 0");
    comm_allreduce(world, x, 1024, COMM_F32, COMM_SUM);
    comm_request *req = comm_allreduce_start(world, x, 1024, COMM_F32, COMM_SUM);
    trace_begin(world, "backward");
    trace_end(world);
    comm_wait(req);
    trace_end(world);
    float blocks[2 * 96] = {0}, got[2 * 96];   /* 2 ranks: one block of 384 B sent */
    comm_alltoall(world, blocks, got, 96, COMM_F32);
    return 0;
}

START_TEST(test_trace) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_comm_trace_%d.json", (int)getpid());
    comm_options o = options(2);
    o.trace_path = path;
    ck_assert_int_eq(launch_threads(&o, trace_main, NULL), 0);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(path);
    ck_assert(strncmp(text, "{\"traceEvents\":[", 16) == 0);
    static const char *expected[] = {"\"name\":\"forward \\\"block\\\" 0\"", "\"name\":\"backward\"",
                                     "\"name\":\"allreduce\"", "\"name\":\"wait allreduce\"",
                                     "\"tid\":1,", "\"tid\":1001,", "\"bytes\":4096",
                                     "\"ph\":\"X\"", "\"pid\":0", "\"name\":\"alltoall\"",
                                     "\"bytes\":384"};
    for (size_t i = 0; i < sizeof expected / sizeof *expected; i++)
        ck_assert_msg(strstr(text, expected[i]), "trace lacks %s", expected[i]);
    int depth = 0;
    for (char *p = text; *p; p++) depth += (*p == '{' || *p == '[') - (*p == '}' || *p == ']');
    ck_assert_int_eq(depth, 0);
}
END_TEST

/* ---- faults: each runs in a child whose stderr we read --------------------------------- */
typedef struct {
    const char *scenario;
    const char *expect[4];
} fault_case;

static const fault_case fault_cases[] = {
    {"mismatch", {"MISMATCH", "calls allgather(16 x f32)", "calls allreduce(16 x f32, sum)", "rank 1"}},
    {"mismatch-count", {"MISMATCH", "allreduce(15 x f32, sum)", "allreduce(16 x f32, sum)", "rank 1"}},
    {"mismatch-root", {"MISMATCH", "root 1", "root 0", "#2"}},
    {"hang", {"TIMEOUT", "allreduce(16 x f32, sum) #2 on group 'world'",
              "rank 2: returned 0 from rank_main", "stuck in allreduce #2 on group 'world'"}},
    {"async-hang", {"TIMEOUT", "allreduce(16 x f32, sum) #2", "rank 2: returned 0 from rank_main",
                    "rank 0:"}},
    {"recv-hang", {"TIMEOUT", "rank 0 waited", "recv(16 x f32, peer 2, tag 7)", "rank 1:"}},
    {"recv-size", {"rank 1 failed: recv on 'world': rank 0 sent 64 bytes with tag 5, rank 1 expects 60", NULL}},
    {"abort", {"rank 2 failed: boom: loss is NaN at step 7", NULL}},
    {"fail", {"rank 1 failed: rank_main returned 3", NULL}},
    {"alltoall-hang", {"TIMEOUT", "alltoall(2 x f32 per rank) #2 on group 'world'",
                       "rank 2: returned 0 from rank_main", "rank 0:"}},
    {"alltoallv-count", {"rank 1 failed: comm_alltoallv on 'world': rank 0 sends 2 elements "
                         "to rank 1, which expects 1 (its recv_counts[0])", NULL}},
};

/* Runs launch_threads(o, fn, arg) in a child process, so that a hang cannot hang the
 * test, with the child's stderr in text. Returns its exit status (-1: it did not exit)
 * and the seconds it took. */
static int run_in_child(const comm_options *o, rank_main_fn fn, void *arg, char *text,
                        size_t size, double *seconds) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    double t0 = comm_now();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        alarm(30);   /* a hang must not hang the test */
        int status = launch_threads(o, fn, arg);
        fflush(stderr);
        _exit(status);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t got;
    while ((got = read(fds[0], text + len, size - 1 - len)) > 0) len += (size_t)got;
    text[len] = 0;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    *seconds = comm_now() - t0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(test_faults) {
    const fault_case *fc = &fault_cases[_i];
    double timeout = 1.0, seconds;
    comm_options o = options(3);
    o.timeout_seconds = timeout;
    static char text[1 << 16];
    int status = run_in_child(&o, comm_fault_main, (void *)fc->scenario, text, sizeof text,
                              &seconds);
    printf("fault '%s' (3 ranks, timeout %.0f s): exit %d after %.2f s; stderr:\n%s",
           fc->scenario, timeout, status, seconds, text);
    ck_assert_msg(status > 0, "'%s' must exit non-zero", fc->scenario);
    ck_assert_msg(seconds < timeout + 5, "'%s' took %.1f s", fc->scenario, seconds);
    for (int i = 0; i < 4 && fc->expect[i]; i++)
        ck_assert_msg(strstr(text, fc->expect[i]), "'%s': stderr lacks \"%s\"", fc->scenario,
                      fc->expect[i]);
}
END_TEST

/* ---- send modes: buffered sends copy and go; rendezvous sends wait as NCCL's ------- */
/* Both ranks send before they receive: fine when sends are buffered, a deadlock when
 * each send waits for the other rank's receive. */
static int send_cycle_main(comm *world, void *arg) {
    (void)arg;
    int r = comm_rank(world), peer = 1 - r;
    float out[16], in[16];
    for (int i = 0; i < 16; i++) out[i] = (float)(100 * r + i);
    comm_send(world, out, 16, COMM_F32, peer, 3);
    comm_recv(world, in, 16, COMM_F32, peer, 3);
    for (int i = 0; i < 16; i++)
        if (in[i] != (float)(100 * peer + i)) return 1;
    return 0;
}

/* Rank 1 receives late: a rendezvous send must wait that long, a buffered one not. The
 * order (0 sends first, 1 receives first, then back) is safe in both modes. */
/* Rank 0 sends, rank 1 posts its receive late: in buffered mode only once rank 0's
 * send has returned (or after 2 s, should it wait for the receive: the bug), in
 * rendezvous mode after 0.2 s, a send returning before then being the bug. What rank 0
 * records is an order, whether the receive was posted when its send returned, so a
 * busy machine changes none of the outcomes (only a buggy send could slip by). */
typedef struct {
    int rendezvous;
    _Atomic int send_returned, receive_posted;
    int posted_before_return;
} late_receiver;

static void wait_for_send(late_receiver *l, double at_most) {
    const struct timespec tick = {.tv_nsec = 1000000};
    for (double t0 = comm_now(); !atomic_load(&l->send_returned) && comm_now() - t0 < at_most;)
        nanosleep(&tick, NULL);
}

static int late_receiver_main(comm *world, void *arg) {
    late_receiver *l = arg;
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    if (comm_rank(world) == 0) {
        comm_send(world, x, 4, COMM_F32, 1, 0);
        l->posted_before_return = atomic_load(&l->receive_posted);
        atomic_store(&l->send_returned, 1);
        comm_recv(world, y, 4, COMM_F32, 1, 0);
    } else {
        wait_for_send(l, l->rendezvous ? 0.2 : 2.0);
        atomic_store(&l->receive_posted, 1);
        comm_recv(world, y, 4, COMM_F32, 0, 0);
        comm_send(world, y, 4, COMM_F32, 0, 0);
    }
    return y[3] == 4 ? 0 : 1;
}

START_TEST(test_send_modes) {
    static char text[1 << 16];
    double timeout = 1.0, seconds;
    comm_options o = options(2);
    o.timeout_seconds = timeout;
    int status = run_in_child(&o, send_cycle_main, NULL, text, sizeof text, &seconds);
    printf("send-before-recv cycle, 2 ranks, buffered: exit %d after %.2f s%s%s\n", status,
           seconds, *text ? "; stderr:\n" : "", text);
    ck_assert_msg(status == 0, "a buffered send-before-recv cycle must complete");
    o.send_mode = COMM_SEND_RENDEZVOUS;
    status = run_in_child(&o, send_cycle_main, NULL, text, sizeof text, &seconds);
    printf("send-before-recv cycle, 2 ranks, rendezvous (timeout %.0f s): exit %d after %.2f s;"
           " stderr:\n%s", timeout, status, seconds, text);
    ck_assert_msg(status > 0, "a rendezvous send-before-recv cycle must fail, not hang");
    ck_assert_msg(seconds < timeout + 5, "the cycle took %.1f s to be reported", seconds);
    const char *expect[] = {"TIMEOUT", "in send(16 x f32, peer", "tag 3",
                            "stuck in send(16 x f32, peer 0, tag 3)",
                            "stuck in send(16 x f32, peer 1, tag 3)"};
    for (size_t i = 0; i < sizeof expect / sizeof *expect; i++)
        ck_assert_msg(strstr(text, expect[i]), "rendezvous cycle: stderr lacks \"%s\"", expect[i]);
}
END_TEST

/* The wait itself, and that it is only a wait. */
START_TEST(test_send_waits_by_mode) {
    for (int mode = 0; mode < 2; mode++) {
        late_receiver l = {.rendezvous = mode};
        comm_options w = options(2);
        w.send_mode = mode ? COMM_SEND_RENDEZVOUS : COMM_SEND_BUFFERED;
        ck_assert_int_eq(launch_threads(&w, late_receiver_main, &l), 0);
        printf("%s send to a late receiver returned %s the receive was posted\n",
               mode ? "rendezvous" : "buffered", l.posted_before_return ? "after" : "before");
        if (mode) ck_assert_msg(l.posted_before_return, "a rendezvous send returned early");
        else ck_assert_msg(!l.posted_before_return, "a buffered send waited for the receiver");
    }
}
END_TEST

int main(int argc, char **argv) {
    if (argc > 1) {   /* a fault demo: test_comm SCENARIO [ranks] [timeout seconds] */
        comm_options o = options(argc > 2 ? atoi(argv[2]) : 3);
        o.timeout_seconds = argc > 3 ? atof(argv[3]) : 2.0;
        int known = 0;
        for (int i = 0; comm_fault_scenarios[i]; i++) known |= !strcmp(argv[1], comm_fault_scenarios[i]);
        if (!known) {
            fprintf(stderr, "usage: %s [SCENARIO [ranks] [timeout]]; scenarios:", argv[0]);
            for (int i = 0; comm_fault_scenarios[i]; i++) fprintf(stderr, " %s", comm_fault_scenarios[i]);
            fprintf(stderr, "\n");
            return 2;
        }
        return launch_threads(&o, comm_fault_main, argv[1]);
    }
    Suite *s = suite_create("comm");
    TCase *basics = tcase_create("basics");
    tcase_add_test(basics, test_shard);
    tcase_add_test(basics, test_conversions);
    suite_add_tcase(s, basics);
    TCase *collectives = tcase_create("collectives");
    tcase_set_timeout(collectives, 300);
    tcase_add_loop_test(collectives, test_collectives, 1, 6);   /* 1..5 ranks */
    tcase_add_loop_test(collectives, test_collectives_doubling, 1, 9);   /* 1..8 ranks */
    tcase_add_test(collectives, test_split);
    tcase_add_test(collectives, test_async);
    tcase_add_test(collectives, test_send_recv);
    tcase_add_test(collectives, test_accounting);
    tcase_add_test(collectives, test_doubling_order_negative);
    tcase_add_loop_test(collectives, test_f64, 1, 6);   /* 1..5 ranks */
    tcase_add_test(collectives, test_f64_negative);
    tcase_add_loop_test(collectives, test_alltoall, 1, 6);   /* 1..5 ranks */
    tcase_add_test(collectives, test_alltoall_negative);
    tcase_add_test(collectives, test_link_model);
    tcase_add_test(collectives, test_trace);
    suite_add_tcase(s, collectives);
    TCase *faults = tcase_create("faults");
    tcase_set_timeout(faults, 60);
    tcase_add_loop_test(faults, test_faults, 0, (int)(sizeof fault_cases / sizeof *fault_cases));
    tcase_add_test(faults, test_send_modes);
    tcase_add_test(faults, test_send_waits_by_mode);
    suite_add_tcase(s, faults);
    return check_run(s, 0);
}
