/* Pipeline schedules, the simulator and the pictures, without a model.
 *
 * - Every schedule's op lists, for p = 1..5, m = 1..8 and 12, v = 1..3, are checked by
 *   a reference written here: one forward and one backward (zb-h1: B and W) per
 *   micro-batch and chunk, in that order; each pass after the receive of its input and
 *   before the send of its output; nothing sent before the first virtual stage or after
 *   the last; between any two ranks the sends and receives pair up in order.
 * - Peak micro-batches in flight: GPipe m, 1F1B min(p - r, m), zb-h1 <= p; interleaved
 *   2(p-r-1) + (v-1)p warm-up forwards and one more (Narayanan et al. 2021).
 * - Makespans at p 4, m 8 computed by hand (a chunk's pass is 1/v of a stage's).
 * - The simulated bubble against the formula (tolerance 1e-9: with unit pass times and
 *   NCCL-like streams the schedules are exact), and against the formula for one
 *   micro-batch more (negative control: the check can tell them apart).
 * - Deadlock: the eager send/recv order of 1F1B, with unbuffered sends, is reported
 *   naming the ranks and operations; the same lists complete when sends are buffered.
 * - p = 64, m = 3072 makes and simulates in under a second of CPU time each.
 * - The lists on real ranks (threads, rendezvous sends): every message arrives where
 *   the list expects it; the eager lists time out with the report of both sends.
 * - The text picture of 1F1B against the expected rows; the SVG's boxes and axis. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "check_run.h"
#include "comm.h"
#include "pp_draw.h"
#include "pp_sim.h"

static const double bubble_tolerance = 1e-9;

/* CPU seconds of this process: the machine is shared, so wall time would measure the
 * neighbours too. */
static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every (kind, p, m, v) that pp_validate accepts for a model of 16 layers. */
typedef struct {
    pp_schedule_kind kind;
    int p, m, v;
} config;

static int all_configs(config *out, int cap) {
    static const int micros[] = {1, 2, 3, 4, 5, 6, 7, 8, 12};
    int n = 0;
    char err[256];
    for (int k = 0; k < PP_NSCHEDULES; k++)
        for (int p = 1; p <= 5; p++)
            for (size_t i = 0; i < sizeof micros / sizeof *micros; i++)
                for (int v = 1; v <= 3; v++)
                    if (pp_validate(k, p, micros[i], v, 16, micros[i], err, sizeof err) && n < cap)
                        out[n++] = (config){k, p, micros[i], v};
    return n;
}

static pp_schedule *make_config(const config *c) {
    return pp_schedule_make(c->kind, c->p, c->m, c->v, PP_COMM_ORDERED);
}

/* ---- the reference check of an op list --------------------------------------------- */
static int is_send_kind(pp_op_kind k) { return k == PP_SEND_ACT || k == PP_SEND_GRAD; }
static int is_recv_kind(pp_op_kind k) { return k == PP_RECV_ACT || k == PP_RECV_GRAD; }

/* Position of the op (kind, micro, chunk) in rank r's list; -1 if absent, -2 if twice. */
static int find_op(const pp_schedule *s, int r, pp_op_kind kind, int micro, int chunk) {
    int at = -1;
    for (int i = 0; i < s->ranks[r].count; i++) {
        const pp_op *op = &s->ranks[r].ops[i];
        if (op->kind == kind && op->micro == micro && op->chunk == chunk) at = at == -1 ? i : -2;
    }
    return at;
}

/* The rank of virtual stage k (interleaved, or in a V). */
static int rank_of(const pp_schedule *s, int k) {
    int r, c;
    pp_place_of(pp_schedule_vshape(s->kind), s->stages, k, &r, &c);
    return r;
}

/* Stage k's neighbour k + step is on another rank (a V's turn is no message). */
static int remote(const pp_schedule *s, int k, int step) {
    const int to = k + step;
    return to >= 0 && to < s->stages * s->chunks && rank_of(s, to) != rank_of(s, k);
}

