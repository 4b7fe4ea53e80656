/* Every pair of the mesh's dimensions on 4 ranks, and chapter 11's 16-rank mesh,
 * trained through parallelize (parallelize.h) against the single-device baseline in the
 * same precision (fp32, bf16, bf16 with bf16 gradients, fp16 with fp16 gradients): loss, step-1 gradients and
 * parameters within mesh_run_tolerances, every rank's bytes on every group equal to
 * the formula to the byte and its model state to the as-stored formula. The dimensions:
 * tp 2 + SP (with pp: each stage's LayerNorms on T/tp rows, its boundaries T/tp rows of
 * each sequence, every schedule), cp 2 (ring, balanced), pp 2 (1F1B, 2 micro-batches),
 * dp_shard 2 and dp_replicate 2 (each at ZeRO 1, 2, 3: with replicas, HSDP), ep 2. A pair the model or
 * the trainer refuses is refused by parallelize_check, and the test holds the refusal
 * (its first words). A negative control per dimension must fail the comparison: f's
 * backward all-reduce left out (tp without SP), g-bar's reduce-scatter keeping its own
 * partial (tp+sp on stages), gradients summed over dp without cp (cp), zeros
 * for the last stage's d(input) (pp), no dp reduction (dp_shard), no all-reduce across
 * replicas (dp_replicate). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_run.h"
#include "compare.h"
#include "parallelize.h"
#include "strategy_runs.h"

enum { TP, CP, PP, SHARD, REPLICATE, EP, DIMS };
/* fp32; bf16; bf16 with bf16 gradients; fp16 with fp16 gradients (and its loss scale) */
enum { PRECISIONS = 4 };
static const char *const dim_names[DIMS] = {"tp+sp", "cp", "pp", "dp_shard", "dp_replicate",
                                            "ep"};

static run_config tiny(int ranks, int k) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 8, .layers = 2, .heads = 4, .dim = 32};
    cfg.batch = 8;
    cfg.steps = TOL_STEPS;
    cfg.quiet = 1;
    static const precision p[PRECISIONS] = {PRECISION_FP32, PRECISION_BF16, PRECISION_BF16,
                                             PRECISION_FP16};
    cfg.precision = p[k];
    if (k >= 2) cfg.grad_precision = p[k];   /* 16-bit gradients */
    cfg.comm.ranks = ranks;
    cfg.comm.timeout_seconds = 60;
    return cfg;
}

/* A mesh of the dimensions in `dims` (bits), 2 each. */
static void mesh_of(unsigned dims, mesh_shape *s, pipeline_options *o) {
    *s = (mesh_shape){.tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1};
    *o = (pipeline_options){.schedule = PP_1F1B, .micro = 1, .chunks = 1,
                            .cp = {.kind = CP_RING, .split = CP_BALANCED}};
    if (dims >> TP & 1) s->tp = 2, o->sequence_parallel = 1;
    if (dims >> CP & 1) s->cp = 2;
    if (dims >> PP & 1) s->pp = 2, o->micro = dims >> CP & 1 ? 1 : 2;   /* CP: one at a time */
    if (dims >> SHARD & 1) s->dp *= 2, o->zero_stage = 3;
    if (dims >> REPLICATE & 1) s->dp *= 2, o->zero_stage = 3;
    if (dims >> EP & 1 && s->dp * s->cp < 2) s->dp = 2;   /* ep carves dp x cp */
    if (dims >> EP & 1) s->ep = 2;
    s->dp_shard = dims >> SHARD & 1 ? 2 : dims >> REPLICATE & 1 ? 1 : s->dp;
}

/* What parallelize_check must say of a pair (its words), or NULL: it trains. */
static const char *refusal_of(unsigned dims, int k) {
    (void)k;
    if (dims >> EP & 1) return "--ep 2";
    return NULL;
}

/* The fraction of the bounds the run reaches (1 = at them). */
static double run_mesh(const run_config *cfg, const dataset *d, const baseline_run *b,
                       mesh_shape s, pipeline_options o, const char *what, int exact) {
    mesh_result *r = launch_mesh(cfg, d, s, o, b);
    const double worst = run_worst_fraction_of(&r->run.result, mesh_run_tolerances(cfg, s, &o.moe, b));
    printf("  %-40s grads %.2e params %.2e loss %.2e: %6.0f%% of the bounds\n", what,
           r->run.result.diff_grads, r->run.result.diff_params, r->run.result.diff_loss,
           100 * worst);
    if (exact) check_mesh_formulas(r, s, 0.0);
    mesh_result_free(r);
    return worst;
}

