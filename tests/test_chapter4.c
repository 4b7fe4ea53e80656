/* Chapter 4 against the single-device baseline: every schedule (naive, GPipe, 1F1B,
 * interleaved with v = 2, ZB-H1) on p = 2, 3, 4 thread ranks with m = 1, 2, 4, 8
 * micro-batches gives the baseline's gradients of step 1, loss per step and parameters
 * after 3 steps, with the threads backend's sends buffered and as rendezvous (a send
 * waits for its receive, as NCCL's: an order that would deadlock on GPUs fails here);
 * a dropped activation gradient fails the comparison; micro-batches in flight per
 * stage are the schedule's (m for GPipe, p - r for 1F1B) and activation bytes follow
 * them; with the compute model every stage runs its schedule's passes in order, busy
 * at least the modelled time, and the bubble of those lists in modelled time (GPipe's
 * and 1F1B's at p = 4, m = 8) is (p-1)/(m+p-1); bytes per stage match 2 m b s h x 4 B.
 * No check reads a clock against an upper bound.
 *
 * Tolerances (fp32 sums in another order, as the other chapters): gradients 1e-6,
 * loss 1e-5, parameters 1e-4. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "pp_draw.h"
#include "pp_sim.h"
#include "small_model.h"
#include "strategy_runs.h"
#include "training.h"

/* Eight blocks so that 4 stages x 2 chunks fit; small enough to run 90 launches. */
static run_config small_config(int ranks) { return small_model_config(8, ranks); }

static pp_result *run(const run_config *cfg, const dataset *d, const baseline_run *b,
                      pipeline_options opts) {
    return launch_pp(cfg, d, 0, opts, b);
}

static void check_schedules(comm_send_mode mode) {
    dataset *d = dataset_builtin();
    const int micros[] = {1, 2, 4, 8};
    double worst = 0;
    int runs = 0;
    for (int p = 2; p <= 4; p++) {
        run_config cfg = small_config(p);
        cfg.comm.send_mode = mode;
        baseline_run *b = baseline_train(&cfg, d);
        for (int kind = 0; kind < PP_NSCHEDULES; kind++)
            for (int i = 0; i < 4; i++) {
                const int m = micros[i], v = kind == PP_INTERLEAVED ? 2 : 1;
                char why[256];
                if (!pp_validate(kind, p, m, v, cfg.model.layers, cfg.batch, why, sizeof why))
                    continue;   /* naive takes m = 1; interleaved m a multiple of p */
                pp_result *o = run(&cfg, d, b, (pipeline_options){.schedule = kind,
                                                                   .micro = m, .chunks = v});
                const run_result *r = &o->run.result;
                printf("%-15s p=%d m=%d v=%d (%s sends): max |diff| loss %.2e grads %.2e "
                       "params %.2e; tied copies %.1e\n", r->strategy, p, m, v,
                       mode == COMM_SEND_RENDEZVOUS ? "rendezvous" : "buffered",
                       r->diff_loss, r->diff_grads, r->diff_params, o->x.tied_drift);
                ck_assert_msg(r->diff_grads <= PP_TOL_GRADS, "%s p=%d m=%d: grads %g",
                              r->strategy, p, m, r->diff_grads);
                ck_assert_msg(r->diff_loss <= PP_TOL_LOSS, "%s p=%d m=%d: loss %g",
                              r->strategy, p, m, r->diff_loss);
                ck_assert_msg(r->diff_params <= PP_TOL_PARAMS, "%s p=%d m=%d: params %g",
                              r->strategy, p, m, r->diff_params);
                ck_assert_msg(o->x.tied_drift == 0.0, "tied copies drifted by %g", o->x.tied_drift);
                /* the largest rank's bytes: its sends and the tied embedding's all-reduce */
                ck_assert_msg(fabs(r->bytes_sent_per_step - r->bytes_formula) <=
                                  1e-9 * r->bytes_formula,
                              "%s p=%d m=%d: sent %.0f bytes per step, formula %.0f", r->strategy,
                              p, m, r->bytes_sent_per_step, r->bytes_formula);
                if (pp_worst_fraction_of_tolerance(r) > worst)
                    worst = pp_worst_fraction_of_tolerance(r);
                runs++;
                pp_result_free(o);
            }
        baseline_free(b);
    }
    printf("%d pipeline runs, worst at %.0f%% of its tolerance\n", runs, 100 * worst);
    dataset_free(d);
}