/* One (micro, virtual stage) pass on its rank: F, backward, messages, in order. */
static int check_pass(const pp_schedule *s, int micro, int stage, char *err, size_t size) {
    int p = s->stages, r = rank_of(s, stage), c, unused;
    pp_place_of(pp_schedule_vshape(s->kind), p, stage, &unused, &c);
    int f = find_op(s, r, PP_FORWARD, micro, c);
    int split = find_op(s, r, PP_BACKWARD_INPUT, micro, c) != -1;   /* B and W, or one B */
    int b = find_op(s, r, split ? PP_BACKWARD_INPUT : PP_BACKWARD, micro, c);
    int w = split ? find_op(s, r, PP_BACKWARD_WEIGHT, micro, c) : b;
    int recv_act = find_op(s, r, PP_RECV_ACT, micro, c);
    int send_act = find_op(s, r, PP_SEND_ACT, micro, c);
    int recv_grad = find_op(s, r, PP_RECV_GRAD, micro, c);
    int send_grad = find_op(s, r, PP_SEND_GRAD, micro, c);
    const char *why = NULL;
    if (f < 0 || b < 0 || w < 0) why = "a pass missing or repeated";
    else if (!(f < b && b <= w)) why = "backward before forward (or W before B)";
    else if (remote(s, stage, -1) == (recv_act == -1) || remote(s, stage, 1) == (send_act == -1))
        why = "activation message missing, repeated or beyond the pipeline's ends";
    else if (remote(s, stage, 1) == (recv_grad == -1) || remote(s, stage, -1) == (send_grad == -1))
        why = "gradient message missing, repeated or beyond the pipeline's ends";
    else if ((recv_act >= 0 && recv_act > f) || (send_act >= 0 && send_act < f) ||
             (recv_grad >= 0 && recv_grad > b) || (send_grad >= 0 && send_grad < b))
        why = "a message on the wrong side of its pass";
    if (!why) return 1;
    snprintf(err, size, "%s p=%d m=%d v=%d: micro %d, virtual stage %d (rank %d chunk %d): %s",
             pp_schedule_name(s->kind), p, s->micro, s->chunks, micro, stage, r, c, why);
    return 0;
}

/* Between ranks a and b the k-th send from a is the k-th receive at b, of the same
 * message (NCCL pairs them in order). */
static int check_pairing(const pp_schedule *s, int a, int b, char *err, size_t size) {
    const pp_rank_ops *from = &s->ranks[a], *to = &s->ranks[b];
    int i = 0, j = 0, p = s->stages;
    for (;;) {
        while (i < from->count && !(is_send_kind(from->ops[i].kind) && from->ops[i].peer == b)) i++;
        while (j < to->count && !(is_recv_kind(to->ops[j].kind) && to->ops[j].peer == a)) j++;
        if (i == from->count && j == to->count) return 1;
        const pp_op *x = i < from->count ? &from->ops[i] : NULL;
        const pp_op *y = j < to->count ? &to->ops[j] : NULL;
        int sx = x ? pp_virtual_stage(s, a, x->chunk) : 0;
        int sy = y ? pp_virtual_stage(s, b, y->chunk) : 0;
        int same = x && y && x->micro == y->micro &&
                   ((x->kind == PP_SEND_ACT && y->kind == PP_RECV_ACT && sy == sx + 1) ||
                    (x->kind == PP_SEND_GRAD && y->kind == PP_RECV_GRAD && sy == sx - 1));
        if (!same) {
            snprintf(err, size, "%s p=%d m=%d v=%d: rank %d -> %d: send op %d and receive op %d"
                     " do not pair", pp_schedule_name(s->kind), p, s->micro, s->chunks, a, b, i, j);
            return 0;
        }
        i++;
        j++;
    }
}

static int check_well_formed(const pp_schedule *s, char *err, size_t size) {
    int p = s->stages, expected_ops = 0;
    for (int stage = 0; stage < p * s->chunks; stage++)
        for (int micro = 0; micro < s->micro; micro++) {
            if (!check_pass(s, micro, stage, err, size)) return 0;
            int r = rank_of(s, stage), c, split;
            pp_place_of(pp_schedule_vshape(s->kind), p, stage, &r, &c);
            split = find_op(s, r, PP_BACKWARD_INPUT, micro, c) != -1;
            int passes = split ? 3 : 2;   /* F, B (or Bi and W) */
            expected_ops += passes + remote(s, stage, -1) * 2 + remote(s, stage, 1) * 2;
        }
    int ops = 0;
    for (int r = 0; r < p; r++) ops += s->ranks[r].count;
    if (ops != expected_ops) {
        snprintf(err, size, "%s p=%d m=%d v=%d: %d ops, expected %d", pp_schedule_name(s->kind),
                 p, s->micro, s->chunks, ops, expected_ops);
        return 0;
    }
    for (int a = 0; a < p; a++)
        for (int b = 0; b < p; b++)
            if (a != b && !check_pairing(s, a, b, err, size)) return 0;
    return 1;
}

