/* Checkpoints on Open MPI processes (mpirun -np 1..4): every layout that N processes
 * can form saves its pieces (each process its own file) and every one loads them back
 * exactly, resharding between ZeRO-3, ZeRO-1, DDP, TP x DP, PP x DP and TP x PP;
 * a negative control must fail. In mixed precision, ZeRO 0-3 in bf16 and ZeRO-2 in
 * fp16 (its loss scale moved off its start by a forced overflow) saved at step 2 of 4
 * and resumed end bit-identical to the uninterrupted run. Every process gets the same largest difference (an
 * all-reduce over the ranks), so all leave a failed test at the same assertion. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_run.h"
#include "checkpoint.h"
#include "checkpoint_layouts.h"
#include "compare.h"
#include "zero_train.h"

static run_config tiny_config(void) {
    run_config cfg = layout_tiny_config();
    cfg.comm.ranks = check_world_size();
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

/* The layouts of exactly n ranks. */
static int layouts_of(int n, layout_spec *out) {
    int count = 0;
    out[count++] = (layout_spec){"zero3", 1, 1, n, 1, 1};
    out[count++] = (layout_spec){"zero1", 1, 1, n, 0, 1};
    out[count++] = (layout_spec){"ddp", 1, 1, n, 0, 0};
    if (n % 2 == 0) {
        out[count++] = (layout_spec){"tp2 x dp", 2, 1, n / 2, 0, 0};
        out[count++] = (layout_spec){"pp2 x dp zero1", 1, 2, n / 2, 0, 1};
    }
    if (n == 4) out[count++] = (layout_spec){"tp2 x pp2", 2, 2, 1, 0, 0};
    return count;
}

/* One directory for all processes of the job: they are children of the same daemon. */
static void scratch(char *path, size_t len, const char *name) {
    ckpt_fits(snprintf(path, len, "/tmp/test_mpi_checkpoint.%d.%s", (int)getppid(), name), len);
}

START_TEST(every_layout_of_the_job_loads_into_every_other) {
    const int N = check_world_size();
    run_config cfg = tiny_config();
    layout_spec layouts[8];
    const int count = layouts_of(N, layouts);
    char dirs[8][256];
    for (int a = 0; a < count; a++) {
        char name[32];
        snprintf(name, sizeof name, "layout-%d", a);
        scratch(dirs[a], sizeof dirs[a], name);
        layout_save(&layouts[a], &cfg, dirs[a], 31, 0);
    }
    float worst = 0;
    for (int a = 0; a < count; a++) {
        for (int b = 0; b < count; b++) {
            const float d = layout_load(&layouts[b], &cfg, dirs[a], 31);
            if (process_hosts_rank0())
                printf("mpi %d processes: %-15s -> %-15s largest difference %g (tolerance 0)\n",
                       N, layouts[a].name, layouts[b].name, d);
            if (d > worst) worst = d;
        }
    }
    const float control = layout_load(&layouts[0], &cfg, dirs[count - 1], 32);
    if (process_hosts_rank0())
        printf("mpi negative control: seed 31's checkpoint against seed 32's values: %g\n",
               control);
    if (process_hosts_rank0())
        for (int a = 0; a < count; a++) {
            char cmd[300];
            ckpt_fits(snprintf(cmd, sizeof cmd, "rm -rf %s", dirs[a]), sizeof cmd);
            if (system(cmd) != 0) worst = 1;
        }
    ck_assert_float_eq(worst, 0);
    ck_assert_float_gt(control, 1e-3f);
}
END_TEST

/* ---- mixed precision: save at step 2 of 4, resume ---------------------------------- */

typedef struct {
    float loss[4], loss_scale;
    int steps, skipped_steps;
    float *masters;   /* all of it: world rank 0's process only (NULL elsewhere) */
} zero_copy;

