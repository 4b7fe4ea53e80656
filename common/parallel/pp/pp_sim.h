/* An event simulator for pipeline op lists (pp_schedule.h): it runs every rank's list
 * as the ranks would, with modelled pass times, and reports where the time went.
 *
 * Times: a stage's forward of one micro-batch takes `forward`, its backward `backward`
 * (zb-h1: B `backward_input`, W `backward_weight`); a chunk of an interleaved rank holds
 * 1/v of the stage, so its passes take 1/v of those. A message takes link_alpha +
 * message_bytes x link_time_per_byte (0 by default), in the same unit.
 *
 * Sends are unbuffered by default, as NCCL's: a send waits until the receiver has
 * posted the matching receive, and both finish together. Messages between two ranks
 * pair up in the order they are posted, as on NCCL; a receive that pairs with a send of
 * another message (wrong kind, micro-batch or chunk) is an error. When nothing can move
 * the lists have deadlocked: the simulator says which ranks wait in which operation,
 * and returns (it never hangs).
 *
 * Two ways a rank runs its list:
 *   streams (default), as a GPU: passes run in list order on a compute stream, sends
 *     and receives in list order on a communication stream (NCCL's). A pass waits for
 *     the receive that brings its input, a send for the pass that made its data; the
 *     two streams otherwise overlap. A send blocks its stream, not the rank.
 *   sequential, as a CPU rank calling comm_send / comm_recv: one operation at a time,
 *     so a rank in a blocking send or receive computes nothing meanwhile.
 * An F&B pair (DualPipeV) with fb_overlap > 0 on streams starts when both of its
 * inputs are there, lasts T_F + T_B - fb_overlap x min(T_F, T_B) and hands both
 * outputs on at its end; with fb_overlap 0, and always on sequential ranks, it is
 * two passes, one after the other (DualPipe's F&B = F + B). */
#ifndef PP_SIM_H
#define PP_SIM_H
#include "pp_schedule.h"

typedef struct {
    double forward, backward, backward_input, backward_weight;
    double link_alpha, link_time_per_byte, message_bytes;
    int buffered;   /* 1: a send returns at once (the threads backend's default) */
    int sequential; /* 1: one operation at a time (a CPU rank); 0: two streams */
    double fb_overlap;   /* DualPipe's F&B (pp_op.fused) on streams: the part of the
                            shorter pass hidden under the longer, 0..1; 0 (the default):
                            one after the other, as CPU ranks always run them */
} pp_sim_options;

/* forward 1, backward 2, B 1, W 1, free messages, unbuffered sends, streams. */
pp_sim_options pp_sim_options_default(void);

typedef struct {
    int ok;                 /* 0: deadlock or mismatched messages, said in error */
    char error[2048];
    int stages;
    double makespan;        /* when the last rank finished */
    double *busy, *idle;    /* [stages]: computing; the rest of the makespan */
    double bubble_fraction;     /* idle over total rank-time (p x makespan) */
    double bubble_over_ideal;   /* idle over busy */
    pp_span *spans;         /* every op, in the order they completed: a pass from start
                               to end, a send or receive from the moment its rank got
                               there to the moment it completed (waiting included) */
    int nspans;
} pp_sim_result;

/* The papers' idle time per rank for the op times of o (a stage's F, B = backward_input,
 * W = backward_weight, a whole backward `backward`), in o's unit:
 *   naive, gpipe, 1f1b  (p-1)(F + B + W)            interleaved  (p-1)(F + B + W) / v
 *   zb-h1   (p-1)(F + B - W)  (Qi et al. 2023)
 *   zb-v    (p-1) F / 2: zero bubble at T_F = T_B = T_W (Qi et al.) but for the V's fill,
 *           which their picture hides under the next step; holds at equal times only
 *   dualpipev  (PP/2 - 1)(F&B + B - 3W) (DeepSeek), PP = 2p stages, a chunk's F = F/2,
 *           B = (B + W)/2 (whole), W = W/2, F&B = F + B - fb_overlap x min(F, B).
 *           Every rank idles exactly this at its assumptions: F&B = F + B (DeepSeek's
 *           figure draws it so: its F&B hides one chunk's communication under the
 *           other's compute, and these passes carry none), F = B (input), W <= F (the
 *           3 W a rank defers into its waits fit there). With the computations
 *           overlapped (fb_overlap > 0) rank r runs 2m - 3p + r + 1 pairs (rank p-1 one
 *           fewer), so its idle is rank 0's + r (F + B - F&B): no one number fits all.
 * Busy time per rank is m (F + B + W) (less the overlap for dualpipev's pairs). */
double pp_sim_idle_formula(pp_schedule_kind kind, int stages, int micro, int chunks,
                           const pp_sim_options *o);

/* DualPipe (pp_dualpipe_make) on p ranks, PP = p stages of a whole stage's times:
 * (PP/2 - 1)(F&B + B - 3W), F&B = F + B - fb_overlap x min(F, B) as above. */
double pp_sim_dualpipe_idle_formula(int stages, const pp_sim_options *o);

/* Runs the lists. Returns result->ok; free the result with pp_sim_result_free. */
int pp_simulate(const pp_schedule *s, const pp_sim_options *opts, pp_sim_result *result);
void pp_sim_result_free(pp_sim_result *result);

#endif
