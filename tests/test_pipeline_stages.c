/* The model cut into pipeline stages by hand, against the single-device baseline.
 *
 * p = 2, 3, 4 stages on p thread ranks (3 stages of a 4-block model are uneven: 1, 1
 * and 2 blocks), micro-batches m = 1 and 4: every micro-batch goes forward through the
 * stages (activations sent from stage to stage), then backward (their gradients sent
 * back), GPipe's order written out; the tied embedding's two gradients are summed over
 * the embedding group; AdamW then runs on every stage's own slabs.
 *
 * Tolerances (fp32, the same sums in another order, as the other chapters): gradients
 * after step 1: 1e-6; loss per step: 1e-5; parameters after 4 steps: 1e-4. The tied
 * weight's two copies must stay bit-identical. Negative controls: without the tied
 * gradient's all-reduce, and with zeros sent instead of one activation gradient, the
 * comparison must fail. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "compare.h"
#include "mesh.h"
#include "ops.h"
#include "pp_stage.h"
#include "baseline.h"
#include "replica.h"

static const double tol_grads = 1e-6, tol_loss = 1e-5, tol_params = 1e-4;

typedef enum { FAULT_NONE, FAULT_NO_TIED_REDUCE, FAULT_DROP_INPUT_GRAD } fault;

typedef struct {
    run_config cfg;
    const dataset *data;
    int micro;                 /* micro-batches per step */
    fault inject;
    /* world rank 0 */
    float *loss, *first_grads, *final_params;
    double tied_drift;
} job;

static run_config small_config(void) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 16, .layers = 4, .heads = 2, .dim = 32};
    cfg.batch = 8;
    cfg.steps = 4;
    cfg.quiet = 1;
    return cfg;
}

static int rank_main(comm *world, void *arg) {
    job *j = arg;
    const run_config *cfg = &j->cfg;
    const int p = comm_size(world), B = cfg->batch, T = cfg->model.ctx;
    const int mb = B / j->micro;
    mesh grid;
    mesh_create(&grid, world, (mesh_shape){.tp = 1, .pp = p, .dp = 1});
    const gpt_shape whole = gpt_shape_make(&cfg->model, 1, 0);
    pp_stage st;
    pp_stage_init(&st, grid.pp, &whole, grid.me.pp, p, mb, T, j->micro, cfg->seed, NULL, 1);
    const size_t n_whole = gpt_num_params(&whole);
    float *host = malloc(n_whole * sizeof(float));
    const float dloss = 1.0f / (float)(B * T);

    for (int step = 1; step <= cfg->steps; step++) {
        vec_zero(st.rep.grads, st.rep.num_params);
        float loss = 0;
        for (int k = 0; k < j->micro; k++) {   /* all forwards ... */
            if (!pp_stage_is_first(&st)) pp_recv_input(&st, k);
            loss += pp_forward(&st, k, j->data, cfg, step, k * mb) / (float)j->micro;
            if (!pp_stage_is_last(&st)) pp_send_output(&st, k);
        }
        st.drop_input_grad = j->inject == FAULT_DROP_INPUT_GRAD && step == 1 &&
                             st.stage == p - 1;
        for (int k = j->micro - 1; k >= 0; k--) {   /* ... then all backwards */
            if (!pp_stage_is_last(&st)) pp_recv_output_grad(&st, k);
            pp_backward(&st, k, dloss, NULL, NULL);
            if (!pp_stage_is_first(&st)) pp_send_input_grad(&st, gpt_stage_input_grad(st.model));
            st.drop_input_grad = 0;
        }
        if (j->inject != FAULT_NO_TIED_REDUCE) pp_stage_reduce_tied_grads(&st, grid.embedding);
        if (step == 1) {
            pp_gather_whole(grid.pp, &st, 1, PP_GRADS, host);
            if (comm_rank(world) == 0) j->first_grads = host, host = malloc(n_whole * 4);
        }
        replica_adamw(&st.rep, &cfg->adamw);
        /* the loss lives on the last stage */
        comm_broadcast(grid.pp, &loss, 1, COMM_F32, p - 1);
        if (comm_rank(world) == 0) j->loss[step - 1] = loss;
    }
    double drift = pp_gather_whole(grid.pp, &st, 1, PP_PARAMS, host);
    if (comm_rank(world) == 0) {
        j->final_params = host;
        j->tied_drift = drift;
    } else {
        free(host);
    }
    pp_stage_free(&st);
    mesh_free(&grid);
    return 0;
}

