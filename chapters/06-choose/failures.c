/* The planner's last section: how often the job fails, how long a save takes, how often
 * to save (Young's interval) and what the failures cost. The formulas are
 * common/plan/plan_restart.h's. */
#include <stdio.h>

#include "planner.h"
#include "report.h"

static double planned_params(const plan_request *r) {
    return r->moe.experts > 0 ? plan_moe_total_params(&r->model, &r->moe) : plan_params(&r->model);
}

/* Every GPU writes its share at once, as sharded checkpoints are written. */
static double save_bandwidth_of_job(const plan_request *r) {
    return r->cluster.gpus * r->failures.save_bandwidth;
}

plan_failures plan_failures_of(const plan_request *r) {
    const plan_failure_inputs *in = &r->failures;
    plan_failures f = {.mtbf_seconds = plan_job_mtbf_seconds(in->gpu_mtbf_hours, r->cluster.gpus)};
    f.save_seconds = in->save_seconds > 0
                         ? in->save_seconds
                         : plan_checkpoint_bytes(planned_params(r)) / save_bandwidth_of_job(r);
    /* loading reads back what the save wrote, at the same rate */
    f.restart_seconds = in->restart_seconds >= 0 ? in->restart_seconds : f.save_seconds;
    return f;
}

/* "0.0102 s", "16.8 s", "40.7 min", "49.5 h", "5.8 days" */
static const char *duration(double seconds, char buf[32]) {
    if (seconds < 10) snprintf(buf, 32, "%.3g s", seconds);
    else if (seconds < 120) snprintf(buf, 32, "%.1f s", seconds);
    else if (seconds < 7200) snprintf(buf, 32, "%.1f min", seconds / 60);
    else if (seconds < 100 * 3600) snprintf(buf, 32, "%.1f h", seconds / 3600);
    else snprintf(buf, 32, "%.1f days", seconds / 86400);
    return buf;
}

static void print_save(const plan_request *r, const plan_failures *f) {
    const double params = planned_params(r), bytes = plan_checkpoint_bytes(params);
    char size[32], rate[32], save[32];
    printf("  a checkpoint: 12 B x %.4g parameters (fp32 weights, Adam m and v) = %s;",
           params, report_bytes(bytes, size));
    if (r->failures.save_seconds > 0)
        printf(" a save takes %s (--save-seconds)\n", duration(f->save_seconds, save));
    else
        printf(" %d GPUs write\n  their shares at %.3g GB/s each (%s/s in all): %s a save\n",
               r->cluster.gpus, r->failures.save_bandwidth / 1e9,
               report_bytes(save_bandwidth_of_job(r), rate), duration(f->save_seconds, save));
}

static void print_mtbf(const plan_request *r, const plan_failures *f) {
    char job[32];
    if (r->failures.mtbf_given == 2)
        printf("  the job fails every %s on average (--mtbf-hours; one GPU every %.0f hours)\n",
               duration(f->mtbf_seconds, job), r->failures.gpu_mtbf_hours);
    else
        printf("  one GPU fails every %.0f GPU-hours%s,\n  so %d GPUs fail every %s\n",
               r->failures.gpu_mtbf_hours,
               r->failures.mtbf_given ? " (--gpu-mtbf-hours)"
                                      : " (Llama 3: 419 interruptions in 54 days on 16,384 H100s)",
               r->cluster.gpus, duration(f->mtbf_seconds, job));
}

/* The fraction lost around Young's interval: its minimum. */
static void print_intervals(const plan_failures *f, double optimal) {
    static const double factors[] = {0.25, 0.5, 1, 2, 4};
    char t[32];
    printf("  %-24s", "save every");
    for (int i = 0; i < 5; i++) printf(" %10s", duration(factors[i] * optimal, t));
    printf("\n  %-24s", "run lost");
    for (int i = 0; i < 5; i++)
        printf(" %9.3g%%", 100 * plan_checkpointing_at(f, factors[i] * optimal).lost_fraction);
    printf("\n");
}

void failures_print(const plan_request *r) {
    const plan_failures f = plan_failures_of(r);
    const plan_checkpointing c = plan_checkpointing_optimal(&f);
    char t[6][32];
    printf("\nCheckpoints and failures (Young 1974's interval, first order: Daly 2006's"
           " higher-order terms left out):\n");
    print_save(r, &f);
    print_mtbf(r, &f);
    printf("  save every sqrt(2 x %s x %s) = %s of work; a failure then loses %s on average\n"
           "  (half an interval) + %s to restart (%s) = %s\n",
           duration(f.save_seconds, t[0]), duration(f.mtbf_seconds, t[1]),
           duration(c.interval, t[2]), duration(c.interval / 2, t[3]),
           duration(f.restart_seconds, t[4]),
           r->failures.restart_seconds >= 0 ? "--restart-seconds" : "loading the checkpoint",
           duration(c.lost_per_failure, t[5]));
    printf("  the run loses %.3g%% saving + %.3g%% to failures = %.3g%% of its time"
           " (sqrt(2 save / MTBF) + restart / MTBF)\n", 100 * c.saving_fraction,
           100 * c.failure_fraction, 100 * c.lost_fraction);
    print_intervals(&f, c.interval);
}

void failures_print_json(const plan_request *r) {
    const plan_failures f = plan_failures_of(r);
    const plan_checkpointing c = plan_checkpointing_optimal(&f);
    printf(",\n \"checkpoint\": {\"bytes\": %.0f, \"save_seconds\": %.6g,"
           " \"save_bandwidth_per_gpu\": %.6g, \"gpu_mtbf_hours\": %.6g, \"job_mtbf_seconds\": %.6g,"
           " \"restart_seconds\": %.6g,\n  \"interval_seconds\": %.6g,"
           " \"lost_per_failure_seconds\": %.6g, \"saving_fraction\": %.6g,"
           " \"failure_fraction\": %.6g, \"lost_fraction\": %.6g}",
           plan_checkpoint_bytes(planned_params(r)), f.save_seconds, r->failures.save_bandwidth,
           r->failures.gpu_mtbf_hours, f.mtbf_seconds, f.restart_seconds, c.interval,
           c.lost_per_failure, c.saving_fraction, c.failure_fraction, c.lost_fraction);
}