START_TEST(every_schedule_matches_the_baseline_buffered) { check_schedules(COMM_SEND_BUFFERED); }
END_TEST

START_TEST(every_schedule_matches_the_baseline_rendezvous) {
    check_schedules(COMM_SEND_RENDEZVOUS);
}
END_TEST

START_TEST(a_dropped_activation_gradient_fails) {
    dataset *d = dataset_builtin();
    run_config cfg = small_config(3);
    baseline_run *b = baseline_train(&cfg, d);
    pp_result *o = run(&cfg, d, b, (pipeline_options){.schedule = PP_1F1B, .micro = 4,
                                                       .chunks = 1, .fault = PIPELINE_FAULT_DROP_INPUT_GRAD});
    printf("1f1b with zeros sent as the last stage's d(input): grads differ by %.2e\n",
           o->run.result.diff_grads);
    ck_assert_msg(o->run.result.diff_grads > 100 * PP_TOL_GRADS, "grads differ by only %g",
                  o->run.result.diff_grads);
    pp_result_free(o);
    baseline_free(b);
    dataset_free(d);
}
END_TEST

START_TEST(in_flight_and_activations_follow_the_schedule) {
    dataset *d = dataset_builtin();
    const int p = 4, m = 8;
    run_config cfg = small_config(p);
    pp_result *g = run(&cfg, d, NULL, (pipeline_options){.schedule = PP_GPIPE, .micro = m,
                                                          .chunks = 1});
    pp_result *f = run(&cfg, d, NULL, (pipeline_options){.schedule = PP_1F1B, .micro = m,
                                                          .chunks = 1});
    for (int r = 0; r < p; r++) {
        printf("stage %d: in flight gpipe %d (m = %d), 1f1b %d (p - r = %d); activations "
               "%.0f and %.0f bytes\n", r, g->x.measured.in_flight[r], m, f->x.measured.in_flight[r],
               p - r, g->x.measured.peak_activations[r], f->x.measured.peak_activations[r]);
        ck_assert_int_eq(g->x.measured.in_flight[r], m);
        ck_assert_int_eq(f->x.measured.in_flight[r], p - r);
        ck_assert_int_eq(g->x.in_flight_formula[r], m);
        ck_assert_int_eq(f->x.in_flight_formula[r], p - r);
        if (r > 0)   /* fewer micro-batches held, fewer bytes: stage r-1 holds one more */
            ck_assert(f->x.measured.peak_activations[r] < f->x.measured.peak_activations[r - 1]);
        ck_assert(f->x.measured.peak_activations[r] < g->x.measured.peak_activations[r]);
    }
    pp_result_free(g);
    pp_result_free(f);
    dataset_free(d);
}
END_TEST

/* The first pass of the last step's spans (rank by rank, as they ran) that is not the
 * schedule's list's pass at that place, or -1 when every stage ran its list in order.
 * A count of passes, no clock: a busy machine changes none of it. */