static run_result run_pipeline(const baseline_run *base, const dataset *data, int stages,
                               int micro, fault inject, double *drift) {
    job j = {.cfg = small_config(), .data = data, .micro = micro, .inject = inject};
    j.loss = calloc((size_t)j.cfg.steps, sizeof(float));
    comm_options co = j.cfg.comm;
    co.ranks = stages;
    ck_assert_int_eq(launch(&co, rank_main, &j), 0);
    run_result r = {.steps = j.cfg.steps};
    compare_to_baseline(&r, base, j.loss, j.first_grads, j.final_params);
    *drift = j.tied_drift;
    free(j.loss);
    free(j.first_grads);
    free(j.final_params);
    return r;
}

START_TEST(stages_match_the_baseline) {
    run_config cfg = small_config();
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    const int micro[] = {1, 4};
    for (int p = 2; p <= 4; p++)
        for (int i = 0; i < 2; i++) {
            double drift;
            run_result r = run_pipeline(base, data, p, micro[i], FAULT_NONE, &drift);
            printf("pipeline p=%d m=%d: max |diff| vs baseline: loss %.2e  grads %.2e  "
                   "params %.2e; tied copies differ by %.1e\n", p, micro[i], r.diff_loss,
                   r.diff_grads, r.diff_params, drift);
            ck_assert_msg(r.diff_grads <= tol_grads, "p=%d m=%d: grads differ by %g (tol %g)",
                          p, micro[i], r.diff_grads, tol_grads);
            ck_assert_msg(r.diff_loss <= tol_loss, "p=%d m=%d: loss differs by %g (tol %g)", p,
                          micro[i], r.diff_loss, tol_loss);
            ck_assert_msg(r.diff_params <= tol_params, "p=%d m=%d: params differ by %g (tol %g)",
                          p, micro[i], r.diff_params, tol_params);
            ck_assert_msg(drift == 0.0, "p=%d m=%d: the tied weight's copies drifted by %g", p,
                          micro[i], drift);
        }
    baseline_free(base);
    dataset_free(data);
}
END_TEST

START_TEST(negative_controls_fail_the_comparison) {
    run_config cfg = small_config();
    dataset *data = dataset_builtin();
    baseline_run *base = baseline_train(&cfg, data);
    double drift;
    run_result r = run_pipeline(base, data, 3, 2, FAULT_NO_TIED_REDUCE, &drift);
    printf("without the tied gradient's all-reduce: grads differ by %.2e, copies by %.2e\n",
           r.diff_grads, drift);
    ck_assert_msg(r.diff_grads > 100 * tol_grads, "grads differ by only %g", r.diff_grads);
    ck_assert_msg(drift > 0, "the tied copies did not drift");
    r = run_pipeline(base, data, 3, 2, FAULT_DROP_INPUT_GRAD, &drift);
    printf("one activation gradient sent as zeros: grads differ by %.2e\n", r.diff_grads);
    ck_assert_msg(r.diff_grads > 100 * tol_grads, "grads differ by only %g", r.diff_grads);
    baseline_free(base);
    dataset_free(data);
}
END_TEST