/* GPipe, p 2, m 3, with rank 1's receives of micro-batches 0 and 1 swapped. */
static pp_schedule *gpipe_with_receives_swapped(void) {
    pp_schedule *s = pp_schedule_make(PP_GPIPE, 2, 3, 1, PP_COMM_ORDERED);
    int x = find_op(s, 1, PP_RECV_ACT, 0, 0), y = find_op(s, 1, PP_RECV_ACT, 1, 0);
    pp_op first = s->ranks[1].ops[x];
    s->ranks[1].ops[x] = s->ranks[1].ops[y];
    s->ranks[1].ops[y] = first;
    return s;
}

START_TEST(op_lists_are_well_formed) {
    config cases[1024];
    int n = all_configs(cases, 1024), failures = 0;
    char err[256];
    for (int i = 0; i < n; i++) {
        pp_schedule *s = make_config(&cases[i]);
        ck_assert_ptr_nonnull(s);
        if (!check_well_formed(s, err, sizeof err) && failures++ < 5) printf("  %s\n", err);
        pp_schedule_free(s);
    }
    printf("well-formed op lists: %d of %d schedules (p 1-5, m 1-8 and 12, v 1-3)\n",
           n - failures, n);
    ck_assert_int_eq(failures, 0);

    /* negative control: a dropped activation gradient, then two swapped receives */
    pp_schedule *s = pp_schedule_make(PP_1F1B, 3, 4, 1, PP_COMM_ORDERED);
    pp_rank_ops *r1 = &s->ranks[1];
    int at = find_op(s, 1, PP_SEND_GRAD, 2, 0);
    memmove(&r1->ops[at], &r1->ops[at + 1], (size_t)(r1->count - at - 1) * sizeof(pp_op));
    r1->count--;
    ck_assert(!check_well_formed(s, err, sizeof err));
    printf("negative control, a dropped send-grad: %s\n", err);
    pp_schedule_free(s);
    s = gpipe_with_receives_swapped();
    ck_assert(!check_well_formed(s, err, sizeof err));
    printf("negative control, two receives swapped: %s\n", err);
    pp_schedule_free(s);
}
END_TEST

/* ---- micro-batches in flight --------------------------------------------------------- */
/* Narayanan et al. 2021: rank r runs 2(p-r-1) + (v-1)p warm-up chunk forwards (all v m
 * when m = p), then one forward and one backward in turn: so it holds one more at most. */
static void check_interleaved_warmup(const pp_schedule *s, int r) {
    const int p = s->stages, total = s->micro * s->chunks;
    int warmup = 2 * (p - r - 1) + (s->chunks - 1) * p, before_first_backward = 0;
    if (warmup > total || s->micro == p) warmup = total;
    const int held = warmup < total ? warmup + 1 : total;
    for (int i = 0; s->ranks[r].ops[i].kind != PP_BACKWARD; i++)
        before_first_backward += s->ranks[r].ops[i].kind == PP_FORWARD;
    ck_assert_msg(before_first_backward == held && pp_peak_in_flight(s, r) == held,
                  "interleaved p %d m %d v %d rank %d: %d forwards before the first backward,"
                  " %d in flight; want warm-up %d + 1", p, s->micro, s->chunks, r,
                  before_first_backward, pp_peak_in_flight(s, r), warmup);
}