static int first_pass_off_the_lists(const pp_result *o, pp_schedule_kind kind, int p, int m,
                                    int v) {
    pp_schedule *s = pp_schedule_make(kind, p, m, v, PP_COMM_ORDERED);
    ck_assert_ptr_nonnull(s);
    int at = 0, off = -1;
    for (int r = 0; r < p && off < 0; r++)
        for (int i = 0; i < s->ranks[r].count && off < 0; i++) {
            const pp_op *op = &s->ranks[r].ops[i];
            if (!pp_op_is_compute(op->kind)) continue;
            const pp_span *ran = at < o->x.nspans ? &o->x.spans[at] : NULL;
            if (!ran || ran->rank != r || ran->kind != op->kind || ran->micro != op->micro ||
                ran->chunk != op->chunk)
                off = at;
            at++;
        }
    pp_schedule_free(s);
    return off >= 0 ? off : at == o->x.nspans ? -1 : at;
}

/* Under the compute model a rank is busy 3 m x stage_seconds a step at least (a
 * backward is two forwards; interleaved chunks split the stage): the model holds every
 * pass that long, and a busy machine only adds to it. */
static void check_busy_at_least_modelled(const pp_result *o, int p, int m, double stage) {
    const double modelled_ms = 3e3 * m * stage;
    for (int r = 0; r < p; r++)
        ck_assert_msg(o->x.measured.busy_ms[r] >= modelled_ms * (1 - 1e-9),
                      "rank %d busy %.3f ms per step, modelled 3 m x stage = %.3f", r,
                      o->x.measured.busy_ms[r], modelled_ms);
}

/* The bubble in modelled time, against the formula: the event simulator's for CPU ranks
 * on the lists the stages ran (which they did, pass for pass). The wall-clock bubble is
 * printed beside it, not checked: another program on the cores lengthens it. Negative
 * control: GPipe's run is not 1F1B's lists. */
START_TEST(bubbles_and_bytes_match_their_formulas) {
    dataset *d = dataset_builtin();
    const int p = 4, m = 8;
    const double stage = 0.005;   /* the checks read no clock: a short model does */
    run_config cfg = small_config(p);
    cfg.steps = 3;
    const pp_schedule_kind kinds[] = {PP_GPIPE, PP_1F1B};
    for (int i = 0; i < 2; i++) {
        pp_result *o = run(&cfg, d, NULL, (pipeline_options){.schedule = kinds[i],
                                                              .micro = m, .chunks = 1,
                                                              .stage_seconds = stage});
        const double modelled = o->x.cpu_ranks.fraction, formula = o->x.formula.fraction;
        printf("%s p=4 m=8: bubble %.4f modelled (the lists the ranks ran), %.4f formula "
               "((p-1)/(m+p-1)); wall clock %.3f\n", o->run.result.strategy, modelled, formula,
               o->x.measured.bubble_fraction);
        ck_assert_msg(fabs(modelled - formula) <= 1e-9, "%s: bubble %.6f, formula %.6f",
                      o->run.result.strategy, modelled, formula);
        ck_assert_int_eq(first_pass_off_the_lists(o, kinds[i], p, m, 1), -1);
        check_busy_at_least_modelled(o, p, m, stage);
        if (kinds[i] == PP_GPIPE) {
            const int off = first_pass_off_the_lists(o, PP_1F1B, p, m, 1);
            printf("negative control: GPipe's passes against 1F1B's lists: pass %d differs\n",
                   off);
            ck_assert_int_ge(off, 0);
        }
        /* bytes: the middle stages send activations and gradients, the ends one each */
        const double per_boundary = o->x.bytes_formula;
        for (int r = 0; r < p; r++) {
            const double expected = (r > 0 && r < p - 1 ? 1.0 : 0.5) * per_boundary;
            ck_assert_msg(fabs(o->x.measured.bytes_sent[r] - expected) <= 1e-9 * expected,
                          "stage %d sent %.0f bytes, formula %.0f", r,
                          o->x.measured.bytes_sent[r], expected);
        }
        pp_result_free(o);
    }
    dataset_free(d);
}
END_TEST

/* Interleaved under the compute model (p 2, v 4, m 8: the chapter's example): the ranks
 * ran the interleaved lists pass for pass, each busy 3 m x stage time per step at least
 * (a chunk's pass is 1/v of a stage's), and the bubble of those lists in modelled time
 * is the simulator's for ranks that do one operation at a time, which is what these
 * are (the textbook's formula assumes GPU streams and says 3%). */
