/* The comm front end: everything that does not depend on how bytes move.
 * Shard math, element conversions and reductions, argument checks, sequence numbers,
 * accounting (the one place where calls, bytes and seconds are counted), the flight
 * recorder, failure reports and the Chrome trace. Backends: comm_threads.c,
 * comm_mpi.c, gpu/ (NCCL). */
#include "comm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double comm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

comm_options comm_options_default(void) {
    return (comm_options){.ranks = 1, .allreduce = ALLREDUCE_RING, .link = LINK_NONE,
                          .link_scale = 1.0, .timeout_seconds = 60.0, .trace_path = NULL};
}

size_t comm_shard(size_t count, int size, int rank, size_t *offset) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, r = (size_t)rank;
    if (offset) *offset = r * base + (r < extra ? r : extra);
    return base + (r < extra ? 1 : 0);
}

/* ---- element types ------------------------------------------------------------------ */
size_t comm_dtype_size(comm_dtype dt) {
    static const size_t sizes[] = {4, 2, 2, 1};
    return (dt >= COMM_F32 && dt <= COMM_F8E4M3) ? sizes[dt] : 0;
}

const char *comm_dtype_name(comm_dtype dt) {
    static const char *names[] = {"f32", "bf16", "f16", "f8e4m3"};
    return (dt >= COMM_F32 && dt <= COMM_F8E4M3) ? names[dt] : "?";
}

static const char *op_name(int op) {
    static const char *names[] = {"sum", "avg", "max"};
    return (op >= COMM_SUM && op <= COMM_MAX) ? names[op] : "?";
}

static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Rounding to nearest even by integer arithmetic: add just under half a unit of the
 * kept last bit, plus one when that bit is odd, then drop the low bits. A carry out of
 * the mantissa correctly bumps the exponent. */