/* Trains the pair (or holds its refusal) in precision k; ZeRO 1-3 where it shards. */
static void pair(const dataset *d, const baseline_run *const b[PRECISIONS], unsigned dims,
                 int k) {
    mesh_shape s;
    pipeline_options o;
    mesh_of(dims, &s, &o);
    run_config cfg = tiny(mesh_world(&s), k);
    char what[96], why[256];
    const parallel_options po = pipeline_parallel_options(&o);
    const char *no = parallelize_check(&cfg, &s, mesh_world(&s), &po, why, sizeof why);
    snprintf(what, sizeof what, "%s x %s %s%s", dim_names[__builtin_ctz(dims)],
             dim_names[31 - __builtin_clz(dims)], precision_name(cfg.precision),
             k >= 2 ? " grads" : "");
    const char *expected = refusal_of(dims, k);
    if (no || expected) {
        printf("  %-40s refused: %s\n", what, no ? no : "(trains)");
        ck_assert_msg(no && expected && strstr(no, expected), "%s: %s, not '%s'", what,
                      no ? no : "trains", expected ? expected : "trains");
        return;
    }
    for (int zero = o.zero_stage ? 1 : 0; zero <= o.zero_stage; zero++) {
        pipeline_options z = o;
        z.zero_stage = zero;
        char w[120];
        snprintf(w, sizeof w, "%s zero %d:", what, zero);
        ck_assert_msg(run_mesh(&cfg, d, b[k], s, z, w, 1) <= 1.0, "%s", w);
    }
}

START_TEST(every_pair_on_4_ranks) {
    dataset *d = dataset_builtin();
    const baseline_run *b[PRECISIONS];
    baseline_run *owned[PRECISIONS];
    for (int k = 0; k < PRECISIONS; k++) {
        run_config one = tiny(1, k);
        b[k] = owned[k] = baseline_train(&one, d);
    }
    for (int i = 0; i < DIMS; i++)
        for (int j = i + 1; j < DIMS; j++)
            for (int k = 0; k < PRECISIONS; k++) pair(d, b, 1u << i | 1u << j, k);
    for (int k = 0; k < PRECISIONS; k++) baseline_free(owned[k]);
    dataset_free(d);
}
END_TEST

/* tp+sp x pp under every schedule of chapter 4 (1F1B is the pair's above): the split
 * backwards (zb-h1, zb-v, dualpipev) gather the LayerNorms' rows again in their weight
 * half; fp32 and bf16, the bytes to the formula. */
START_TEST(sequence_parallel_stages_under_every_schedule) {
    static const pp_schedule_kind kinds[] = {PP_GPIPE, PP_INTERLEAVED, PP_ZB_H1, PP_ZB_V,
                                             PP_DUALPIPE_V};
    dataset *d = dataset_builtin();
    for (int k = 0; k < 2; k++) {
        run_config one = tiny(1, k);
        one.model.layers = 4;   /* a block for each of a V's 4 stages */
        baseline_run *b = baseline_train(&one, d);
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            mesh_shape s;
            pipeline_options o;
            mesh_of(1u << TP | 1u << PP, &s, &o);
            o.schedule = kinds[i];
            o.chunks = pp_schedule_chunks(kinds[i], 2);
            o.micro = kinds[i] == PP_DUALPIPE_V ? 2 * s.pp : o.micro;   /* DualPipeV: 2p at least */
            run_config cfg = tiny(mesh_world(&s), k);
            cfg.model.layers = one.model.layers;
            char what[96];
            snprintf(what, sizeof what, "tp+sp x pp %s %s:", pp_schedule_name(kinds[i]),
                     precision_name(cfg.precision));
            ck_assert_msg(run_mesh(&cfg, d, b, s, o, what, 1) <= 1.0, "%s", what);
        }
        baseline_free(b);
    }
    dataset_free(d);
}
END_TEST

/* One control a dimension: the pair trained with that dimension's communication broken. */
START_TEST(a_broken_dimension_fails) {
    static const struct { unsigned dims; pipeline_fault fault; const char *what; } controls[] = {
        {1u << TP | 1u << PP, PIPELINE_FAULT_DROP_F_BACKWARD, "tp (no SP): f's backward left out"},
        {1u << TP | 1u << PP, PIPELINE_FAULT_SP_OWN_PARTIAL,
         "tp+sp x pp: reduce-scatter without the sum"},
        {1u << CP | 1u << SHARD, PIPELINE_FAULT_GRADS_OVER_DP_ONLY, "cp: gradients over dp alone"},
        {1u << PP | 1u << SHARD, PIPELINE_FAULT_DROP_INPUT_GRAD, "pp: d(input) zeros"},
        {1u << SHARD | 1u << REPLICATE, PIPELINE_FAULT_SKIP_DP_REDUCE, "dp_shard: no reduction"},
        {1u << SHARD | 1u << REPLICATE, PIPELINE_FAULT_SKIP_REPLICATE_REDUCE,
         "dp_replicate: no all-reduce"}};
    dataset *d = dataset_builtin();
    run_config one = tiny(1, 0);
    baseline_run *b = baseline_train(&one, d);
    for (size_t i = 0; i < sizeof controls / sizeof controls[0]; i++) {
        mesh_shape s;
        pipeline_options o;
        mesh_of(controls[i].dims, &s, &o);
        o.fault = controls[i].fault;
        /* f's backward is SP's reduce-scatter with SP: dropped only without it */
        if (o.fault == PIPELINE_FAULT_DROP_F_BACKWARD) o.sequence_parallel = 0;
        const run_config cfg = tiny(mesh_world(&s), 0);
        const double f = run_mesh(&cfg, d, b, s, o, controls[i].what, 0);
        ck_assert_msg(f > 1.0, "%s: %.2f of the bounds", controls[i].what, f);
    }
    baseline_free(b);
    dataset_free(d);
}
END_TEST

