/* Chapter 6: how to choose. A planner that computes, without training, the memory per
 * GPU and the step time of every strategy, walks the course's decision tree with the
 * numbers, and checks itself against the other chapters' measured runs.
 *   make chapter6 && ./run 1 --params 70e9 --gpus 64 --gpu-mem 80
 *   ./run 1 --layers 96 --hidden 12288 --heads 96 --vocab 51200 --seq 2048 --gpus 1024
 *   ./run 1 --course               the course text's claims, re-derived
 *   ./run 1 --predict-chapters     predicted against measured, chapters 1-5 and 9 on bench256,
 *                                  and the planner's mesh trained in chapter 11
 *   ./run 1 --model gpt4-moe       a mixture of experts against a dense GPT of its active size
 *   ./run 1 --model gpt3           the course's GPT-3 on 1024 GPUs, and how often to save it */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "data.h"
#include "planner.h"
#include "predict.h"
#include "baseline.h"
#include "replica.h"

static const char *const recompute_choices[] = {"auto", "none", "selective", "full", NULL};
static const char *const zero_choices[] = {"0", "1", "2", "3", NULL};
static const char *const every_choices[] = {"1", "2", NULL};
static const char *const model_choices[] = {"gpt3", "gpt4-moe", NULL};
enum { MODEL_GPT3, MODEL_GPT4_MOE };

typedef struct {
    double params, gpu_mem, gpu_tflops, peak_tflops, mfu, tokens;
    int gpus, gpus_per_node, micro_batch, tp, pp, dp, zero, recompute;
    int max_params, course, predict;
    int model;                                  /* with --model: a model_choices index */
    int batch;                                  /* --model's global batch; 0: 8 a GPU */
    int moe_experts, moe_top_k, moe_every, moe_ffn, ep;
    int cp, cp_attention;                       /* context parallel: size, cp_attention_kind */
    int dp_shard;                               /* HSDP's shard group, out of dp */
    double mtbf_hours, gpu_mtbf_hours, save_seconds, save_bandwidth, restart_seconds;
} planner_flags;

/* The most GPUs planned for: the default batch, 8 sequences a GPU, stays an int. */
#define PLANNER_MAX_GPUS 1e8

/* The shared flags the planner has no use for: it trains nothing itself. --steps,
 * --data and --link-scale stay: --predict-chapters passes them to the chapters. */
static const char *const planner_unused[] = {
    "seed", "lr", "weight-decay", "warmup", "quiet", "profile", "device", "tf32",
    "allreduce", "send-mode", "comm-timeout", "trace", "save", "save-every", "resume",
    "save-test-crash", "loss-scale", "loss-scale-window", "no-loss-scale",
    "test-overflow-step", "grad-dtype", "fp8-recipe", "fp8-format", "fp8-amax-history",
    "fp8-margin", "link-intra", "link-inter", "ranks-per-node", "matmul", NULL};
/* Flags only --predict-chapters uses. */
static const char *const predict_only[] = {"steps", "data", "link-scale", NULL};
/* What a plan is made of: the model, the cluster, the mesh and what to print. */
static const char *const plan_flags[] = {
    "params", "hidden", "seq", "layers", "heads", "dim", "ctx", "vocab", "preset", "batch",
    "gpus", "gpu-mem", "gpus-per-node", "micro-batch", "gpu-tflops", "peak-tflops", "mfu",
    "tokens", "tp", "pp", "dp", "zero", "recompute", "max-params", "model", "moe-experts",
    "moe-top-k", "moe-every", "moe-ffn", "ep", "mtbf-hours", "gpu-mtbf-hours", "save-seconds",
    "save-bandwidth", "restart-seconds", "cp", "cp-attention", "dp-shard", NULL};
/* A model given by shape. */
static const char *const shape_flags[] = {"layers", "hidden", "dim", "heads", "vocab", "seq",
                                          "ctx", "preset", "model", NULL};