static inline uint16_t to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline uint16_t to_f16(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return sign | 0x7e00u;                 /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                /* >= 65520: infinity */
    if (a < 0x38800000u)                                        /* < 2^-14: subnormal, */
        return sign | (uint16_t)nearbyintf(bits_f32(a) * 0x1p24f);   /* units of 2^-24 */
    a -= 112u << 23;                                            /* exponent bias 127 -> 15 */
    return sign | (uint16_t)((a + 0x0fffu + ((a >> 13) & 1u)) >> 13);
}
static inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { float v = (float)m * 0x1p-24f; return sign ? -v : v; }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint8_t to_f8(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return sign | 0x7fu;                   /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7eu;                  /* >= 448: saturate */
    if (a < 0x3c800000u)                                        /* < 2^-6: subnormal, */
        return sign | (uint8_t)nearbyintf(bits_f32(a) * 512.0f);   /* units of 2^-9 */
    a -= 120u << 23;                                            /* exponent bias 127 -> 7 */
    return sign | (uint8_t)((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20);
}
static inline float from_f8(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);
    if (e == 0) { float v = (float)m * 0x1p-9f; return sign ? -v : v; }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

uint16_t comm_f32_to_bf16(float x) { return to_bf16(x); }
float comm_bf16_to_f32(uint16_t h) { return from_bf16(h); }
uint16_t comm_f32_to_f16(float x) { return to_f16(x); }
float comm_f16_to_f32(uint16_t h) { return from_f16(h); }
uint8_t comm_f32_to_f8e4m3(float x) { return to_f8(x); }
float comm_f8e4m3_to_f32(uint8_t b) { return from_f8(b); }

static inline float load(const void *p, size_t i, comm_dtype dt) {
    switch (dt) {
    case COMM_BF16: return from_bf16(((const uint16_t *)p)[i]);
    case COMM_F16: return from_f16(((const uint16_t *)p)[i]);
    case COMM_F8E4M3: return from_f8(((const uint8_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}
static inline void store(void *p, size_t i, comm_dtype dt, float x) {
    switch (dt) {
    case COMM_BF16: ((uint16_t *)p)[i] = to_bf16(x); break;
    case COMM_F16: ((uint16_t *)p)[i] = to_f16(x); break;
    case COMM_F8E4M3: ((uint8_t *)p)[i] = to_f8(x); break;
    default: ((float *)p)[i] = x;
    }
}

void comm_convert(void *dst, comm_dtype dst_dt, const void *src, comm_dtype src_dt,
                  size_t count) {
    if (dst_dt == src_dt) {
        if (count) memmove(dst, src, count * comm_dtype_size(dst_dt));
        return;
    }
    for (size_t i = 0; i < count; i++) store(dst, i, dst_dt, load(src, i, src_dt));
}

/* dst = a op b. The 16- and 8-bit types are widened to fp32, combined and rounded back
 * once per call, i.e. once per hop of a ring. One loop per type so that the compiler
 * vectorises each. */
#define REDUCE_LOOP(T, FROM, TO)                                                      \
    do {                                                                              \
        T *d = dst; const T *x = a, *y = b;                                           \
        if (op == COMM_MAX)                                                           \
            for (size_t i = 0; i < count; i++) {                                      \
                float p = FROM(x[i]), q = FROM(y[i]);                                 \
                d[i] = TO(p > q ? p : q);                                             \
            }                                                                         \
        else                                                                          \
            for (size_t i = 0; i < count; i++) d[i] = TO(FROM(x[i]) + FROM(y[i]));    \
    } while (0)
#define SAME(v) (v)

void comm_reduce_buffers(void *dst, const void *a, const void *b, size_t count,
                         comm_dtype dt, comm_op op) {
    switch (dt) {
    case COMM_F32: REDUCE_LOOP(float, SAME, SAME); break;
    case COMM_BF16: REDUCE_LOOP(uint16_t, from_bf16, to_bf16); break;
    case COMM_F16: REDUCE_LOOP(uint16_t, from_f16, to_f16); break;
    case COMM_F8E4M3: REDUCE_LOOP(uint8_t, from_f8, to_f8); break;
    }
}

void comm_divide_buffer(void *buf, size_t count, comm_dtype dt, int divisor) {
    float d = (float)divisor;
    if (dt == COMM_F32) {
        float *x = buf;
        for (size_t i = 0; i < count; i++) x[i] /= d;
        return;
    }
    for (size_t i = 0; i < count; i++) store(buf, i, dt, load(buf, i, dt) / d);
}

/* ---- jobs, ranks, comms ----------------------------------------------------------- */
comm_job *comm_job_create(const comm_options *opts, int nranks, int first_world_rank) {
    comm_job *job = calloc(1, sizeof *job);
    comm_rank_state *ranks = calloc((size_t)nranks, sizeof *ranks);
    if (!job || !ranks) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    job->opts = *opts;
    if (!(job->opts.timeout_seconds > 0)) job->opts.timeout_seconds = 60.0;
    if (!(job->opts.link_scale > 0)) job->opts.link_scale = 1.0;
    job->nranks = nranks;
    job->ranks = ranks;
    job->t0 = comm_now();
    for (int r = 0; r < nranks; r++) {
        ranks[r].world_rank = first_world_rank + r;
        pthread_mutex_init(&ranks[r].lock, NULL);
    }
    return job;
}

static void comm_destroy(comm *c) {
    comm **link = &c->rs->groups;
    while (*link && *link != c) link = &(*link)->next_of_rank;
    if (*link) *link = c->next_of_rank;
    c->backend->free(c);
    free(c->world_ranks);
    free(c);
}

void comm_job_free(comm_job *job) {
    for (int r = 0; r < job->nranks; r++)
        while (job->ranks[r].groups) comm_destroy(job->ranks[r].groups);
    for (int r = 0; r < job->nranks; r++) {
        pthread_mutex_destroy(&job->ranks[r].lock);
        free(job->ranks[r].events);
    }
    free(job->ranks);
    free(job);
}

comm *comm_create(comm_job *job, comm_rank_state *rs, const comm_backend *backend,
                  int rank, int size, const int *world_ranks, const char *name) {
    comm *c = calloc(1, sizeof *c);
    int *map = malloc((size_t)size * sizeof *map);
    if (!c || !map) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    memcpy(map, world_ranks, (size_t)size * sizeof *map);
    *c = (comm){.backend = backend, .job = job, .rs = rs, .rank = rank, .size = size,
                .world_ranks = map, .next_of_rank = rs->groups};
    snprintf(c->name, sizeof c->name, "%s", name ? name : "group");
    rs->groups = c;
    return c;
}

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }
int comm_world_rank(const comm *c) { return c->rs->world_rank; }
const char *comm_backend_name(const comm *c) { return c->backend->name; }
const char *comm_name(const comm *c) { return c->name; }
int comm_bytes_are_modelled(const comm *c) { return c->backend->bytes_modelled; }
mem_stats *comm_mem_stats(comm *c) { return &c->rs->mem; }

double comm_link_seconds(const comm_job *job, size_t bytes) {
    static const double bandwidth[] = {0, 900e9, 50e9, 3.125e9};
    static const double latency[] = {0, 2e-6, 5e-6, 30e-6};
    comm_link link = job->opts.link;
    if (link <= LINK_NONE || link > LINK_ETHERNET) return 0;
    return job->opts.link_scale * (latency[link] + (double)bytes / bandwidth[link]);
}

/* ---- describing calls -------------------------------------------------------------- */
const char *comm_kind_name(comm_kind kind) {
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                  "reduce", "sendrecv", "barrier"};
    if ((int)kind == COMM_KIND_SPLIT) return "split";
    return (kind >= 0 && kind < COMM_NKINDS) ? names[kind] : "?";
}

int comm_call_matches(const comm_call *a, const comm_call *b) {
    return a->kind == b->kind && a->count == b->count && a->dt == b->dt &&
           a->op == b->op && a->root == b->root;
}

void comm_call_describe(const comm_call *call, char *out, size_t size) {
    const char *name = comm_kind_name((comm_kind)call->kind);
    if (call->kind == COMM_KIND_BARRIER || call->kind == COMM_KIND_SPLIT) {
        snprintf(out, size, "%s", name);
    } else if (call->kind == COMM_KIND_SENDRECV) {
        snprintf(out, size, "%s(%zu x %s, peer %d, tag %d)", call->op ? "recv" : "send",
                 call->count, comm_dtype_name(call->dt), call->root, call->tag);
    } else {
        char extra[32] = "";
        if (call->op >= 0) snprintf(extra, sizeof extra, ", %s", op_name(call->op));
        if (call->root >= 0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", root %d",
                     call->root);
        snprintf(out, size, "%s(%zu x %s%s)", name, call->count, comm_dtype_name(call->dt),
                 extra);
    }
}

/* ---- flight recorder: the last COMM_FLIGHT_LEN operations of each rank ------------- */
static uint64_t flight_begin(comm *c, const comm_call *call, int state) {
    comm_rank_state *rs = c->rs;
    pthread_mutex_lock(&rs->lock);
    uint64_t id = ++rs->flight_count;
    comm_flight_entry *e = &rs->flight[id % COMM_FLIGHT_LEN];
    *e = (comm_flight_entry){.id = id, .call = *call, .state = state,
                             .t_start = comm_now()};
    snprintf(e->group, sizeof e->group, "%s", c->name);
    pthread_mutex_unlock(&rs->lock);
    return id;
}

void comm_flight_set(comm *c, uint64_t id, int state) {
    comm_rank_state *rs = c->rs;
    if (id == 0) return;
    pthread_mutex_lock(&rs->lock);
    comm_flight_entry *e = &rs->flight[id % COMM_FLIGHT_LEN];
    if (e->id == id && e->state != FLIGHT_DONE) {
        e->state = state;
        if (state == FLIGHT_DONE) e->t_end = comm_now();
    }
    pthread_mutex_unlock(&rs->lock);
}

/* One line for where the rank is, then its recorded operations, oldest first. */
static void flight_report(comm_rank_state *rs) {
    comm_flight_entry log[COMM_FLIGHT_LEN];
    pthread_mutex_lock(&rs->lock);
    memcpy(log, rs->flight, sizeof log);
    uint64_t last = rs->flight_count;
    pthread_mutex_unlock(&rs->lock);
    double now = comm_now();
    char where[160] = "busy outside comm";
    if (atomic_load(&rs->finished) && atomic_load(&rs->status) < 0) {
        snprintf(where, sizeof where, "stopped by this failure");
    } else if (atomic_load(&rs->finished)) {
        snprintf(where, sizeof where, "returned %d from rank_main",
                 atomic_load(&rs->status));
    } else {
        for (uint64_t id = last; id > 0 && id + COMM_FLIGHT_LEN > last; id--) {
            const comm_flight_entry *e = &log[id % COMM_FLIGHT_LEN];
            if (e->id != id || e->state == FLIGHT_DONE) continue;
            char what[96];
            if (e->call.kind == COMM_KIND_SENDRECV) comm_call_describe(&e->call, what, sizeof what);
            else snprintf(what, sizeof what, "%s #%llu", comm_kind_name((comm_kind)e->call.kind),
                          (unsigned long long)e->call.seq);
            snprintf(where, sizeof where, "stuck in %s on group '%s' for %.2f s", what,
                     e->group, now - e->t_start);
            break;
        }
    }
    fprintf(stderr, "comm:   rank %d: %s; last operations:%s\n", rs->world_rank, where,
            last ? "" : " none");
    uint64_t first = last >= COMM_FLIGHT_LEN ? last - COMM_FLIGHT_LEN + 1 : 1;
    for (uint64_t id = first; id <= last; id++) {
        const comm_flight_entry *e = &log[id % COMM_FLIGHT_LEN];
        if (e->id != id) continue;
        char what[96], state[48], number[24] = "";
        comm_call_describe(&e->call, what, sizeof what);
        if (e->call.kind != COMM_KIND_SENDRECV)
            snprintf(number, sizeof number, "#%llu ", (unsigned long long)e->call.seq);
        if (e->state == FLIGHT_DONE)
            snprintf(state, sizeof state, "done in %.3f ms", 1e3 * (e->t_end - e->t_start));
        else
            snprintf(state, sizeof state, "%s for %.2f s",
                     e->state == FLIGHT_QUEUED ? "queued" : "RUNNING", now - e->t_start);
        fprintf(stderr, "comm:     '%s' %s%s %s\n", e->group, number, what, state);
    }
}

/* ---- failures ------------------------------------------------------------------------ */
int comm_claim_failure(comm_job *job) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&job->failed, &expected, 1)) return 1;
    /* Another failure is being reported: let it finish before this rank stops, so the
     * report shows where every rank was, not the ranks that stopped since. */
    for (int i = 0; i < 200 && !atomic_load(&job->reported); i++) {
        struct timespec pause = {.tv_nsec = 5000000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

static void reported(comm_job *job) {
    fflush(stderr);
    atomic_store(&job->reported, 1);
}

static _Noreturn void stop_rank(comm *c, double grace_seconds) {
    fflush(stderr);
    c->backend->stop(c, grace_seconds);
    abort();   /* stop never returns */
}

_Noreturn void comm_fail_timeout(comm *c, const comm_call *call, int peer, double waited) {
    if (comm_claim_failure(c->job)) {
        char what[128], waiting[64] = "";
        comm_call_describe(call, what, sizeof what);
        if (call->kind != COMM_KIND_SENDRECV)
            snprintf(what + strlen(what), sizeof what - strlen(what), " #%llu",
                     (unsigned long long)call->seq);
        if (peer >= 0)
            snprintf(waiting, sizeof waiting, " waiting for rank %d", c->world_ranks[peer]);
        fprintf(stderr,
                "comm: TIMEOUT: rank %d waited %.1f s in %s on group '%s' (rank %d of %d)%s; "
                "%s:\n",
                comm_world_rank(c), waited, what, c->name, c->rank, c->size, waiting,
                c->job->nranks > 1 ? "where every rank is" : "its state (every rank reports its own)");
        for (int r = 0; r < c->job->nranks; r++) flight_report(&c->job->ranks[r]);
        reported(c->job);
    }
    stop_rank(c, 1.0);
}

_Noreturn void comm_fail_mismatch(comm *c, int other, const comm_call *mine,
                                  const comm_call *theirs) {
    if (comm_claim_failure(c->job)) {
        char a[96], b[96];
        comm_call_describe(mine, a, sizeof a);
        comm_call_describe(theirs, b, sizeof b);
        fprintf(stderr,
                "comm: collective MISMATCH on group '%s' #%llu: rank %d calls %s but rank %d "
                "calls %s\n",
                c->name, (unsigned long long)mine->seq, comm_world_rank(c), a,
                c->world_ranks[other], b);
        reported(c->job);
    }
    stop_rank(c, 0.5);
}

static _Noreturn void vfail(comm *c, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    atomic_store(&c->job->failed, 1);
    fprintf(stderr, "rank %d failed: %s\n", comm_world_rank(c), msg);
    stop_rank(c, 0.0);
}

_Noreturn void comm_fail(comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, fmt, ap);
}

_Noreturn void comm_abort(comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, fmt, ap);
}

/* ---- accounting ---------------------------------------------------------------------- */
void comm_count(comm *copier, comm *owner, int kind, uint64_t bytes) {
    if (kind < 0 || kind >= COMM_NKINDS) return;
    if (copier) atomic_fetch_add_explicit(&copier->counters.received[kind], bytes,
                                          memory_order_relaxed);
    if (owner) atomic_fetch_add_explicit(&owner->counters.sent[kind], bytes,
                                         memory_order_relaxed);
}

/* The textbook volume a rank moves (MPI, NCCL): rings for all-reduce, reduce-scatter
 * and all-gather, a pipelined chain from (broadcast) or to (reduce) the root. */
static void count_modelled(comm *c, const comm_call *call) {
    if (!c->backend->bytes_modelled) return;
    uint64_t n = (uint64_t)c->size, bytes = call->count * comm_dtype_size(call->dt);
    uint64_t sent = 0, received = 0;
    int pos;
    switch (call->kind) {
    case COMM_KIND_ALLREDUCE: sent = received = 2 * (n - 1) * bytes / n; break;
    case COMM_KIND_REDUCE_SCATTER:
    case COMM_KIND_ALLGATHER: sent = received = (n - 1) * bytes / n; break;
    case COMM_KIND_BROADCAST:
        pos = (c->rank - call->root + c->size) % c->size;
        received = pos > 0 ? bytes : 0;
        sent = pos < c->size - 1 ? bytes : 0;
        break;
    case COMM_KIND_REDUCE:
        pos = (c->rank - call->root - 1 + 2 * c->size) % c->size;
        received = pos > 0 ? bytes : 0;
        sent = pos < c->size - 1 ? bytes : 0;
        break;
    case COMM_KIND_SENDRECV:
        if (call->op) received = bytes; else sent = bytes;
        break;
    }
    atomic_fetch_add(&c->counters.sent[call->kind], sent);
    atomic_fetch_add(&c->counters.received[call->kind], received);
}

static void add_stats(comm_stats *s, const comm *c) {
    const comm_counters *k = &c->counters;
    for (int i = 0; i < COMM_NKINDS; i++) {
        s->calls[i] += k->calls[i];
        s->bytes_sent[i] += atomic_load(&k->sent[i]);
        s->bytes_received[i] += atomic_load(&k->received[i]);
        s->seconds[i] += k->seconds[i];
    }
    s->async_seconds += k->async_seconds;
    s->hidden_seconds += k->hidden_seconds;
}

comm_stats comm_stats_get(const comm *c) {
    comm_stats s = {0};
    add_stats(&s, c);
    return s;
}

comm_stats comm_stats_all(const comm *c) {
    comm_stats s = {0};
    for (const comm *g = c->rs->groups; g; g = g->next_of_rank) add_stats(&s, g);
    return s;
}

void comm_stats_reset(comm *c) {
    for (comm *g = c->rs->groups; g; g = g->next_of_rank) {
        comm_counters *k = &g->counters;
        for (int i = 0; i < COMM_NKINDS; i++) {
            k->calls[i] = 0;
            k->seconds[i] = 0;
            atomic_store(&k->sent[i], 0);
            atomic_store(&k->received[i], 0);
        }
        k->async_seconds = k->hidden_seconds = 0;
    }
}

uint64_t comm_stats_total_sent(const comm_stats *s) {
    uint64_t total = 0;
    for (int i = 0; i < COMM_NKINDS; i++) total += s->bytes_sent[i];
    return total;
}

double comm_stats_total_seconds(const comm_stats *s) {
    double total = 0;
    for (int i = 0; i < COMM_NKINDS; i++) total += s->seconds[i];
    return total;
}

/* ---- the API: check, number, record, hand to the backend, account ----------------- */
static comm_call make_call(int kind, const void *send, void *recv, size_t count,
                           comm_dtype dt, int op, int root) {
    return (comm_call){.kind = kind, .send = send, .recv = recv, .count = count,
                       .dt = (int)dt, .op = op, .root = root};
}

static void check_call(comm *c, const comm_call *call) {
    const char *name = comm_kind_name((comm_kind)call->kind);
    if (call->dt < COMM_F32 || call->dt > COMM_F8E4M3)
        comm_fail(c, "comm_%s on '%s': unknown dtype %d", name, c->name, call->dt);
    if (call->kind != COMM_KIND_ALLGATHER && call->kind != COMM_KIND_BROADCAST &&
        call->kind != COMM_KIND_BARRIER && (call->op < COMM_SUM || call->op > COMM_MAX))
        comm_fail(c, "comm_%s on '%s': unknown op %d", name, c->name, call->op);
    if (call->root != -1 && (call->root < 0 || call->root >= c->size))
        comm_fail(c, "comm_%s on '%s': rank %d out of range (the group has %d ranks)", name,
                  c->name, call->root, c->size);
    if (call->count > 0 && (!call->send || !call->recv))
        comm_fail(c, "comm_%s on '%s': NULL buffer for %zu elements", name, c->name,
                  call->count);
}

static void trace_call(comm *c, int tid, const char *prefix, const comm_call *call,
                       double t0, double t1) {
    if (!c->job->opts.trace_path) return;
    char name[48];
    snprintf(name, sizeof name, "%s%s", prefix, comm_kind_name((comm_kind)call->kind));
    comm_trace_span(c, tid, name, t0, t1, call->count * comm_dtype_size(call->dt));
}

static void run_blocking(comm *c, comm_call call) {
    check_call(c, &call);
    call.seq = ++c->seq;
    uint64_t flight = flight_begin(c, &call, FLIGHT_RUNNING);
    double t0 = comm_now();
    c->backend->run(c, &call);
    double t1 = comm_now();
    comm_flight_set(c, flight, FLIGHT_DONE);
    c->counters.calls[call.kind]++;
    c->counters.seconds[call.kind] += t1 - t0;
    count_modelled(c, &call);
    trace_call(c, comm_world_rank(c), "", &call, t0, t1);
}

static comm_request *start(comm *c, comm_call call) {
    check_call(c, &call);
    call.seq = ++c->seq;
    comm_request *req = calloc(1, sizeof *req);
    if (!req) comm_fail(c, "out of memory");
    *req = (comm_request){.c = c, .call = call, .t_start = comm_now()};
    req->flight = flight_begin(c, &call, FLIGHT_QUEUED);
    c->counters.calls[call.kind]++;
    count_modelled(c, &call);
    c->backend->start(c, req);
    return req;
}

void comm_wait(comm_request *req) {
    if (!req) return;
    comm *c = req->c;
    double t0 = comm_now();
    c->backend->wait(c, req);
    double t1 = comm_now();
    comm_flight_set(c, req->flight, FLIGHT_DONE);
    double done = req->t_done > req->t_start ? req->t_done : t1;
    /* Hidden: the part of the flight before the program started waiting for it. */
    double hidden = (t0 < done ? t0 : done) - req->t_start;
    c->counters.seconds[req->call.kind] += t1 - t0;
    c->counters.async_seconds += done - req->t_start;
    c->counters.hidden_seconds += hidden > 0 ? hidden : 0;
    trace_call(c, 1000 + comm_world_rank(c), "", &req->call, req->t_start, done);
    trace_call(c, comm_world_rank(c), "wait ", &req->call, t0, t1);
    free(req);
}

void comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op) {
    run_blocking(c, make_call(COMM_KIND_ALLREDUCE, buf, buf, count, dt, (int)op, -1));
}
void comm_reduce_scatter(comm *c, const void *send, void *recv, size_t count,
                         comm_dtype dt, comm_op op) {
    run_blocking(c,
                 make_call(COMM_KIND_REDUCE_SCATTER, send, recv, count, dt, (int)op, -1));
}
void comm_allgather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt) {
    run_blocking(c, make_call(COMM_KIND_ALLGATHER, send, recv, count, dt, -1, -1));
}
void comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root) {
    run_blocking(c, make_call(COMM_KIND_BROADCAST, buf, buf, count, dt, -1, root));
}
void comm_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, int root) {
    run_blocking(c, make_call(COMM_KIND_REDUCE, buf, buf, count, dt, (int)op, root));
}
void comm_barrier(comm *c) {
    run_blocking(c, make_call(COMM_KIND_BARRIER, NULL, NULL, 0, COMM_F32, -1, -1));
}

