/* The pipeline simulator: each stream of each rank (or the rank, sequential) walks the
 * rank's op list with its own clock; a message completes when both of its ranks have
 * reached it (or, buffered, when the receiver has). Ranks are advanced in turn, each
 * as far as it can go, until all are done or a whole round moves nobody: a deadlock. */
#include "pp_sim.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"

pp_sim_options pp_sim_options_default(void) {
    return (pp_sim_options){.forward = 1, .backward = 2, .backward_input = 1,
                            .backward_weight = 1};
}

/* A send posted and not yet received: who, which op, when. */
typedef struct {
    int rank, op_index;
    double posted;
} posted_send;

typedef struct {   /* FIFO of the sends from one rank to another */
    posted_send *items;
    int head, tail;
} channel;

typedef struct {   /* where one stream of a rank is in the rank's list */
    int pos;
    double clock;
    int posted;        /* the send at pos is in its channel, since posted_at */
    double posted_at;
    int taken;         /* ... and its receiver has completed it, at taken_at */
    double taken_at;
} cursor;

typedef struct {
    cursor compute, comm;   /* sequential: compute walks every op, comm stays unused */
    double *done;           /* [ops]: when each op finished; < 0 before */
    int *needs;             /* [ops]: the op it waits for (a pass: the receive of its
                               input; a send: the pass that made it), or -1 */
} sim_rank;

typedef struct {
    const pp_schedule *s;
    const pp_sim_options *o;
    sim_rank *ranks;
    channel *channels;   /* [from * p + to] */
    pp_sim_result *res;
} sim;

static int is_send(pp_op_kind kind) { return kind == PP_SEND_ACT || kind == PP_SEND_GRAD; }

static channel *channel_of(sim *m, int from, int to) {
    return &m->channels[(size_t)from * m->s->stages + to];
}

/* The stream that runs op kind on rank r. */
static cursor *cursor_for(sim *m, int r, pp_op_kind kind) {
    sim_rank *sr = &m->ranks[r];
    return m->o->sequential || pp_op_is_compute(kind) ? &sr->compute : &sr->comm;
}

/* Moves cur past the ops of the other stream (streams only). */
static void skip_foreign(sim *m, int r, cursor *cur) {
    const pp_rank_ops *list = &m->s->ranks[r];
    if (m->o->sequential) return;
    int want_compute = cur == &m->ranks[r].compute;
    while (cur->pos < list->count && pp_op_is_compute(list->ops[cur->pos].kind) != want_compute)
        cur->pos++;
}

static double compute_time(const sim *m, pp_op_kind kind) {
    const pp_sim_options *o = m->o;
    double t = kind == PP_FORWARD          ? o->forward
               : kind == PP_BACKWARD       ? o->backward
               : kind == PP_BACKWARD_INPUT ? o->backward_input
                                           : o->backward_weight;
    return m->s->bidirectional ? t : t / m->s->chunks;   /* DualPipe: a pass is a stage */
}

static double message_time(const sim *m) {
    return m->o->link_alpha + m->o->message_bytes * m->o->link_time_per_byte;
}

static void describe(const pp_op *op, char *out, size_t size) {
    int n = snprintf(out, size, "%s(micro %d, chunk %d)", pp_op_kind_name(op->kind), op->micro,
                     op->chunk);
    if (op->peer >= 0 && n > 0 && (size_t)n < size)
        snprintf(out + n, size - (size_t)n, " %s rank %d", is_send(op->kind) ? "to" : "from",
                 op->peer);
}

/* Does the receive `recv` on rank r take the message that `send` on rank from sends? */
static int pairs_with(const sim *m, const pp_op *send, int from, const pp_op *recv, int r) {
    int from_stage = pp_virtual_stage(m->s, from, send->chunk);
    int to_stage = pp_virtual_stage(m->s, r, recv->chunk);
    if (send->micro != recv->micro) return 0;
    if (send->kind == PP_SEND_ACT) return recv->kind == PP_RECV_ACT && to_stage == from_stage + 1;
    return send->kind == PP_SEND_GRAD && recv->kind == PP_RECV_GRAD && to_stage == from_stage - 1;
}

