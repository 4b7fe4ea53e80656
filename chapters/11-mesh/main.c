/* Chapter 11: one mesh, every dimension. TP (with SP), CP, PP, DP as dp_shard x
 * dp_replicate with ZeRO 0-3 (HSDP), EP for MoE blocks, laid out in Megatron-core's order and applied to
 * one model by parallelize (parallelize.h), trained against the single-device run in
 * the same precision. What the model does not compute yet is refused with its reason.
 *
 *   make chapter11 && ./run 16       tp 2 x cp 2 x pp 2 x dp 2 where the model trains CP
 *                                    in bf16, else tp 2 x pp 2 x dp 4 (2 shards x 2
 *                                    replicas); ZeRO-3, bf16 with bf16 gradients, and one
 *                                    line for each dimension left out
 *   ./run 16 --sp                    the default mesh with TP + SP on every stage
 *   ./run 4 --tp 2 --sp --dp-shard 2 --zero 3 --precision fp32
 *   ./run 8 --cp 2 --cp-attention ulysses --tp 2 --dp-shard 2 --zero 1 --precision fp32
 *   ./run 8 --tp 2 --ep 2 --experts 4 --moe-every 2   MoE: TP x EP x DP against the MoE
 *                                    model on one device (moe_params.h)
 *   ./run 1 --mesh-only --world 16384 --tp 8 --cp 16 --pp 16 --dp-shard 8 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "fits.h"
#include "matmul16.h"
#include "mesh_chapter.h"
#include "parallelize.h"
#include "report.h"

/* The MoE model's blocks where the mesh has expert ranks, else a dense model. */
static moe_config moe_of(const mesh_args *a) {
    if (mesh_ep_size(&a->shape) < 2) return (moe_config){0};
    return (moe_config){.experts = a->experts, .top_k = a->top_k, .every = a->moe_every,
                        .capacity_factor = a->capacity_factor, .aux_coef = (float)a->aux_loss};
}

static parallel_options parallel_of(const mesh_args *a) {
    return (parallel_options){.zero = a->zero, .sequence_parallel = a->sp,
                              .cp = {.kind = a->cp_attention, .split = CP_CONTIGUOUS},
                              .micro = a->micro, .moe = moe_of(a),
                              .split_backward = pp_schedule_about(a->schedule)->split_backward};
}

static pipeline_options pipeline_of(const mesh_args *a) {
    return (pipeline_options){.schedule = a->schedule, .micro = a->micro,
                              .chunks = pp_schedule_chunks(a->schedule, 2),
                              .zero_stage = a->zero, .sequence_parallel = a->sp,
                              .cp = parallel_of(a).cp, .moe = moe_of(a)};
}

/* Sizes not given, for `world` ranks: cp 1, ep 1; tp, pp and dp as chapter 5 completes
 * them (pp 1 when a dp size, cp, sp or ep is given); dp split into 2 shards x the rest as replicas
 * where it is 4 or more and even. */
static void complete(mesh_args *a, int world) {
    char err[200];
    mesh_shape *s = &a->shape;
    s->cp = s->cp > 0 ? s->cp : 1;
    if (world % s->cp) cli_fail("--cp %d does not divide the %d ranks", s->cp, world);
    if (a->dp_shard && a->dp_replicate) s->dp = a->dp_shard * a->dp_replicate;
    /* dp sizes, CP, SP or EP asked for (the mesh's own dimensions rather than chapter
     * 5's; EP trains without stages so far): one stage unless --pp says otherwise */
    if ((a->dp_shard || a->dp_replicate || s->cp > 1 || a->sp || s->ep > 1) && !s->pp) s->pp = 1;
    if (!mesh_complete(s, world / s->cp, a->cfg.model.heads, a->cfg.model.layers, err,
                       sizeof err))
        cli_fail("%s (ranks = tp x cp x dp x pp)", err);
    if (a->dp_shard) s->dp_shard = a->dp_shard;
    else if (a->dp_replicate) s->dp_shard = s->dp % a->dp_replicate ? -1 : s->dp / a->dp_replicate;
    else s->dp_shard = s->dp >= 4 && s->dp % 2 == 0 ? 2 : s->dp;
    if (s->dp_shard < 1 || s->dp % s->dp_shard) {
        char asked[64];
        if (a->dp_shard && a->dp_replicate)
            snprintf(asked, sizeof asked, "--dp-shard %d x --dp-replicate %d", a->dp_shard,
                     a->dp_replicate);
        else
            snprintf(asked, sizeof asked, "--dp-%s %d", a->dp_shard ? "shard" : "replicate",
                     a->dp_shard ? a->dp_shard : a->dp_replicate);
        cli_fail("%s does not divide the %d data-parallel ranks that %d ranks / (tp %d x cp %d"
                 " x pp %d) leave", asked, s->dp, world, s->tp, s->cp, s->pp);
    }
}