/* tp 2 x cp 2 x pp 2 x dp 2 at ZeRO-3, one micro-batch (CP's attention keeps one): the
 * tied embedding's two copies may differ in their last bit, the pieces that hold it on
 * the first and the last stage being summed in other orders by a ring of 4 (cp x
 * dp_shard); printed, and held within the parameters' tolerance. */
static double every_dimension(const run_config *cfg, const dataset *d, const baseline_run *b,
                              pipeline_options o) {
    const mesh_shape s = {.tp = 2, .pp = 2, .dp = 2, .cp = 2, .dp_shard = 2};
    mesh_result *r = launch_mesh(cfg, d, s, o, b);
    const double worst = run_worst_fraction_of(&r->run.result, mesh_run_tolerances(cfg, s, &o.moe, b));
    printf("  %-40s grads %.2e params %.2e loss %.2e: %6.0f%% of the bounds; tied copies %.1e\n",
           "16: tp 2 x cp 2 x pp 2 x dp 2 fp32:", r->run.result.diff_grads,
           r->run.result.diff_params, r->run.result.diff_loss, 100 * worst, r->x.tied_drift);
    ck_assert_msg(r->x.worst_bytes_error == 0, "bytes off by %g", r->x.worst_bytes_error);
    ck_assert(r->x.tied_drift <= TOL_PARAMS);
    for (int w = 0; w < mesh_world(&s); w++)
        for (int i = 0; i < 3; i++) ck_assert(r->x.ranks[w].state[i] == r->x.ranks[w].state_formula[i]);
    mesh_result_free(r);
    return worst;
}

/* Chapter 11's mesh: tp 2 x pp 2 x dp 4 (2 shards x 2 replicas) at ZeRO-3 in every
 * precision; with CP 2 in place of the stages, and tp 2 x cp 2 x pp 2 x dp 2 (fp32: CP
 * computes in fp32 so far). */
START_TEST(the_chapter_mesh_on_16_ranks) {
    dataset *d = dataset_builtin();
    const mesh_shape with_pp = {.tp = 2, .pp = 2, .dp = 4, .cp = 1, .dp_shard = 2};
    const mesh_shape with_cp = {.tp = 2, .pp = 1, .dp = 4, .cp = 2, .dp_shard = 2};
    for (int k = 0; k < PRECISIONS; k++) {
        run_config one = tiny(1, k);
        baseline_run *b = baseline_train(&one, d);
        const run_config cfg = tiny(16, k);
        pipeline_options o = {.schedule = PP_1F1B, .micro = 2, .chunks = 1, .zero_stage = 3};
        char what[80];
        snprintf(what, sizeof what, "16: tp 2 x pp 2 x dp 2 x 2 %s%s:",
                 precision_name(cfg.precision), k >= 2 ? " grads" : "");
        ck_assert(run_mesh(&cfg, d, b, with_pp, o, what, 1) <= 1.0);
        if (k == 0) {
            o.micro = 1;
            o.cp = (cp_options){.kind = CP_RING, .split = CP_BALANCED};
            ck_assert(run_mesh(&cfg, d, b, with_cp, o, "16: tp 2 x cp 2 x dp 2 x 2 fp32:", 1) <= 1.0);
            ck_assert(every_dimension(&cfg, d, b, o) <= 1.0);
        }
        baseline_free(b);
    }
    dataset_free(d);
}
END_TEST

static Suite *matrix_suite(void) {
    Suite *s = suite_create("mesh matrix");
    TCase *t = tcase_create("pairs");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, every_pair_on_4_ranks);
    tcase_add_test(t, sequence_parallel_stages_under_every_schedule);
    tcase_add_test(t, a_broken_dimension_fails);
    tcase_add_test(t, the_chapter_mesh_on_16_ranks);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return check_run(matrix_suite(), 0); }