/* What only a model's plan uses, not the largest model per ZeRO stage. */
static const char *const model_plan_flags[] = {
    "batch", "micro-batch", "gpu-tflops", "peak-tflops", "mfu", "tokens", "zero", "recompute",
    "gpus-per-node", "link", "model", "moe-experts", "moe-top-k", "moe-every", "moe-ffn", "ep",
    "mtbf-hours", "gpu-mtbf-hours", "save-seconds", "save-bandwidth", "restart-seconds", "cp",
    "cp-attention", "dp-shard", NULL};
/* What only a mixture of experts uses, and what a preset fixes. */
static const char *const moe_detail_flags[] = {"moe-top-k", "moe-every", "moe-ffn", "ep", NULL};
static const char *const model_fixed_flags[] = {
    "params", "layers", "hidden", "dim", "heads", "vocab", "seq", "ctx", "preset",
    "moe-experts", "moe-top-k", "moe-every", "moe-ffn", NULL};
/* What a mixture of experts' plan does not print. */
static const char *const dense_only_flags[] = {"max-params", "tokens", NULL};

static int any_given(const char *const *flags) {
    for (int i = 0; flags[i]; i++)
        if (cli_given(flags[i])) return 1;
    return 0;
}

/* --max-params without a model: the largest model per ZeRO stage is all it prints. */
static int cluster_only(const planner_flags *f) {
    return f->max_params && f->params < 0 && !any_given(shape_flags);
}

static int is_moe(const planner_flags *f) {
    return f->moe_experts > 0 || (cli_given("model") && f->model == MODEL_GPT4_MOE);
}

/* A mixture of experts' flags and the checkpoint section's, where they do not apply. */
static void refuse_moe_and_failure_flags(const planner_flags *f) {
    if (cli_given("model"))
        cli_refuse_in_mode("--model", model_fixed_flags, "the preset fixes the model; plan"
                           " another with --params or a shape and --moe-experts");
    if (!is_moe(f))
        cli_refuse_in_mode("a dense model", moe_detail_flags, "it has no experts: give"
                           " --moe-experts");
    else
        cli_refuse_in_mode("a mixture of experts", dense_only_flags, "its plan compares it"
                           " with a dense model and prints no training days or largest models");
    if (is_moe(f))
        cli_refuse_in_mode("a mixture of experts", (const char *const[]){"cp", "cp-attention",
                                                                          NULL},
                           "its plan has no context parallelism; plan the dense model with it");
    if (cli_given("cp-attention") && f->cp < 2)
        cli_fail("--cp-attention %s without --cp 2 or more: it says how context parallelism"
                 " crosses the chunks", cp_attention_names[f->cp_attention]);
    if (cli_given("mtbf-hours") && cli_given("gpu-mtbf-hours"))
        cli_fail("--mtbf-hours %g and --gpu-mtbf-hours %g both given: give the job's MTBF or"
                 " one GPU's, not both", f->mtbf_hours, f->gpu_mtbf_hours);
    if (cli_given("save-seconds") && cli_given("save-bandwidth"))
        cli_fail("--save-seconds %g and --save-bandwidth %g both given: give the save's time"
                 " or the bandwidth it follows from, not both", f->save_seconds,
                 f->save_bandwidth);
}

static int fp8_planned;   /* --precision fp8 */

/* The modes that ignore flags refuse them, in one line, before anything runs. */
static void refuse_ignored_flags(const planner_flags *f) {
    if (f->predict) {
        cli_refuse_in_mode("--predict-chapters", plan_flags, "it runs bench256 on 2 and 4"
                           " ranks, as chapters 1-5 and 9 are built");
        cli_refuse_in_mode("--predict-chapters", (const char *const[]){"course", NULL},
                           "run them one at a time");
        if (cli_given("precision") && fp8_planned)
            cli_fail("--precision fp8: --predict-chapters runs the chapters in fp32, bf16 or"
                     " fp16 (a plan takes fp8)");
        return;
    }
    cli_refuse_in_mode("a plan", predict_only, "only --predict-chapters runs programs");
    if (f->course) {
        cli_refuse_in_mode("--course", plan_flags, "it checks the course text's own numbers");
        cli_refuse_in_mode("--course", (const char *const[]){"json", NULL},
                           "it prints its checks as text");
        cli_refuse_in_mode("--course", (const char *const[]){"link", NULL},
                           "its cluster is fixed: InfiniBand between nodes");
        cli_refuse_in_mode("--course", (const char *const[]){"precision", NULL},
                           "the course's numbers are mixed precision's");
    }
    if (cluster_only(f))
        cli_refuse_in_mode("--max-params without a model", model_plan_flags,
                           "the largest models need only the GPUs, their memory and --tp x"
                           " --pp; give --params or a shape to plan a model too");
    refuse_moe_and_failure_flags(f);
}