comm_request *comm_allreduce_start(comm *c, void *buf, size_t count, comm_dtype dt,
                                   comm_op op) {
    return start(c, make_call(COMM_KIND_ALLREDUCE, buf, buf, count, dt, (int)op, -1));
}
comm_request *comm_reduce_scatter_start(comm *c, const void *send, void *recv,
                                        size_t count, comm_dtype dt, comm_op op) {
    return start(c,
                 make_call(COMM_KIND_REDUCE_SCATTER, send, recv, count, dt, (int)op, -1));
}
comm_request *comm_allgather_start(comm *c, const void *send, void *recv, size_t count,
                                   comm_dtype dt) {
    return start(c, make_call(COMM_KIND_ALLGATHER, send, recv, count, dt, -1, -1));
}

static void point_to_point(comm *c, comm_call call, int tag) {
    int is_recv = call.op;
    const char *name = is_recv ? "comm_recv" : "comm_send";
    if (call.dt < COMM_F32 || call.dt > COMM_F8E4M3)
        comm_fail(c, "%s on '%s': unknown dtype %d", name, c->name, call.dt);
    if (call.root < 0 || call.root >= c->size)
        comm_fail(c, "%s on '%s': peer %d out of range (the group has %d ranks)", name,
                  c->name, call.root, c->size);
    if (tag < 0 || tag > 32767)
        comm_fail(c, "%s on '%s': tag %d outside 0..32767", name, c->name, tag);
    if (call.count > 0 && !call.send)
        comm_fail(c, "%s on '%s': NULL buffer", name, c->name);
    call.seq = 0;
    call.tag = tag;
    uint64_t flight = flight_begin(c, &call, FLIGHT_RUNNING);
    size_t bytes = call.count * comm_dtype_size(call.dt);
    double t0 = comm_now();
    if (is_recv) c->backend->recv(c, &call);
    else c->backend->send(c, &call);
    double t1 = comm_now();
    comm_flight_set(c, flight, FLIGHT_DONE);
    c->counters.calls[COMM_KIND_SENDRECV]++;
    c->counters.seconds[COMM_KIND_SENDRECV] += t1 - t0;
    count_modelled(c, &call);
    if (c->job->opts.trace_path)
        comm_trace_span(c, comm_world_rank(c), is_recv ? "recv" : "send", t0, t1, bytes);
}

