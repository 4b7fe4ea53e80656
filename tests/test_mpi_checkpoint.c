/* Checkpoints on Open MPI processes (mpirun -np 1..4): every layout that N processes
 * can form saves its pieces (each process its own file) and every one loads them back
 * exactly, resharding between ZeRO-3, ZeRO-1, DDP, TP x DP, PP x DP and TP x PP;
 * a negative control must fail. Every process gets the same largest difference (an
 * all-reduce over the ranks), so all leave a failed test at the same assertion. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_run.h"
#include "checkpoint.h"
#include "checkpoint_layouts.h"
#include "compare.h"

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

int main(void) {
    Suite *suite = suite_create("mpi_checkpoint");
    TCase *tc = tcase_create("mpi_checkpoint");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_layout_of_the_job_loads_into_every_other);
    suite_add_tcase(suite, tc);
    return check_run(suite, 1);
}