START_TEST(interleaved_bubble_under_the_compute_model) {
    dataset *d = dataset_builtin();
    const int p = 2, m = 8, v = 4;
    const double stage = 0.005;
    run_config cfg = small_config(p);
    cfg.steps = 3;
    pp_result *o = run(&cfg, d, NULL, (pipeline_options){.schedule = PP_INTERLEAVED,
                                                          .micro = m, .chunks = v,
                                                          .stage_seconds = stage});
    printf("interleaved p=2 m=8 v=4: bubble %.3f CPU ranks (formula %.3f), wall clock %.3f;"
           " busy %.1f and %.1f ms per step, modelled %.1f at least\n", o->x.cpu_ranks.fraction,
           o->x.formula.fraction, o->x.measured.bubble_fraction, o->x.measured.busy_ms[0],
           o->x.measured.busy_ms[1], 3e3 * m * stage);
    ck_assert_int_eq(first_pass_off_the_lists(o, PP_INTERLEAVED, p, m, v), -1);
    ck_assert(o->x.cpu_ranks.fraction > o->x.formula.fraction);   /* no streams here */
    check_busy_at_least_modelled(o, p, m, stage);
    pp_result_free(o);
    dataset_free(d);
}
END_TEST

/* Fewer stages than ranks: the other ranks are more pipelines, data parallel. Every
 * schedule that fits 2 stages on 4 ranks trains the baseline's model, and each stage
 * holds what a 2-stage schedule holds (1F1B: 2 and 1 micro-batches). */
START_TEST(two_stages_on_four_ranks_train_data_parallel) {
    dataset *d = dataset_builtin();
    run_config cfg = small_config(4);
    baseline_run *b = baseline_train(&cfg, d);
    for (int kind = 0; kind < PP_NSCHEDULES; kind++) {
        const int m = kind == PP_NAIVE ? 1 : kind == PP_DUALPIPE_V ? 4 : 2;   /* dualpipev: 2p */
        const int v = pp_schedule_chunks(kind, 2);
        pipeline_options opts = {.schedule = kind, .micro = m, .chunks = v};
        pp_result *o = launch_pp(&cfg, d, 2, opts, b);
        const run_result *r = &o->run.result;
        printf("%-15s pp 2 x dp %d, m=%d v=%d: max |diff| loss %.2e grads %.2e params %.2e;"
               " stages %d, in flight %d %d\n", r->strategy, o->x.replicas, m, v, r->diff_loss,
               r->diff_grads, r->diff_params, o->x.stages, o->x.measured.in_flight[0],
               o->x.measured.in_flight[1]);
        ck_assert_int_eq(o->x.stages, 2);
        ck_assert_int_eq(o->x.replicas, 2);
        ck_assert_msg(pp_worst_fraction_of_tolerance(r) <= 1, "%s: outside the tolerances",
                      r->strategy);
        ck_assert_msg(fabs(r->bytes_sent_per_step - r->bytes_formula) <= 1e-9 * r->bytes_formula,
                      "%s: sent %.0f bytes per step, formula %.0f", r->strategy,
                      r->bytes_sent_per_step, r->bytes_formula);
        if (kind == PP_1F1B) {
            ck_assert_int_eq(o->x.measured.in_flight[0], 2);
            ck_assert_int_eq(o->x.measured.in_flight[1], 1);
        }
        pp_result_free(o);
    }
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* ---- the pictures of an interleaved schedule ------------------------------------------ */
/* Interleaved at p 2, m 4, v 4 on the event simulator (a chunk's forward lasts 1/4). */
static pp_sim_result interleaved_spans(pp_schedule **s) {
    *s = pp_schedule_make(PP_INTERLEAVED, 2, 4, 4, PP_COMM_ORDERED);
    pp_sim_options o = pp_sim_options_default();
    pp_sim_result res;
    ck_assert(pp_simulate(*s, &o, &res));
    return res;
}

/* Checks every row of a text picture: cells of 4 characters, each blank, "----" or a
 * label "F3.1" (letter, micro-batch, chunk); every pass of the lists labelled once. */
static void check_cells(const char *text, const pp_schedule *s) {
    int labels[2][3][4][4] = {{{{0}}}};   /* [rank][F, B, W][micro][chunk] */
    int rows = 0;
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        if (strncmp(line, "  rank ", 7) != 0) continue;
        const int r = atoi(line + 7);
        const char *open = strchr(line, '|'), *close = strchr(open + 1, '|');
        const int len = (int)(close - open - 1);
        ck_assert_msg(len % 4 == 0, "a row of %d characters is not in cells of 4: %.*s", len,
                      len, open + 1);
        for (const char *c = open + 1; c < close; c += 4) {
            if (strncmp(c, "    ", 4) == 0 || strncmp(c, "----", 4) == 0) continue;
            const char *letters = "FBW", *at = strchr(letters, c[0]);
            ck_assert_msg(at && c[0] && c[1] >= '0' && c[1] <= '3' && c[2] == '.' &&
                              c[3] >= '0' && c[3] <= '3', "cell \"%.4s\" is no label", c);
            labels[r][at - letters][c[1] - '0'][c[3] - '0']++;
        }
        rows++;
    }
    ck_assert_int_ge(rows, 2);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < s->ranks[r].count; i++) {
            const pp_op *op = &s->ranks[r].ops[i];
            if (!pp_op_is_compute(op->kind)) continue;
            const int k = op->kind == PP_FORWARD ? 0 : op->kind == PP_BACKWARD_WEIGHT ? 2 : 1;
            ck_assert_msg(labels[r][k][op->micro][op->chunk] == 1, "rank %d: %s of micro %d"
                          " chunk %d labelled %d times", r, pp_op_kind_name(op->kind), op->micro,
                          op->chunk, labels[r][k][op->micro][op->chunk]);
        }
}