/* Micro-batches not given: up to 4 with stages, 1 without or with CP (whose attention
 * keeps one micro-batch's state). */
static void choose_micro(mesh_args *a) {
    const int per_replica = a->cfg.batch / (a->shape.dp > 0 ? a->shape.dp : 1);
    if (!a->micro) {
        const int many = a->shape.pp > 1 && mesh_cp_size(&a->shape) == 1;
        a->micro = many ? (per_replica < 4 ? per_replica : 4) : 1;
        while (a->micro > 1 && per_replica % a->micro) a->micro--;
    }
    a->micro = pp_schedule_micro(a->schedule, a->micro);
}

/* The default run: the course's mesh with CP (tp 2 x cp 2 x pp 2 x the rest as dp) where
 * the model trains it in this precision, else what complete() lays out. */
static void default_mesh(mesh_args *a, int world) {
    char why[512];
    mesh_args with_cp = *a;
    const int dp = world / 8;
    with_cp.shape = (mesh_shape){.tp = 2, .cp = 2, .pp = 2, .dp = dp,
                                 .dp_shard = dp >= 4 && dp % 2 == 0 ? 2 : dp};
    with_cp.micro = 1;
    const parallel_options po = parallel_of(&with_cp);
    if (world % 8 == 0 && !parallelize_check(&with_cp.cfg, &with_cp.shape, world, &po, why,
                                             sizeof why)) {
        *a = with_cp;
        return;
    }
    complete(a, world);
    choose_micro(a);
}

static void check_or_exit(mesh_args *a, int world) {
    char why[512];
    const parallel_options po = parallel_of(a);
    if (parallelize_check(&a->cfg, &a->shape, world, &po, why, sizeof why))
        cli_fail("%s", why);
    const pipeline_options pl = pipeline_of(a);
    if (!pp_validate(a->schedule, a->shape.pp, a->micro, pl.chunks, a->cfg.model.layers,
                     a->cfg.batch / a->shape.dp, why, sizeof why))
        cli_fail("%s (each of the %d data-parallel ranks trains on %d of the --batch %d"
                 " sequences)", why, a->shape.dp, a->cfg.batch / a->shape.dp, a->cfg.batch);
}

/* The course's whole mesh, one dimension at a time on this one: the flags that add it,
 * or why the model and the trainers refuse it so far, one line each (the default run's
 * note). */
static void print_left_out(const mesh_args *a, int world) {
    char why[512];
    mesh_args sp = *a, cp = *a, ep = *a;
    sp.sp = 1;
    cp.shape.cp = 2, cp.shape.dp /= 2, cp.shape.dp_shard = cp.shape.dp, cp.micro = 1;
    ep.shape.ep = 2;
    const mesh_args *tries[] = {&sp, &cp, &ep};
    const char *names[] = {"+ SP", "CP 2", "EP 2 (MoE)"};
    const char *flags[] = {"add --sp", "add --cp 2", "add --ep 2 --moe-every 2"};
    printf("\nThe course's whole mesh (TP 2 + SP x CP 2 x PP 2 x DP 2, EP 2 with MoE every"
           " other block), one dimension at a time on this one:\n");
    ep.moe_every = 2;
    for (int i = 0; i < 3; i++) {
        if ((i == 0 && a->sp) || (i == 1 && mesh_cp_size(&a->shape) > 1)) continue;   /* trained here */
        const parallel_options po = parallel_of(tries[i]);
        const char *no = parallelize_check(&tries[i]->cfg, &tries[i]->shape, world, &po, why,
                                           sizeof why);
        printf("  %-11s %s%s\n", names[i], no ? "not yet: " : "trains: ",
               no ? no : flags[i]);
    }
}

