/* Checkpoints in mixed precision (--precision bf16|fp16), on thread ranks. What a
 * checkpoint holds is the fp32 masters (with m and v), and its metadata names the
 * precision and fp16's loss scale (scale, clean steps, skipped steps). Saved at step 2
 * of 4 and resumed, the baseline, DDP and ZeRO 0-3 in bf16 end bit-identical to the
 * uninterrupted run (memcmp of the final masters and of the losses of steps 3-4); fp16
 * too once its loss scale continues from the checkpoint; a checkpoint whose metadata
 * has neither (saved before precisions) is fp32 without a loss scale. Each test has a
 * negative control that must fail. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baseline.h"
#include "check_run.h"
#include "checkpoint.h"
#include "checkpoint_layouts.h"
#include "compare.h"
#include "crc32.h"
#include "strategy_runs.h"
#include "zero_train.h"

enum { SAVED_AT = 2, TOTAL = 4 };

/* The one run of a strategy the tests compare: steps run, their losses, the masters. */
typedef struct {
    int steps;
    float loss[TOTAL];
    float *masters;
    size_t num_params;
    float loss_scale;
    int skipped_steps;
} run_copy;

typedef enum { RUN_BASELINE, RUN_DDP, RUN_ZERO } run_kind;

static run_config mixed_config(precision p, int ranks) {
    run_config cfg = layout_tiny_config();
    cfg.precision = p;
    cfg.steps = TOTAL;
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

static void copy_run(run_copy *c, const run_result *r, const float *loss, const float *masters,
                     size_t num_params) {
    c->steps = r->steps;
    ck_assert_int_le(c->steps, TOTAL);
    memcpy(c->loss, loss, (size_t)c->steps * sizeof(float));
    c->num_params = num_params;
    c->masters = malloc(num_params * sizeof(float));
    memcpy(c->masters, masters, num_params * sizeof(float));
    c->loss_scale = r->loss_scale;
    c->skipped_steps = r->skipped_steps;
}

/* Runs kind (ZeRO: that stage) on cfg's ranks and keeps what the tests compare. */
static run_copy train(run_kind kind, int stage, const run_config *cfg, const dataset *d) {
    run_copy c = {0};
    if (kind == RUN_BASELINE) {
        baseline_run *b = baseline_train(cfg, d);
        copy_run(&c, &b->result, b->loss, b->final_params, b->num_params);
        baseline_free(b);
    } else if (kind == RUN_DDP) {
        ddp_result *o = launch_ddp(cfg, d, ddp_options_default(), NULL);
        copy_run(&c, &o->run.result, o->run.loss, o->run.final_params, o->run.num_params);
        ddp_result_free(o);
    } else {
        strategy_outcome o = {.extra = calloc(1, sizeof(zero_extra))};
        const zero_options opts = {.stage = stage};
        ck_assert_int_eq(zero_launch(cfg, d, &opts, &o), 0);
        copy_run(&c, &o.result, o.loss, o.final_params, o.num_params);
        free(o.extra);
        o.extra = NULL;
        strategy_outcome_free(&o);
    }
    return c;
}

/* The same run saved at step 2 (into dir) and resumed from it to step 4. */
static run_copy save_and_resume(run_kind kind, int stage, const run_config *cfg,
                                const dataset *d, const char *dir) {
    run_config first = *cfg, second = *cfg;
    first.steps = SAVED_AT;
    first.save_dir = dir;
    run_copy head = train(kind, stage, &first, d);
    free(head.masters);
    second.resume_dir = dir;
    char err[512] = "";
    ck_assert_msg(checkpoint_check(dir, &second, err, sizeof err) == SAVED_AT, "%s", err);
    return train(kind, stage, &second, d);
}

/* 1 when the resumed run is the uninterrupted one bit for bit: losses of steps 3-4, the
 * final masters, and the loss scale's end. */
static int same_bits(const run_copy *full, const run_copy *resumed) {
    return resumed->steps == TOTAL - SAVED_AT &&
           memcmp(resumed->loss, full->loss + SAVED_AT, (size_t)resumed->steps * sizeof(float)) == 0 &&
           resumed->num_params == full->num_params &&
           memcmp(resumed->masters, full->masters, full->num_params * sizeof(float)) == 0 &&
           resumed->loss_scale == full->loss_scale && resumed->skipped_steps == full->skipped_steps;
}

static void report(const char *what, const run_copy *full, const run_copy *resumed) {
    printf("%-26s steps 3-4 loss %.9g %.9g (uninterrupted %.9g %.9g), masters differ by %g,"
           " loss scale %g / %g, skipped %d / %d: %s\n", what, resumed->loss[0], resumed->loss[1],
           full->loss[SAVED_AT], full->loss[SAVED_AT + 1],
           max_abs_diff(resumed->masters, full->masters, full->num_params),
           (double)resumed->loss_scale, (double)full->loss_scale, resumed->skipped_steps,
           full->skipped_steps, same_bits(full, resumed) ? "bit-identical" : "DIFFERENT");
}

/* An index.json's text into buf (NUL-terminated). */
static void read_index(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    const size_t len = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[len] = '\0';
}

/* Writes an edited index with its index_crc32 recomputed, as a save would have. */
static void write_sealed_index(const char *path, const char *text) {
    const char *crc_line = strstr(text, CKPT_INDEX_CRC_LINE);
    ck_assert_ptr_nonnull(crc_line);
    const size_t kept = (size_t)(crc_line - text) + 1;   /* with the newline */
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(text, 1, kept, f);
    fprintf(f, "%s%u\n}\n", CKPT_INDEX_CRC_LINE + 1, crc32_update(0, text, kept));
    fclose(f);
}

/* Rewrites an index.json as a save from before precisions wrote it: the metadata
 * without its precision and loss scale. 0 when they are not there. */
static int strip_run_state(const char *path) {
    static char text[1 << 16];
    read_index(path, text, sizeof text);
    char *from = strstr(text, ", \"precision\"");
    char *to = from ? strstr(from, "},\n") : NULL;
    if (!to) return 0;
    memmove(from, to, strlen(to) + 1);
    write_sealed_index(path, text);
    return 1;
}

/* Names a precision no program knows in a sealed index. 0 when it names none. */
static int rename_precision(const char *path, const char *name) {
    static char text[1 << 16], edited[1 << 16];
    read_index(path, text, sizeof text);
    char *at = strstr(text, "\"precision\": \"");
    if (!at) return 0;
    at += strlen("\"precision\": \"");
    const char *rest = strchr(at, '"');
    snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - text), text, name, rest);
    write_sealed_index(path, edited);
    return 1;
}