START_TEST(stage_holds_only_its_blocks) {
    const gpt_config cfg = small_config().model;
    const gpt_shape whole = gpt_shape_make(&cfg, 1, 0);
    size_t total = 0;
    for (int k = 0; k < 3; k++) {
        gpt_shape s = whole;
        gpt_shape_split_stages(&s, 3, k);
        total += gpt_num_params(&s);
        ck_assert_int_eq(s.has_embed, k == 0);
        ck_assert_int_eq(s.has_head, k == 2);
        /* initial values: the same as the whole model's, slab by slab */
        float *mine = malloc(gpt_num_params(&s) * sizeof(float));
        float *ref = malloc(gpt_num_params(&whole) * sizeof(float));
        gpt_init_params(&s, 7, 0, gpt_num_params(&s), mine);
        gpt_init_params(&whole, 7, 0, gpt_num_params(&whole), ref);
        for (int slab = 0; slab < gpt_num_slabs(&s); slab++) {
            const float *a = mine + gpt_slab_offset(&s, slab);
            const float *b = ref + gpt_slab_offset(&whole, gpt_slab_in_whole(&s, slab));
            ck_assert_msg(max_abs_diff(a, b, gpt_slab_numel(&s, slab)) == 0.0,
                          "stage %d slab %d does not start as the whole model's", k, slab);
        }
        free(mine);
        free(ref);
    }
    /* the blocks once, the embedding twice (the last stage's HEAD copy of wte) */
    ck_assert_uint_eq(total, gpt_num_params(&whole) + gpt_tied_weight_numel(&whole));
}
END_TEST

/* The zero-bubble split (B: input gradient now, W: weight gradients later) gives the
 * whole backward's numbers bit for bit, on every kind of stage. */
START_TEST(split_backward_is_the_whole_backward_bit_for_bit) {
    run_config cfg = small_config();
    dataset *data = dataset_builtin();
    const gpt_shape whole = gpt_shape_make(&cfg.model, 1, 0);
    const int stages[][2] = {{0, 4}, {0, 2}, {1, 3}, {2, 4}};
    const int B = 2, T = cfg.model.ctx;
    const size_t NC = (size_t)B * T * cfg.model.dim;
    for (size_t k = 0; k < sizeof stages / sizeof stages[0]; k++) {
        gpt_shape s = whole;
        gpt_shape_set_stage(&s, stages[k][0], stages[k][1]);
        replica rep;
        replica_init(&rep, &s, cfg.seed, 0);
        gpt_model *m = gpt_model_create(&s, B, T, &(gpt_model_options){.max_slots = 2});
        float *grads[2], *d_in[2], *d_out = malloc(NC * sizeof(float));
        for (size_t i = 0; i < NC; i++) d_out[i] = 1e-3f * (float)((i * 7919) % 101) - 0.05f;
        for (int split = 0; split < 2; split++) {
            gpt_use_slot(m, split);
            load_batch(m, data, &cfg, 1, 0, B);
            float *input = gpt_stage_input(m);   /* an fp32 model's */
            if (!s.has_embed)   /* some input activations: the whole model's embedding */
                for (size_t i = 0; i < NC; i++) input[i] = d_out[(i * 31) % NC] * 40;
            gpt_forward(m, rep.params);
            if (!s.has_head) memcpy(gpt_stage_output_grad(m), d_out, NC * sizeof(float));
            grads[split] = calloc(rep.num_params, sizeof(float));
            if (split) {
                gpt_backward_input(m, rep.params, grads[split], 1e-3f);
                gpt_backward_weights(m, rep.params, grads[split], NULL, NULL);
            } else {
                gpt_backward(m, rep.params, grads[split], 1e-3f, NULL, NULL);
            }
            d_in[split] = malloc(NC * sizeof(float));
            if (!s.has_embed) memcpy(d_in[split], gpt_stage_input_grad(m), NC * sizeof(float));
        }
        double dg = max_abs_diff(grads[0], grads[1], rep.num_params);
        double dx = s.has_embed ? 0 : max_abs_diff(d_in[0], d_in[1], NC);
        printf("split backward, blocks [%d, %d): max |diff| grads %.1e, d input %.1e (must be"
               " 0)\n", stages[k][0], stages[k][1], dg, dx);
        ck_assert_msg(dg == 0.0 && dx == 0.0, "blocks [%d, %d): grads %g, d input %g",
                      stages[k][0], stages[k][1], dg, dx);
        for (int i = 0; i < 2; i++) free(grads[i]), free(d_in[i]);
        free(d_out);
        gpt_model_free(m);
        replica_free(&rep);
    }
    dataset_free(data);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pipeline_stages");
    TCase *tc = tcase_create("stages");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stage_holds_only_its_blocks);
    tcase_add_test(tc, split_backward_is_the_whole_backward_bit_for_bit);
    tcase_add_test(tc, stages_match_the_baseline);
    tcase_add_test(tc, negative_controls_fail_the_comparison);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