static void print_verdict(const run_config *cfg, const run_tolerances *t, double worst,
                          const mesh_extra *x, double spread_bound, int moe) {
    if (moe && cfg->precision != PRECISION_FP32 && matmul16_widens(cfg->precision))
        printf("\nThe experts' %s products run widened to fp32 here, 16 rows a call, each row"
               " summed by where it falls:\nan expert's rows sit elsewhere than on one device,"
               " so a row may round one unit apart (bounds: tolerances.h)\n",
               precision_name(cfg->precision));
    if (spread_bound > 0)
        printf("\nThe loss over %d steps in %s: held within %.1e, %d x one device's largest"
               " distance from the same run in fp32 (past %d steps two runs that round apart"
               " drift apart: tolerances.h)\n", cfg->steps, precision_name(cfg->precision),
               spread_bound, MIXED_SPREAD_FACTOR, TOL_STEPS);
    if (t->loss == 0)
        printf("\nThe loss over %d steps in fp32: not held past %d (AdamW parts the runs where"
               " a gradient is near 0, a near-tied\nrouting choice flips and the runs part:"
               " tolerances.h); the parameters within AdamW's drift bound\n", cfg->steps,
               TOL_STEPS);
    char loss[32] = "not held";
    if (t->loss > 0) snprintf(loss, sizeof loss, "%.0e", t->loss);
    printf("\n%s: the mesh against the baseline (%s tolerances: gradients of step 1 %.0e,"
           " loss %s, parameters %.0e): %.0f%% of the tolerance at worst; bytes %s their"
           " formulas; the tied embedding's two copies differ by %.1e\n",
           worst <= 1 ? "OK" : "FAILED", precision_name(cfg->precision), t->grads, loss,
           t->params, 100 * worst, x->worst_bytes_error == 0 ? "equal to" : "off",
           x->tied_drift);
}

/* MoE: the routers' and experts' step-1 gradients and final parameters against one
 * device's, as a fraction of the bounds (0 for a dense model). */
static double moe_worst(const mesh_extra *x, const mesh_extra *one, const run_tolerances *t,
                        int print) {
    if (!x->moe_num_params || x->moe_num_params != one->moe_num_params) return 0;
    double grads = 0, params = 0;
    for (size_t i = 0; i < x->moe_num_params; i++) {
        grads = fmax(grads, fabs((double)x->moe_first_grads[i] - one->moe_first_grads[i]));
        params = fmax(params, fabs((double)x->moe_final_params[i] - one->moe_final_params[i]));
    }
    if (print)
        printf("\nThe routers and every expert (gathered over ep) against one device: step-1"
               " gradients %.2e, parameters %.2e\n", grads, params);
    return fmax(grads / t->grads, params / t->params);
}

