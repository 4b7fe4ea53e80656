/* Chapter 4 on Open MPI processes (mpirun -np 1..4): every schedule that fits the
 * world size against the single-device baseline (a send and its receive now cross
 * processes), and the negative control. World rank 0's process judges (check_expect),
 * every process waits for its verdict (check_agree). Tolerances as test_chapter4.c. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_run.h"
#include "pp_execute.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "tp_train.h"

static run_config small_config(void) {
    run_config cfg = small_model_config(8, check_world_size());
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

START_TEST(every_schedule_matches_the_baseline) {
    const int N = check_world_size();
    dataset *d = dataset_builtin();
    run_config cfg = small_config();
    baseline_run *b = process_hosts_rank0() ? baseline_train(&cfg, d) : NULL;
    check_verdict v = {0};
    for (int kind = 0; kind < PP_NSCHEDULES; kind++) {
        const int m = kind == PP_NAIVE ? 1 : kind == PP_DUALPIPE_V ? 2 * N : 4;   /* m >= 2p */
        const int chunks = pp_schedule_chunks(kind, 2);
        char why[256];
        if (!pp_validate(kind, N, m, chunks, cfg.model.layers, cfg.batch, why, sizeof why))
            continue;   /* interleaved at -np 1 and 3: m = 4 is no multiple of p; dualpipev
                           at -np 3: m = 6 does not divide the batch */
        pipeline_options opts = {.schedule = kind, .micro = m, .chunks = chunks};
        pp_result *o = launch_pp(&cfg, d, 0, opts, b);
        if (b) {
            const run_result *r = &o->run.result;
            printf("mpi %-15s p=%d m=%d: max |diff| loss %.2e grads %.2e params %.2e\n",
                   r->strategy, N, m, r->diff_loss, r->diff_grads, r->diff_params);
            check_expect(&v, r->diff_grads <= PP_TOL_GRADS);
            check_expect(&v, r->diff_loss <= PP_TOL_LOSS);
            check_expect(&v, r->diff_params <= PP_TOL_PARAMS);
            check_expect(&v, o->x.tied_drift == 0.0);
        }
        pp_result_free(o);
    }
    check_agree(&v);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* The V-shaped schedules across processes: zb-v at m = p and 2p, dualpipev at 2p and 4p
 * (DeepSeek's DualPipeV refuses m < 2p), fp32 and bf16 (the pipelines' 16-bit bounds, as
 * test_pp_vshape). 2p layers, a batch of 16. */
START_TEST(the_v_shapes_match_the_baseline) {
    const int N = check_world_size();
    const pp_schedule_kind kinds[] = {PP_ZB_V, PP_DUALPIPE_V};
    const precision precisions[] = {PRECISION_FP32, PRECISION_BF16};
    dataset *d = dataset_builtin();
    check_verdict v = {0};
    for (int i = 0; i < 2; i++) {
        run_config cfg = small_model_config(2 * N, N);
        cfg.comm.timeout_seconds = 60;
        cfg.batch = 16;
        cfg.precision = precisions[i];
        baseline_run *b = process_hosts_rank0() ? baseline_train(&cfg, d) : NULL;
        const run_tolerances t = b ? tp_run_tolerances(&cfg, 1, b) : (run_tolerances){0};
        for (int k = 0; k < 2; k++) {
            const int least = kinds[k] == PP_DUALPIPE_V ? 2 * N : N;
            for (int m = least; m <= 2 * least; m *= 2) {
                pp_result *o = launch_pp(&cfg, d, 0, (pipeline_options){
                    .schedule = kinds[k], .micro = m, .chunks = 2}, b);
                if (b) {
                    const run_result *r = &o->run.result;
                    printf("mpi %-12s %s p=%d m=%2d: max |diff| loss %.2e grads %.2e params"
                           " %.2e (bounds %.0e %.0e %.0e)\n", r->strategy,
                           precision_name(cfg.precision), N, m, r->diff_loss, r->diff_grads,
                           r->diff_params, t.loss, t.grads, t.params);
                    check_expect(&v, r->diff_grads <= t.grads && r->diff_loss <= t.loss &&
                                         r->diff_params <= t.params && o->x.tied_drift == 0);
                }
                pp_result_free(o);
            }
        }
        baseline_free(b);
    }
    check_agree(&v);
    dataset_free(d);
}
END_TEST

