/* The schedules' orders of passes, rank by rank (pp_schedule.h says what each is). */
#include "pp_plan.h"

static void plan_add(rank_plan *plan, pp_op_kind kind, int micro, int chunk) {
    plan->passes[plan->count++] = (pass){kind, micro, chunk, 0};
}

/* GPipe: every forward, then every backward, the last micro-batch first. */
static void plan_gpipe(rank_plan *plan, int m) {
    for (int i = 0; i < m; i++) plan_add(plan, PP_FORWARD, i, 0);
    for (int i = m - 1; i >= 0; i--) plan_add(plan, PP_BACKWARD, i, 0);
}

/* 1F1B: warm-up forwards, then one forward and one backward, then the drain. */
static void plan_1f1b(rank_plan *plan, int p, int r, int m, pp_op_kind backward) {
    int warmup = p - r - 1 < m ? p - r - 1 : m;
    for (int i = 0; i < warmup; i++) plan_add(plan, PP_FORWARD, i, 0);
    for (int i = 0; i < m - warmup; i++) {
        plan_add(plan, PP_FORWARD, warmup + i, 0);
        plan_add(plan, backward, i, 0);
    }
    for (int i = m - warmup; i < m; i++) plan_add(plan, backward, i, 0);
}

/* Megatron-LM's interleaved order: the k-th chunk pass of a rank takes micro-batch
 * group k / (p v), member k % p, chunk (k / p) % v (backwards: the chunks reversed). */
static pass interleaved_pass(int k, int p, int v, int backward) {
    int chunk = (k / p) % v;
    return (pass){backward ? PP_BACKWARD : PP_FORWARD, (k / (p * v)) * p + k % p,
                  backward ? v - 1 - chunk : chunk, 0};
}

static void plan_interleaved(rank_plan *plan, int p, int r, int m, int v) {
    int total = m * v, warmup = 2 * (p - r - 1) + (v - 1) * p;
    if (warmup > total || m == p) warmup = total;   /* m = p: all forwards first (Megatron) */
    for (int k = 0; k < warmup; k++) plan->passes[plan->count++] = interleaved_pass(k, p, v, 0);
    for (int k = 0; k < total - warmup; k++) {
        plan->passes[plan->count++] = interleaved_pass(warmup + k, p, v, 0);
        plan->passes[plan->count++] = interleaved_pass(k, p, v, 1);
    }
    for (int k = total - warmup; k < total; k++)
        plan->passes[plan->count++] = interleaved_pass(k, p, v, 1);
}

/* ZB-V on rank r (pp_schedule.h): next[c] is the next forward of chunk c, back[c] its
 * next B. A group is a chunk's forward (while any is left), its oldest B and a W. */
typedef struct {
    int next[2], back[2];
} vshape_counts;

static void zbv_group(rank_plan *plan, vshape_counts *n, int c, int m, int with_w) {
    if (n->next[c] < m) plan_add(plan, PP_FORWARD, n->next[c]++, c);
    if (n->back[c] < n->next[c]) {
        plan_add(plan, PP_BACKWARD_INPUT, n->back[c]++, c);
        if (with_w) plan_add(plan, PP_BACKWARD_WEIGHT, n->back[c] - 1, c);
    }
}

static void plan_zbv(rank_plan *plan, int p, int r, int m) {
    vshape_counts n = {{0, 0}, {0, 0}};
    for (int i = 0; i < 2 * p - 1 - 2 * r && n.next[0] < m; i++)
        plan_add(plan, PP_FORWARD, n.next[0]++, 0);
    for (int i = 0; i < r; i++) {   /* chunk 1's inputs start to come back */
        if (n.next[1] < n.next[0]) plan_add(plan, PP_FORWARD, n.next[1]++, 1);
        if (n.next[0] < m) plan_add(plan, PP_FORWARD, n.next[0]++, 0);
    }
    int turn = 0;   /* groups so far: the first p - r are chunk 1's, then 0 and 1 in turn */
    while (n.back[0] < m || n.back[1] < m) {
        const int c = turn < p - r ? 1 : (turn - (p - r)) % 2 == 0 ? 0 : 1;
        const int steady = n.next[0] < m || n.next[1] < m;   /* after: W fill the waits */
        if (n.back[c] < m) zbv_group(plan, &n, c, m, steady);
        else zbv_group(plan, &n, 1 - c, m, steady);
        turn++;
    }
}