/* --model: a published shape with its cluster and mesh, where the flags say nothing else.
 * GPT-3 175B: Brown et al. 2020 Table 2.1, batch 1536 (Narayanan Table 1), on the course
 * text's 1024 GPUs as tp 8 x pp 16 x dp 8. GPT-4: the rumoured MoE (moe.c says whose),
 * 16 experts of 4h, top-2, on 960 nodes of 8 as tp 8 x pp 15 x dp 64 (pp 15: the same
 * rumour), batch 7296 x 8192 tokens (the rumour's 60M, a multiple of dp). */
static void apply_model(run_config *cfg, planner_flags *f) {
    if (!cli_given("model")) return;
    const int gpt4 = f->model == MODEL_GPT4_MOE;
    gpt_config *g = &cfg->model;
    g->layers = gpt4 ? 120 : 96;
    g->dim = gpt4 ? 10752 : 12288;
    g->heads = 96;
    g->vocab = gpt4 ? 100277 : 51200;
    g->ctx = gpt4 ? 8192 : 2048;
    if (gpt4) {
        f->moe_experts = 16;
        f->moe_top_k = 2;
        f->moe_ffn = 4 * g->dim;
    }
    if (!cli_given("gpus")) f->gpus = gpt4 ? 7680 : 1024;
    if (!cli_given("tp") && !cli_given("pp") && !cli_given("dp")) {
        f->tp = 8;
        f->pp = gpt4 ? 15 : 16;
        if (!cli_given("zero")) f->zero = gpt4;   /* ZeRO-1 over dp: the optimizer sharded */
    }
    if (!cli_given("batch")) f->batch = gpt4 ? 7296 : 1536;
}

/* The experts and their EP size: by default the largest that divides both the experts
 * and dp; with no mesh given, the experts spread over a plain data-parallel mesh. */
static void moe_from_flags(plan_request *r, const planner_flags *f) {
    if (!is_moe(f)) return;
    r->moe = (plan_moe){.experts = f->moe_experts, .top_k = f->moe_top_k,
                        .every = f->moe_every + 1,
                        .expert_ffn = f->moe_ffn ? f->moe_ffn : 4.0 * r->model.hidden};
    if (r->moe.top_k > r->moe.experts)
        cli_fail("--moe-top-k %d is more than the %d experts (at most %d)", r->moe.top_k,
                 r->moe.experts, r->moe.experts);
    if (!r->mesh.tp) r->mesh = (plan_mesh){.tp = 1, .pp = 1, .dp = f->gpus};
    int common = r->moe.experts;
    for (int dp = r->mesh.dp; dp;) {   /* gcd(experts, dp) */
        const int rest = common % dp;
        common = dp;
        dp = rest;
    }
    r->ep = f->ep ? f->ep : common;
    if (r->moe.experts % r->ep || r->mesh.dp % r->ep)
        cli_fail("--ep %d does not divide both the %d experts and dp %d (try a divisor of %d)",
                 r->ep, r->moe.experts, r->mesh.dp, common);
}

static plan_failure_inputs failures_from_flags(const planner_flags *f) {
    return (plan_failure_inputs){
        .gpu_mtbf_hours = f->gpu_mtbf_hours > 0 ? f->gpu_mtbf_hours
                          : f->mtbf_hours > 0   ? f->mtbf_hours * f->gpus
                                                : plan_llama3_gpu_mtbf_hours(),
        .mtbf_given = f->gpu_mtbf_hours > 0 ? 1 : f->mtbf_hours > 0 ? 2 : 0,
        .save_bandwidth = 1e9 * f->save_bandwidth,
        .save_seconds = f->save_seconds,
        .restart_seconds = f->restart_seconds,
    };
}