static char *draw_text(const pp_sim_result *res, int width) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    pp_draw_text(out, res->spans, res->nspans, 2, width, 1.0);
    fclose(out);
    return text;
}

START_TEST(interleaved_text_picture_has_fixed_width_cells) {
    pp_schedule *s;
    pp_sim_result res = interleaved_spans(&s);
    char *text = draw_text(&res, 100);
    printf("interleaved p 2 m 4 v 4, simulated:\n%s", text);
    check_cells(text, s);
    ck_assert_msg(strstr(text, "F3.1: forward of micro-batch 3, chunk 1"), "no key line");
    free(text);
    /* as measured: passes end late by up to a third of a cell, the next starts later */
    for (int i = 0; i < res.nspans; i++) {
        const double late = 0.25 / 3 * (i % 4);
        res.spans[i].start += 0.02 * i, res.spans[i].end += 0.02 * i + late;
    }
    text = draw_text(&res, 40);   /* narrow: several bands */
    printf("the same, late and in bands of 10 cells:\n%s", text);
    check_cells(text, s);
    free(text);
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}
END_TEST

static char *read_svg(const pp_sim_result *res, const char *title) {
    char path[] = "/tmp/test_chapter4_svg_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pp_draw_svg(path, res->spans, res->nspans, 2, 1.0, title), 0);
    FILE *f = fdopen(fd, "r");
    static char svg[1 << 18];
    size_t got = fread(svg, 1, sizeof svg - 1, f);
    svg[got] = 0;
    fclose(f);
    remove(path);
    return svg;
}

