#include "pp_execute.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "alloc.h"
#include "ops.h"
#include "ops_mixed.h"

void pp_executor_init(pp_executor *e, const pp_schedule *schedule, int rank, pp_stage *chunks,
                      const run_config *cfg, const dataset *data, int first_sequence,
                      int micro_stride, float dloss, double stage_seconds) {
    const int v = schedule->chunks, m = schedule->micro;
    *e = (pp_executor){.schedule = schedule, .rank = rank, .chunks = chunks, .cfg = cfg,
                       .data = data, .first_sequence = first_sequence,
                       .micro_stride = micro_stride, .dloss = dloss,
                       .stage_seconds = stage_seconds};
    /* charged to the rank (MEM_OTHER): a rank stopped by a failure gives them back */
    e->slot_of = mem_alloc(MEM_OTHER, sizeof(int) * (size_t)v * m);
    e->outbox = mem_alloc(MEM_OTHER, (size_t)v * m * sizeof *e->outbox);
    e->grad_sent = mem_alloc(MEM_OTHER, (size_t)v * m * sizeof *e->grad_sent);
    e->inbox = mem_alloc(MEM_OTHER, (size_t)v * m * sizeof *e->inbox);
    e->spare = mem_alloc(MEM_OTHER, 2 * (size_t)v * m * sizeof *e->spare);
    e->slot_busy = mem_alloc(MEM_OTHER, (size_t)v * m * sizeof(int));
    e->spans = mem_alloc(MEM_OTHER, (size_t)schedule->ranks[rank].count * sizeof *e->spans);
    if (!e->slot_of || !e->grad_sent || !e->inbox || !e->outbox || !e->spare ||
        !e->slot_busy || !e->spans) {
        fprintf(stderr, "error: out of memory for the pipeline schedule\n");
        exit(1);
    }
}

void pp_executor_free(pp_executor *e) {
    mem_free(e->slot_of);
    for (int i = 0; i < e->spares; i++) mem_free(e->spare[i]);
    mem_free(e->outbox);
    mem_free(e->grad_sent);
    mem_free(e->inbox);
    mem_free(e->spare);
    mem_free(e->slot_busy);
    mem_free(e->spans);
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
    if (++e->in_flight > e->in_flight_peak) e->in_flight_peak = e->in_flight;
    return slot;
}

/* A boundary buffer (one micro-batch's activations or their gradient, in the model's
 * precision) in transit. Every chunk's boundary has the same size and precision. */
static void *box_take(pp_executor *e, const pp_stage *st) {
    return e->spares > 0 ? e->spare[--e->spares]
                         : mem_alloc_on(MEM_DEVICE, MEM_COMM, pp_boundary_bytes(st));
}

static void box_give(pp_executor *e, void *box) { e->spare[e->spares++] = box; }

/* Its activations are no longer needed; its input gradient goes to the outbox. */
static void slot_release(pp_executor *e, int chunk, int micro) {
    const int m = e->schedule->micro, at = chunk * m + micro;
    pp_stage *st = &e->chunks[chunk];
    if (!pp_stage_is_first(st) && !e->grad_sent[at]) {
        void *box = box_take(e, st);
        mixed_vec_copy(st->precision, box, gpt_stage_input_grad(st->model), st->boundary_numel);
        e->outbox[at] = box;
    }
    e->slot_busy[chunk * m + e->slot_of[at]] = 0;
    e->slot_of[at] = -1;
    e->in_flight--;
}