/* When op pos of rank r may start as far as what it needs goes; < 0: not yet. */
static double ready_time(const sim *m, int r, int pos) {
    int need = m->ranks[r].needs[pos];
    return need < 0 ? 0 : m->ranks[r].done[need];
}

static void add_span(sim *m, int r, const pp_op *op, double start, double end) {
    m->res->spans[m->res->nspans++] = (pp_span){r, op->kind, op->micro, op->chunk, start, end};
}

/* The compute op after pos in rank r's list (an F&B's backward), or -1. */
static int next_compute(const sim *m, int r, int pos) {
    const pp_rank_ops *list = &m->s->ranks[r];
    for (int i = pos + 1; i < list->count; i++)
        if (pp_op_is_compute(list->ops[i].kind)) return i;
    return -1;
}

/* An F&B on GPU streams: both passes once both inputs are there, the shorter one
 * fb_overlap hidden under the other; the time split between them in proportion. */
static int run_fused(sim *m, int r, cursor *cur, const pp_op *op, int pair, double start) {
    const double ready = ready_time(m, r, pair);
    if (ready < 0) return 0;
    if (ready > start) start = ready;
    const pp_op *b = &m->s->ranks[r].ops[pair];
    const double tf = compute_time(m, op->kind), tb = compute_time(m, b->kind);
    const double both = tf + tb - m->o->fb_overlap * (tf < tb ? tf : tb);
    const double split = start + both * tf / (tf + tb);
    add_span(m, r, op, start, split);
    add_span(m, r, b, split, start + both);
    m->res->busy[r] += both;
    cur->clock = start + both;
    m->ranks[r].done[pair] = cur->clock;
    m->ranks[r].done[cur->pos++] = cur->clock;
    return 1;
}

/* Returns 1 when the pass ran, 0 when its input is not there yet. */
static int run_compute(sim *m, int r, cursor *cur, const pp_op *op) {
    if (m->ranks[r].done[cur->pos] >= 0) {   /* an F&B's backward: ran with its F */
        cur->pos++;
        return 1;
    }
    double ready = ready_time(m, r, cur->pos);
    if (ready < 0) return 0;
    const int overlaps = op->fused && !m->o->sequential && m->o->fb_overlap > 0;
    const int pair = overlaps ? next_compute(m, r, cur->pos) : -1;
    double t = compute_time(m, op->kind), start = ready > cur->clock ? ready : cur->clock;
    if (pair >= 0) return run_fused(m, r, cur, op, pair, start);
    add_span(m, r, op, start, start + t);
    cur->clock = start + t;
    m->res->busy[r] += t;
    m->ranks[r].done[cur->pos++] = cur->clock;
    return 1;
}

/* Returns 1 when the send at pos moved (posted, or completed). */
static int run_send(sim *m, int r, cursor *cur, const pp_op *op) {
    if (!cur->posted) {
        double ready = ready_time(m, r, cur->pos);
        if (ready < 0) return 0;
        if (ready > cur->clock) cur->clock = ready;
        channel *ch = channel_of(m, r, op->peer);
        ch->items[ch->tail++] = (posted_send){r, cur->pos, cur->clock};
        cur->posted = 1;
        cur->posted_at = cur->clock;
        if (m->o->buffered) {
            cur->posted = 0;
            add_span(m, r, op, cur->clock, cur->clock);
            m->ranks[r].done[cur->pos++] = cur->clock;
        }
        return 1;
    }
    if (!cur->taken) return 0;
    cur->clock = cur->taken_at;
    add_span(m, r, op, cur->posted_at, cur->clock);
    cur->posted = cur->taken = 0;
    m->ranks[r].done[cur->pos++] = cur->clock;
    return 1;
}