void comm_send(comm *c, const void *buf, size_t count, comm_dtype dt, int peer, int tag) {
    point_to_point(c, make_call(COMM_KIND_SENDRECV, buf, NULL, count, dt, 0, peer), tag);
}
void comm_recv(comm *c, void *buf, size_t count, comm_dtype dt, int peer, int tag) {
    point_to_point(c, make_call(COMM_KIND_SENDRECV, buf, buf, count, dt, 1, peer), tag);
}

comm *comm_split(comm *c, int color, int key, const char *name) {
    comm_call call = make_call(COMM_KIND_SPLIT, NULL, NULL, 0, COMM_F32, -1, -1);
    call.seq = ++c->seq;
    uint64_t flight = flight_begin(c, &call, FLIGHT_RUNNING);
    double t0 = comm_now();
    comm *group = c->backend->split(c, color, key, name ? name : "group", call.seq);
    comm_flight_set(c, flight, FLIGHT_DONE);
    if (c->job->opts.trace_path)
        comm_trace_span(c, comm_world_rank(c), "split", t0, comm_now(), 0);
    return group;
}

void comm_free(comm *c) {
    if (c) comm_destroy(c);
}

/* ---- trace ------------------------------------------------------------------------- */
void comm_trace_span(comm *c, int tid, const char *name, double t0, double t1,
                     uint64_t bytes) {
    comm_rank_state *rs = c->rs;
    pthread_mutex_lock(&rs->lock);
    if (rs->nevents == rs->cap_events) {
        size_t cap = rs->cap_events ? 2 * rs->cap_events : 256;
        comm_trace_event *grown = realloc(rs->events, cap * sizeof *grown);
        if (!grown) { pthread_mutex_unlock(&rs->lock); return; }   /* drop the event */
        rs->events = grown;
        rs->cap_events = cap;
    }
    comm_trace_event *e = &rs->events[rs->nevents++];
    *e = (comm_trace_event){.tid = tid, .t0 = t0, .t1 = t1, .bytes = bytes};
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->group, sizeof e->group, "%s", bytes || tid >= 1000 ? c->name : "");
    pthread_mutex_unlock(&rs->lock);
}

