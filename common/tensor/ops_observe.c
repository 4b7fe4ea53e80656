/* This thread's watchers of the ops: an observer (chapter 1's lock) and a profiler. */
#include "ops_observe.h"

#include <stddef.h>

/* This thread's observer (ops_observe) and profiler (ops_profile), or NULL. */
static _Thread_local const ops_observer *observer, *profiler;

void ops_observe(const ops_observer *o) { observer = o; }
void ops_profile(const ops_observer *p) { profiler = p; }
int ops_watched(void) { return observer || profiler; }

int op_is_kernel(op_kind kind) {
    return kind == OP_LINEAR_FORWARD || kind == OP_LINEAR_BACKWARD ||
           kind == OP_ATTENTION_FORWARD || kind == OP_ATTENTION_BACKWARD;
}

/* The profiler is innermost: it times the op, not the observer's lock. */
void ops_watch_begin(op_kind kind, double bytes) {
    const ops_observer *o = observer, *p = profiler;
    if (o) {
        o->begin(o->ctx, kind);
        if (o->traffic) o->traffic(o->ctx, kind, bytes);
    }
    if (p) {
        p->begin(p->ctx, kind);
        if (p->traffic) p->traffic(p->ctx, kind, bytes);
    }
}

void ops_watch_end(op_kind kind) {
    const ops_observer *o = observer, *p = profiler;
    if (p) p->end(p->ctx, kind);
    if (o) o->end(o->ctx, kind);
}

void ops_gemm_begin(int trans_a, int trans_b, int M, int N, int K) {
    const ops_observer *w[2] = {observer, profiler};
    for (int i = 0; i < 2; i++)
        if (w[i] && w[i]->gemm_begin) w[i]->gemm_begin(w[i]->ctx, trans_a, trans_b, M, N, K);
}

void ops_gemm_end(void) {
    const ops_observer *w[2] = {profiler, observer};
    for (int i = 0; i < 2; i++)
        if (w[i] && w[i]->gemm_end) w[i]->gemm_end(w[i]->ctx);
}
