#include "pp_execute.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ops.h"

void pp_executor_init(pp_executor *e, const pp_schedule *schedule, int rank, pp_stage *chunks,
                      const run_config *cfg, const dataset *data, int first_sequence,
                      float dloss, double stage_seconds) {
    const int v = schedule->chunks, m = schedule->micro;
    *e = (pp_executor){.schedule = schedule, .rank = rank, .chunks = chunks, .cfg = cfg,
                       .data = data, .first_sequence = first_sequence, .dloss = dloss,
                       .stage_seconds = stage_seconds};
    e->slot_of = malloc(sizeof(int) * (size_t)v * m);
    e->uses_left = calloc((size_t)v * m, sizeof(int));
    e->slot_busy = calloc((size_t)v * m, sizeof(int));
    e->slots_used = calloc((size_t)v, sizeof(int));
    e->spans = calloc((size_t)schedule->ranks[rank].count, sizeof *e->spans);
    if (!e->slot_of || !e->uses_left || !e->slot_busy || !e->slots_used || !e->spans) {
        fprintf(stderr, "error: out of memory for the pipeline schedule\n");
        exit(1);
    }
}

void pp_executor_free(pp_executor *e) {
    free(e->slot_of);
    free(e->uses_left);
    free(e->slot_busy);
    free(e->slots_used);
    free(e->spans);
}

/* ---- slots ---------------------------------------------------------------------------- */

/* The slot of micro-batch `micro` on chunk `chunk`, taken on first use. */
static int slot_for(pp_executor *e, int chunk, int micro) {
    const int m = e->schedule->micro, at = chunk * m + micro;
    if (e->slot_of[at] >= 0) return e->slot_of[at];
    int *busy = e->slot_busy + chunk * m, slot = 0;
    while (busy[slot]) slot++;   /* the lowest free slot: at most m are ever needed */
    busy[slot] = 1;
    e->slot_of[at] = slot;
    /* what is left of it: its backward (or W), and the send of its input gradient */
    e->uses_left[at] = 1 + !pp_stage_is_first(&e->chunks[chunk]);
    int taken = 0;
    for (int s = 0; s < m; s++) taken += busy[s];
    if (taken > e->slots_used[chunk]) e->slots_used[chunk] = taken;
    return slot;
}

static void slot_done_with(pp_executor *e, int chunk, int micro) {
    const int m = e->schedule->micro, at = chunk * m + micro;
    if (--e->uses_left[at] > 0) return;
    e->slot_busy[chunk * m + e->slot_of[at]] = 0;
    e->slot_of[at] = -1;
}

/* ---- the compute model ------------------------------------------------------------------ */

static double modelled_seconds(const pp_executor *e, pp_op_kind kind) {
    const double f = e->stage_seconds / e->schedule->chunks;
    return kind == PP_BACKWARD ? 2 * f : f;   /* F, and B and W of a split backward */
}

static void sleep_until(double when) {
    struct timespec t = {.tv_sec = (time_t)when};
    t.tv_nsec = (long)((when - (double)t.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
    }
}

/* ---- one step ------------------------------------------------------------------------------ */

static float run_compute(pp_executor *e, const pp_op *op, int step) {
    pp_stage *st = &e->chunks[op->chunk];
    const int slot = slot_for(e, op->chunk, op->micro);
    float loss = 0;
    switch (op->kind) {
    case PP_FORWARD:
        loss = pp_forward(st, slot, e->data, e->cfg, step,
                          e->first_sequence + op->micro * st->micro_batch);
        break;
    case PP_BACKWARD:
        pp_backward(st, slot, e->dloss, NULL, NULL);
        slot_done_with(e, op->chunk, op->micro);
        break;
    case PP_BACKWARD_INPUT:
        gpt_use_slot(st->model, slot);
        gpt_backward_input(st->model, st->rep.params, st->rep.grads, e->dloss);
        break;
    default:   /* PP_BACKWARD_WEIGHT */
        gpt_use_slot(st->model, slot);
        gpt_backward_weights(st->model, st->rep.params, st->rep.grads, NULL, NULL);
        slot_done_with(e, op->chunk, op->micro);
        break;
    }
    ops_synchronize();
    return loss;
}

static void run_message(pp_executor *e, const pp_op *op) {
    pp_stage *st = &e->chunks[op->chunk];
    const int slot = slot_for(e, op->chunk, op->micro);
    switch (op->kind) {
    case PP_RECV_ACT: pp_recv_input(st, slot); break;
    case PP_SEND_ACT: pp_send_output(st, slot); break;
    case PP_RECV_GRAD: pp_recv_output_grad(st, slot); break;
    default:   /* PP_SEND_GRAD */
        gpt_use_slot(st->model, slot);
        pp_send_input_grad(st);
        slot_done_with(e, op->chunk, op->micro);
        break;
    }
}

float pp_execute_step(pp_executor *e, int step, double start) {
    const pp_rank_ops *list = &e->schedule->ranks[e->rank];
    const int v = e->schedule->chunks, m = e->schedule->micro;
    for (int i = 0; i < v * m; i++) e->slot_of[i] = -1;
    e->nspans = 0;
    e->busy_seconds = 0;
    double loss = 0;
    for (int i = 0; i < list->count; i++) {
        const pp_op *op = &list->ops[i];
        if (!pp_op_is_compute(op->kind)) {
            run_message(e, op);
            continue;
        }
        const double t0 = comm_now();
        loss += run_compute(e, op, step);
        double t1 = comm_now();
        if (e->stage_seconds > 0) {
            const double until = t0 + modelled_seconds(e, op->kind);
            if (t1 < until) sleep_until(until);
            else e->overrun_seconds += t1 - until;
            t1 = comm_now();
        }
        e->busy_seconds += t1 - t0;
        e->spans[e->nspans++] = (pp_span){.rank = e->rank, .kind = op->kind, .micro = op->micro,
                                          .chunk = op->chunk, .start = t0 - start,
                                          .end = t1 - start};
    }
    e->finish_seconds = comm_now() - start;
    return (float)(loss / m);
}