void trace_begin(comm *c, const char *name) {
    comm_rank_state *rs = c->rs;
    if (!c->job->opts.trace_path) return;
    if (rs->depth < 32) {
        snprintf(rs->open_spans[rs->depth].name, sizeof rs->open_spans[0].name, "%s", name);
        rs->open_spans[rs->depth].t0 = comm_now();
    }
    rs->depth++;
}

void trace_end(comm *c) {
    comm_rank_state *rs = c->rs;
    if (!c->job->opts.trace_path || rs->depth == 0) return;
    rs->depth--;
    if (rs->depth < 32)
        comm_trace_span(c, rs->world_rank, rs->open_spans[rs->depth].name,
                        rs->open_spans[rs->depth].t0, comm_now(), 0);
}

static void json_string(char *out, size_t size, const char *s) {
    size_t n = 0;
    for (; *s && n + 7 < size; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { out[n++] = '\\'; out[n++] = (char)ch; }
        else if (ch < 0x20) n += (size_t)snprintf(out + n, size - n, "\\u%04x", ch);
        else out[n++] = (char)ch;
    }
    out[n] = 0;
}

/* Appends to a growing string; returns 0 when out of memory. */
static int append(char **out, size_t *len, size_t *cap, const char *text) {
    size_t n = strlen(text);
    if (*len + n + 1 > *cap) {
        size_t cap2 = 2 * (*len + n + 1);
        char *grown = realloc(*out, cap2);
        if (!grown) return 0;
        *out = grown;
        *cap = cap2;
    }
    memcpy(*out + *len, text, n + 1);
    *len += n;
    return 1;
}

