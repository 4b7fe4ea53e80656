/* Checkpoints (common/checkpoint*.c): resharding between six layouts with values that
 * name their place in the unsplit model, ZeRO's own state saved at every stage, a
 * resumed run bit-identical to an uninterrupted one, the numpy reader against the
 * program's tensors, faults (a truncated file, a flipped byte, an edited index, another
 * model), malformed safetensors headers and a bounded fuzz of the header parser (the
 * save protocol's faults: test_checkpoint_save.c). Every comparison prints the largest difference it
 * saw; each has a negative control that must fail. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "check_run.h"
#include "checkpoint_layouts.h"
#include "checkpoint.h"
#include "compare.h"
#include "crc32.h"
#include "data.h"
#include "floats.h"
#include "safetensors.h"
#include "baseline.h"
#include "replica.h"
#include "restart.h"
#include "zero_state.h"

enum { FUZZ_MUTATIONS = 8000 };   /* random header mutations parsed; none may crash */

START_TEST(every_layout_loads_into_every_other_exactly) {
    run_config cfg = layout_tiny_config();
    char paths[8][256];
    for (int a = 0; a < checkpoint_num_layouts; a++) {
        char name[32];
        snprintf(name, sizeof name, "layout-%d", a);
        snprintf(paths[a], sizeof paths[a], "%s", layout_scratch_dir(name));
        layout_save(&checkpoint_layouts[a], &cfg, paths[a], 77, 0);
    }
    float worst = 0;
    for (int a = 0; a < checkpoint_num_layouts; a++) {
        for (int b = 0; b < checkpoint_num_layouts; b++) {
            const float d = layout_load(&checkpoint_layouts[b], &cfg, paths[a], 77);
            printf("reshard %-18s -> %-18s largest difference %g (tolerance 0: a copy)\n",
                   checkpoint_layouts[a].name, checkpoint_layouts[b].name, d);
            if (d > worst) worst = d;
        }
    }
    ck_assert_float_eq(worst, 0);
    /* negative control: the same comparison against other values must fail */
    const float control = layout_load(&checkpoint_layouts[3], &cfg, paths[1], 78);
    printf("negative control: zero3 checkpoint of seed 77 against seed 78's values: %g\n",
           control);
    ck_assert_float_gt(control, 1e-3f);
}
END_TEST

/* ---- ZeRO's own state: what a data-parallel stage says it stores, every ZeRO stage --- */

typedef struct {
    const run_config *cfg;
    const char *dir;
    int stage;
} zero_save_job;

/* Each rank fills a ZeRO stage's state (dp_grads.h, what chapter 2's trainer holds) with
 * the values of seed 61, stored as its table says (parameters sharded at stage 3,
 * moments from stage 1), and saves it as the mesh trainer does. */
static int zero_save_rank(comm *world, void *arg) {
    const zero_save_job *job = arg;
    const gpt_shape shape = gpt_shape_make(&job->cfg->model, 1, 0);
    dp_grads g;
    dp_grads_init(&g, world, &shape, 1, &(dp_grads_options){.zero = job->stage});
    float *vectors[3] = {g.params, g.adam_m, g.adam_v};
    for (int k = 0; k < 3; k++)
        layout_upload_values(&shape, &g.layout, k, k == 0 ? job->stage == 3 : job->stage >= 1,
                             61, vectors[k]);
    g.adam_step = 5;
    ckpt_state state = {.count = 1};
    state.parts[0] = dp_grads_checkpoint_part(&g, comm_rank(world) == 0);
    state.adam_steps[0] = &g.adam_step;
    run_config cfg = *job->cfg;
    cfg.save_dir = job->dir;
    checkpoint_save(world, &cfg, "zero", &state, 5);
    dp_grads_free(&g);
    return 0;
}