START_TEST(peak_in_flight) {
    config cases[1024];
    int n = all_configs(cases, 1024), checked = 0;
    for (int i = 0; i < n; i++) {
        const config *c = &cases[i];
        if (c->kind == PP_NAIVE) continue;
        pp_schedule *s = make_config(c);
        for (int r = 0; r < c->p; r++) {
            int peak = pp_peak_in_flight(s, r), bound = c->p - r < c->m ? c->p - r : c->m;
            if (c->kind == PP_INTERLEAVED) check_interleaved_warmup(s, r);
            if (c->kind == PP_GPIPE) ck_assert_int_eq(peak, c->m);
            if (c->kind == PP_1F1B) ck_assert_int_eq(peak, bound);
            if (c->kind == PP_ZB_H1) ck_assert_int_le(peak, c->p);   /* 1F1B's peak, rank 0's */
            checked++;
        }
        pp_schedule_free(s);
    }
    pp_schedule *s = pp_schedule_make(PP_1F1B, 4, 8, 1, PP_COMM_ORDERED);
    pp_schedule *g = pp_schedule_make(PP_GPIPE, 4, 8, 1, PP_COMM_ORDERED);
    pp_schedule *z = pp_schedule_make(PP_ZB_H1, 4, 8, 1, PP_COMM_ORDERED);
    printf("peak in flight, p 4 m 8: gpipe %d %d %d %d, 1f1b %d %d %d %d (p - r), zb-h1 %d %d %d %d"
           " (<= p); %d rank checks\n", pp_peak_in_flight(g, 0), pp_peak_in_flight(g, 1),
           pp_peak_in_flight(g, 2), pp_peak_in_flight(g, 3), pp_peak_in_flight(s, 0),
           pp_peak_in_flight(s, 1), pp_peak_in_flight(s, 2), pp_peak_in_flight(s, 3),
           pp_peak_in_flight(z, 0), pp_peak_in_flight(z, 1), pp_peak_in_flight(z, 2),
           pp_peak_in_flight(z, 3), checked);
    ck_assert_int_eq(pp_peak_in_flight(z, 0), 4);
    pp_schedule_free(s);
    pp_schedule_free(g);
    pp_schedule_free(z);
}
END_TEST

/* ---- the simulated bubble against the formula ---------------------------------------- */
static pp_sim_result simulate(const pp_schedule *s, int sequential, int buffered) {
    pp_sim_options o = pp_sim_options_default();
    o.sequential = sequential;
    o.buffered = buffered;
    pp_sim_result res;
    ck_assert_msg(pp_simulate(s, &o, &res), "%s p=%d m=%d v=%d: %s", pp_schedule_name(s->kind),
                  s->stages, s->micro, s->chunks, res.error);
    return res;
}

/* Largest differences over the schedules, against the formula and between ways of
 * running the same lists. */
typedef struct {
    int checked;
    double fraction, over_ideal;       /* |simulated - formula| */
    double closest_wrong;              /* |simulated - formula for m + 1|: the control */
    double buffered;                   /* |makespan buffered - unbuffered| */
    double sequential_fixed;           /* |makespan sequential - streams|, not interleaved */
    double sequential_interleaved;     /* bubble sequential - streams, interleaved */
} bubble_gaps;

static void compare_runs(const config *c, const pp_sim_result *res, const pp_sim_result *buf,
                         const pp_sim_result *seq, bubble_gaps *g) {
    ck_assert(seq->makespan >= res->makespan - bubble_tolerance);
    g->buffered = fmax(g->buffered, fabs(buf->makespan - res->makespan));
    if (c->kind == PP_INTERLEAVED)
        g->sequential_interleaved =
            fmax(g->sequential_interleaved, seq->bubble_fraction - res->bubble_fraction);
    else
        g->sequential_fixed = fmax(g->sequential_fixed, fabs(seq->makespan - res->makespan));
    /* the zero-bubble formulas assume m >= p (zb-v below that: the V cannot fill) */
    if ((c->kind == PP_ZB_H1 || c->kind == PP_ZB_V) && c->m < c->p) return;
    pp_bubble f = pp_bubble_formula(c->kind, c->p, c->m, c->v);
    pp_bubble wrong = pp_bubble_formula(c->kind, c->p, c->m + 1, c->v);
    g->fraction = fmax(g->fraction, fabs(res->bubble_fraction - f.fraction));
    g->over_ideal = fmax(g->over_ideal, fabs(res->bubble_over_ideal - f.over_ideal));
    if (c->p > 1)
        g->closest_wrong = fmin(g->closest_wrong, fabs(res->bubble_fraction - wrong.fraction));
    g->checked++;
}

START_TEST(bubble_matches_formula) {
    config cases[1024];
    int n = all_configs(cases, 1024);
    bubble_gaps g = {.closest_wrong = INFINITY};
    for (int i = 0; i < n; i++) {   /* every list runs, unbuffered, both ways */
        pp_schedule *s = make_config(&cases[i]);
        pp_sim_result res = simulate(s, 0, 0), buf = simulate(s, 0, 1), seq = simulate(s, 1, 0);
        compare_runs(&cases[i], &res, &buf, &seq, &g);
        pp_sim_result_free(&res);
        pp_sim_result_free(&buf);
        pp_sim_result_free(&seq);
        pp_schedule_free(s);
    }
    printf("bubble vs formula, %d schedules (of %d simulated): largest |fraction - formula| %.2e,"
           " |over ideal - formula| %.2e (tolerance %.0e); negative control, formula for m + 1:"
           " closest %.3e\n", g.checked, n, g.fraction, g.over_ideal, bubble_tolerance,
           g.closest_wrong);
    printf("  buffered sends change the makespan by at most %.2e; one operation at a time (CPU"
           " ranks) changes gpipe/1f1b/zb-h1 by %.2e and adds up to %.4f to interleaved's bubble\n",
           g.buffered, g.sequential_fixed, g.sequential_interleaved);
    ck_assert(g.fraction <= bubble_tolerance && g.over_ideal <= bubble_tolerance);
    ck_assert(g.closest_wrong > 100 * bubble_tolerance);
    ck_assert(g.buffered <= bubble_tolerance);
    ck_assert(g.sequential_fixed <= bubble_tolerance);
}
END_TEST

