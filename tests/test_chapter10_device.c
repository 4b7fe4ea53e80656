/* Chapter 10 on a GPU machine (moe_chapter_device), checked on the host, where no GPU is
 * needed: the MoE layer's routing reads the activations on the host, so --device cuda
 * asked by name is refused in one line that says so, and a GPU that --device auto found
 * is set aside for the CPU (device_cpu_only's rules, tests/test_cpu_only.c). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "moe_chapter.h"

START_TEST(the_moe_chapter_runs_on_the_cpu) {
    run_config cfg = run_config_default();
    cfg.comm.device = DEVICE_CUDA;
    const char *why = moe_chapter_device(&cfg, "cuda");
    ck_assert_ptr_nonnull(why);
    printf("  the refusal: %s\n", why);
    ck_assert_ptr_nonnull(strstr(why, "--device cuda: the MoE layer's routing"));
    ck_assert_int_eq(cfg.comm.device, DEVICE_CUDA);
    ck_assert_ptr_null(moe_chapter_device(&cfg, "auto"));
    ck_assert_int_eq(cfg.comm.device, DEVICE_CPU);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("chapter10_device");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, the_moe_chapter_runs_on_the_cpu);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