START_TEST(zero_state_at_every_stage_loads_with_its_moments_in_other_layouts) {
    run_config cfg = layout_tiny_config();
    float worst = 0;
    for (int stage = 0; stage <= 3; stage++) {
        char name[32];
        snprintf(name, sizeof name, "zero-stage-%d", stage);
        zero_save_job job = {.cfg = &cfg, .dir = layout_scratch_dir(name), .stage = stage};
        comm_options opts = cfg.comm;
        opts.ranks = 3;
        ck_assert_int_eq(launch(&opts, zero_save_rank, &job), 0);
        const int into[3] = {0, 1, 5};   /* baseline, zero3 x4, tp2 pp2 dp2 zero1 */
        for (int i = 0; i < 3; i++) {
            const float d = layout_load(&checkpoint_layouts[into[i]], &cfg, job.dir, 61);
            printf("ZeRO-%d x3 -> %-18s parameters, m and v: largest difference %g"
                   " (tolerance 0)\n", stage, checkpoint_layouts[into[i]].name, d);
            ck_assert_msg(d == 0, "ZeRO-%d x3 saved, loaded as %s: parameters or AdamW moments"
                          " differ by %g", stage, checkpoint_layouts[into[i]].name, d);
            if (d > worst) worst = d;
        }
    }
    ck_assert_float_eq(worst, 0);
}
END_TEST

/* ---- training: a resumed run is the uninterrupted run --------------------------------- */

START_TEST(resumed_baseline_is_bit_identical_to_an_uninterrupted_run) {
    run_config cfg = layout_tiny_config();
    dataset *data = dataset_builtin();
    baseline_run *full = baseline_train(&cfg, data);
    const char *dir = layout_scratch_dir("resume");
    run_config first = cfg, second = cfg;
    first.steps = 5;
    first.save_dir = dir;
    baseline_free(baseline_train(&first, data));
    second.resume_dir = dir;
    char err[512] = "";
    ck_assert_int_eq(checkpoint_check(dir, &second, err, sizeof err), 5);
    baseline_run *rest = baseline_train(&second, data);
    ck_assert_int_eq(rest->result.steps, 5);
    double loss_diff = 0;
    for (int s = 0; s < 5; s++) {
        double d = fabs((double)rest->loss[s] - full->loss[5 + s]);
        if (d > loss_diff) loss_diff = d;
    }
    const double param_diff = max_abs_diff(rest->final_params, full->final_params, full->num_params);
    printf("resume at step 5 of 10: losses of steps 6-10 differ by %g, final parameters by %g"
           " (tolerance 0: bit-identical)\n", loss_diff, param_diff);
    ck_assert(loss_diff == 0 && param_diff == 0);
    /* negative control: steps 6-10 from the seed's parameters (the state lost) differ */
    run_config fresh = cfg;
    fresh.steps = 5;
    baseline_run *lost = baseline_train(&fresh, data);
    const double lost_diff = max_abs_diff(lost->final_params, full->final_params, full->num_params);
    printf("negative control: 5 steps without the saved state end %g away\n", lost_diff);
    ck_assert(lost_diff > 1e-4);
    baseline_free(lost);
    baseline_free(rest);
    baseline_free(full);
    dataset_free(data);
}
END_TEST

/* ---- the numpy reader ------------------------------------------------------------------- */