static plan_model model_from_flags(const run_config *cfg, const planner_flags *f) {
    const gpt_config *g = &cfg->model;
    if (f->params < 0)
        return (plan_model){g->layers, g->dim, g->heads, g->vocab, g->ctx};
    static const char *const by_shape[] = {"layers", "hidden", "dim", "heads"};
    for (size_t i = 0; i < sizeof by_shape / sizeof by_shape[0]; i++)
        if (cli_given(by_shape[i]))
            cli_fail("--params %g and --%s both given: give a parameter count or a shape"
                     " (--layers --hidden --heads), not both", f->params, by_shape[i]);
    const int vocab = cli_given("vocab") ? g->vocab : 51200;
    const int seq = cli_given("seq") || cli_given("ctx") ? g->ctx : 2048;
    return plan_shape_for_params(f->params, vocab, seq);
}

/* The mesh's sizes against the GPUs; products in 64 bits, since each size may be up
 * to 1e9. */
static plan_mesh mesh_from_flags(const planner_flags *f) {
    if (!f->tp && !f->pp && !f->dp && !f->cp) {
        if (f->zero)
            cli_fail("--zero %d belongs to a mesh: give --tp, --pp or --dp with it", f->zero);
        if (f->dp_shard)
            cli_fail("--dp-shard %d belongs to a mesh: give --dp (and --zero 3) with it",
                     f->dp_shard);
        return (plan_mesh){0};
    }
    const int tp = f->tp ? f->tp : 1, pp = f->pp ? f->pp : 1, cp = f->cp ? f->cp : 1;
    const int64_t model_parallel = (int64_t)tp * pp * cp;
    char sizes[64];   /* "--tp 8 x --pp 4", with " x --cp 2" when CP is given */
    snprintf(sizes, sizeof sizes, "--tp %d x --pp %d", tp, pp);
    if (f->cp) snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), " x --cp %d", cp);
    if (model_parallel > f->gpus)
        cli_fail("%s = %lld GPUs, more than --gpus %d (a mesh's product is the GPUs)", sizes,
                 (long long)model_parallel, f->gpus);
    int dp = f->dp;
    if (!dp) {
        if (f->gpus % model_parallel)
            cli_fail("%s = %lld does not divide --gpus %d (give --dp, or a mesh whose product"
                     " is %d)", sizes, (long long)model_parallel, f->gpus, f->gpus);
        dp = (int)(f->gpus / model_parallel);
    }
    if (model_parallel * dp != f->gpus)
        cli_fail("%s x --dp %d = %lld does not multiply to --gpus %d", sizes, dp,
                 (long long)(model_parallel * dp), f->gpus);
    if (f->dp_shard && (f->zero != 3 || dp % f->dp_shard))
        cli_fail("--dp-shard %d: HSDP shards ZeRO-3 over a group that divides dp; give --zero"
                 " 3 and a divisor of dp %d", f->dp_shard, dp);
    return (plan_mesh){.tp = tp, .pp = pp, .dp = dp, .zero_stage = f->zero, .cp = cp,
                       .cp_attention = (cp_attention_kind)f->cp_attention,
                       .dp_shard = f->dp_shard};
}

/* Context parallelism must split the sequence: the ring in 2 cp chunks (rank i holds
 * chunks i and 2 cp - 1 - i, the causal load balanced), Ulysses by heads over cp x tp. */
static void check_cp_fits_model(const plan_mesh *mesh, const plan_model *m) {
    if (mesh->cp < 2) return;
    const int ring = mesh->cp_attention == CP_RING;
    const int chunks = ring ? 2 * mesh->cp : mesh->cp;
    if (m->seq % chunks)
        cli_fail("--cp %d does not split the sequence of %d into %d equal chunks (%s; try a cp"
                 " whose %s divides %d)", mesh->cp, m->seq, chunks,
                 ring ? "the balanced ring takes 2 cp" : "Ulysses takes cp",
                 ring ? "double" : "value", m->seq);
    if (!ring && m->heads % ((long)mesh->tp * mesh->cp))
        cli_fail("--cp %d with --cp-attention ulysses: the %d heads do not split over tp %d x cp"
                 " %d (tp x cp must divide the heads)", mesh->cp, m->heads, mesh->tp, mesh->cp);
}