START_TEST(interleaved_svg_has_v_labels_shades_and_a_legend) {
    pp_schedule *s;
    pp_sim_result res = interleaved_spans(&s);
    pp_extra x = {.opts = {.schedule = PP_INTERLEAVED, .micro = 4, .chunks = 4}, .stages = 2,
                  .cpu_ranks = {0.2, 0.25}};
    strategy_outcome o = {.result = {.strategy = "pp-interleaved"}, .extra = &x};
    char title[160];
    pipeline_svg_title(&o, title, sizeof title);
    const char *svg = read_svg(&res, title);
    printf("svg title: %s\n", title);
    ck_assert_msg(strstr(title, "v = 4") && strstr(svg, title), "the title lacks v");
    char fill[3][4][8] = {{{0}}};   /* [F, B, W][chunk] */
    int forwards = 0;
    for (const char *p = svg; (p = strstr(p, "<rect x=")); p++) {
        char kind[4], colour[8], label[16];
        int micro, chunk;
        ck_assert(sscanf(strstr(p, "fill=\""), "fill=\"%7[^\"]", colour) == 1);
        ck_assert(sscanf(strstr(p, "<title>"), "<title>%3s micro %d chunk %d", kind, &micro,
                         &chunk) == 3);
        const int k = kind[0] == 'F' ? 0 : kind[0] == 'W' ? 2 : 1;
        ck_assert_msg(!fill[k][chunk][0] || strcmp(fill[k][chunk], colour) == 0,
                      "%s chunk %d in two colours", kind, chunk);
        strcpy(fill[k][chunk], colour);
        if (k != 0) continue;
        /* a forward's box is followed by its label: micro-batch.chunk */
        const char *text = strstr(p, "</rect>\n") + 8;
        char want[16];
        snprintf(want, sizeof want, "%d.%d", micro, chunk);
        ck_assert_msg(strncmp(text, "<text", 5) == 0 &&
                          sscanf(strchr(text, '>') + 1, "%15[^<]", label) == 1 &&
                          strcmp(label, want) == 0, "forward %s has no label", want);
        forwards++;
    }
    ck_assert_int_eq(forwards, 2 * 4 * 4);
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 4; a++)
            for (int b = a + 1; b < 4; b++)
                ck_assert_msg(strcmp(fill[k][a], fill[k][b]) != 0, "%s: chunks %d and %d share"
                              " %s", k ? "B" : "F", a, b, fill[k][a]);
    printf("forward shades %s %s %s %s, backward %s %s %s %s\n", fill[0][0], fill[0][1],
           fill[0][2], fill[0][3], fill[1][0], fill[1][1], fill[1][2], fill[1][3]);
    const char *legend = strstr(svg, "<g id=\"legend\"");
    ck_assert_msg(legend && strstr(legend, "F forward") && strstr(legend, "B backward") &&
                      strstr(legend, "chunk 0") && strstr(legend, "chunk 3"), "no legend");
    pp_sim_result_free(&res);
    pp_schedule_free(s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("chapter4");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, every_schedule_matches_the_baseline_buffered);
    tcase_add_test(tc, every_schedule_matches_the_baseline_rendezvous);
    tcase_add_test(tc, a_dropped_activation_gradient_fails);
    tcase_add_test(tc, in_flight_and_activations_follow_the_schedule);
    tcase_add_test(tc, bubbles_and_bytes_match_their_formulas);
    suite_add_tcase(s, tc);
    TCase *model = tcase_create("compute model");
    tcase_set_timeout(model, 300);
    tcase_add_test(model, interleaved_bubble_under_the_compute_model);
    suite_add_tcase(s, model);
    TCase *dp = tcase_create("pipelines side by side");
    tcase_set_timeout(dp, 300);
    tcase_add_test(dp, two_stages_on_four_ranks_train_data_parallel);
    suite_add_tcase(s, dp);
    TCase *pictures = tcase_create("pictures");
    tcase_add_test(pictures, interleaved_text_picture_has_fixed_width_cells);
    tcase_add_test(pictures, interleaved_svg_has_v_labels_shades_and_a_legend);
    suite_add_tcase(s, pictures);
    return check_run(s, 0);
}
