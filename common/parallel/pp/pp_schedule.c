/* Pipeline schedules: each rank's plan of passes, a dry run that times them, and the
 * messages placed between the passes (see pp_schedule.h for the why). */
#include "pp_schedule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "pp_plan.h"

static const pp_schedule_info schedules[PP_NSCHEDULES] = {
    [PP_NAIVE] = {"naive", "pp-naive", "the whole batch forward through every stage, then"
                  " backward", .whole_batch = 1},
    [PP_GPIPE] = {"gpipe", "pp-gpipe", "all micro-batches forward, then all backward"},
    [PP_1F1B] = {"1f1b", "pp-1f1b", "one forward, one backward in turn after a warm-up"},
    [PP_INTERLEAVED] = {"interleaved", "pp-interleaved", "1F1B over v chunks per rank",
                        .takes_virtual = 1},
    [PP_ZB_H1] = {"zb-h1", "pp-zb-h1", "1F1B with the weight gradient (W) filling the"
                  " bubble", .split_backward = 1},
    [PP_ZB_V] = {"zb-v", "pp-zb-v", "two chunks per rank in a V, B and W split",
                 .vshape = 1, .split_backward = 1},
    [PP_DUALPIPE_V] = {"dualpipev", "pp-dualpipev", "a V whose forwards and backwards of"
                       " the two chunks run in pairs (F&B)", .vshape = 1,
                       .split_backward = 1},
};
static const char *const op_names[PP_NKINDS] = {"F", "B", "Bi", "W", "send-act",
                                                "recv-act", "send-grad", "recv-grad"};

const pp_schedule_info *pp_schedule_about(pp_schedule_kind kind) {
    return kind >= 0 && kind < PP_NSCHEDULES ? &schedules[kind] : NULL;
}

const char *pp_schedule_name(pp_schedule_kind kind) {
    return kind >= 0 && kind < PP_NSCHEDULES ? schedules[kind].name : "?";
}

int pp_schedule_from_name(const char *name) {
    for (int k = 0; k < PP_NSCHEDULES; k++)
        if (strcmp(name, schedules[k].name) == 0) return k;
    return -1;
}

void pp_schedule_choices(const char *choices[PP_NSCHEDULES + 2], const char *extra) {
    int n = 0;
    for (int k = 0; k < PP_NSCHEDULES; k++) choices[n++] = schedules[k].name;
    if (extra) choices[n++] = extra;
    choices[n] = NULL;
}

int pp_schedule_micro(pp_schedule_kind kind, int micro) {
    const pp_schedule_info *s = pp_schedule_about(kind);
    return s && s->whole_batch ? 1 : micro;
}

int pp_schedule_chunks(pp_schedule_kind kind, int chunks) {
    const pp_schedule_info *s = pp_schedule_about(kind);
    return s && s->vshape ? 2 : s && s->takes_virtual ? chunks : 1;
}

int pp_schedule_vshape(pp_schedule_kind kind) {
    const pp_schedule_info *s = pp_schedule_about(kind);
    return s ? s->vshape : 0;
}

const char *pp_op_kind_name(pp_op_kind kind) {
    return kind >= 0 && kind < PP_NKINDS ? op_names[kind] : "?";
}

int pp_op_is_compute(pp_op_kind kind) { return kind <= PP_BACKWARD_WEIGHT; }

int pp_stage_of(int vshape, int stages, int rank, int chunk) {
    return vshape && chunk == 1 ? 2 * stages - 1 - rank : chunk * stages + rank;
}

void pp_place_of(int vshape, int stages, int stage, int *rank, int *chunk) {
    *chunk = stage / stages;
    *rank = vshape && *chunk == 1 ? 2 * stages - 1 - stage : stage % stages;
}

int pp_virtual_stage(const pp_schedule *s, int rank, int chunk) {
    return pp_stage_of(pp_schedule_vshape(s->kind), s->stages, rank, chunk);
}