/* The mesh must split the model: whole heads per TP rank, a layer or more a stage. */
static void check_mesh_fits_model(const plan_mesh *mesh, const plan_model *m) {
    if (!mesh->tp) return;
    if (m->heads % mesh->tp)
        cli_fail("--tp %d does not divide the %d heads (try a divisor of %d)", mesh->tp,
                 m->heads, m->heads);
    if (mesh->pp > m->layers)
        cli_fail("--pp %d is more stages than the %d layers (at most %d)", mesh->pp, m->layers,
                 m->layers);
    check_cp_fits_model(mesh, m);
}

/* The planner's precision: 16-bit unless --precision says otherwise (the chapters'
 * default, fp32, is for training on this machine, not for planning a cluster). */
static precision planned_precision(const run_config *cfg) {
    return cli_given("precision") ? cfg->precision : PRECISION_BF16;
}

/* --gpu-tflops as given; else --peak-tflops, a 16-bit tensor-core peak, x --mfu, and in
 * fp32 the fraction of it fp32 GEMMs reach (plan_time.h); in fp8 the FP8 peak, twice the
 * 16-bit one on H100 and H200 (989 and 1979 TFLOP/s dense). */
static double achieved_flops(const planner_flags *f, precision dtype) {
    if (f->gpu_tflops > 0) return 1e12 * f->gpu_tflops;
    const double fraction = dtype == PRECISION_FP32 ? PLAN_FP32_PEAK_FRACTION
                            : fp8_planned                ? 2
                                                         : 1;
    return 1e12 * f->peak_tflops * fraction * f->mfu;
}

static plan_request request_from_flags(const run_config *cfg, const planner_flags *f) {
    plan_request r = {.gpu_bytes = f->gpu_mem * 1e9, .dtype = planned_precision(cfg),
                      .fp8 = fp8_planned};
    r.cluster.gpus = f->gpus;
    r.mesh = mesh_from_flags(f);
    if (cluster_only(f)) return r;   /* no model: nothing else is used */
    r.model = model_from_flags(cfg, f);
    r.model_name = cli_given("model") ? model_choices[f->model] : NULL;
    r.failures = failures_from_flags(f);
    moe_from_flags(&r, f);
    check_mesh_fits_model(&r.mesh, &r.model);
    if (f->mfu <= 0 || f->mfu > 1)
        cli_fail("--mfu %g: must be a fraction of peak in (0, 1]", f->mfu);
    r.cluster = (plan_cluster){
        .gpus = f->gpus,
        .gpus_per_node = f->gpus_per_node,
        .between_nodes = cfg->comm.link == LINK_NONE ? LINK_IB : cfg->comm.link,
        .flops_per_gpu = achieved_flops(f, r.dtype),
    };
    r.micro_batch = f->micro_batch;
    /* default: 8 sequences per GPU, enough micro-batches to keep a pipeline busy */
    r.global_batch = cli_given("batch") ? cfg->batch : f->batch ? f->batch : 8 * f->gpus;
    r.recompute = f->recompute - 1;   /* auto (-1), none, selective, full */
    r.mesh.micro_batch = r.micro_batch;
    r.mesh.global_batch = r.global_batch;
    if (r.mesh.tp && !plan_micro_batches(&r.mesh))
        cli_fail("--batch %d does not split into --dp %d x --micro-batch %d sequences (use a"
                 " multiple of %lld)", r.global_batch, r.mesh.dp, r.micro_batch,
                 (long long)r.mesh.dp * r.micro_batch);
    return r;
}

static int plan_and_print(const run_config *cfg, const planner_flags *f) {
    plan_request r = request_from_flags(cfg, f);
    if (cluster_only(f)) {
        plan_print_max_params(&r, cfg->json);
        return 0;
    }
    if (r.moe.experts > 0) {
        moe_print(&r, cfg->json);
        return 0;
    }
    plan_row rows[PLAN_MAX_ROWS];
    const int n = plan_strategies(&r, rows);
    plan_decision d;
    plan_decide(&r, rows, n, &d);
    if (cfg->json)
        plan_print_json(&r, rows, n, &d, f->tokens, f->max_params);
    else
        plan_print(&r, rows, n, &d, f->tokens, f->max_params);
    return 0;
}