/* The case: p = 4, m = 8, forward 1, backward 2: measured next to formula. */
START_TEST(bubble_p4_m8) {
    const pp_schedule_kind kinds[] = {PP_GPIPE, PP_1F1B, PP_INTERLEAVED, PP_ZB_H1};
    const double makespans[] = {33, 33, 28.5, 27};
    double one_f1b = 0, zb = 0;
    for (int k = 0; k < 4; k++) {
        int v = kinds[k] == PP_INTERLEAVED ? 2 : 1;
        pp_schedule *s = pp_schedule_make(kinds[k], 4, 8, v, PP_COMM_ORDERED);
        pp_sim_result res = simulate(s, 0, 0);
        pp_bubble f = pp_bubble_formula(kinds[k], 4, 8, s->chunks);
        printf("p 4 m 8 %-12s bubble %.4f (formula %.4f), over ideal %.4f (formula %.4f),"
               " makespan %.1f\n",
               pp_schedule_name(kinds[k]), res.bubble_fraction, f.fraction, res.bubble_over_ideal,
               f.over_ideal, res.makespan);
        ck_assert(fabs(res.bubble_fraction - f.fraction) <= bubble_tolerance);
        /* by hand: (m + p - 1)(F + B); interleaved (v m + p - 1)(F + B)/v; zb-h1 3m + p - 1 */
        ck_assert_msg(fabs(res.makespan - makespans[k]) <= bubble_tolerance, "makespan %g, not"
                      " %g", res.makespan, makespans[k]);
        if (kinds[k] == PP_1F1B) one_f1b = res.makespan - 24;   /* idle per rank */
        if (kinds[k] == PP_ZB_H1) zb = res.makespan - 24;
        pp_sim_result_free(&res);
        pp_schedule_free(s);
    }
    printf("zb-h1 idles %.1f per rank, 1f1b %.1f: %.3f of it\n", zb, one_f1b, zb / one_f1b);
    ck_assert(fabs(zb / one_f1b - 1.0 / 3.0) < 1e-9);
}
END_TEST

/* ---- deadlock: the eager order under unbuffered sends ---------------------------------- */
START_TEST(eager_order_deadlocks) {
    pp_schedule *s = pp_schedule_make(PP_1F1B, 2, 4, 1, PP_COMM_EAGER);
    for (int sequential = 0; sequential < 2; sequential++) {
        pp_sim_options o = pp_sim_options_default();
        o.sequential = sequential;
        pp_sim_result res;
        double t0 = now_seconds();
        int ok = pp_simulate(s, &o, &res);
        printf("eager 1f1b p 2 m 4, unbuffered, %s: ok %d after %.1e s: %s\n",
               sequential ? "sequential" : "streams", ok, now_seconds() - t0, res.error);
        ck_assert(!ok);
        const char *expect[] = {"deadlock", "rank 0 waits in send-act(micro 1, chunk 0) to rank 1",
                                "rank 1 waits in send-grad(micro 0, chunk 0) to rank 0"};
        for (int i = 0; i < 3; i++)
            ck_assert_msg(strstr(res.error, expect[i]), "the report lacks \"%s\"", expect[i]);
        pp_sim_result_free(&res);
    }
    /* positive control: the same lists with buffered sends (the threads default) run */
    pp_sim_result res = simulate(s, 0, 1);
    pp_bubble f = pp_bubble_formula(PP_1F1B, 2, 4, 1);
    printf("the same lists, buffered sends: bubble %.4f (formula %.4f)\n", res.bubble_fraction,
           f.fraction);
    ck_assert(fabs(res.bubble_fraction - f.fraction) <= bubble_tolerance);
    pp_sim_result_free(&res);
    pp_schedule_free(s);

    /* every schedule that sends both ways deadlocks eagerly, naming every stuck rank */
    s = pp_schedule_make(PP_INTERLEAVED, 4, 8, 2, PP_COMM_EAGER);
    pp_sim_options o = pp_sim_options_default();
    int ok = pp_simulate(s, &o, &res);
    printf("eager interleaved p 4 m 8 v 2: ok %d: %.300s\n", ok, res.error);
    ck_assert(!ok && strstr(res.error, "deadlock"));
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}
END_TEST