/* ---- what can run ---------------------------------------------------------------- */
int pp_validate(pp_schedule_kind kind, int stages, int micro, int chunks, int layers,
                int batch, char *err, size_t err_size) {
    const char *name = pp_schedule_name(kind);
    if (kind < 0 || kind >= PP_NSCHEDULES)
        snprintf(err, err_size, "unknown schedule %d", (int)kind);
    else if (stages < 1)
        snprintf(err, err_size, "--pp %d: needs at least 1 stage", stages);
    else if (micro < 1)
        snprintf(err, err_size, "--micro %d: needs at least 1 micro-batch", micro);
    else if (chunks < 1)
        snprintf(err, err_size, "--virtual %d: needs at least 1 chunk per rank", chunks);
    else if (stages > layers)
        snprintf(err, err_size, "--pp %d: more stages than the %d layers (each stage needs"
                 " a block: use --pp 1 to %d)", stages, layers, layers);
    else if (batch % micro != 0)
        snprintf(err, err_size, "--micro %d does not divide --batch %d (each micro-batch"
                 " holds batch / micro sequences)", micro, batch);
    else if (schedules[kind].whole_batch && micro != 1)
        snprintf(err, err_size, "--micro %d: the naive pipeline runs the whole batch at"
                 " once (use --micro 1, or gpipe / 1f1b)", micro);
    else if (schedules[kind].vshape && chunks != 2)
        snprintf(err, err_size, "--virtual %d: %s places exactly 2 chunks on each rank, in a V",
                 chunks, name);
    else if (schedules[kind].vshape && 2L * stages > layers)
        snprintf(err, err_size, "--pp %d: %s cuts the model into 2 x %d = %d chunks, more than"
                 " the %d layers (each chunk needs a block: use --pp 1 to %d)", stages, name,
                 stages, 2 * stages, layers, layers / 2);
    else if (!schedules[kind].takes_virtual && !schedules[kind].vshape && chunks != 1)
        snprintf(err, err_size, "--virtual %d: only the interleaved schedule has chunks"
                 " (use --virtual 1 with %s)", chunks, name);
    else if (kind == PP_DUALPIPE_V && micro < 2 * stages)
        snprintf(err, err_size, "--micro %d: dualpipev takes 2 x --pp = %d micro-batches or more"
                 " (DeepSeek's DualPipeV refuses fewer: rank 0 runs 2p - 1 forwards before its"
                 " first backward)", micro, 2 * stages);
    else if (kind == PP_INTERLEAVED && chunks < 2)
        snprintf(err, err_size, "--virtual %d: interleaved 1F1B needs at least 2 chunks per"
                 " rank (with 1 it is 1f1b)", chunks);
    else if (kind == PP_INTERLEAVED && stages < 2)
        snprintf(err, err_size, "--pp %d: interleaving needs at least 2 stages (chunks"
                 " alternate between ranks)", stages);
    else if (kind == PP_INTERLEAVED && (long)chunks * stages > layers)
        snprintf(err, err_size, "--virtual %d x --pp %d = %d chunks, more than the %d layers"
                 " (each chunk needs a block: v x p <= %d)", chunks, stages, chunks * stages,
                 layers, layers);
    else if (kind == PP_INTERLEAVED && micro % stages != 0)
        snprintf(err, err_size, "--micro %d: interleaved 1F1B takes micro-batches in groups"
                 " of --pp %d (use a multiple of %d: %d, %d, ...)", micro, stages, stages,
                 stages, 2 * stages);
    else
        return 1;
    return 0;
}

/* ---- the dry run: unit pass times, free messages, integer clock ------------------- */
typedef struct {
    pp_op op;
    double start, end;
} timed_pass;

typedef struct {
    int p, m, v, stages_total;          /* stages_total = S = p v */
    int vshape;                         /* chunks placed in a V (pp_stage_of) */
    int bidirectional;                  /* DualPipe: a micro-batch runs through one copy */
    int w_cap;                          /* F waits for a W owed past this many held */
    int w_fills_waits;                  /* a W owed runs where the next pass must wait */
    double *forward_start, *forward_end;     /* [m][S], INFINITY until run */
    double *backward_start, *backward_end;   /* B or Bi */
    timed_pass **timed;                 /* [p][passes run] */
    int *ntimed;
} dry_run;

static int slot(const dry_run *d, int micro, int vstage) {
    return micro * d->stages_total + vstage;
}

static double pass_time(pp_op_kind kind) { return kind == PP_BACKWARD ? 2.0 : 1.0; }

void pp_micro_stages(int bidirectional, int stages, int chunks, int micro_count, int micro,
                     int *first, int *last) {
    const int copy = bidirectional && micro >= micro_count / 2;
    *first = copy * stages;
    *last = bidirectional ? *first + stages - 1 : stages * chunks - 1;
}