/* DualPipeV on rank r (pp_schedule.h): the backward is whole (B) or split (B, then
 * a W in the plan or owed), and F&B pairs a chunk's forward with the other chunk's
 * backward. tail = p - r - 1. */
static void dpv_forward(rank_plan *plan, vshape_counts *n, int c, int fused) {
    plan->passes[plan->count++] = (pass){PP_FORWARD, n->next[c]++, c, fused};
}

static void dpv_backward(rank_plan *plan, vshape_counts *n, int c, int split) {
    plan_add(plan, split ? PP_BACKWARD_INPUT : PP_BACKWARD, n->back[c]++, c);
}

static void plan_dualpipev(rank_plan *plan, int p, int r, int m) {
    vshape_counts n = {{0, 0}, {0, 0}};
    const int tail = p - r - 1;
    for (int i = 0; i < 2 * tail; i++) dpv_forward(plan, &n, 0, 0);
    for (int i = 0; i <= r; i++) {
        dpv_forward(plan, &n, 0, 0);
        dpv_forward(plan, &n, 1, 0);
    }
    for (int i = 0; i < tail; i++) {   /* B, its W at once, and the next chunk-1 forward */
        dpv_backward(plan, &n, 1, 1);
        plan_add(plan, PP_BACKWARD_WEIGHT, 0, 1);
        dpv_forward(plan, &n, 1, 0);
    }
    for (int i = 0; i < m - 2 * p + r + 1; i++) {   /* the main part: F0&B1, F1&B0 */
        dpv_forward(plan, &n, 0, !(i == 0 && r == p - 1));   /* the turn's first: apart */
        dpv_backward(plan, &n, 1, 0);
        dpv_forward(plan, &n, 1, 1);
        dpv_backward(plan, &n, 0, 0);
    }
    for (int i = 0; i < tail; i++) {
        dpv_backward(plan, &n, 1, 0);
        dpv_forward(plan, &n, 1, 1);
        dpv_backward(plan, &n, 0, 0);
    }
    for (int i = 0; i < 2 * (r + 1); i++)   /* B1, B0 in turn; the latter half split */
        dpv_backward(plan, &n, i % 2 == 0 ? 1 : 0, i >= r + 1);
    for (int i = 0; i < tail; i++) {
        plan_add(plan, PP_BACKWARD_WEIGHT, 0, 0);
        dpv_backward(plan, &n, 0, 1);
    }
    for (int i = 0; i <= r; i++) plan_add(plan, PP_BACKWARD_WEIGHT, 0, 0);
}

void pp_plan_rank(rank_plan *plan, pp_schedule_kind kind, int p, int r, int m, int v) {
    switch (kind) {
    case PP_ZB_V: plan_zbv(plan, p, r, m); break;
    case PP_DUALPIPE_V: plan_dualpipev(plan, p, r, m); break;
    case PP_NAIVE:
    case PP_GPIPE: plan_gpipe(plan, m); break;
    case PP_1F1B: plan_1f1b(plan, p, r, m, PP_BACKWARD); break;
    case PP_INTERLEAVED: plan_interleaved(plan, p, r, m, v); break;
    default: plan_1f1b(plan, p, r, m, PP_BACKWARD_INPUT); break;
    }
}


/* DualPipeV's plan for half rank h = min(r, p-1-r) of p/2 with m/2 micro-batches a
 * direction (DeepSeek's DualPipe runs the same steps on half_rank); on the second half
 * of the ranks its phase 0 is copy 1, so the chunks swap. Copy 1's micro-batches are
 * the second half. The W passes of a plan run the oldest owed (their names do not
 * matter). */
void pp_plan_dualpipe_rank(rank_plan *plan, int p, int r, int m) {
    const int second = r >= p / 2;
    plan_dualpipev(plan, p / 2, second ? p - 1 - r : r, m / 2);
    for (int i = 0; i < plan->count; i++) {
        pass *ps = &plan->passes[i];
        ps->chunk ^= second;
        if (ps->chunk == 1) ps->micro += m / 2;
    }
}