START_TEST(bf16_resumed_runs_are_bit_identical_in_every_layout) {
    dataset *d = dataset_builtin();
    const struct { const char *name; run_kind kind; int stage, ranks; } runs[] = {
        {"bf16 baseline", RUN_BASELINE, 0, 1}, {"bf16 ddp x2", RUN_DDP, 0, 2},
        {"bf16 zero0 x2", RUN_ZERO, 0, 2},     {"bf16 zero1 x2", RUN_ZERO, 1, 2},
        {"bf16 zero2 x3", RUN_ZERO, 2, 3},     {"bf16 zero3 x2", RUN_ZERO, 3, 2},
    };
    int different = 0;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const run_config cfg = mixed_config(PRECISION_BF16, runs[i].ranks);
        run_copy full = train(runs[i].kind, runs[i].stage, &cfg, d);
        run_copy resumed = save_and_resume(runs[i].kind, runs[i].stage, &cfg, d,
                                           layout_scratch_dir(runs[i].name + 5));
        report(runs[i].name, &full, &resumed);
        different += !same_bits(&full, &resumed);
        free(full.masters);
        free(resumed.masters);
    }
    ck_assert_int_eq(different, 0);
    dataset_free(d);
}
END_TEST

/* fp16 from a scale of 2^20: the test hook's overflow at step 1 skips it and halves S
 * to 2^19, which the later steps keep. Resumed with that scale, steps 3-4 are the
 * uninterrupted run's; started afresh at 2^20 (the negative control: the checkpoint's
 * precision and loss scale taken out of its metadata), whose product with this model's
 * step-3 gradients overflows fp16, the resumed run skips step 3 and ends elsewhere. */