static void chain_of(const dry_run *d, int micro, int *first, int *last) {
    pp_micro_stages(d->bidirectional, d->p, d->v, d->m, micro, first, last);
}

/* Is the input of this pass (activation or output gradient) there at time t? */
static int input_ready(const dry_run *d, const pass *ps, int rank, double t) {
    int s = pp_stage_of(d->vshape, d->p, rank, ps->chunk), first, last;
    chain_of(d, ps->micro, &first, &last);
    if (ps->kind == PP_FORWARD)
        return s == first || d->forward_end[slot(d, ps->micro, s - 1)] <= t;
    if (s == last) return d->forward_end[slot(d, ps->micro, s)] <= t;
    return d->backward_end[slot(d, ps->micro, s + 1)] <= t;
}

static void run_pass(dry_run *d, int rank, const pass *ps, double t) {
    const pp_op_kind kind = ps->kind;
    const int micro = ps->micro, chunk = ps->chunk;
    timed_pass *tp = &d->timed[rank][d->ntimed[rank]++];
    *tp = (timed_pass){{kind, micro, chunk, -1, ps->fused}, t, t + pass_time(kind)};
    int i = slot(d, micro, pp_stage_of(d->vshape, d->p, rank, chunk));
    if (kind == PP_FORWARD) {
        d->forward_start[i] = tp->start;
        d->forward_end[i] = tp->end;
    } else if (kind != PP_BACKWARD_WEIGHT) {
        d->backward_start[i] = tp->start;
        d->backward_end[i] = tp->end;
    }
}

/* One rank's state in the dry run. zb-h1 keeps the W passes it owes in a queue. */
typedef struct {
    rank_plan plan;
    int next;                  /* next pass of the plan */
    double busy_until;
    int in_flight;             /* forwards whose last backward has not run */
    pass *owed_w;              /* B done, W not yet: a FIFO */
    int owed_head, owed_tail;
} dry_rank;

/* The oldest W owed, at t. */
static void run_owed_w(dry_run *d, dry_rank *dr, int r, double t) {
    run_pass(d, r, &dr->owed_w[dr->owed_head++], t);
    dr->in_flight--;
}

/* The plan's next pass at t; a B (input) leaves its W owed. */
static void run_planned(dry_run *d, dry_rank *dr, int r, double t) {
    const pass *ps = &dr->plan.passes[dr->next++];
    run_pass(d, r, ps, t);
    if (ps->kind == PP_FORWARD) dr->in_flight++;
    else if (ps->kind == PP_BACKWARD) dr->in_flight--;
    else dr->owed_w[dr->owed_tail++] = (pass){PP_BACKWARD_WEIGHT, ps->micro, ps->chunk, 0};
}

/* What rank r does when it is free at time t; returns 0 when it stays idle. A W in
 * the plan (zb-v's groups, DualPipeV) runs the oldest W owed, or nothing when a wait
 * ran it; an F&B pair starts when both inputs are there, its backward right after. */
static int dry_step(dry_run *d, dry_rank *dr, int r, double t) {
    int owed = dr->owed_tail - dr->owed_head;
    while (dr->next < dr->plan.count && dr->plan.passes[dr->next].kind == PP_BACKWARD_WEIGHT &&
           owed == 0)
        dr->next++;
    const pass *ps = dr->next < dr->plan.count ? &dr->plan.passes[dr->next] : NULL;
    int ready = ps && input_ready(d, ps, r, t) && (!ps->fused || input_ready(d, ps + 1, r, t));
    int must_free = ps && ps->kind == PP_FORWARD && dr->in_flight >= d->w_cap && owed > 0;
    if (ps && ps->kind == PP_BACKWARD_WEIGHT) {
        run_owed_w(d, dr, r, t);
        dr->next++;
    } else if (ready && !must_free) {
        run_planned(d, dr, r, t);
        if (ps->fused) {   /* the pair's outputs leave together, at its end */
            run_planned(d, dr, r, t + pass_time(ps->kind));
            d->forward_end[slot(d, ps->micro, pp_stage_of(d->vshape, d->p, r, ps->chunk))] =
                d->timed[r][d->ntimed[r] - 1].end;
        }
    } else if (owed > 0 && d->w_fills_waits) {   /* zb-h1, zb-v: a W fills the wait */
        run_owed_w(d, dr, r, t);
    } else {
        return 0;
    }
    dr->busy_until = d->timed[r][d->ntimed[r] - 1].end;
    return 1;
}