char *comm_trace_rank_json(const comm_job *job, const comm_rank_state *rs) {
    size_t cap = 4096, len = 0;
    char *out = malloc(cap), line[512];
    if (!out) return NULL;
    out[0] = 0;
    int r = rs->world_rank;
    snprintf(line, sizeof line,
             "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
             "\"args\":{\"name\":\"rank %d\"}},\n"
             "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
             "\"args\":{\"sort_index\":%d}},\n"
             "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
             "\"args\":{\"name\":\"rank %d async comm\"}},\n"
             "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
             "\"args\":{\"sort_index\":%d}},\n",
             r, r, r, 2 * r, 1000 + r, r, 1000 + r, 2 * r + 1);
    int ok = append(&out, &len, &cap, line);
    for (size_t i = 0; ok && i < rs->nevents; i++) {
        const comm_trace_event *e = &rs->events[i];
        char name[100], group[70], args[160] = "";
        json_string(name, sizeof name, e->name);
        json_string(group, sizeof group, e->group);
        if (e->group[0])
            snprintf(args, sizeof args, ",\"args\":{\"group\":\"%s\",\"bytes\":%llu}", group,
                     (unsigned long long)e->bytes);
        snprintf(line, sizeof line,
                 "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                 "\"ts\":%.3f,\"dur\":%.3f%s},\n",
                 name, e->group[0] ? "comm" : "compute", e->tid, 1e6 * (e->t0 - job->t0),
                 1e6 * (e->t1 - e->t0), args);
        ok = append(&out, &len, &cap, line);
    }
    return out;
}