static int train(mesh_args *a, int world, int default_mesh) {
    const run_config *cfg = &a->cfg;
    dataset *data = dataset_from_config(cfg);
    const int root = process_hosts_rank0();
    baseline_run *baseline = NULL;
    const mesh_shape *s = &a->shape;
    if (root) {
        char title[320], moe[120] = "";
        if (mesh_ep_size(s) > 1)
            snprintf(moe, sizeof moe, ", ep %d (MoE: %d experts, top-%d, every %s block)",
                     s->ep, a->experts, a->top_k, a->moe_every == 1 ? "" : "other");
        snprintf(title, sizeof title, "Chapter 11: one mesh, tp %d%s x cp %d x pp %d x dp %d"
                 " (%d shards x %d replicas, ZeRO-%d)%s against single-device training%s",
                 s->tp, a->sp ? " + SP" : "", mesh_cp_size(s), s->pp, s->dp,
                 mesh_dp_shard_size(s), mesh_dp_replicate_size(s), a->zero, moe,
                 moe[0] ? " (the MoE model's)" : "");
        report_header(cfg, title, world, 1);
        if (!cfg->json) mesh_print_layout(s);
    }
    const pipeline_options opts = pipeline_of(a);
    mesh_extra x_one = {0};
    strategy_outcome moe_one = {.extra = &x_one};
    baseline_run moe_baseline;
    if (root && opts.moe.experts > 0) {   /* the MoE model on one device */
        if (mesh_train_one_device(cfg, data, &opts, &moe_one) != 0) return 1;
        moe_baseline = mesh_outcome_as_baseline(&moe_one);
        moe_baseline.result.strategy = "baseline";
        baseline = &moe_baseline;
    } else if (root) {
        baseline = baseline_reference(cfg, data);
    }
    mesh_extra x;
    strategy_outcome o = {.extra = &x};
    int status = mesh_launch(cfg, data, *s, &opts, &o);
    if (root && status == 0) {
        strategy_outcome_compare(&o, baseline);
        run_result rows[2] = {baseline->result, o.result};
        char *extra = mesh_json(&x, world, a);
        rows[1].json_extra = extra;
        run_tolerances t = mesh_run_tolerances(cfg, *s, &opts.moe, baseline);
        double spread_bound = mesh_loss_bound_from_fp32(cfg, data, &opts, baseline->loss);
        if (spread_bound < 0) status = 1;
        if (spread_bound > t.loss) t.loss = spread_bound;
        else spread_bound = 0;   /* the precision's own bound is larger: it holds */
        const double worst = fmax(run_worst_fraction_of(&o.result, t),
                                  moe_worst(&x, &x_one, &t, 0));
        if (cfg->json) {
            report_json(cfg, "11-mesh", world, launch_backend_name(&cfg->comm, world), rows, 2,
                        NULL);
        } else {
            report_table(cfg, rows, 2);
            mesh_print_bytes(&x, world);
            mesh_print_memory(&x, world, cfg);
            moe_worst(&x, &x_one, &t, 1);
            if (default_mesh) print_left_out(a, world);
            print_verdict(cfg, &t, worst, &x, spread_bound, opts.moe.experts > 0);
        }
        if (worst > 1 || x.worst_bytes_error != 0 || x.alltoall_mismatch != 0) status = 1;
        free(extra);
    }
    strategy_outcome_free(&o);
    mesh_extra_free(&x);
    if (baseline != &moe_baseline) baseline_free(baseline);
    if (moe_one.loss) strategy_outcome_free(&moe_one);
    mesh_extra_free(&x_one);
    dataset_free(data);
    return status;
}

/* (with the shared cli_training_flags) */
static const char *const training_flags[] = {"schedule", "micro", "zero", "sp", "cp-attention",
                                             "precision", NULL};
/* (--sp alone keeps the default mesh: it trains with SP on it) */
static const char *const mesh_sizes[] = {"tp", "cp", "pp", "dp-shard", "dp-replicate", "ep",
                                         "zero", NULL};

/* Refusals before any rank starts: flags that do nothing here, and MoE. */
static void refuse_flags(const mesh_args *a) {
    if (a->mesh_only) {
        const char *why = "it lays out the mesh and trains nothing";
        cli_refuse_in_mode("--mesh-only", cli_training_flags, why);
        cli_refuse_in_mode("--mesh-only", training_flags, why);
    }
    if (a->world && !a->mesh_only) cli_fail("--world %d belongs to --mesh-only", a->world);
    if (a->zero > 3) cli_fail("--zero %d: ZeRO has stages 0-3", a->zero);
    if (cli_given("cp-attention") && a->shape.cp < 2)
        cli_fail("--cp-attention does nothing without --cp 2 or more");
    if (!a->mesh_only && (cli_given("experts") || cli_given("moe-every")) && a->shape.ep < 2)
        cli_fail("--experts and --moe-every go with --ep (the MoE model's expert ranks)");
    static const char *const moe_flags[] = {"top-k", "capacity-factor", "aux-loss", NULL};
    if (a->shape.ep < 2 || a->mesh_only)
        cli_refuse_in_mode(a->mesh_only ? "--mesh-only" : "a dense mesh (no --ep)", moe_flags,
                           "they shape the MoE blocks that --ep 2 or more trains");
}

static int mesh_only(mesh_args *a) {
    char why[512];
    if (!a->world) cli_fail("--mesh-only needs --world N (e.g. --world 16384 --tp 8 --cp 16)");
    if (a->world > 1 << 20) cli_fail("--world %d: at most 1048576 ranks", a->world);
    complete(a, a->world);
    const mesh_config mc = {.shape = a->shape, .world = a->world,
                            .experts = a->shape.ep > 1 ? a->experts : 0};
    if (mesh_check(&mc, why, sizeof why)) cli_fail("%s", why);
    if (process_hosts_rank0()) mesh_print_only(&a->shape, a->cfg.json);
    return 0;
}