static double *filled(size_t n, double value) {
    double *a = mem_alloc(MEM_OTHER, n * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = value;
    return a;
}

static void dry_run_init(dry_run *d, pp_schedule_kind kind, int p, int m, int v) {
    size_t n = (size_t)m * p * v;
    /* DualPipeV's plan says where every W goes; the others keep 1F1B's peak, p stages */
    const int planned = kind == PP_DUALPIPE_V;
    *d = (dry_run){.p = p, .m = m, .v = v, .stages_total = p * v,
                   .vshape = pp_schedule_vshape(kind), .w_cap = planned ? m * v : p * v,
                   .w_fills_waits = !planned};
    d->forward_start = filled(n, INFINITY);
    d->forward_end = filled(n, INFINITY);
    d->backward_start = filled(n, INFINITY);
    d->backward_end = filled(n, INFINITY);
    d->timed = mem_alloc(MEM_OTHER, (size_t)p * sizeof *d->timed);
    d->ntimed = mem_alloc(MEM_OTHER, (size_t)p * sizeof *d->ntimed);
    for (int r = 0; r < p; r++)
        d->timed[r] = mem_alloc(MEM_OTHER, 3 * (size_t)m * v * sizeof **d->timed);
}

static void dry_run_free(dry_run *d) {
    for (int r = 0; r < d->p; r++) mem_free(d->timed[r]);
    mem_free(d->timed);
    mem_free(d->ntimed);
    mem_free(d->forward_start);
    mem_free(d->forward_end);
    mem_free(d->backward_start);
    mem_free(d->backward_end);
}

/* Times every pass of every rank. Pass times are whole numbers, so the clock ticks by
 * one; ranks free at the same tick decide in rank order, which is safe because a pass
 * started at this tick ends later. */
static void dry_run_execute(dry_run *d, pp_schedule_kind kind) {
    int p = d->p, m = d->m, v = d->v;
    dry_rank *ranks = mem_alloc(MEM_OTHER, (size_t)p * sizeof *ranks);
    for (int r = 0; r < p; r++) {
        ranks[r].plan.passes = mem_alloc(MEM_OTHER, (size_t)pp_plan_room(m, v) * sizeof(pass));
        ranks[r].owed_w = mem_alloc(MEM_OTHER, (size_t)m * v * sizeof(pass));
        if (d->bidirectional) pp_plan_dualpipe_rank(&ranks[r].plan, p, r, m);
        else pp_plan_rank(&ranks[r].plan, kind, p, r, m, v);
    }
    int active = p;
    double limit = 4.0 * (3.0 * m * v + 2.0 * p * v) + 16;   /* far past any makespan */
    for (double t = 0; active > 0; t += 1) {
        if (t > limit) {
            fprintf(stderr, "pp_schedule: internal error: the dry run of %s did not finish\n",
                    pp_schedule_name(kind));
            abort();
        }
        active = 0;
        for (int r = 0; r < p; r++) {
            dry_rank *dr = &ranks[r];
            if (dr->busy_until <= t) dry_step(d, dr, r, t);
            if (dr->next < dr->plan.count || dr->owed_tail > dr->owed_head ||
                dr->busy_until > t)
                active++;
        }
    }
    for (int r = 0; r < p; r++) {
        mem_free(ranks[r].plan.passes);
        mem_free(ranks[r].owed_w);
    }
    mem_free(ranks);
}

/* ---- messages placed between the passes ------------------------------------------ */
typedef struct {
    pp_op op;
    double time;         /* on the global clock */
    int order;           /* among equal times: smaller first */
    long long message;   /* among equal (time, order): the same on both ranks */
} keyed_op;

static int keyed_cmp(const void *a, const void *b) {
    const keyed_op *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    if (x->order != y->order) return x->order - y->order;
    return (x->message > y->message) - (x->message < y->message);
}

typedef struct {
    keyed_op *ops;
    int count;
} keyed_list;

/* The message a pass sends: activation to stage s+1 after F, gradient to s-1 after
 * B / Bi (W sends nothing). Returns 0 when there is none. */
static int outgoing(const dry_run *d, const timed_pass *tp, int rank, int *to_stage,
                    int *is_grad) {
    int s = pp_stage_of(d->vshape, d->p, rank, tp->op.chunk), first, last;
    chain_of(d, tp->op.micro, &first, &last);
    if (tp->op.kind == PP_FORWARD && s < last) {
        *to_stage = s + 1;
        *is_grad = 0;
        return 1;
    }
    if ((tp->op.kind == PP_BACKWARD || tp->op.kind == PP_BACKWARD_INPUT) && s > first) {
        *to_stage = s - 1;
        *is_grad = 1;
        return 1;
    }
    return 0;
}

/* The end of the pass rank is in the middle of at time t, or -1 when it is between
 * passes (or idle) then. Its passes are in time order. */
static double busy_until_at(const dry_run *d, int rank, double t) {
    const timed_pass *tp = d->timed[rank];
    int lo = 0, hi = d->ntimed[rank];   /* first pass starting at or after t */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (tp[mid].start < t) lo = mid + 1;
        else hi = mid;
    }
    return lo > 0 && tp[lo - 1].end > t ? tp[lo - 1].end : -1;
}