/* The planner's own flags, into options[PLANNER_NUM_OPTIONS]. */
#define PLANNER_NUM_OPTIONS 40
static void planner_options(cli_option *options, run_config *cfg, planner_flags *f) {
    const cli_option table[] = {
        {"params", OPT_FLOAT, &f->params, "plan for this many parameters (a shape is derived)", NULL, 1},
        {"hidden", OPT_INT, &cfg->model.dim, "hidden size h (the same as --dim)", NULL, 1},
        {"seq", OPT_INT, &cfg->model.ctx, "sequence length s (the same as --ctx)", NULL, 1},
        {"gpus", OPT_INT, &f->gpus, "GPUs of the cluster (default 8)", NULL, 1},
        {"gpu-mem", OPT_FLOAT, &f->gpu_mem, "GB per GPU (default 80)", NULL, 1e-3},
        {"gpus-per-node", OPT_INT, &f->gpus_per_node, "GPUs joined by NVLink (default 8)", NULL, 1},
        {"micro-batch", OPT_INT, &f->micro_batch, "sequences per micro-batch (default 1)", NULL, 1},
        {"gpu-tflops", OPT_FLOAT, &f->gpu_tflops, "achieved TFLOP/s per GPU (default: peak x mfu)", NULL, 1e-6},
        {"peak-tflops", OPT_FLOAT, &f->peak_tflops, "16-bit tensor-core peak TFLOP/s per GPU"
         " (default 989: H100 BF16; fp32 plans take 67/989 of it)", NULL, 1e-6},
        {"mfu", OPT_FLOAT, &f->mfu, "achieved fraction of peak (default 0.4)", NULL, 0},
        {"tokens", OPT_FLOAT, &f->tokens, "training tokens: print the days it takes", NULL, 1},
        {"tp", OPT_INT, &f->tp, "evaluate this mesh too: tensor-parallel size", NULL, 1},
        {"pp", OPT_INT, &f->pp, "... pipeline stages", NULL, 1},
        {"dp", OPT_INT, &f->dp, "... data-parallel size (default: the rest)", NULL, 1},
        {"cp", OPT_INT, &f->cp, "... context-parallel size: each GPU holds seq / cp of every"
         " sequence", NULL, 1},
        {"cp-attention", OPT_CHOICE, &f->cp_attention, "... how attention crosses the chunks:"
         " ring (default) or ulysses", cp_attention_names, 0},
        {"zero", OPT_CHOICE, &f->zero, "... ZeRO stage of that mesh", zero_choices, 0},
        {"dp-shard", OPT_INT, &f->dp_shard, "... with --zero 3: HSDP, ZeRO-3 over this many of"
         " the dp ranks, replicated across the dp / dp-shard groups", NULL, 1},
        {"recompute", OPT_CHOICE, &f->recompute, "activation recomputation (auto: the lightest"
         " that fits)", recompute_choices, 0},
        {"max-params", OPT_FLAG, &f->max_params,
         "largest model per ZeRO stage on the cluster (model parallel: --tp x --pp)", NULL, 0},
        {"course", OPT_FLAG, &f->course, "check the course text's claims by arithmetic", NULL, 0},
        {"predict-chapters", OPT_FLAG, &f->predict,
         "predict chapters 1-5 and 9 on bench256 (2 and 4 ranks) and the planner's mesh in"
         " chapter 11 (8 ranks), and run them to compare", NULL, 0},
        {"model", OPT_CHOICE, &f->model, "a published model with its cluster and mesh: gpt3"
         " (175B on 1024 GPUs, the course's), gpt4-moe (the rumoured 1.8T mixture of experts)",
         model_choices, 0},
        {"moe-experts", OPT_INT, &f->moe_experts, "a mixture of experts: E experts replace each"
         " MLP (of the shape --params or the flags give)", NULL, 1},
        {"moe-top-k", OPT_INT, &f->moe_top_k, "... experts a token visits (default 2)", NULL, 1},
        {"moe-every", OPT_CHOICE, &f->moe_every, "... in every layer, or every other (default 1)",
         every_choices, 0},
        {"moe-ffn", OPT_INT, &f->moe_ffn, "... an expert's MLP size (default 4 x hidden)", NULL, 1},
        {"ep", OPT_INT, &f->ep, "... expert-parallel size, out of dp (default: the largest that"
         " divides the experts and dp)", NULL, 1},
        {"gpu-mtbf-hours", OPT_FLOAT, &f->gpu_mtbf_hours, "one GPU's mean time between failures"
         " (default 50677: Llama 3's 419 interruptions in 54 days on 16384 GPUs)", NULL, 1e-6},
        {"mtbf-hours", OPT_FLOAT, &f->mtbf_hours, "the job's mean time between failures (default:"
         " one GPU's / GPUs)", NULL, 1e-6},
        {"save-bandwidth", OPT_FLOAT, &f->save_bandwidth, "GB/s each GPU writes its share of a"
         " checkpoint at (default 0.122: Llama 3's 2 TB/s storage over its 16384 GPUs)", NULL, 1e-9},
        {"save-seconds", OPT_FLOAT, &f->save_seconds, "a checkpoint save's time (default: 12 B a"
         " parameter over the GPUs' bandwidth)", NULL, 1e-6},
        {"restart-seconds", OPT_FLOAT, &f->restart_seconds, "from a failure back to training"
         " (default: the checkpoint's load, as long as its save)", NULL, 0},
        {0},
    };
    _Static_assert(sizeof table <= PLANNER_NUM_OPTIONS * sizeof(cli_option), "too many flags");
    memcpy(options, table, sizeof table);
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    planner_flags f = {.params = -1, .gpu_mem = 80, .peak_tflops = 989, .mfu = 0.4,
                       .gpus = 8, .gpus_per_node = 8, .micro_batch = 1, .moe_top_k = 2,
                       .gpu_mtbf_hours = -1, .mtbf_hours = -1, .save_seconds = -1,
                       .save_bandwidth = plan_llama3_save_bandwidth_per_gpu() / 1e9,
                       .restart_seconds = -1};
    cli_option options[PLANNER_NUM_OPTIONS];
    planner_options(options, &cfg, &f);
    cfg.unused_flags = planner_unused;
    cfg.fp8_training = 1;   /* --precision fp8 is planned: bf16 with FP8 linears */
    cfg.unused_why = "the planner trains nothing";
    cli_parse(argc, argv, &cfg, options, argv[0],
              "How to choose: memory per GPU, time and the decision tree for any model and"
              " cluster, without training.\n--steps, --data and --link-scale are for the"
              " chapters --predict-chapters runs.");
    fp8_planned = cfg.fp8;
    cli_check_at_most("params", f.params, 1e15, "a million billion parameters");
    cli_check_at_most("gpus", f.gpus, PLANNER_MAX_GPUS, "a hundred million GPUs; 8 sequences each still count in an int");
    cli_check_at_most("gpu-mem", f.gpu_mem, 1e6, "a petabyte a GPU");
    cli_check_at_most("gpu-tflops", f.gpu_tflops, 1e6, "a million TFLOP/s");
    cli_check_at_most("peak-tflops", f.peak_tflops, 1e6, "a million TFLOP/s");
    cli_check_at_most("tokens", f.tokens, 1e18, "a billion billion tokens");
    if (cfg.data_path) dataset_free(dataset_from_config(&cfg));   /* refuse a bad file */
    refuse_ignored_flags(&f);
    apply_model(&cfg, &f);
    if (!process_hosts_rank0()) return 0;   /* under mpirun: one process answers */

    if (f.predict) {
        predict_options po = {.steps = cli_given("steps") ? cfg.steps : 3,
                              .link = cfg.comm.link, .link_scale = cfg.comm.link_scale,
                              .data_path = cfg.data_path, .json = cfg.json,
                              .dtype = cfg.precision};
        return predict_chapters(&po);
    }
    if (f.course) {
        course_print();
        return 0;
    }
    return plan_and_print(&cfg, &f);
}