/* A planted fault must take the gradients far from the baseline's (world rank 0 judges). */
static void expect_fault_fails(const run_config *cfg, pipeline_options opts, const char *what) {
    dataset *d = dataset_builtin();
    baseline_run *b = process_hosts_rank0() ? baseline_train(cfg, d) : NULL;
    check_verdict v = {0};
    pp_result *o = launch_pp(cfg, d, 0, opts, b);
    if (b) {
        printf("mpi %s: grads differ by %.2e\n", what, o->run.result.diff_grads);
        check_expect(&v, o->run.result.diff_grads > 100 * PP_TOL_GRADS);
    }
    pp_result_free(o);
    check_agree(&v);
    baseline_free(b);
    dataset_free(d);
}

/* The control of the V-shapes' comparison: dualpipev with rank 0's first W left out. */
START_TEST(dualpipev_without_a_w_fails) {
    const int N = check_world_size();
    run_config cfg = small_model_config(2 * N, N);
    cfg.comm.timeout_seconds = 60;
    cfg.batch = 16;
    expect_fault_fails(&cfg, (pipeline_options){.schedule = PP_DUALPIPE_V, .micro = 2 * N,
                       .chunks = 2, .fault = PIPELINE_FAULT_DROP_WEIGHT_PASS},
                       "dualpipev without rank 0's first W");
}
END_TEST

START_TEST(a_dropped_activation_gradient_fails) {
    const run_config cfg = small_config();
    expect_fault_fails(&cfg, (pipeline_options){.schedule = PP_1F1B, .micro = 4, .chunks = 1,
                       .fault = PIPELINE_FAULT_DROP_INPUT_GRAD}, "1f1b, zeros as one d(input)");
}
END_TEST

/* A message far over Open MPI's eager limit (4 KB by default, 256 KB through ./run)
 * moves only while its sender is inside an MPI call. Rank 0 sends 1 MB to rank 1, then
 * waits out a modelled pass of 400 ms; rank 1's receive must end before the pass does
 * (without comm_progress in the wait it ended with the pass). An order of two moments
 * on the machine's one monotonic clock, not a bound on a duration. */
enum { LARGE_FLOATS = 1 << 18 };
static const double modelled_pass_seconds = 0.4;

typedef struct { double received_at, pass_ended_at; } pass_moments;

static int send_during_pass_main(comm *world, void *arg) {
    pass_moments *at = arg;
    float *buf = calloc(LARGE_FLOATS, sizeof *buf);
    double mine[2] = {0, 0};   /* rank 1's receive, rank 0's pass: the others leave 0 */
    comm_barrier(world);
    const double start = comm_now();
    if (comm_rank(world) == 0) {
        comm_send(world, buf, LARGE_FLOATS, COMM_F32, 1, 7);
        pp_compute_model_wait(world, start + modelled_pass_seconds);
        mine[1] = comm_now() - start;
    } else if (comm_rank(world) == 1) {
        comm_recv(world, buf, LARGE_FLOATS, COMM_F32, 0, 7);
        mine[0] = comm_now() - start;
    }
    comm_allreduce(world, mine, 2, COMM_F64, COMM_MAX);
    *at = (pass_moments){mine[0], mine[1]};
    free(buf);
    return 0;
}

START_TEST(a_large_send_moves_while_its_sender_waits_out_a_pass) {
    run_config cfg = small_config();
    pass_moments at = {-1, -1};
    ck_assert_int_eq(launch(&cfg.comm, send_during_pass_main, &at), 0);
    check_verdict v = {0};
    if (process_hosts_rank0()) {
        printf("mpi: 1 MB received %.1f ms after it was sent; its sender's %.0f ms pass ended"
               " at %.1f ms (the receive must end first)\n", 1e3 * at.received_at,
               1e3 * modelled_pass_seconds, 1e3 * at.pass_ended_at);
        check_expect(&v, at.received_at > 0 && at.received_at < at.pass_ended_at);
    }
    check_agree(&v);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mpi_chapter4");
    TCase *tc = tcase_create("pipeline");
    tcase_add_test(tc, every_schedule_matches_the_baseline);
    check_add_test_where(tc, the_v_shapes_match_the_baseline,
                         check_world_size() == 2 || check_world_size() == 4,
                         "p = 2 and 4, as test_pp_vshape");
    check_add_test_where(tc, dualpipev_without_a_w_fails, check_world_size() == 2,
                         "the control, on 2 processes");
    check_add_test_where(tc, a_dropped_activation_gradient_fails, check_world_size() >= 2,
                         "one stage sends no input gradient");
    check_add_test_where(tc, a_large_send_moves_while_its_sender_waits_out_a_pass,
                         check_world_size() >= 2, "a send needs two ranks");
    suite_add_tcase(s, tc);
    return check_run(s, 1);
}