/* When a rendezvous message can pass without holding up the dry run's timing: the
 * first moment from the end of its producer on which both ranks are between passes.
 * Failing that (the sender is still busy when the receiver needs it), the moment the
 * receiver needs it: later ranks then wait, but the order stays deadlock-free. */
static double meeting_time(const dry_run *d, int sender, int receiver, double produced,
                           double needed) {
    double t = produced;
    while (t < needed) {
        double a = busy_until_at(d, sender, t), b = busy_until_at(d, receiver, t);
        if (a < 0 && b < 0) return t;
        t = a > b ? a : b;
    }
    return needed;
}

static void place_message(const dry_run *d, keyed_list *lists, const timed_pass *tp, int rank,
                          pp_comm_order order) {
    int to, grad, peer, to_chunk;
    if (!outgoing(d, tp, rank, &to, &grad)) return;
    pp_place_of(d->vshape, d->p, to, &peer, &to_chunk);
    if (peer == rank) return;   /* a V's turn: the next chunk is on this rank, in memory */
    int from_stage = pp_stage_of(d->vshape, d->p, rank, tp->op.chunk), micro = tp->op.micro;
    double consumer_start = grad ? d->backward_start[slot(d, micro, to)]
                                 : d->forward_start[slot(d, micro, to)];
    double when = meeting_time(d, rank, peer, tp->end, consumer_start);
    long long id = ((long long)micro * d->stages_total + from_stage) * 2 + grad;
    keyed_op send = {{grad ? PP_SEND_GRAD : PP_SEND_ACT, micro, tp->op.chunk, peer, 0}, when, 0,
                     id};
    keyed_op recv = {{grad ? PP_RECV_GRAD : PP_RECV_ACT, micro, to_chunk, rank, 0}, when, 0, id};
    if (order == PP_COMM_EAGER) {   /* send right after, receive right before */
        send.time = tp->end;
        recv.time = consumer_start;
        recv.order = 1;               /* sends first */
    }
    lists[rank].ops[lists[rank].count++] = send;
    lists[peer].ops[lists[peer].count++] = recv;
}

static void build_op_lists(pp_schedule *s, const dry_run *d) {
    int p = s->stages, compute_order = s->order == PP_COMM_EAGER ? 2 : 1;
    keyed_list *lists = mem_alloc(MEM_OTHER, (size_t)p * sizeof *lists);
    for (int r = 0; r < p; r++)   /* each pass: itself, at most one send, one receive */
        lists[r].ops = mem_alloc(MEM_OTHER, 3 * (size_t)d->ntimed[r] * sizeof(keyed_op));
    for (int r = 0; r < p; r++)
        for (int i = 0; i < d->ntimed[r]; i++) {
            const timed_pass *tp = &d->timed[r][i];
            lists[r].ops[lists[r].count++] = (keyed_op){tp->op, tp->start, compute_order, 0};
            place_message(d, lists, tp, r, s->order);
        }
    for (int r = 0; r < p; r++) {
        qsort(lists[r].ops, (size_t)lists[r].count, sizeof(keyed_op), keyed_cmp);
        pp_rank_ops *out = &s->ranks[r];
        out->ops = mem_alloc(MEM_OTHER, ((size_t)lists[r].count + 1) * sizeof(pp_op));
        out->count = lists[r].count;
        for (int i = 0; i < out->count; i++) out->ops[i] = lists[r].ops[i].op;
        mem_free(lists[r].ops);
    }
    mem_free(lists);
}