static int any_given(const char *const *flags) {
    for (int i = 0; flags[i]; i++)
        if (cli_given(flags[i])) return 1;
    return 0;
}

static void apply_defaults(mesh_args *a) {
    if (!cli_given("precision")) a->cfg.precision = PRECISION_BF16;
    if (!cli_given("grad-dtype")) a->cfg.grad_precision = a->cfg.precision;
    if (!cli_given("zero")) a->zero = 3;
}

int main(int argc, char **argv) {
    mesh_args a = {.cfg = run_config_default(), .schedule = PP_1F1B, .experts = 4,
                   .moe_every = 2, .top_k = 2, .capacity_factor = 1.25, .aux_loss = 0.01};
    const char *schedules[PP_NSCHEDULES + 2];
    pp_schedule_choices(schedules, NULL);
    a.cfg.no_checkpoints = "chapter 11 trains a short run to compare with one device, not"
                           " one to keep";
    const cli_option options[] = {
        {"tp", OPT_INT, &a.shape.tp, "tensor-parallel size", NULL, 1},
        {"sp", OPT_FLAG, &a.sp, "Megatron sequence parallelism on the TP group", NULL, 0},
        {"cp", OPT_INT, &a.shape.cp, "context-parallel size (chunks of every sequence)", NULL, 1},
        {"cp-attention", OPT_CHOICE, &a.cp_attention, "how attention crosses the chunks",
         cp_attention_names, 0},
        {"pp", OPT_INT, &a.shape.pp, "pipeline stages", NULL, 1},
        {"schedule", OPT_CHOICE, &a.schedule, "pipeline schedule (chapter 4's)", schedules, 0},
        {"micro", OPT_INT, &a.micro, "micro-batches per step and replica", NULL, 1},
        {"dp-shard", OPT_INT, &a.dp_shard, "data-parallel ranks ZeRO shards over", NULL, 1},
        {"dp-replicate", OPT_INT, &a.dp_replicate, "replicas of the shard group (HSDP)", NULL, 1},
        {"zero", OPT_INT, &a.zero, "ZeRO over dp_shard x cp: 0 DDP .. 3 FSDP, a stage's weights"
         " gathered once a step (default 3)", NULL, 0},
        {"ep", OPT_INT, &a.shape.ep, "expert-parallel size (MoE)", NULL, 1},
        {"experts", OPT_INT, &a.experts, "experts per MoE block", NULL, 1},
        {"moe-every", OPT_INT, &a.moe_every, "MoE in every (1) or every other (2) block", NULL, 1},
        {"top-k", OPT_INT, &a.top_k, "experts a token goes to: 1 or 2", NULL, 1},
        {"capacity-factor", OPT_FLOAT, &a.capacity_factor,
         "an expert takes ceil(factor x tokens x k / E) pairs (0: no dropping)", NULL, 0},
        {"aux-loss", OPT_FLOAT, &a.aux_loss, "the load-balancing loss's coefficient", NULL, 0},
        {"mesh-only", OPT_FLAG, &a.mesh_only, "lay out and check a mesh of --world ranks", NULL, 0},
        {"world", OPT_INT, &a.world, "ranks for --mesh-only", NULL, 1},
        {0},
    };
    cli_parse(argc, argv, &a.cfg, options, argv[0],
              "One mesh, every dimension (TP + SP, CP, PP, DP as shards x replicas with ZeRO),"
              " against single-device training.");
    refuse_flags(&a);
    if (a.mesh_only) return mesh_only(&a);
    const int default_run = !any_given(mesh_sizes);
    apply_defaults(&a);
    const int mpi = launch_mpi_world_size();
    const int world = mpi > 0 ? mpi : a.cfg.comm.ranks;
    if (default_run) {
        default_mesh(&a, world);
    } else {
        complete(&a, world);
        choose_micro(&a);
    }
    check_or_exit(&a, world);
    fits_check_or_exit(&a.cfg, 1.0 / (a.shape.tp * a.shape.pp));
    return train(&a, world, default_run);
}
