/* Chapter 6: how to choose. A planner that computes, without training, the memory per
 * GPU and the step time of every strategy, walks the course's decision tree with the
 * numbers, and checks itself against the other chapters' measured runs.
 *   make chapter6 && ./run 1 --params 70e9 --gpus 64 --gpu-mem 80
 *   ./run 1 --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --gpus 1024
 *   ./run 1 --course               the course text's claims, re-derived
 *   ./run 1 --predict-chapters     predicted against measured, chapters 1-5 on bench256 */
#include <stdio.h>
#include <string.h>

#include "compare.h"
#include "data.h"
#include "planner.h"
#include "predict.h"
#include "train.h"

static const char *const recompute_choices[] = {"auto", "none", "selective", "full", NULL};
static const char *const zero_choices[] = {"0", "1", "2", "3", NULL};

typedef struct {
    double params, gpu_mem, gpu_tflops, peak_tflops, mfu, tokens;
    int gpus, gpus_per_node, micro_batch, tp, pp, dp, zero, recompute;
    int max_params, course, predict;
} planner_flags;

/* Whether --name was on the command line (as --name X or --name=X). */
static int flag_given(int argc, char **argv, const char *name) {
    const size_t len = strlen(name);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, name, len) == 0 &&
            (argv[i][2 + len] == 0 || argv[i][2 + len] == '='))
            return 1;
    return 0;
}

static plan_model model_from_flags(int argc, char **argv, const run_config *cfg,
                                   const planner_flags *f) {
    const gpt_config *g = &cfg->model;
    if (f->params < 0)
        return (plan_model){g->layers, g->dim, g->heads, g->vocab, g->ctx};
    static const char *const shape_flags[] = {"layers", "hidden", "dim", "heads"};
    for (size_t i = 0; i < sizeof shape_flags / sizeof shape_flags[0]; i++)
        if (flag_given(argc, argv, shape_flags[i]))
            cli_fail("--params %g and --%s both given: give a parameter count or a shape"
                     " (--layers --hidden --heads), not both", f->params, shape_flags[i]);
    const int vocab = flag_given(argc, argv, "vocab") ? g->vocab : 51200;
    const int seq = flag_given(argc, argv, "seq") || flag_given(argc, argv, "ctx") ? g->ctx : 2048;
    return plan_shape_for_params(f->params, vocab, seq);
}

static plan_mesh mesh_from_flags(const planner_flags *f, const plan_model *m) {
    if (!f->tp && !f->pp && !f->dp) {
        if (f->zero)
            cli_fail("--zero %d belongs to a mesh: give --tp, --pp or --dp with it", f->zero);
        return (plan_mesh){0};
    }
    const int tp = f->tp ? f->tp : 1, pp = f->pp ? f->pp : 1;
    int dp = f->dp;
    if (!dp) {
        if (f->gpus % (tp * pp))
            cli_fail("--tp %d x --pp %d = %d does not divide --gpus %d (give --dp, or a mesh"
                     " whose product is %d)", tp, pp, tp * pp, f->gpus, f->gpus);
        dp = f->gpus / (tp * pp);
    }
    if ((long)tp * pp * dp != f->gpus)
        cli_fail("--tp %d x --pp %d x --dp %d = %ld does not multiply to --gpus %d", tp, pp, dp,
                 (long)tp * pp * dp, f->gpus);
    if (m->heads % tp)
        cli_fail("--tp %d does not divide the %d heads (try a divisor of %d)", tp, m->heads,
                 m->heads);
    if (pp > m->layers)
        cli_fail("--pp %d is more stages than the %d layers (at most %d)", pp, m->layers,
                 m->layers);
    return (plan_mesh){.tp = tp, .pp = pp, .dp = dp, .zero_stage = f->zero};
}