START_TEST(fp16_resumes_with_its_loss_scale) {
    dataset *d = dataset_builtin();
    run_config cfg = mixed_config(PRECISION_FP16, 1);
    cfg.loss_scale_init = 1048576;
    cfg.test_overflow_step = 1;
    run_copy full = train(RUN_BASELINE, 0, &cfg, d);
    const char *dir = layout_scratch_dir("fp16");
    run_copy resumed = save_and_resume(RUN_BASELINE, 0, &cfg, d, dir);
    report("fp16 baseline", &full, &resumed);
    ck_assert_int_eq(full.skipped_steps, 1);
    ck_assert_float_eq(full.loss_scale, 524288);
    ck_assert(same_bits(&full, &resumed));
    free(resumed.masters);
    /* negative control: the same checkpoint as one from before precisions */
    char index[512];
    ckpt_fits(snprintf(index, sizeof index, "%s/step-%06d/index.json", dir, SAVED_AT), sizeof index);
    ck_assert(strip_run_state(index));
    run_config second = cfg;
    second.resume_dir = dir;
    char err[512] = "";   /* an older checkpoint is still accepted */
    ck_assert_msg(checkpoint_check(dir, &second, err, sizeof err) == SAVED_AT, "%s", err);
    run_copy fresh = train(RUN_BASELINE, 0, &second, d);
    report("control: scale afresh", &full, &fresh);
    ck_assert(rename_precision(index, "fp8") == 0);   /* stripped: none left to rename */
    ck_assert(!same_bits(&full, &fresh));
    ck_assert(memcmp(fresh.loss, full.loss + SAVED_AT, 2 * sizeof(float)) != 0);
    free(fresh.masters);
    free(full.masters);
    dataset_free(d);
}
END_TEST

/* checkpoint_check takes every precision it knows (any resumes any other: the masters
 * are fp32) and names one it does not know, with what would be valid. */
START_TEST(check_accepts_every_precision_and_names_an_unknown_one) {
    dataset *d = dataset_builtin();
    const precision all[] = {PRECISION_FP32, PRECISION_BF16, PRECISION_FP16};
    char err[512], index[512];
    for (int saved = 0; saved < 3; saved++) {
        run_config cfg = mixed_config(all[saved], 1);
        cfg.steps = SAVED_AT;
        cfg.save_dir = layout_scratch_dir(precision_name(all[saved]));
        run_copy head = train(RUN_BASELINE, 0, &cfg, d);
        free(head.masters);
        for (int resumed = 0; resumed < 3; resumed++) {
            run_config next = mixed_config(all[resumed], 1);
            err[0] = '\0';
            const int step = checkpoint_check(cfg.save_dir, &next, err, sizeof err);
            printf("checkpoint saved in %s, run in %s: %s\n", precision_name(all[saved]),
                   precision_name(all[resumed]), step == SAVED_AT ? "accepted" : err);
            ck_assert_msg(step == SAVED_AT, "%s", err);
        }
        ckpt_fits(snprintf(index, sizeof index, "%s/step-%06d/index.json", cfg.save_dir,
                           SAVED_AT), sizeof index);
        ck_assert(rename_precision(index, "fp8"));
        const run_config next = mixed_config(all[saved], 1);
        ck_assert_int_eq(checkpoint_check(cfg.save_dir, &next, err, sizeof err), -1);
        printf("  its precision renamed fp8: %s\n", err);
        ck_assert(strstr(err, "index.json") && strstr(err, "'fp8'") && strstr(err, "bf16"));
    }
    dataset_free(d);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("checkpoint_mixed");
    TCase *tc = tcase_create("checkpoint_mixed");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, bf16_resumed_runs_are_bit_identical_in_every_layout);
    tcase_add_test(tc, fp16_resumes_with_its_loss_scale);
    tcase_add_test(tc, check_accepts_every_precision_and_names_an_unknown_one);
    suite_add_tcase(suite, tc);
    static char root[] = "/tmp/test_checkpoint_mixed.XXXXXX";
    if (!layout_scratch_open(root)) return 1;
    return layout_scratch_close(check_run(suite, 0));
}
