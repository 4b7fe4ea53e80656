/* Chapter 10 on a GPU machine (moe_chapter_device), checked on the host, where no GPU is
 * needed: the MoE layer's routing reads the activations on the host, so
 *   - --device cuda (asked by name) is refused in one line that names the flag and what
 *     to give instead, and the run's device is left as it was;
 *   - a GPU that --device auto found (the default; asked "auto" or not given) is set
 *     aside: the chapter runs on the CPU rather than failing a run nobody asked onto a
 *     GPU;
 *   - on the CPU nothing changes. */
#include <check.h>
#include <string.h>

#include "check_run.h"
#include "moe_chapter.h"

static run_config on(device_kind device) {
    run_config cfg = run_config_default();
    cfg.comm.device = device;
    return cfg;
}

START_TEST(cuda_by_name_is_refused_in_one_line) {
    run_config cfg = on(DEVICE_CUDA);
    const char *why = moe_chapter_device(&cfg, "cuda");
    ck_assert_ptr_nonnull(why);
    printf("  the refusal: %s\n", why);
    ck_assert(strncmp(why, "--device cuda: ", 15) == 0);
    ck_assert_ptr_nonnull(strstr(why, "--device cpu"));
    ck_assert_ptr_null(strchr(why, '\n'));
    ck_assert_int_eq(cfg.comm.device, DEVICE_CUDA);
}
END_TEST

START_TEST(auto_gpu_runs_on_the_cpu) {
    const char *asked[] = {NULL, "auto"};
    for (int i = 0; i < 2; i++) {
        run_config cfg = on(DEVICE_CUDA);
        ck_assert_ptr_null(moe_chapter_device(&cfg, asked[i]));
        ck_assert_int_eq(cfg.comm.device, DEVICE_CPU);
    }
    run_config cpu = on(DEVICE_CPU);
    ck_assert_ptr_null(moe_chapter_device(&cpu, "cpu"));
    ck_assert_int_eq(cpu.comm.device, DEVICE_CPU);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter10_device");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, cuda_by_name_is_refused_in_one_line);
    tcase_add_test(tc, auto_gpu_runs_on_the_cpu);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