static void send_from_outbox(pp_executor *e, int chunk, int micro) {
    const int at = chunk * e->schedule->micro + micro;
    pp_send_input_grad(&e->chunks[chunk], e->outbox[at]);
    e->grad_sent[at] = 1;
    box_give(e, e->outbox[at]);
    e->outbox[at] = NULL;
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

/* The rest of a modelled pass, in slices with comm_progress between: under Open MPI a
 * message this rank sent that is over the eager limit moves only while the rank is in
 * an MPI call, so a whole pass asleep held its receiver up by as long (chapter 4 at
 * --dim 256, p 2 measured a 50% bubble for 11%). */
static const double progress_slice_seconds = 0.5e-3;

void pp_compute_model_wait(comm *c, double until) {
    for (double now = comm_now(); now < until; now = comm_now()) {
        comm_progress(c);
        sleep_until(now + progress_slice_seconds < until ? now + progress_slice_seconds
                                                         : until);
    }
}

/* ---- a V's turn: stages p-1 and p on one rank ----------------------------------------------- */

/* The chunk of this rank that holds virtual stage `stage`, or -1. */
static int local_chunk(const pp_executor *e, int stage) {
    const pp_schedule *s = e->schedule;
    int rank, chunk;
    if (stage < 0 || stage >= s->stages * s->chunks) return -1;
    pp_place_of(pp_schedule_vshape(s->kind), s->stages, stage, &rank, &chunk);
    return rank == e->rank ? chunk : -1;
}

/* After a forward: the output goes to the next stage's inbox when that is here. */
static void hand_on_output(pp_executor *e, const pp_op *op, int slot) {
    pp_stage *st = &e->chunks[op->chunk];
    const int next = local_chunk(e, st->stage + 1);
    if (next < 0) return;
    void *box = box_take(e, st);
    gpt_use_slot(st->model, slot);
    mixed_vec_copy(st->precision, box, gpt_stage_output(st->model), st->boundary_numel);
    e->inbox[next * e->schedule->micro + op->micro] = box;
}

/* After a backward (B): d(input) is the previous stage's d(output) when that is here. */
static void hand_back_input_grad(pp_executor *e, const pp_op *op) {
    pp_stage *st = &e->chunks[op->chunk];
    const int before = local_chunk(e, st->stage - 1);
    if (before < 0) return;
    pp_stage *to = &e->chunks[before];
    gpt_use_slot(to->model, slot_for(e, before, op->micro));
    mixed_vec_copy(st->precision, gpt_stage_output_grad(to->model),
                   gpt_stage_input_grad(st->model), st->boundary_numel);
    e->grad_sent[op->chunk * e->schedule->micro + op->micro] = 1;
}

/* ---- one step ------------------------------------------------------------------------------ */

static float run_compute(pp_executor *e, const pp_op *op, int step) {
    pp_stage *st = &e->chunks[op->chunk];
    const int slot = slot_for(e, op->chunk, op->micro);
    float loss = 0;
    switch (op->kind) {
    case PP_FORWARD: {
        void **box = &e->inbox[op->chunk * e->schedule->micro + op->micro];
        if (*box) {
            gpt_use_slot(st->model, slot);
            mixed_vec_copy(st->precision, gpt_stage_input(st->model), *box, st->boundary_numel);
            box_give(e, *box);
            *box = NULL;
        }
        loss = pp_forward(st, slot, e->data, e->cfg, step,
                          e->first_sequence + op->micro * e->micro_stride);
        hand_on_output(e, op, slot);
        break;
    }
    case PP_BACKWARD: {
        const int last = op->micro == e->schedule->micro - 1;
        pp_backward(st, slot, e->dloss, last ? e->last_backward_slab_ready : NULL,
                    e->slab_ctx);
        hand_back_input_grad(e, op);
        slot_release(e, op->chunk, op->micro);
        break;
    }
    case PP_BACKWARD_INPUT:   /* d(input) is ready: its send may come before W */
        gpt_use_slot(st->model, slot);
        gpt_backward_input(st->model, st->rep.compute, st->rep.grads, e->dloss);
        hand_back_input_grad(e, op);
        break;
    default:   /* PP_BACKWARD_WEIGHT: the activations' last use */
        gpt_use_slot(st->model, slot);
        if (!(e->drop_weight_pass && e->weight_passes++ == 0))
            gpt_backward_weights(st->model, st->rep.compute, st->rep.grads, NULL, NULL);
        slot_release(e, op->chunk, op->micro);
        break;
    }
    ops_synchronize();
    return loss;
}

static void run_message(pp_executor *e, const pp_op *op) {
    pp_stage *st = &e->chunks[op->chunk];
    switch (op->kind) {
    case PP_RECV_ACT: {   /* into the inbox: its slot is taken by its forward */
        void *box = box_take(e, st);
        pp_recv_input_into(st, box);
        e->inbox[op->chunk * e->schedule->micro + op->micro] = box;
        break;
    }
    case PP_SEND_ACT: pp_send_output(st, slot_for(e, op->chunk, op->micro)); break;
    case PP_RECV_GRAD: pp_recv_output_grad(st, slot_for(e, op->chunk, op->micro)); break;
    default:   /* PP_SEND_GRAD: from the outbox, or (zero bubble, before W) the slot */
        if (e->outbox[op->chunk * e->schedule->micro + op->micro]) {
            send_from_outbox(e, op->chunk, op->micro);
        } else {
            gpt_use_slot(st->model, slot_for(e, op->chunk, op->micro));
            pp_send_input_grad(st, gpt_stage_input_grad(st->model));
            e->grad_sent[op->chunk * e->schedule->micro + op->micro] = 1;
        }
        break;
    }
}

float pp_execute_step(pp_executor *e, int step, double start) {
    const pp_rank_ops *list = &e->schedule->ranks[e->rank];
    const int v = e->schedule->chunks, m = e->schedule->micro;
    for (int i = 0; i < v * m; i++) e->slot_of[i] = -1, e->grad_sent[i] = 0;
    e->nspans = 0;
    e->busy_seconds = 0;
    e->weight_passes = 0;
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
        if (e->stage_seconds > 0) {   /* late: computing longer, or woken late */
            const double until = t0 + modelled_seconds(e, op->kind);
            if (t1 < until) pp_compute_model_wait(e->chunks[0].pp, until);
            t1 = comm_now();
            e->overrun_seconds += t1 > until ? t1 - until : 0;
        }
        e->busy_seconds += t1 - t0;
        e->spans[e->nspans++] = (pp_span){.rank = e->rank, .kind = op->kind, .micro = op->micro,
                                          .chunk = op->chunk, .start = t0 - start,
                                          .end = t1 - start};
    }
    e->finish_seconds = comm_now() - start;
    return (float)(loss / m);
}