static plan_request request_from_flags(int argc, char **argv, const run_config *cfg,
                                       const planner_flags *f) {
    plan_request r = {.model = model_from_flags(argc, argv, cfg, f)};
    if (f->mfu <= 0 || f->mfu > 1)
        cli_fail("--mfu %g: must be a fraction of peak in (0, 1]", f->mfu);
    r.cluster = (plan_cluster){
        .gpus = f->gpus,
        .gpus_per_node = f->gpus_per_node,
        .between_nodes = cfg->comm.link == LINK_NONE ? LINK_IB : cfg->comm.link,
        .flops_per_gpu = 1e12 * (f->gpu_tflops > 0 ? f->gpu_tflops : f->peak_tflops * f->mfu),
    };
    r.gpu_bytes = f->gpu_mem * 1e9;
    r.micro_batch = f->micro_batch;
    /* default: 8 sequences per GPU, enough micro-batches to keep a pipeline busy */
    r.global_batch = flag_given(argc, argv, "batch") ? cfg->batch : 8 * f->gpus;
    r.recompute = f->recompute - 1;   /* auto (-1), none, selective, full */
    r.mesh = mesh_from_flags(f, &r.model);
    if (r.mesh.tp && !plan_micro_batches(&(plan_mesh){.dp = r.mesh.dp, .micro_batch = r.micro_batch,
                                                      .global_batch = r.global_batch}))
        cli_fail("--batch %d does not split into --dp %d x --micro-batch %d sequences (use a"
                 " multiple of %d)", r.global_batch, r.mesh.dp, r.micro_batch,
                 r.mesh.dp * r.micro_batch);
    return r;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    planner_flags f = {.params = -1, .gpu_mem = 80, .peak_tflops = 989, .mfu = 0.4,
                       .gpus = 8, .gpus_per_node = 8, .micro_batch = 1};
    const cli_option options[] = {
        {"params", OPT_FLOAT, &f.params, "plan for this many parameters (a shape is derived)", NULL, 1},
        {"hidden", OPT_INT, &cfg.model.dim, "hidden size h (the same as --dim)", NULL, 1},
        {"seq", OPT_INT, &cfg.model.ctx, "sequence length s (the same as --ctx)", NULL, 1},
        {"gpus", OPT_INT, &f.gpus, "GPUs of the cluster (default 8)", NULL, 1},
        {"gpu-mem", OPT_FLOAT, &f.gpu_mem, "GB per GPU (default 80)", NULL, 1e-3},
        {"gpus-per-node", OPT_INT, &f.gpus_per_node, "GPUs joined by NVLink (default 8)", NULL, 1},
        {"micro-batch", OPT_INT, &f.micro_batch, "sequences per micro-batch (default 1)", NULL, 1},
        {"gpu-tflops", OPT_FLOAT, &f.gpu_tflops, "achieved TFLOP/s per GPU (default: peak x mfu)", NULL, 1e-6},
        {"peak-tflops", OPT_FLOAT, &f.peak_tflops, "peak TFLOP/s per GPU (default 989: H100 BF16)", NULL, 1e-6},
        {"mfu", OPT_FLOAT, &f.mfu, "achieved fraction of peak (default 0.4)", NULL, 0},
        {"tokens", OPT_FLOAT, &f.tokens, "training tokens: print the days it takes", NULL, 1},
        {"tp", OPT_INT, &f.tp, "evaluate this mesh too: tensor-parallel size", NULL, 1},
        {"pp", OPT_INT, &f.pp, "... pipeline stages", NULL, 1},
        {"dp", OPT_INT, &f.dp, "... data-parallel size (default: the rest)", NULL, 1},
        {"zero", OPT_CHOICE, &f.zero, "... ZeRO stage of that mesh", zero_choices, 0},
        {"recompute", OPT_CHOICE, &f.recompute, "activation recomputation (auto: the lightest"
         " that fits)", recompute_choices, 0},
        {"max-params", OPT_FLAG, &f.max_params,
         "largest model per ZeRO stage on the cluster (model parallel: --tp x --pp)", NULL, 0},
        {"course", OPT_FLAG, &f.course, "check the course text's claims by arithmetic", NULL, 0},
        {"predict-chapters", OPT_FLAG, &f.predict,
         "predict chapters 1-5 on bench256 (2 and 4 ranks) and run them to compare", NULL, 0},
        {0},
    };
    cli_parse(argc, argv, &cfg, options, argv[0],
              "How to choose: memory per GPU, time and the decision tree for any model and"
              " cluster, without training.");
    cli_check_at_most("params", f.params, 1e15, "a million billion parameters");
    cli_check_at_most("gpu-mem", f.gpu_mem, 1e6, "a petabyte a GPU");
    cli_check_at_most("gpu-tflops", f.gpu_tflops, 1e6, "a million TFLOP/s");
    cli_check_at_most("peak-tflops", f.peak_tflops, 1e6, "a million TFLOP/s");
    cli_check_at_most("tokens", f.tokens, 1e18, "a billion billion tokens");
    if (cfg.data_path) dataset_free(dataset_from_config(&cfg));   /* refuse a bad file */
    if (!process_hosts_rank0()) return 0;   /* under mpirun: one process answers */

    if (f.predict) {
        predict_options po = {.steps = flag_given(argc, argv, "steps") ? cfg.steps : 3,
                              .link = cfg.comm.link, .link_scale = cfg.comm.link_scale,
                              .data_path = cfg.data_path, .json = cfg.json};
        return predict_chapters(&po);
    }
    if (f.course) {
        course_print();
        return 0;
    }
    plan_request r = request_from_flags(argc, argv, &cfg, &f);
    plan_row rows[PLAN_MAX_ROWS];
    const int n = plan_strategies(&r, rows);
    plan_decision d;
    plan_decide(&r, rows, n, &d);
    if (cfg.json)
        plan_print_json(&r, rows, n, &d, f.tokens, f.max_params);
    else
        plan_print(&r, rows, n, &d, f.tokens, f.max_params);
    return 0;
}
