/* Parts whose work reads host memory on a GPU machine (device_cpu_only: chapter 12, and
 * chapter 2's ZeRO++), checked on the host, where no GPU is needed:
 *   - --device cuda (asked by name) is refused in one line that names the flag, what
 *     reads host memory and what to give instead; the run's device is left as it was;
 *   - a GPU that --device auto found (asked "auto" or not given) is set aside: the CPU
 *     runs the part rather than failing a run nobody asked onto a GPU;
 *   - on the CPU nothing changes. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "cli_checks.h"

static run_config on(device_kind device) {
    run_config cfg = run_config_default();
    cfg.comm.device = device;
    return cfg;
}

START_TEST(cuda_by_name_is_refused_in_one_line) {
    run_config cfg = on(DEVICE_CUDA);
    char why[256];
    const char *got = device_cpu_only(&cfg, "cuda", "ZeRO++'s block codecs read", why,
                                      sizeof why);
    ck_assert_ptr_eq(got, why);
    printf("  the refusal: %s\n", why);
    ck_assert(strncmp(why, "--device cuda: ZeRO++'s block codecs read host memory", 53) == 0);
    ck_assert_ptr_nonnull(strstr(why, "give --device cpu"));
    ck_assert_ptr_null(strchr(why, '\n'));
    ck_assert_int_eq(cfg.comm.device, DEVICE_CUDA);
}
END_TEST

START_TEST(auto_gpu_runs_on_the_cpu) {
    const char *asked[] = {NULL, "auto"};
    char why[256];
    for (int i = 0; i < 2; i++) {
        run_config cfg = on(DEVICE_CUDA);
        ck_assert_ptr_null(device_cpu_only(&cfg, asked[i], "x reads", why, sizeof why));
        ck_assert_int_eq(cfg.comm.device, DEVICE_CPU);
    }
    run_config cpu = on(DEVICE_CPU);
    ck_assert_ptr_null(device_cpu_only(&cpu, "cpu", "x reads", why, sizeof why));
    ck_assert_int_eq(cpu.comm.device, DEVICE_CPU);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("cpu_only");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, cuda_by_name_is_refused_in_one_line);
    tcase_add_test(tc, auto_gpu_runs_on_the_cpu);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
