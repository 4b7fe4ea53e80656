/* DualPipe itself (DeepSeek-V3), bidirectional, on the event simulator: p ranks, the
 * model's p stages held twice (copy 0's stage r and copy 1's stage p-1-r on rank r),
 * half the micro-batches fed in at rank 0 and half at rank p-1. At its formula's
 * assumptions (F = B, W = F or F/2, F&B = F + B) every rank idles exactly
 * (PP/2 - 1)(F&B + B - 3W) for p = 4, 8, 16, on GPU streams and CPU ranks; DualPipeV on
 * p/2 ranks, the same p stages, idles the same (DeepSeek's table: one bubble for both);
 * every pass keeps its dependencies (pp_check.h); activations PP + 1 stage passes a
 * rank, parameters two stages of p a rank (2x). A W left out, two receives swapped and
 * the sizes DeepSeek's DualPipe refuses fail. The executor does not run DualPipe. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "pp_check.h"
#include "pp_sim.h"

/* A stage's F = B = 1.5 ms and W = w; F&B one pass after the other. */
static pp_sim_options times(double w, int sequential) {
    return (pp_sim_options){.forward = 1.5, .backward = 1.5 + w, .backward_input = 1.5,
                            .backward_weight = w, .sequential = sequential};
}

static pp_sim_result simulate_checked(const pp_schedule *s, const pp_sim_options *o) {
    pp_sim_result res;
    ck_assert_msg(pp_simulate(s, o, &res), "p %d m %d: %s", s->stages, s->micro, res.error);
    char err[256];
    ck_assert_msg(pp_check_dependencies(s, res.spans, res.nspans, err, sizeof err),
                  "p %d m %d: %s", s->stages, s->micro, err);
    return res;
}

/* DualPipeV on p/2 ranks with the same p stages: its chunk is one of them, so its
 * ranks' stage (two chunks) takes twice DualPipe's pass. Every rank's idle. */
static double dualpipev_same_stages(int p, int m, double w) {
    pp_schedule *v = pp_schedule_make(PP_DUALPIPE_V, p / 2, m, 2, PP_COMM_ORDERED);
    pp_sim_options o = times(w, 0);
    o.forward *= 2;
    o.backward_input *= 2;
    o.backward_weight *= 2;
    o.backward *= 2;
    pp_sim_result res = simulate_checked(v, &o);
    const double idle = res.idle[0];
    for (int r = 1; r < p / 2; r++) ck_assert(fabs(res.idle[r] - idle) <= 1e-9);
    pp_sim_result_free(&res);
    pp_schedule_free(v);
    return idle;
}

START_TEST(every_rank_idles_the_formula_at_its_assumptions) {
    double worst = 0;
    for (int p = 4; p <= 16; p *= 2)
        for (int m = 2 * p; m <= 4 * p; m += 2 * p)
            for (int half_w = 0; half_w <= 1; half_w++) {
                const double w = half_w ? 0.75 : 1.5;
                pp_schedule *s = pp_dualpipe_make(p, m, PP_COMM_ORDERED);
                for (int seq = 0; seq <= 1; seq++) {
                    pp_sim_options o = times(w, seq);
                    const double formula = pp_sim_dualpipe_idle_formula(p, &o);
                    pp_sim_result res = simulate_checked(s, &o);
                    for (int r = 0; r < p; r++) {
                        worst = fmax(worst, fabs(res.idle[r] - formula));
                        ck_assert_msg(fabs(res.idle[r] - formula) <= 1e-9, "p %d m %d W %g"
                                      " rank %d: idle %.4f, formula %.4f", p, m, w, r,
                                      res.idle[r], formula);
                        ck_assert_int_eq(pp_peak_in_flight(s, r), p + 1);   /* PP + 1 */
                    }
                    pp_sim_result_free(&res);
                }
                const double v = dualpipev_same_stages(p, m, w);
                const pp_sim_options o = times(w, 0);
                const double formula = pp_sim_dualpipe_idle_formula(p, &o);
                ck_assert_msg(fabs(v - formula) <= 1e-9, "dualpipev on %d ranks: %.4f", p / 2, v);
                printf("dualpipe p %2d m %2d W %.2f: idle per rank %5.2f ms = formula; dualpipev"
                       " on %d ranks %5.2f; 1f1b (p-1)(F+B) %5.2f, zb1p (p-1)(F+B-2W) %5.2f\n",
                       p, m, w, formula, p / 2, v, (p - 1) * (3 + w), (p - 1) * (3 - w));
                pp_schedule_free(s);
            }
    printf("largest |idle - formula|: %.1e\n", worst);
}
END_TEST

/* Two copies: rank r computes copy 0's stage r (chunk 0, virtual stage r) and copy 1's
 * stage p-1-r (chunk 1, virtual 2p-1-r), so every stage of the model sits on two ranks
 * and a rank holds 2 of p stages' parameters: 2x 1F1B's. Micro-batches enter at both
 * ends: rank 0's first pass is micro-batch 0's, rank p-1's micro-batch m/2's. */