/* The lists of kind (DualPipe: bidirectional, on PP_DUALPIPE_V's placement and plans). */
static pp_schedule *make_lists(pp_schedule_kind kind, int bidirectional, int stages, int micro,
                               int chunks, pp_comm_order order) {
    pp_schedule *s = mem_alloc(MEM_OTHER, sizeof *s);
    *s = (pp_schedule){.kind = kind, .stages = stages, .micro = micro, .chunks = chunks,
                       .order = order, .bidirectional = bidirectional};
    s->ranks = mem_alloc(MEM_OTHER, (size_t)stages * sizeof *s->ranks);
    dry_run d;
    dry_run_init(&d, kind, stages, micro, chunks);
    d.bidirectional = bidirectional;
    dry_run_execute(&d, kind);
    build_op_lists(s, &d);
    dry_run_free(&d);
    return s;
}

pp_schedule *pp_schedule_make(pp_schedule_kind kind, int stages, int micro, int chunks,
                              pp_comm_order order) {
    char err[256];
    if (!pp_validate(kind, stages, micro, chunks, stages * chunks, micro, err, sizeof err)) {
        fprintf(stderr, "pp_schedule_make: %s\n", err);
        return NULL;
    }
    return make_lists(kind, 0, stages, micro, chunks, order);
}

int pp_dualpipe_validate(int stages, int micro, int layers, int batch, char *err,
                         size_t err_size) {
    if (stages < 2 || stages % 2)
        snprintf(err, err_size, "--pp %d: dualpipe needs an even number of ranks (its two"
                 " directions meet in the middle two; DeepSeek's DualPipe asserts it)", stages);
    else if (micro < 2 * stages || micro % 2)
        snprintf(err, err_size, "--micro %d: dualpipe takes an even number of micro-batches,"
                 " 2 x --pp = %d or more (half from each end; DeepSeek's DualPipe asserts it)",
                 micro, 2 * stages);
    else
        return pp_validate(PP_1F1B, stages, micro, 1, layers, batch, err, err_size);
    return 0;
}

pp_schedule *pp_dualpipe_make(int stages, int micro, pp_comm_order order) {
    char err[256];
    if (!pp_dualpipe_validate(stages, micro, stages, micro, err, sizeof err)) {
        fprintf(stderr, "pp_dualpipe_make: %s\n", err);
        return NULL;
    }
    return make_lists(PP_DUALPIPE_V, 1, stages, micro, 2, order);
}

void pp_schedule_free(pp_schedule *s) {
    if (!s) return;
    for (int r = 0; r < s->stages; r++) mem_free(s->ranks[r].ops);
    mem_free(s->ranks);
    mem_free(s);
}

/* ---- measures of a schedule -------------------------------------------------------- */
int pp_peak_in_flight(const pp_schedule *s, int rank) {
    int held = 0, peak = 0;
    const pp_rank_ops *ops = &s->ranks[rank];
    for (int i = 0; i < ops->count; i++) {
        pp_op_kind k = ops->ops[i].kind;
        if (k == PP_FORWARD && ++held > peak) peak = held;
        if (k == PP_BACKWARD || k == PP_BACKWARD_WEIGHT) held--;
    }
    return peak;
}

pp_bubble pp_bubble_formula(pp_schedule_kind kind, int stages, int micro, int chunks) {
    double p = stages, work;   /* work: a rank's busy time in units of one F + B */
    switch (kind) {
    case PP_INTERLEAVED: work = (double)chunks * micro; break;   /* bubble shrinks v-fold */
    case PP_ZB_H1: work = 3.0 * micro; break;   /* idle (p-1)(F+B-W) = p-1 of busy 3m */
    case PP_ZB_V:   /* no idle but the V's fill, p-1 chunk forwards: (p-1)/2 of busy 3m */
        work = 6.0 * micro;
        break;
    case PP_DUALPIPE_V:   /* (p-1)(F&B + B - 3W), chunks' F 1/2, B 1, W 1/2, F&B = F + B */
        work = 3.0 * micro;
        break;
    default: work = micro; break;
    }
    return (pp_bubble){(p - 1) / (work + p - 1), (p - 1) / work};
}