START_TEST(mismatched_messages_reported) {
    pp_schedule *s = gpipe_with_receives_swapped();
    pp_sim_options o = pp_sim_options_default();
    pp_sim_result res;
    int ok = pp_simulate(s, &o, &res);
    printf("receives swapped on rank 1: ok %d: %s\n", ok, res.error);
    ck_assert(!ok && strstr(res.error, "mismatched messages: rank 1 posts recv-act(micro 1"));
    pp_sim_result_free(&res);
    s->ranks[1].ops[0].peer = 7;
    ok = pp_simulate(s, &o, &res);
    printf("a peer outside the pipeline: ok %d: %s\n", ok, res.error);
    ck_assert(!ok && strstr(res.error, "names peer 7"));
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}
END_TEST

/* ---- size: p = 64, m = 3072 ------------------------------------------------------------ */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
static const double large_limit_seconds = 20;   /* sanitizers run several times slower */
#else
static const double large_limit_seconds = 1;
#endif

START_TEST(large_pipeline_is_fast) {
    const pp_schedule_kind kinds[] = {PP_1F1B, PP_ZB_H1, PP_INTERLEAVED};
    for (int k = 0; k < 3; k++) {
        int v = kinds[k] == PP_INTERLEAVED ? 2 : 1;
        double t0 = now_seconds();
        pp_schedule *s = pp_schedule_make(kinds[k], 64, 3072, v, PP_COMM_ORDERED);
        double t1 = now_seconds();
        pp_sim_result res = simulate(s, 0, 0);
        double t2 = now_seconds();
        pp_bubble f = pp_bubble_formula(kinds[k], 64, 3072, v);
        printf("p 64 m 3072 %-12s made in %.3f s, simulated in %.3f s of CPU (limit %.0f s each):"
               " bubble %.5f (formula %.5f)\n", pp_schedule_name(kinds[k]), t1 - t0, t2 - t1,
               large_limit_seconds, res.bubble_fraction, f.fraction);
        ck_assert(t2 - t1 < large_limit_seconds && t1 - t0 < large_limit_seconds);
        ck_assert(fabs(res.bubble_fraction - f.fraction) <= bubble_tolerance);
        pp_sim_result_free(&res);
        pp_schedule_free(s);
    }
}
END_TEST

/* ---- validation ----------------------------------------------------------------------- */
START_TEST(bad_combinations_refused) {
    const struct {
        pp_schedule_kind kind;
        int p, m, v, layers, batch;
        const char *expect;
    } cases[] = {
        {PP_1F1B, 5, 4, 1, 4, 8, "--pp 5: more stages than the 4 layers"},
        {PP_INTERLEAVED, 2, 4, 3, 4, 8, "--virtual 3 x --pp 2 = 6 chunks, more than the 4 layers"},
        {PP_GPIPE, 2, 3, 1, 4, 8, "--micro 3 does not divide --batch 8"},
        {PP_INTERLEAVED, 4, 6, 2, 8, 12,
         "--micro 6: interleaved 1F1B takes micro-batches in groups of --pp 4"},
        {PP_INTERLEAVED, 2, 4, 1, 4, 8, "--virtual 1: interleaved 1F1B needs at least 2 chunks"},
        {PP_1F1B, 2, 4, 2, 4, 8, "--virtual 2: only the interleaved schedule has chunks"},
        {PP_NAIVE, 2, 4, 1, 4, 8, "--micro 4: the naive pipeline runs the whole batch at once"},
        {PP_GPIPE, 0, 4, 1, 4, 8, "--pp 0: needs at least 1 stage"},
        {PP_GPIPE, 2, 0, 1, 4, 8, "--micro 0: needs at least 1 micro-batch"},
        {PP_INTERLEAVED, 1, 4, 2, 4, 8, "--pp 1: interleaving needs at least 2 stages"},
    };
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int ok = pp_validate(cases[i].kind, cases[i].p, cases[i].m, cases[i].v, cases[i].layers,
                             cases[i].batch, err, sizeof err);
        printf("refused: %s\n", err);
        ck_assert(!ok);
        ck_assert_msg(strstr(err, cases[i].expect), "\"%s\" lacks \"%s\"", err, cases[i].expect);
    }
    /* positive control: the same sizes, made to fit */
    ck_assert(pp_validate(PP_INTERLEAVED, 4, 8, 2, 8, 16, err, sizeof err));
    ck_assert(pp_validate(PP_1F1B, 4, 8, 1, 4, 8, err, sizeof err));
    ck_assert(pp_validate(PP_NAIVE, 4, 1, 1, 4, 8, err, sizeof err));
    ck_assert_ptr_null(pp_schedule_make(PP_INTERLEAVED, 4, 6, 2, PP_COMM_ORDERED));
}
END_TEST