static zero_copy train_zero(const run_config *cfg, const dataset *d, int stage) {
    strategy_outcome o = {.extra = calloc(1, sizeof(zero_extra))};
    const zero_options opts = {.stage = stage};
    ck_assert_int_eq(zero_launch(cfg, d, &opts, &o), 0);
    zero_copy c = {.steps = o.result.steps, .loss_scale = o.result.loss_scale,
                   .skipped_steps = o.result.skipped_steps};
    ck_assert_int_le(c.steps, 4);
    if (process_hosts_rank0()) {
        memcpy(c.loss, o.loss, (size_t)c.steps * sizeof(float));
        c.masters = malloc(o.num_params * sizeof(float));
        memcpy(c.masters, o.final_params, o.num_params * sizeof(float));
    }
    free(o.extra);
    o.extra = NULL;
    strategy_outcome_free(&o);
    return c;
}

/* 1 when steps 3-4, the final masters and the loss scale's end of the resumed run are
 * the uninterrupted run's, bit for bit (world rank 0's process judges; the others say 1
 * and learn the verdict from check_agree). */
static int resumed_is_uninterrupted(const run_config *cfg, const dataset *d, int stage,
                                    const char *name) {
    char dir[256];
    scratch(dir, sizeof dir, name);
    run_config first = *cfg, second = *cfg;
    first.steps = 2;
    first.save_dir = dir;
    second.resume_dir = dir;
    zero_copy full = train_zero(cfg, d, stage), head = train_zero(&first, d, stage);
    zero_copy resumed = train_zero(&second, d, stage);
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    const size_t P = gpt_num_params(&whole);
    int same = 1;   /* judged where the outcome is: world rank 0's process */
    if (process_hosts_rank0()) {
        same = resumed.steps == 2 && resumed.loss_scale == full.loss_scale &&
               resumed.skipped_steps == full.skipped_steps &&
               memcmp(resumed.loss, full.loss + 2, 2 * sizeof(float)) == 0 &&
               memcmp(resumed.masters, full.masters, P * sizeof(float)) == 0;
        printf("mpi %d processes, %s zero%d: steps 3-4 loss %.9g %.9g (uninterrupted %.9g"
               " %.9g), masters differ by %g, loss scale %g / %g, skipped %d / %d: %s\n",
               check_world_size(), precision_name(cfg->precision), stage, resumed.loss[0],
               resumed.loss[1], full.loss[2], full.loss[3],
               max_abs_diff(resumed.masters, full.masters, P), (double)resumed.loss_scale,
               (double)full.loss_scale, resumed.skipped_steps, full.skipped_steps,
               same ? "bit-identical" : "DIFFERENT");
        char cmd[300];
        ckpt_fits(snprintf(cmd, sizeof cmd, "rm -rf %s", dir), sizeof cmd);
        if (system(cmd) != 0) same = 0;
    }
    free(full.masters);
    free(head.masters);
    free(resumed.masters);
    return same;
}

START_TEST(mixed_precision_resumes_bit_identically) {
    run_config cfg = tiny_config();
    cfg.steps = 4;
    cfg.precision = PRECISION_BF16;
    dataset *d = dataset_builtin();
    check_verdict v = {0};
    for (int stage = 0; stage <= 3; stage++) {
        char name[32];
        snprintf(name, sizeof name, "bf16-zero%d", stage);
        check_expect(&v, resumed_is_uninterrupted(&cfg, d, stage, name));
    }
    cfg.precision = PRECISION_FP16;
    cfg.loss_scale_init = 1048576;
    cfg.test_overflow_step = 1;
    check_expect(&v, resumed_is_uninterrupted(&cfg, d, 2, "fp16-zero2"));
    dataset_free(d);
    check_agree(&v);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("mpi_checkpoint");
    TCase *tc = tcase_create("mpi_checkpoint");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_layout_of_the_job_loads_into_every_other);
    tcase_add_test(tc, mixed_precision_resumes_bit_identically);
    suite_add_tcase(suite, tc);
    return check_run(suite, 1);
}