/* Returns 1 when the receive completed, 0 when it waits, -1 on a mismatch. */
static int run_recv(sim *m, int r, cursor *cur, const pp_op *op) {
    channel *ch = channel_of(m, op->peer, r);
    if (ch->head == ch->tail) return 0;
    posted_send *ps = &ch->items[ch->head];
    const pp_op *send = &m->s->ranks[ps->rank].ops[ps->op_index];
    if (!pairs_with(m, send, ps->rank, op, r)) {
        char a[96], b[96];
        describe(op, a, sizeof a);
        describe(send, b, sizeof b);
        snprintf(m->res->error, sizeof m->res->error,
                 "mismatched messages: rank %d posts %s, but the next message from rank %d"
                 " is its %s", r, a, ps->rank, b);
        return -1;
    }
    double posted_at = cur->clock, start = ps->posted > cur->clock ? ps->posted : cur->clock;
    if (m->o->buffered) {   /* the bytes left when the send was posted */
        double arrival = ps->posted + message_time(m);
        cur->clock = arrival > cur->clock ? arrival : cur->clock;
    } else {
        cur->clock = start + message_time(m);
        cursor *sender = cursor_for(m, ps->rank, send->kind);
        sender->taken = 1;
        sender->taken_at = cur->clock;
    }
    ch->head++;
    add_span(m, r, op, posted_at, cur->clock);
    m->ranks[r].done[cur->pos++] = cur->clock;
    return 1;
}

/* Moves one stream of rank r as far as it can: 1 if it moved, 0 if not, -1 on error. */
static int advance_cursor(sim *m, int r, cursor *cur) {
    const pp_rank_ops *list = &m->s->ranks[r];
    int moved = 0;
    for (skip_foreign(m, r, cur); cur->pos < list->count; skip_foreign(m, r, cur)) {
        const pp_op *op = &list->ops[cur->pos];
        int step = pp_op_is_compute(op->kind) ? run_compute(m, r, cur, op)
                   : is_send(op->kind)        ? run_send(m, r, cur, op)
                                              : run_recv(m, r, cur, op);
        if (step < 0) return -1;
        if (step == 0) break;
        moved = 1;
    }
    return moved;
}

static int advance(sim *m, int r) {
    int a = advance_cursor(m, r, &m->ranks[r].compute);
    if (a < 0 || m->o->sequential) return a;
    int b = advance_cursor(m, r, &m->ranks[r].comm);
    return b < 0 ? -1 : a | b;
}

static int rank_finished(const sim *m, int r) {
    int count = m->s->ranks[r].count;
    return m->ranks[r].compute.pos >= count && (m->o->sequential || m->ranks[r].comm.pos >= count);
}

/* "rank 1 waits in send-act(micro 1, chunk 0) to rank 0 (op 3)", or for a pass, for
 * the op it needs. */
static int describe_wait(const sim *m, int r, const cursor *cur, char *out, size_t size) {
    const pp_rank_ops *list = &m->s->ranks[r];
    if (cur->pos >= list->count) return 0;
    char what[96];
    const pp_op *op = &list->ops[cur->pos];
    describe(op, what, sizeof what);
    int n = snprintf(out, size, "rank %d waits in %s (op %d)", r, what, cur->pos);
    int need = m->ranks[r].needs[cur->pos];
    if (need >= 0 && m->ranks[r].done[need] < 0 && n > 0 && (size_t)n < size) {
        describe(&list->ops[need], what, sizeof what);
        n += snprintf(out + n, size - (size_t)n, " for its %s (op %d)", what, need);
    }
    return n;
}

static void report_deadlock(sim *m) {
    char *out = m->res->error;
    size_t size = sizeof m->res->error;
    int n = snprintf(out, size, "deadlock: no rank can move;"), shown = 0;
    for (int r = 0; r < m->s->stages && (size_t)n + 200 < size; r++) {
        cursor *streams[2] = {&m->ranks[r].compute, &m->ranks[r].comm};
        for (int k = 0; k < (m->o->sequential ? 1 : 2) && (size_t)n + 200 < size; k++) {
            char line[256];
            if (!describe_wait(m, r, streams[k], line, sizeof line)) continue;
            if (shown++ == 8) {
                n += snprintf(out + n, size - (size_t)n, " ...");
                return;
            }
            n += snprintf(out + n, size - (size_t)n, "%s %s", shown > 1 ? ";" : "", line);
        }
    }
}