/* ---- pictures --------------------------------------------------------------------------- */
START_TEST(text_picture_of_1f1b) {
    pp_schedule *s = pp_schedule_make(PP_1F1B, 2, 3, 1, PP_COMM_ORDERED);
    pp_sim_result res = simulate(s, 0, 0);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    pp_draw_text(out, res.spans, res.nspans, 2, 24, 0);   /* 2 columns per time unit */
    fclose(out);
    const char *expected = "  rank 0   |F0F1    B0--F2B1--  B2--|\n"
                           "  rank 1   |  F0B0--F1B1--F2B2--    |\n";
    printf("1f1b p 2 m 3 drawn:\n%s", text);
    ck_assert_msg(strncmp(text, expected, strlen(expected)) == 0, "the rows differ from:\n%s",
                  expected);
    /* negative control: a pass moved by one time unit changes the rows */
    int passes = 0, moved = -1;
    for (int i = 0; i < res.nspans; i++) {
        if (!pp_op_is_compute(res.spans[i].kind)) continue;
        if (moved < 0) moved = i;
        passes++;
    }
    res.spans[moved].start += 1;
    res.spans[moved].end += 1;
    free(text);
    out = open_memstream(&text, &len);
    pp_draw_text(out, res.spans, res.nspans, 2, 24, 0);
    fclose(out);
    ck_assert(strncmp(text, expected, strlen(expected)) != 0);
    free(text);

    char path[] = "/tmp/test_pp_svg_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pp_draw_svg(path, res.spans, res.nspans, 2, 10, "1f1b"), 0);
    FILE *f = fdopen(fd, "r");
    static char svg[1 << 16];
    size_t got = fread(svg, 1, sizeof svg - 1, f);
    svg[got] = 0;
    fclose(f);
    remove(path);
    int rects = 0;
    for (const char *p = svg; (p = strstr(p, "<rect")); p++) rects++;
    printf("svg: %zu bytes, %d boxes for %d passes (+1 background; %d sends and receives"
           " left out)\n", got, rects, passes, res.nspans - passes);
    ck_assert_int_eq(rects, passes + 1);
    ck_assert(strstr(svg, "<svg") && strstr(svg, "</svg>") && strstr(svg, "rank 1") &&
              strstr(svg, "time (ms)"));
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}
END_TEST

/* ---- the lists on real ranks: threads, sends that wait for their receive ----------- */
/* Each rank walks its list; a message carries (activation or gradient, micro-batch,
 * from stage, to stage) and the receiver checks it is the one its list expects. All
 * messages use one tag, so they pair up in order, as on NCCL. */
static int walk_lists_main(comm *world, void *arg) {
    const pp_schedule *s = arg;
    int r = comm_rank(world);
    const pp_rank_ops *list = &s->ranks[r];
    for (int i = 0; i < list->count; i++) {
        const pp_op *op = &list->ops[i];
        int stage = pp_virtual_stage(s, r, op->chunk), grad = op->kind == PP_SEND_GRAD || op->kind == PP_RECV_GRAD;
        if (op->kind == PP_SEND_ACT || op->kind == PP_SEND_GRAD) {
            int message[4] = {grad, op->micro, stage, grad ? stage - 1 : stage + 1};
            comm_send(world, message, 4, COMM_F32, op->peer, 0);   /* 4 x 4 bytes */
        } else if (op->kind == PP_RECV_ACT || op->kind == PP_RECV_GRAD) {
            int message[4], from = grad ? stage + 1 : stage - 1;
            comm_recv(world, message, 4, COMM_F32, op->peer, 0);
            int expected[4] = {grad, op->micro, from, stage};
            if (memcmp(message, expected, sizeof expected) != 0)
                comm_abort(world, "op %d expected %s of micro %d from stage %d, got %s of micro"
                           " %d from stage %d", i, grad ? "grad" : "act", op->micro, from,
                           message[0] ? "grad" : "act", message[1], message[2]);
        }
    }
    return 0;
}