START_TEST(two_copies_fed_from_both_ends) {
    const int p = 8, m = 16;
    pp_schedule *s = pp_dualpipe_make(p, m, PP_COMM_ORDERED);
    int held[8] = {0};   /* ranks holding each model stage */
    for (int r = 0; r < p; r++) {
        int seen[2] = {0, 0};
        for (int i = 0; i < s->ranks[r].count; i++) {
            const pp_op *op = &s->ranks[r].ops[i];
            if (!pp_op_is_compute(op->kind)) continue;
            ck_assert_int_eq(op->chunk, op->micro >= m / 2);   /* a direction, a copy */
            seen[op->chunk] = 1;
        }
        ck_assert(seen[0] && seen[1]);
        held[r]++;
        held[p - 1 - r]++;
        const pp_op *first = &s->ranks[r].ops[0];
        if (r == 0) ck_assert(first->kind == PP_FORWARD && first->micro == 0);
        if (r == p - 1) ck_assert(first->kind == PP_FORWARD && first->micro == m / 2);
    }
    for (int k = 0; k < p; k++) ck_assert_int_eq(held[k], 2);
    printf("dualpipe p %d: every stage on 2 ranks, 2 stages of %d a rank (2x 1f1b's"
           " parameters); rank 0 starts micro-batch 0, rank %d micro-batch %d\n", p, p, p - 1,
           m / 2);
    pp_schedule_free(s);
}
END_TEST

/* F&B overlapped: the end ranks run fewest pairs; the idle spreads by rank, symmetric. */
START_TEST(overlapped_fb_is_symmetric) {
    const int p = 8, m = 32;
    pp_schedule *s = pp_dualpipe_make(p, m, PP_COMM_ORDERED);
    pp_sim_options o = times(1.5, 0);
    o.fb_overlap = 1;
    pp_sim_result res = simulate_checked(s, &o);
    for (int r = 0; r < p; r++) ck_assert(fabs(res.idle[r] - res.idle[p - 1 - r]) <= 1e-9);
    printf("dualpipe p %d m %d, F&B = B: idle %.2f (ends) .. %.2f (middle), formula %.2f\n", p,
           m, res.idle[0], res.idle[p / 2], pp_sim_dualpipe_idle_formula(p, &o));
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}
END_TEST

static int find_op(const pp_schedule *s, int r, pp_op_kind kind, int micro) {
    for (int i = 0; i < s->ranks[r].count; i++)
        if (s->ranks[r].ops[i].kind == kind && s->ranks[r].ops[i].micro == micro) return i;
    return -1;
}

START_TEST(a_dropped_w_swapped_receives_and_bad_sizes_fail) {
    pp_schedule *s = pp_dualpipe_make(4, 8, PP_COMM_ORDERED);
    pp_rank_ops *list = &s->ranks[1];
    int w = 0;
    while (w < list->count && list->ops[w].kind != PP_BACKWARD_WEIGHT) w++;
    ck_assert_int_lt(w, list->count);
    memmove(&list->ops[w], &list->ops[w + 1], (size_t)(list->count - w - 1) * sizeof(pp_op));
    list->count--;
    pp_sim_options o = pp_sim_options_default();
    pp_sim_result res;
    ck_assert(pp_simulate(s, &o, &res));
    char err[256];
    ck_assert(!pp_check_dependencies(s, res.spans, res.nspans, err, sizeof err));
    printf("dualpipe without rank 1's first W: %s\n", err);
    pp_sim_result_free(&res);
    pp_schedule_free(s);
    s = pp_dualpipe_make(4, 8, PP_COMM_ORDERED);   /* copy 1's receives on rank 2 */
    const int a = find_op(s, 2, PP_RECV_ACT, 4), b = find_op(s, 2, PP_RECV_ACT, 5);
    ck_assert(a >= 0 && b >= 0);
    s->ranks[2].ops[a].micro = 5;
    s->ranks[2].ops[b].micro = 4;
    ck_assert(!pp_simulate(s, &o, &res));
    printf("dualpipe with rank 2's receives of micro-batches 4 and 5 swapped: %.100s...\n",
           res.error);
    pp_sim_result_free(&res);
    pp_schedule_free(s);
    const int bad[][2] = {{3, 6}, {4, 6}, {4, 9}, {1, 2}};   /* p odd, m < 2p, m odd, p 1 */
    for (int i = 0; i < 4; i++) {
        ck_assert(!pp_dualpipe_validate(bad[i][0], bad[i][1], 16, 144, err, sizeof err));
        printf("p %d m %d: %s\n", bad[i][0], bad[i][1], err);
    }
    ck_assert(pp_dualpipe_validate(4, 8, 16, 60, err, sizeof err) == 0);   /* 60 % 8 */
    ck_assert(pp_dualpipe_validate(4, 8, 16, 64, err, sizeof err) == 1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pp_dualpipe");
    TCase *tc = tcase_create("simulator");
    tcase_add_test(tc, every_rank_idles_the_formula_at_its_assumptions);
    tcase_add_test(tc, two_copies_fed_from_both_ends);
    tcase_add_test(tc, overlapped_fb_is_symmetric);
    tcase_add_test(tc, a_dropped_w_swapped_receives_and_bad_sizes_fail);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
