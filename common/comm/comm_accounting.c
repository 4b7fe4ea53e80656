/* Accounting and the trace: the one place where calls, bytes and seconds are counted
 * (measured copies, or the textbook volume for MPI and NCCL), the per-rank totals, and
 * the spans written out as Chrome trace JSON. */
#include "comm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- accounting ---------------------------------------------------------------------- */
int comm_counting_paused(const comm *c) {
    return atomic_load_explicit(&c->rs->stats_paused, memory_order_relaxed);
}

void comm_stats_pause(comm *c, int paused) {
    atomic_store(&c->rs->stats_paused, paused != 0);
}

/* The thread that copies counts both sides: a copy made while its rank is paused (the
 * copier's, or the sender's own copy-and-go) is left out of both, so no copy of the
 * paused traffic lands in a peer that has gone on. */
void comm_count(comm *copier, comm *owner, int kind, comm_tier tier, uint64_t bytes) {
    if (kind < 0 || kind >= COMM_NKINDS) return;
    if (comm_counting_paused(copier ? copier : owner)) return;
    if (copier) {
        atomic_fetch_add_explicit(&copier->counters.received[kind], bytes, memory_order_relaxed);
        atomic_fetch_add_explicit(&copier->counters.tier_received[tier], bytes,
                                  memory_order_relaxed);
    }
    if (owner) {
        atomic_fetch_add_explicit(&owner->counters.sent[kind], bytes, memory_order_relaxed);
        atomic_fetch_add_explicit(&owner->counters.tier_sent[tier], bytes, memory_order_relaxed);
    }
}

/* A transfer's time on the modelled link, which the rank waits out (threads backend). */
void comm_count_link(comm *c, comm_tier tier, double seconds) {
    if (comm_counting_paused(c)) return;
    atomic_fetch_add_explicit(&c->counters.link_nanoseconds[tier],
                              (uint64_t)llround(seconds * 1e9), memory_order_relaxed);
}

/* The modelled backends' tier bytes: a ring receives from its left neighbour and sends
 * to its right; a chain likewise; all-to-all goes straight to each peer. */
static void count_modelled_tiers(comm *c, const comm_call *call, uint64_t sent,
                                 uint64_t received) {
    comm_counters *k = &c->counters;
    if (call->kind == COMM_KIND_ALLTOALL) {
        const size_t es = comm_dtype_size(call->dt);
        for (int j = 0; j < c->size; j++) {
            if (j == c->rank) continue;
            size_t off;
            const comm_tier t = comm_tier_to(c, j);
            atomic_fetch_add(&k->tier_sent[t], comm_alltoall_block(call, 0, j, &off) * es);
            atomic_fetch_add(&k->tier_received[t], comm_alltoall_block(call, 1, j, &off) * es);
        }
        return;
    }
    int from = (c->rank - 1 + c->size) % c->size, to = (c->rank + 1) % c->size;
    if (call->kind == COMM_KIND_SENDRECV) from = to = call->root;
    atomic_fetch_add(&k->tier_sent[comm_tier_to(c, to)], sent);
    atomic_fetch_add(&k->tier_received[comm_tier_to(c, from)], received);
}

/* The textbook volume a rank moves (MPI, NCCL): rings for all-reduce, reduce-scatter
 * and all-gather, a pipelined chain from (broadcast) or to (reduce) the root, all-to-all
 * straight to each peer. */
void comm_count_modelled(comm *c, const comm_call *call) {
    if (!c->backend->bytes_modelled || comm_counting_paused(c)) return;
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
    case COMM_KIND_ALLTOALL:   /* every block but its own, straight to its rank */
        sent = comm_alltoall_moved(call, 0, c->size, c->rank) * comm_dtype_size(call->dt);
        received = comm_alltoall_moved(call, 1, c->size, c->rank) * comm_dtype_size(call->dt);
        break;
    }
    atomic_fetch_add(&c->counters.sent[call->kind], sent);
    atomic_fetch_add(&c->counters.received[call->kind], received);
    count_modelled_tiers(c, call, sent, received);
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
    for (int t = 0; t < COMM_NTIERS; t++) {
        const double seconds = 1e-9 * (double)atomic_load(&k->link_nanoseconds[t]);
        s->link_seconds += seconds;
        s->tier_link_seconds[t] += seconds;
        s->tier_sent[t] += atomic_load(&k->tier_sent[t]);
        s->tier_received[t] += atomic_load(&k->tier_received[t]);
    }
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
        for (int t = 0; t < COMM_NTIERS; t++) {
            atomic_store(&k->link_nanoseconds[t], 0);
            atomic_store(&k->tier_sent[t], 0);
            atomic_store(&k->tier_received[t], 0);
        }
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