int comm_trace_write(const char *path, char **parts, int nparts) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "comm: cannot write trace %s\n", path);
        return -1;
    }
    fputs("{\"traceEvents\":[\n", f);
    for (int i = 0; i < nparts; i++)
        if (parts[i]) fputs(parts[i], f);
    fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"ranks\"}}\n"
          "],\"displayTimeUnit\":\"ms\"}\n", f);
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- rank threads of in-process backends ------------------------------------------ */

_Thread_local jmp_buf *comm_thread_escape;

_Noreturn void comm_leave_thread(void) {
    if (comm_thread_escape) longjmp(*comm_thread_escape, 1);
    fprintf(stderr, "comm: stopping a thread that launch() did not start: exiting\n");
    exit(1);
}

int comm_run_rank_thread(comm *world, rank_main_fn fn, void *args) {
    jmp_buf stopped_here;
    comm_thread_escape = &stopped_here;
    if (setjmp(stopped_here)) {
        comm_thread_escape = NULL;
        return -1;
    }
    int status = fn(world, args);
    comm_thread_escape = NULL;
    if (status != 0) {
        atomic_store(&world->job->failed, 1);
        fprintf(stderr, "rank %d failed: rank_main returned %d\n", comm_world_rank(world),
                status);
        atomic_store(&world->job->stop, 1);
    }
    return status;
}
