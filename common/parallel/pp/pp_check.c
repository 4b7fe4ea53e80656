#include "pp_check.h"

#include <math.h>
#include <stdio.h>

#include "alloc.h"

enum { PASS_F, PASS_B, PASS_W, PASS_KINDS };   /* B: a whole backward or its input half */

typedef struct {
    double start, end;   /* NAN: not run */
    int count;
} ran;

/* The spans by (kind, micro, stage); 0 with err when one is run twice or names a
 * pass outside the schedule. */
static int index_passes(const pp_schedule *s, const pp_span *spans, int n, ran *at,
                        int *split, char *err, size_t size) {
    const int S = s->stages * s->chunks;
    for (int i = 0; i < n; i++) {
        const pp_span *x = &spans[i];
        if (!pp_op_is_compute(x->kind)) continue;
        if (x->micro < 0 || x->micro >= s->micro || x->chunk < 0 || x->chunk >= s->chunks ||
            x->rank < 0 || x->rank >= s->stages) {
            snprintf(err, size, "rank %d ran %s(micro %d, chunk %d): not in the schedule",
                     x->rank, pp_op_kind_name(x->kind), x->micro, x->chunk);
            return 0;
        }
        const int kind = x->kind == PP_FORWARD ? PASS_F : x->kind == PP_BACKWARD_WEIGHT ? PASS_W
                                                                                       : PASS_B;
        const int k = pp_virtual_stage(s, x->rank, x->chunk);
        ran *r = &at[((size_t)kind * s->micro + x->micro) * S + k];
        if (r->count++ > 0) {
            snprintf(err, size, "stage %d runs %s of micro-batch %d twice", k,
                     pp_op_kind_name(x->kind), x->micro);
            return 0;
        }
        r->start = x->start;
        r->end = x->end;
        if (x->kind == PP_BACKWARD_INPUT) split[(size_t)x->micro * S + k] = 1;
    }
    return 1;
}

/* What a pass needs has ended before it starts (and exists). */
static int after(const ran *pass, const ran *need, const char *what, const char *needs,
                 int micro, int stage, char *err, size_t size) {
    if (need->count == 1 && pass->start >= need->end) return 1;
    snprintf(err, size, "%s of micro-batch %d on stage %d %s its %s", what, micro, stage,
             need->count == 1 ? "starts before" : "runs without", needs);
    return 0;
}

static int passes_in_order(const pp_schedule *s, const ran *at, const int *split, char *err,
                           size_t size) {
    const int S = s->stages * s->chunks, m = s->micro;
#define AT(kind, i, k) (&at[((size_t)(kind) * m + (i)) * S + (k)])
    for (int i = 0; i < m; i++)
        for (int k = 0; k < S; k++) {
            const ran *f = AT(PASS_F, i, k), *b = AT(PASS_B, i, k), *w = AT(PASS_W, i, k);
            int first, last;   /* DualPipe: micro-batch i runs through one copy alone */
            pp_micro_stages(s->bidirectional, s->stages, s->chunks, m, i, &first, &last);
            if (k < first || k > last) {
                if (f->count + b->count + w->count == 0) continue;
                snprintf(err, size, "micro-batch %d runs on stage %d, outside its stages %d .."
                         " %d", i, k, first, last);
                return 0;
            }
            if (f->count != 1 || b->count != 1) {
                snprintf(err, size, "micro-batch %d on stage %d: %d forwards, %d backwards", i,
                         k, f->count, b->count);
                return 0;
            }
            if (split[(size_t)i * S + k] != (w->count == 1)) {
                snprintf(err, size, "micro-batch %d on stage %d: %s", i, k,
                         w->count ? "a W after a whole backward" : "B without its W");
                return 0;
            }
            if ((k > first && !after(f, AT(PASS_F, i, k - 1), "F",
                                     "input (F of the stage before)", i, k, err, size)) ||
                !after(b, f, "B", "forward", i, k, err, size) ||
                (k < last && !after(b, AT(PASS_B, i, k + 1), "B",
                                     "output gradient (B of the stage after)", i, k, err, size)) ||
                (w->count && !after(w, b, "W", "B", i, k, err, size)))
                return 0;
        }
#undef AT
    return 1;
}

/* Sends and receives between each pair of ranks, counted by message. */
static int messages_matched(const pp_schedule *s, char *err, size_t size) {
    const int p = s->stages;
    for (int r = 0; r < p; r++)
        for (int i = 0; i < s->ranks[r].count; i++) {
            const pp_op *op = &s->ranks[r].ops[i];
            if (op->kind != PP_SEND_ACT && op->kind != PP_SEND_GRAD) continue;
            const int grad = op->kind == PP_SEND_GRAD;
            const int to = pp_virtual_stage(s, r, op->chunk) + (grad ? -1 : 1);
            int found = 0;
            for (int j = 0; op->peer >= 0 && op->peer < p && j < s->ranks[op->peer].count; j++) {
                const pp_op *in = &s->ranks[op->peer].ops[j];
                found += in->kind == (grad ? PP_RECV_GRAD : PP_RECV_ACT) && in->peer == r &&
                         in->micro == op->micro && pp_virtual_stage(s, op->peer, in->chunk) == to;
            }
            if (found != 1) {
                snprintf(err, size, "rank %d's %s(micro %d, chunk %d) to rank %d has %d"
                         " receives", r, pp_op_kind_name(op->kind), op->micro, op->chunk,
                         op->peer, found);
                return 0;
            }
        }
    return 1;
}

int pp_check_dependencies(const pp_schedule *s, const pp_span *spans, int nspans, char *err,
                          size_t size) {
    const size_t cells = (size_t)s->micro * s->stages * s->chunks;
    ran *at = mem_alloc(MEM_OTHER, PASS_KINDS * cells * sizeof *at);
    int *split = mem_alloc(MEM_OTHER, cells * sizeof *split);
    for (size_t i = 0; i < PASS_KINDS * cells; i++) at[i] = (ran){NAN, NAN, 0};
    for (size_t i = 0; i < cells; i++) split[i] = 0;
    int ok = index_passes(s, spans, nspans, at, split, err, size) &&
             passes_in_order(s, at, split, err, size) && messages_matched(s, err, size);
    mem_free(at);
    mem_free(split);
    return ok;
}