/* What each op waits for: a pass, the receive of its input; a send, its pass. */
static void find_needs(sim *m, int r) {
    const pp_schedule *s = m->s;
    const pp_rank_ops *list = &s->ranks[r];
    size_t slots = (size_t)s->micro * s->chunks;
    int *where = mem_alloc(MEM_OTHER, 4 * slots * sizeof *where);   /* recv-act, recv-grad,
                                                                       F, B or Bi */
    for (size_t i = 0; i < 4 * slots; i++) where[i] = -1;
    for (int i = 0; i < list->count; i++) {
        const pp_op *op = &list->ops[i];
        int kind = op->kind == PP_RECV_ACT ? 0 : op->kind == PP_RECV_GRAD ? 1
                 : op->kind == PP_FORWARD  ? 2
                 : op->kind == PP_BACKWARD || op->kind == PP_BACKWARD_INPUT ? 3 : -1;
        if (kind >= 0) where[(size_t)kind * slots + (size_t)op->micro * s->chunks + op->chunk] = i;
    }
    for (int i = 0; i < list->count; i++) {
        const pp_op *op = &list->ops[i];
        size_t at = (size_t)op->micro * s->chunks + op->chunk;
        int kind = op->kind == PP_FORWARD   ? 0 : op->kind == PP_BACKWARD ? 1
                 : op->kind == PP_BACKWARD_INPUT ? 1
                 : op->kind == PP_SEND_ACT  ? 2 : op->kind == PP_SEND_GRAD ? 3 : -1;
        m->ranks[r].needs[i] = kind >= 0 ? where[(size_t)kind * slots + at] : -1;
        m->ranks[r].done[i] = -1;
    }
    mem_free(where);
}

static void alloc_state(sim *m) {
    const pp_schedule *s = m->s;
    int p = s->stages, ops = 0;
    m->ranks = mem_alloc(MEM_OTHER, (size_t)p * sizeof *m->ranks);
    m->channels = mem_alloc(MEM_OTHER, (size_t)p * p * sizeof *m->channels);
    int *sends = mem_alloc(MEM_OTHER, (size_t)p * p * sizeof *sends);
    for (int r = 0; r < p; r++)
        for (int i = 0; i < s->ranks[r].count; i++) {
            const pp_op *op = &s->ranks[r].ops[i];
            ops++;
            if ((op->kind == PP_SEND_ACT || op->kind == PP_SEND_GRAD) && op->peer >= 0 &&
                     op->peer < p)
                sends[r * p + op->peer]++;
        }
    for (int c = 0; c < p * p; c++)
        if (sends[c])
            m->channels[c].items = mem_alloc(MEM_OTHER, (size_t)sends[c] * sizeof(posted_send));
    mem_free(sends);
    for (int r = 0; r < p; r++) {
        size_t n = (size_t)s->ranks[r].count + 1;
        m->ranks[r].done = mem_alloc(MEM_OTHER, n * sizeof(double));
        m->ranks[r].needs = mem_alloc(MEM_OTHER, n * sizeof(int));
        find_needs(m, r);
    }
    m->res->spans = mem_alloc(MEM_OTHER, ((size_t)ops + 1) * sizeof(pp_span));
    m->res->busy = mem_alloc(MEM_OTHER, (size_t)p * sizeof(double));
    m->res->idle = mem_alloc(MEM_OTHER, (size_t)p * sizeof(double));
}

static void free_state(sim *m) {
    for (int r = 0; r < m->s->stages; r++) {
        mem_free(m->ranks[r].done);
        mem_free(m->ranks[r].needs);
    }
    for (int c = 0; c < m->s->stages * m->s->stages; c++) mem_free(m->channels[c].items);
    mem_free(m->channels);
    mem_free(m->ranks);
}

/* Every op must name a micro-batch and chunk of the schedule, and a message another
 * rank: lists that do not are refused, not simulated. */