static const char *python_with_numpy(void) {
    static const char *const candidates[] = {"/usr/bin/python3", "python3"};
    for (int i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", candidates[i]);
        if (system(cmd) == 0) return candidates[i];
    }
    return NULL;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    ck_assert_uint_eq(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

/* Largest difference between the reader's whole tensors and the unsplit model's values. */
static double compare_whole_file(const char *path, const run_config *cfg, uint64_t seed) {
    size_t len;
    char *bytes = slurp(path, &len);
    st_file st;
    char err[256];
    ck_assert_msg(safetensors_parse(bytes, len, &st, err, sizeof err), "%s", err);
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    const size_t P = gpt_num_params(&whole);
    float *want = malloc(P * sizeof(float));
    double worst = 0;
    const char *prefix[3] = {"", "optimizer.m.", "optimizer.v."};
    for (int k = 0; k < 3; k++) {
        gpt_init_params(&whole, layout_vector_seed(seed, k), 0, P, want);
        ckpt_tensor tensors[CKPT_MAX_TENSORS];
        for (int slab = 0; slab < gpt_num_slabs(&whole); slab++) {
            const int n = ckpt_slab_tensors(&whole, slab, tensors);
            for (int i = 0; i < n; i++) {
                char name[CKPT_NAME_LEN + 16];
                ckpt_fits(snprintf(name, sizeof name, "%s%s", prefix[k], tensors[i].name), sizeof name);
                size_t numel = 0;
                const unsigned char *got = safetensors_find(&st, name, &numel);
                ck_assert_msg(got && numel == ckpt_box_numel(&tensors[i]), "%s", name);
                const float *w = want + gpt_slab_offset(&whole, slab) + tensors[i].local_offset;
                for (size_t j = 0; j < numel; j++) {
                    float g;
                    memcpy(&g, got + 4 * j, 4);
                    if (fabs((double)g - w[j]) > worst) worst = fabs((double)g - w[j]);
                }
            }
        }
    }
    free(want);
    safetensors_close(&st);
    free(bytes);
    return worst;
}

START_TEST(numpy_reader_assembles_the_unsplit_tensors) {
    const char *python = python_with_numpy();
    if (!python) {
        printf("SKIP: numpy_reader_assembles_the_unsplit_tensors: no python3 with numpy\n");
        return;
    }
    run_config cfg = layout_tiny_config();
    const char *dir = layout_scratch_dir("numpy");
    layout_save(&checkpoint_layouts[5], &cfg, dir, 91, 0);   /* TP 2 x PP 2 x DP 2, ZeRO-1 */
    char out[300], cmd[900];
    snprintf(out, sizeof out, "%s/whole.safetensors", dir);
    snprintf(cmd, sizeof cmd, "%s tools/checkpoint_read.py %s --out %s", python, dir, out);
    ck_assert_int_eq(system(cmd), 0);
    const double d = compare_whole_file(out, &cfg, 91);
    printf("numpy reader (%s) from TP 2 x PP 2 x DP 2 + ZeRO-1: largest difference %g"
           " (tolerance 0)\n", python, d);
    ck_assert(d == 0);
    const double control = compare_whole_file(out, &cfg, 92);
    printf("negative control: against seed 92's values: %g\n", control);
    ck_assert(control > 1e-3);
    /* the reader refuses a corrupted file, as the program does */
    char file[300];
    snprintf(file, sizeof file, "%s/step-000005/rank-00003.safetensors", dir);
    FILE *f = fopen(file, "r+b");
    fseek(f, -3, SEEK_END);
    fputc(0x5a, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tools/checkpoint_read.py %s > /dev/null 2>&1", python, dir);
    ck_assert_int_ne(system(cmd), 0);
}
END_TEST

/* ---- faults ------------------------------------------------------------------------------ */

static int check_error(const char *dir, const run_config *cfg, char *err, size_t len) {
    err[0] = '\0';
    const int step = checkpoint_check(dir, cfg, err, len);
    printf("  checkpoint_check: %s\n", step >= 0 ? "accepted" : err);
    return step;
}

static void copy_tree(const char *from, const char *to) {
    char cmd[700];
    ckpt_fits(snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", to, from, to), sizeof cmd);
    ck_assert_int_eq(system(cmd), 0);
}

static void flip_byte(const char *path, long offset_from_end) {
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, -offset_from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -offset_from_end, SEEK_END);
    fputc(c ^ 0x01, f);
    fclose(f);
}

/* Replaces the first `from` in the file by `to`; 0 when it is not there. */
static int replace_in_file(const char *path, const char *from, const char *to) {
    size_t len;
    char *text = slurp(path, &len);
    text[len] = '\0';
    char *at = strstr(text, from);
    if (at) {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        fwrite(text, 1, (size_t)(at - text), f);
        fputs(to, f);
        fputs(at + strlen(from), f);
        fclose(f);
    }
    free(text);
    return at != NULL;
}

START_TEST(damaged_or_foreign_checkpoints_are_refused_with_the_file_named) {
    run_config cfg = layout_tiny_config();
    const char *good = layout_scratch_dir("good");
    layout_save(&checkpoint_layouts[3], &cfg, good, 77, 0);
    char err[1024], bad[300], file[400], good_step[300];
    ck_assert_int_eq(check_error(good, &cfg, err, sizeof err), 5);
    snprintf(good_step, sizeof good_step, "%s/step-000005", good);
    snprintf(bad, sizeof bad, "%s-bad", good);

    copy_tree(good_step, bad);   /* truncated */
    snprintf(file, sizeof file, "%s/rank-00001.safetensors", bad);   /* TP rank 1's slice */
    struct stat sb;
    ck_assert_int_eq(stat(file, &sb), 0);
    ck_assert_int_eq(truncate(file, sb.st_size / 2), 0);
    ck_assert_int_eq(check_error(bad, &cfg, err, sizeof err), -1);
    ck_assert(strstr(err, "rank-00001.safetensors") && strstr(err, "truncated"));

    copy_tree(good_step, bad);   /* one bit flipped in the data */
    snprintf(file, sizeof file, "%s/rank-00000.safetensors", bad);
    flip_byte(file, 10);
    ck_assert_int_eq(check_error(bad, &cfg, err, sizeof err), -1);
    ck_assert(strstr(err, "rank-00000.safetensors") && strstr(err, "CRC-32"));

    copy_tree(good_step, bad);   /* the index itself cut short */
    snprintf(file, sizeof file, "%s/index.json", bad);
    ck_assert_int_eq(truncate(file, 300), 0);
    ck_assert_int_eq(check_error(bad, &cfg, err, sizeof err), -1);
    ck_assert(strstr(err, "index.json"));

    copy_tree(good_step, bad);   /* the index edited: AdamW's step, then the step */
    snprintf(file, sizeof file, "%s/index.json", bad);
    ck_assert(replace_in_file(file, "\"adam_step\": 5", "\"adam_step\": 6"));
    ck_assert_int_eq(check_error(bad, &cfg, err, sizeof err), -1);
    ck_assert(strstr(err, "index.json") && strstr(err, "edited or corrupted"));
    copy_tree(good_step, bad);
    ck_assert(replace_in_file(file, "\"step\": 5", "\"step\": 4"));
    ck_assert_int_eq(check_error(bad, &cfg, err, sizeof err), -1);
    ck_assert(strstr(err, "index.json") && strstr(err, "edited or corrupted"));
    copy_tree(good_step, bad);   /* an index without its checksum (an older save) */
    ck_assert(replace_in_file(file, "],\n  \"index_crc32\"", "],\n  \"no_crc32\""));
    ck_assert_int_eq(check_error(bad, &cfg, err, sizeof err), -1);
    ck_assert(strstr(err, "index.json") && strstr(err, "no index_crc32"));

    run_config other = cfg;   /* another model */
    other.model.dim = 28;
    ck_assert_int_eq(check_error(good, &other, err, sizeof err), -1);
    ck_assert(strstr(err, "another model") && strstr(err, "--dim 26 there, 28 here"));
    other = cfg;   /* another seed: another data order */
    other.seed = 99;
    ck_assert_int_eq(check_error(good, &other, err, sizeof err), -1);
    ck_assert(strstr(err, "--seed"));
    other = cfg;   /* --steps is the total */
    other.steps = 5;
    ck_assert_int_eq(check_error(good, &other, err, sizeof err), -1);
    ck_assert(strstr(err, "--steps 5"));

    /* the good one still loads after all that */
    ck_assert_float_eq(layout_load(&checkpoint_layouts[4], &cfg, good, 77), 0);
}
END_TEST

/* ---- the header parser under fuzz ----------------------------------------------------- */

START_TEST(header_parser_survives_truncation_and_random_bytes) {
    run_config cfg = layout_tiny_config();
    const char *dir = layout_scratch_dir("fuzz");
    layout_save(&checkpoint_layouts[0], &cfg, dir, 77, 0);
    char path[400];
    snprintf(path, sizeof path, "%s/step-000005/rank-00000.safetensors", dir);
    size_t len;
    char *valid = slurp(path, &len);
    char err[256];
    st_file st;
    ck_assert(safetensors_parse(valid, len, &st, err, sizeof err));   /* control: whole */
    safetensors_close(&st);
    uint64_t header_end = 8;
    for (int i = 0; i < 8; i++) header_end += (uint64_t)(unsigned char)valid[i] << (8 * i);
    ck_assert_uint_le(header_end, len);
    /* every truncation is refused: each cut inside the length and the header, and in the
     * data every cut from the end back to the header (the data is all floats, so a cut
     * anywhere in it leaves the last tensor short) */
    size_t accepted = 0, cuts = 0;
    for (size_t n = 0; n < len; n++) {
        if (n > header_end + 64 && n + 64 < len && n % 61) continue;   /* sampled middle */
        char *cut = malloc(n ? n : 1);   /* exactly n bytes: ASan sees any overread */
        memcpy(cut, valid, n);
        if (safetensors_parse(cut, n, &st, err, sizeof err)) {
            accepted++;
            safetensors_close(&st);
        }
        free(cut);
        cuts++;
    }
    printf("fuzz: %zu truncations of a %zu-byte file (all %llu of the length and header,"
           " 1 in 61 of the data), %zu accepted\n", cuts, len, (unsigned long long)header_end,
           accepted);
    ck_assert_uint_eq(accepted, 0);
    /* random mutations of the header and random files: a fixed number, not a time
     * bound, so that a busy machine tries as many (0.5 s here, 3 s under ASan) */
    uint64_t state = 12345;
    size_t tries = 0, parsed = 0;
    while (tries < FUZZ_MUTATIONS) {
        size_t n = (size_t)(header_end < len ? header_end : len);
        char *buf = malloc(n);
        memcpy(buf, valid, n);
        const int flips = 1 + (int)(tries % 8);
        for (int i = 0; i < flips; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const size_t at = (size_t)(state >> 33) % n;
            buf[at] = (tries % 3 == 0) ? (char)(state >> 17) : "{}[]\",:0 9e-"[(state >> 20) % 12];
        }
        if (tries % 5 == 0)   /* an arbitrary length prefix */
            for (int i = 0; i < 8; i++) buf[i] = (char)(state >> (8 * i));
        if (safetensors_parse(buf, n, &st, err, sizeof err)) {
            parsed++;
            safetensors_close(&st);
        }
        free(buf);
        tries++;
    }
    printf("fuzz: %zu mutated headers, %zu parsed, no crash\n", tries, parsed);
    free(valid);
}
END_TEST

/* Parses a file of this header and data_len zero bytes; 1 when accepted, else why. */
static int parse_header(const char *header, size_t data_len, char *err, size_t err_len) {
    const size_t n = strlen(header), size = 8 + n + data_len;
    unsigned char *bytes = calloc(size, 1);   /* exactly size bytes: ASan sees overreads */
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(bytes + 8, header, n);
    st_file st;
    const int ok = safetensors_parse(bytes, size, &st, err, err_len);
    if (ok) safetensors_close(&st);
    free(bytes);
    return ok;
}

#define TENSOR(name, dtype, shape, begin, end) \
    "\"" name "\": {\"dtype\": \"" dtype "\", \"shape\": [" shape "], \"data_offsets\": [" #begin ", " #end "]}"

START_TEST(malformed_headers_are_refused_not_only_survived) {
    const struct {
        const char *what, *header, *why;   /* why: NULL for the control, which parses */
    } cases[] = {
        {"control: two tensors side by side", "{" TENSOR("a", "F32", "2", 0, 8) ", " TENSOR("b", "F32", "2", 8, 16) "}", NULL},
        {"offsets past the shape", "{" TENSOR("a", "F32", "2", 0, 12) "}", "data_offsets"},
        {"offsets short of the shape", "{" TENSOR("a", "F32", "3", 0, 8) "}", "data_offsets"},
        {"offsets past the data", "{" TENSOR("a", "F32", "2", 16, 24) "}", "data_offsets"},
        {"offsets backwards", "{" TENSOR("a", "F32", "0", 8, 0) "}", "data_offsets"},
        {"overlapping tensors", "{" TENSOR("a", "F32", "2", 0, 8) ", " TENSOR("b", "F32", "2", 4, 12) "}", "overlap"},
        {"a tensor inside another", "{" TENSOR("a", "F32", "4", 0, 16) ", " TENSOR("b", "F32", "1", 4, 8) "}", "overlap"},
        {"dtype F16", "{" TENSOR("a", "F16", "4", 0, 8) "}", "F32"},
        {"dtype missing", "{\"a\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", "F32"},
        {"a name twice", "{" TENSOR("a", "F32", "2", 0, 8) ", " TENSOR("a", "F32", "2", 8, 16) "}", "twice"},
        {"three dimensions", "{" TENSOR("a", "F32", "1, 1, 2", 0, 8) "}", "shape"},
        {"a negative size", "{" TENSOR("a", "F32", "-2", 0, 8) "}", "shape"},
    };
    int wrong = 0;
    const char *first_wrong = "";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        const int ok = parse_header(cases[i].header, 16, err, sizeof err);
        const int right = cases[i].why ? !ok && strstr(err, cases[i].why) : ok;
        printf("header %-34s %s%s%s\n", cases[i].what, ok ? "accepted" : "refused: ", err,
               right ? "" : "  <- WRONG");
        if (!right && !wrong++) first_wrong = cases[i].what;
    }
    ck_assert_msg(wrong == 0, "%d malformed headers accepted or refused for another reason,"
                  " the first: %s", wrong, first_wrong);
}
END_TEST

START_TEST(crc32_matches_zlib) {
    /* zlib.crc32(b"123456789") = 0xCBF43926, the standard check value */
    ck_assert_uint_eq(crc32_update(0, "123456789", 9), 0xCBF43926u);
    ck_assert_uint_eq(crc32_update(crc32_update(0, "1234", 4), "56789", 5), 0xCBF43926u);
    ck_assert_uint_ne(crc32_update(0, "123456788", 9), 0xCBF43926u);   /* control */
}
END_TEST

/* A strategy resumed at another step than its baseline (a restart continues each from
 * its own checkpoint, the baseline from where the job began) is compared on the steps
 * both ran, each at its place; step 1's gradients only when both started together. */
START_TEST(runs_resumed_at_different_steps_compare_the_steps_both_ran) {
    float base_loss[6] = {6, 5, 4, 3, 2, 1}, grads[2] = {0.5f, 0.5f}, params[2] = {1, 2};
    const baseline_run b = {.result = {.steps = 6}, .loss = base_loss, .first_grads = grads,
                            .final_params = params, .num_params = 2};
    const float later[2] = {2.25f, 1}, earlier[8] = {9, 9, 6, 5, 4, 3, 2, 1.5f};
    run_result r = {.steps = 2};   /* resumed after step 4 of 6 */
    compare_to_baseline(&r, &b, later, grads, params);
    ck_assert(r.diff_loss == 0.25 && r.diff_grads == -1 && r.diff_params == 0);
    r = (run_result){.steps = 8};   /* started 2 steps before the baseline */
    compare_to_baseline(&r, &b, earlier, grads, params);
    ck_assert(r.diff_loss == 0.5 && r.diff_grads == -1);
    r = (run_result){.steps = 6};   /* together */
    compare_to_baseline(&r, &b, base_loss, grads, params);
    ck_assert(r.diff_loss == 0 && r.diff_grads == 0);
    r = (run_result){.steps = 0};   /* a restart found it finished: nothing to compare */
    compare_to_baseline(&r, &b, later, grads, params);
    ck_assert(r.diff_loss == -1 && r.diff_grads == -1 && r.diff_params == 0);
}
END_TEST

/* The flags' checks that the command line asks before any rank starts: a path too long
 * for the checkpoints' names, and the restart flags, each refused by its reason; the
 * control: flags that go together pass. */
START_TEST(checkpoint_and_restart_flags_are_refused_with_their_reason) {
    char why[512], longer[CKPT_DIR_MAX + 2];
    memset(longer, 'd', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    ck_assert(checkpoint_dir_check("save", "runs/a", why, sizeof why) == NULL);
    ck_assert(checkpoint_dir_check("save", longer + 1, why, sizeof why) == NULL);   /* at most */
    const char *got = checkpoint_dir_check("resume", longer, why, sizeof why);
    printf("%s\n", got);
    ck_assert(got && strcmp(got, "--resume: a path of 2049 characters; at most 2048 (the"
                                 " checkpoint's files are named under it)") == 0);

    run_config ok = {.save_dir = "runs/a"};
    ok.restart.on = ok.restart.from_run = 1;
    ok.restart.max_restarts = 2;
    ok.restart.record = "1 2 0.5 1.5 0.25 100.0 4";
    ck_assert(restart_flags_check(&ok, "chapter1", why, sizeof why) == NULL);
    run_config none = {0};
    ck_assert(restart_flags_check(&none, "chapter1", why, sizeof why) == NULL);
    struct {
        run_config cfg;
        const char *reason;
    } cases[] = {
        {ok, "--max-restarts 2: needs --save DIR"},
        {ok, "--max-restarts 2: chapter 9 keeps none"},
        {ok, "--max-restarts 2: ./run makes the restarts"},
        {none, "--elastic: needs --max-restarts K"},
        {none, "--restart-attempt and --restart-record: ./run gives them"},
        {ok, "--restart-record '1 2': ./run's record of the earlier attempts has 7 numbers"},
    };
    cases[0].cfg.save_dir = NULL;
    cases[1].cfg.no_checkpoints = "chapter 9 keeps none";
    cases[2].cfg.restart.from_run = 0;
    cases[3].cfg.restart.elastic = 1;
    cases[4].cfg.restart.from_run = 1;
    cases[5].cfg.restart.record = "1 2";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        got = restart_flags_check(&cases[i].cfg, "chapter1", why, sizeof why);
        printf("case %zu: %s\n", i, got ? got : "taken");
        ck_assert_msg(got && strstr(got, cases[i].reason) == got, "case %zu", i);
    }
}
END_TEST

int main(void) {
    Suite *suite = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, crc32_matches_zlib);
    tcase_add_test(tc, checkpoint_and_restart_flags_are_refused_with_their_reason);
    tcase_add_test(tc, runs_resumed_at_different_steps_compare_the_steps_both_ran);
    tcase_add_test(tc, every_layout_loads_into_every_other_exactly);
    tcase_add_test(tc, zero_state_at_every_stage_loads_with_its_moments_in_other_layouts);
    tcase_add_test(tc, resumed_baseline_is_bit_identical_to_an_uninterrupted_run);
    tcase_add_test(tc, numpy_reader_assembles_the_unsplit_tensors);
    tcase_add_test(tc, damaged_or_foreign_checkpoints_are_refused_with_the_file_named);
    tcase_add_test(tc, header_parser_survives_truncation_and_random_bytes);
    tcase_add_test(tc, malformed_headers_are_refused_not_only_survived);
    suite_add_tcase(suite, tc);
    /* every test's directories live under one temporary root, removed at the end */
    static char root[] = "/tmp/test_checkpoint.XXXXXX";
    if (!layout_scratch_open(root)) return 1;
    return layout_scratch_close(check_run(suite, 0));
}
