/* Chapter 6's checkpoint interval (common/plan/plan_restart.h and the planner's
 * failures.c): Young's sqrt(2 x save x MTBF), the time a failure loses and the fraction
 * of the run lost, against cases computed by hand here, Llama 3's failure rate and the
 * course's GPT-3 on 1024 GPUs; that Young's interval is the minimum of the loss; and a
 * negative control: an interval off by the formula's factor of 2 is caught. */
#include <check.h>
#include <math.h>
#include <stdio.h>

#include "../chapters/06-choose/planner.h"
#include "by_hand.h"
#include "check_run.h"

START_TEST(young_interval_and_losses_by_hand) {
    worst = 0;
    /* save 10 s, a failure every 5 h, 30 s to restart: T = sqrt(2 x 10 x 18000) = 600 s;
     * a failure loses 300 + 30 s; saving 10/600, failures 330/18000: 0.035 of the run */
    const plan_failures f = {.save_seconds = 10, .mtbf_seconds = 18000, .restart_seconds = 30};
    const plan_checkpointing c = plan_checkpointing_optimal(&f);
    EXACT(c.interval, 600);
    EXACT(c.lost_per_failure, 330);
    EXACT(c.saving_fraction, 1.0 / 60);
    EXACT(c.failure_fraction, 330.0 / 18000);
    EXACT(c.lost_fraction, 0.035);
    /* at the optimum: sqrt(2 save / MTBF) + restart / MTBF */
    EXACT(c.lost_fraction, sqrt(2 * 10 / 18000.0) + 30 / 18000.0);
    /* saving every 1200 s instead: 10/1200 + 630/18000 */
    EXACT(plan_checkpointing_at(&f, 1200).lost_fraction, 10 / 1200.0 + 630 / 18000.0);
    /* a checkpoint is 12 B a parameter */
    EXACT(plan_checkpoint_bytes(1e9), 12e9);
    printf("Young's interval by hand: largest relative difference %.3g (tolerance %g)\n", worst,
           TOLERANCE);
}
END_TEST

START_TEST(young_interval_is_the_least_loss) {
    const plan_failures f = {.save_seconds = 16.7, .mtbf_seconds = 178161, .restart_seconds = 16.7};
    const plan_checkpointing best = plan_checkpointing_optimal(&f);
    double least_other = INFINITY;
    for (double factor = 0.5; factor <= 2.0; factor += 0.01) {
        if (fabs(factor - 1) < 1e-9) continue;
        const double lost = plan_checkpointing_at(&f, factor * best.interval).lost_fraction;
        ck_assert_msg(lost > best.lost_fraction, "saving every %.3g x T loses %.6g <= %.6g",
                      factor, lost, best.lost_fraction);
        least_other = fmin(least_other, lost);
    }
    printf("Young's interval loses %.6g of the run; the least at 0.5-2x it otherwise %.6g\n",
           best.lost_fraction, least_other);
}
END_TEST

START_TEST(llama3_rate_and_the_courses_gpt3) {
    worst = 0;
    /* Llama 3: 419 interruptions in 54 days on 16384 GPUs: 54 x 24 x 16384 / 419 GPU-hours,
     * the job's MTBF 54 x 24 / 419 h; storage 2 TB/s over 16384 GPUs */
    EXACT(plan_llama3_gpu_mtbf_hours(), 21233664.0 / 419);
    EXACT(plan_job_mtbf_seconds(plan_llama3_gpu_mtbf_hours(), 16384), 3600 * 1296.0 / 419);
    EXACT(plan_llama3_save_bandwidth_per_gpu(), 2e12 / 16384);
    /* GPT-3 175B (96 x 12288, V 51200, s 2048) on the course's 1024 GPUs: 174615822336
     * parameters, 2095389868032 B of checkpoint over 1024 x 2e12 / 16384 B/s */
    plan_request r = {.model = {.layers = 96, .hidden = 12288, .heads = 96, .vocab = 51200,
                                .seq = 2048},
                      .cluster = {.gpus = 1024},
                      .failures = {.gpu_mtbf_hours = plan_llama3_gpu_mtbf_hours(),
                                   .save_bandwidth = plan_llama3_save_bandwidth_per_gpu(),
                                   .restart_seconds = -1}};
    const plan_failures f = plan_failures_of(&r);
    const double save = 2095389868032.0 / (1024 * 2e12 / 16384);
    const double mtbf = 3600 * 21233664.0 / 419 / 1024;
    EXACT(f.save_seconds, save);
    EXACT(f.mtbf_seconds, mtbf);
    EXACT(f.restart_seconds, save);   /* loading the checkpoint, at the save's rate */
    const plan_checkpointing c = plan_checkpointing_optimal(&f);
    EXACT(c.interval, sqrt(2 * save * mtbf));
    EXACT(c.lost_per_failure, sqrt(2 * save * mtbf) / 2 + save);
    printf("GPT-3 on 1024 GPUs: save %.4g s, MTBF %.4g h, save every %.4g min, %.4g min lost a"
           " failure, %.3g%% of the run; largest relative difference %.3g (tolerance %g)\n",
           f.save_seconds, f.mtbf_seconds / 3600, c.interval / 60, c.lost_per_failure / 60,
           100 * c.lost_fraction, worst, TOLERANCE);
    /* given as the job's or with a save time, those are taken as they are */
    r.failures.save_seconds = 60;
    r.failures.restart_seconds = 600;
    const plan_failures given = plan_failures_of(&r);
    EXACT(given.save_seconds, 60);
    EXACT(given.restart_seconds, 600);
    /* an MoE's checkpoint holds all its experts: 12 B x its total parameters */
    r.moe = (plan_moe){.experts = 16, .top_k = 2, .every = 1, .expert_ffn = 4 * 12288};
    r.failures.save_seconds = -1;
    EXACT(plan_failures_of(&r).save_seconds,
          plan_checkpoint_bytes(plan_moe_total_params(&r.model, &r.moe)) / (1024 * 2e12 / 16384));
}
END_TEST

/* Negative control: Young's interval without its factor 2, or the loss without the
 * restart, differ from the hand values by more than the tolerance. */
START_TEST(an_interval_off_by_the_factor_2_is_caught) {
    const plan_failures f = {.save_seconds = 10, .mtbf_seconds = 18000, .restart_seconds = 30};
    const plan_checkpointing c = plan_checkpointing_optimal(&f);
    const double no_two = sqrt(10 * 18000.0), no_restart = c.interval / 2;
    ck_assert(!agrees(no_two, c.interval));
    ck_assert(!agrees(no_restart, c.lost_per_failure));
    printf("negative control: sqrt(save x MTBF) = %.4g s against Young's %.4g s, and T/2 = %g s"
           " against %g s lost a failure: both caught\n", no_two, c.interval, no_restart,
           c.lost_per_failure);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter6_failures");
    TCase *formulas = tcase_create("formulas");
    tcase_add_test(formulas, young_interval_and_losses_by_hand);
    tcase_add_test(formulas, young_interval_is_the_least_loss);
    tcase_add_test(formulas, llama3_rate_and_the_courses_gpt3);
    tcase_add_test(formulas, an_interval_off_by_the_factor_2_is_caught);
    suite_add_tcase(suite, formulas);
    return check_run(suite, 0);
}
