#include "plan_restart.h"

#include <math.h>

double plan_llama3_gpu_mtbf_hours(void) {
    return (double)PLAN_LLAMA3_DAYS * 24 * PLAN_LLAMA3_GPUS / PLAN_LLAMA3_INTERRUPTIONS;
}

double plan_llama3_save_bandwidth_per_gpu(void) {
    return PLAN_LLAMA3_STORAGE_BYTES_PER_S / PLAN_LLAMA3_GPUS;
}

double plan_checkpoint_bytes(double params) {
    return 12 * params;   /* fp32 weights 4 + Adam m 4 + v 4 */
}

double plan_job_mtbf_seconds(double gpu_mtbf_hours, int gpus) {
    return 3600 * gpu_mtbf_hours / gpus;
}

double plan_young_interval(double save_seconds, double mtbf_seconds) {
    return sqrt(2 * save_seconds * mtbf_seconds);
}

plan_checkpointing plan_checkpointing_at(const plan_failures *f, double interval) {
    plan_checkpointing c = {.interval = interval};
    c.lost_per_failure = interval / 2 + f->restart_seconds;
    c.saving_fraction = f->save_seconds / interval;
    c.failure_fraction = c.lost_per_failure / f->mtbf_seconds;
    c.lost_fraction = c.saving_fraction + c.failure_fraction;
    return c;
}

plan_checkpointing plan_checkpointing_optimal(const plan_failures *f) {
    return plan_checkpointing_at(f, plan_young_interval(f->save_seconds, f->mtbf_seconds));
}