static int walk_on_threads(const pp_schedule *s, double timeout_seconds) {
    comm_options o = comm_options_default();
    o.ranks = s->stages;
    o.send_mode = COMM_SEND_RENDEZVOUS;
    o.timeout_seconds = timeout_seconds;
    return launch_threads(&o, walk_lists_main, (void *)s);
}

START_TEST(lists_run_on_rendezvous_threads) {
    config cases[1024];
    int n = all_configs(cases, 1024), ran = 0;
    for (int i = 0; i < n; i++) {
        const config *c = &cases[i];
        if (c->p < 2 || c->m > 8) continue;
        pp_schedule *s = make_config(c);
        ck_assert_msg(walk_on_threads(s, 10) == 0, "%s p=%d m=%d v=%d failed on threads",
                      pp_schedule_name(c->kind), c->p, c->m, c->v);
        pp_schedule_free(s);
        ran++;
    }
    printf("op lists walked on threads with rendezvous sends: %d schedules (p 2-5, m 1-8),"
           " every message the one expected\n", ran);
    /* negative control: receives swapped on rank 1 take the wrong message */
    pp_schedule *s = gpipe_with_receives_swapped();
    printf("the same with rank 1's receives swapped (expect a failure report):\n");
    fflush(stdout);
    ck_assert_int_ne(walk_on_threads(s, 5), 0);
    pp_schedule_free(s);
}
END_TEST

/* The eager 1F1B lists on real ranks, in a child process (they must time out). */
static const char *self_path;

START_TEST(eager_lists_time_out_on_threads) {
    char log[] = "/tmp/test_pp_eager_XXXXXX";
    int fd = mkstemp(log);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char command[512];
    snprintf(command, sizeof command, "%s eager-on-threads 2>%s", self_path, log);
    double t0 = comm_now();
    int status = system(command);
    double seconds = comm_now() - t0;
    static char text[1 << 14];
    FILE *f = fopen(log, "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[got] = 0;
    if (f) fclose(f);
    remove(log);
    printf("eager 1f1b p 2 m 4 on threads, rendezvous, timeout 1 s: status %d after %.2f s;"
           " stderr:\n%s", status, seconds, text);
    ck_assert_msg(status != 0, "the eager lists must fail on rendezvous threads");
    ck_assert(seconds < 10);
    ck_assert(strstr(text, "TIMEOUT") && strstr(text, "stuck in send(4 x f32, peer 1, tag 0)") &&
              strstr(text, "stuck in send(4 x f32, peer 0, tag 0)"));
}
END_TEST

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc > 1 && strcmp(argv[1], "eager-on-threads") == 0) {
        pp_schedule *s = pp_schedule_make(PP_1F1B, 2, 4, 1, PP_COMM_EAGER);
        return walk_on_threads(s, 1.0);
    }
    Suite *suite = suite_create("pp_schedule");
    TCase *lists = tcase_create("lists");
    tcase_set_timeout(lists, 120);
    tcase_add_test(lists, op_lists_are_well_formed);
    tcase_add_test(lists, peak_in_flight);
    tcase_add_test(lists, bad_combinations_refused);
    suite_add_tcase(suite, lists);
    TCase *sim = tcase_create("simulator");
    tcase_set_timeout(sim, 120);
    tcase_add_test(sim, bubble_matches_formula);
    tcase_add_test(sim, bubble_p4_m8);
    tcase_add_test(sim, eager_order_deadlocks);
    tcase_add_test(sim, mismatched_messages_reported);
    tcase_add_test(sim, large_pipeline_is_fast);
    suite_add_tcase(suite, sim);
    TCase *threads = tcase_create("threads");
    tcase_set_timeout(threads, 120);
    tcase_add_test(threads, lists_run_on_rendezvous_threads);
    tcase_add_test(threads, eager_lists_time_out_on_threads);
    suite_add_tcase(suite, threads);
    TCase *draw = tcase_create("draw");
    tcase_add_test(draw, text_picture_of_1f1b);
    suite_add_tcase(suite, draw);
    return check_run(suite, 0);
}