static int ops_valid(const pp_schedule *s, char *err, size_t size) {
    for (int r = 0; r < s->stages; r++)
        for (int i = 0; i < s->ranks[r].count; i++) {
            const pp_op *op = &s->ranks[r].ops[i];
            if (op->kind < 0 || op->kind >= PP_NKINDS || op->micro < 0 ||
                op->micro >= s->micro || op->chunk < 0 || op->chunk >= s->chunks) {
                snprintf(err, size, "rank %d op %d: kind %d, micro %d, chunk %d outside the"
                         " schedule (m = %d, v = %d)", r, i, (int)op->kind, op->micro, op->chunk,
                         s->micro, s->chunks);
                return 0;
            }
            int bad_peer = op->peer < 0 || op->peer >= s->stages || op->peer == r;
            if (!pp_op_is_compute(op->kind) && bad_peer) {
                snprintf(err, size, "rank %d op %d (%s) names peer %d: not another rank of %d",
                         r, i, pp_op_kind_name(op->kind), op->peer, s->stages);
                return 0;
            }
        }
    return 1;
}

static void summarise(pp_sim_result *res) {
    double busy = 0, idle = 0;
    for (int r = 0; r < res->stages; r++) {
        res->idle[r] = res->makespan - res->busy[r];
        busy += res->busy[r];
        idle += res->idle[r];
    }
    res->bubble_fraction = busy + idle > 0 ? idle / (busy + idle) : 0;
    res->bubble_over_ideal = busy > 0 ? idle / busy : 0;
}

int pp_simulate(const pp_schedule *s, const pp_sim_options *opts, pp_sim_result *res) {
    memset(res, 0, sizeof *res);
    res->stages = s->stages;
    if (!ops_valid(s, res->error, sizeof res->error)) return 0;
    sim m = {.s = s, .o = opts, .res = res};
    alloc_state(&m);
    int p = s->stages, done = 0, failed = 0;
    while (!done && !failed) {
        int moved = 0;
        done = 1;
        for (int r = 0; r < p && !failed; r++) {
            int step = advance(&m, r);
            failed = step < 0;
            moved |= step > 0;
            if (!rank_finished(&m, r)) done = 0;
        }
        if (!done && !moved && !failed) {
            report_deadlock(&m);
            failed = 1;
        }
    }
    for (int r = 0; r < p; r++)
        for (int i = 0; i < s->ranks[r].count; i++)
            if (m.ranks[r].done[i] > res->makespan) res->makespan = m.ranks[r].done[i];
    summarise(res);
    free_state(&m);
    res->ok = !failed;
    return res->ok;
}

double pp_sim_idle_formula(pp_schedule_kind kind, int stages, int micro, int chunks,
                           const pp_sim_options *o) {
    const double p = stages, F = o->forward, B = o->backward_input, W = o->backward_weight;
    (void)micro;
    switch (kind) {
    case PP_INTERLEAVED: return (p - 1) * (F + o->backward) / chunks;
    case PP_ZB_H1: return (p - 1) * (F + B - W);
    case PP_ZB_V: return (p - 1) * F / 2;
    case PP_DUALPIPE_V: {   /* a chunk holds half a stage */
        const double f = F / 2, b = (B + W) / 2, w = W / 2;
        const double fb = f + b - o->fb_overlap * (f < b ? f : b);
        return (p - 1) * (fb + b - 3 * w);
    }
    default: return (p - 1) * (F + o->backward);
    }
}

void pp_sim_result_free(pp_sim_result *res) {
    mem_free(res->busy);
    mem_free(res->idle);
    mem_free(res->spans);
    memset(res, 0, sizeof *res);
}

double pp_sim_dualpipe_idle_formula(int stages, const pp_sim_options *o) {
    const double f = o->forward, b = o->backward_input + o->backward_weight;
    const double w = o->backward_weight, fb = f + b - o->fb_overlap * (f < b ? f : b);
    return (stages / 2.0 - 1) * (fb + b - 3 * w);
}
