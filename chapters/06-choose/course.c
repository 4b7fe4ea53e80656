/* --course: the course text's claims, re-derived with the planner's arithmetic and
 * corrected where the numbers say otherwise. */
#include <stdio.h>
#include <string.h>

#include "course.h"
#include "planner.h"

#define GB 1e9

const course_bracket COURSE_BRACKETS[] = {
    {"< 1B", 0.35e9, "DDP", {.tp = 1, .pp = 1, .dp = 256, .zero_stage = 0}, -1},
    {"1-13B", 7e9, "FSDP / ZeRO-3", {.tp = 1, .pp = 1, .dp = 256, .zero_stage = 3}, -1},
    {"13-70B", 30e9, "FSDP + activation checkpointing",
     {.tp = 1, .pp = 1, .dp = 256, .zero_stage = 3}, RECOMPUTE_FULL},
    {"70-200B", 130e9, "TP + FSDP", {.tp = 8, .pp = 1, .dp = 32, .zero_stage = 3}, -1},
    {"200B+", 400e9, "TP + PP + DP (3D)", {.tp = 8, .pp = 8, .dp = 4, .zero_stage = 1}, -1},
};
const int COURSE_NUM_BRACKETS = sizeof COURSE_BRACKETS / sizeof COURSE_BRACKETS[0];

plan_request course_cluster(double params) {
    plan_request r = {
        .model = plan_shape_for_params(params, 51200, 2048),
        .cluster = {.gpus = 256, .gpus_per_node = 8, .between_nodes = LINK_IB,
                    .flops_per_gpu = 0.4 * 989e12},
        .gpu_bytes = 80 * GB,
        .micro_batch = 1,
        .global_batch = 2048,
        .recompute = -1,
        .dtype = PRECISION_BF16,   /* the course's mixed precision */
    };
    return r;
}

plan_row course_advice_row(const course_bracket *b) {
    plan_request r = course_cluster(b->params);
    r.recompute = b->recompute;
    return plan_evaluate(&r, "course", b->mesh);
}

void course_verdict(const course_bracket *b, plan_decision *d, plan_row *fastest) {
    plan_request r = course_cluster(b->params);
    plan_row rows[PLAN_MAX_ROWS];
    const int n = plan_strategies(&r, rows);
    plan_decide(&r, rows, n, d);
    *fastest = *plan_find_row(rows, n, "3d");
}

static void print_mesh(const plan_row *row) {
    printf("tp %d pp %d dp %d ZeRO-%d recompute %-9s %5.1f GB %s %7.3g s/step",
           row->mesh.tp, row->mesh.pp, row->mesh.dp, row->mesh.zero_stage,
           plan_recompute_names[row->mesh.recompute], plan_total(row->memory) / GB,
           row->fits ? "fits    " : "too big ", row->step.total);
}

/* DDP, ZeRO, TP + ZeRO or 3D: what kind of strategy a mesh is. */
static int kind_of(const plan_mesh *m) {
    return m->pp > 1 ? 3 : m->tp > 1 ? 2 : m->zero_stage > 0 ? 1 : 0;
}

const char *course_agreement(const plan_row *advice, const plan_row *tree) {
    if (kind_of(&advice->mesh) != kind_of(&tree->mesh)) return "differs";
    if (advice->mesh.zero_stage != tree->mesh.zero_stage ||
        advice->mesh.recompute != tree->mesh.recompute)
        return "agrees in kind";
    return "agrees";
}

static void print_rule_of_thumb(void) {
    printf("1. The rule-of-thumb table, re-derived for 256 H100s of 80 GB (32 nodes of 8,"
           " NVLink inside, InfiniBand\n   between), sequences of 2048, global batch 2048,"
           " micro-batch 1, 40%% of 989 TFLOP/s achieved:\n\n");
    for (int i = 0; i < COURSE_NUM_BRACKETS; i++) {
        const course_bracket *b = &COURSE_BRACKETS[i];
        plan_row advice = course_advice_row(b), fastest;
        plan_decision d;
        course_verdict(b, &d, &fastest);
        const plan_model m = course_cluster(b->params).model;
        printf("   %-8s e.g. %.3g parameters (%d layers, hidden %d)\n", b->bracket,
               plan_params(&m), m.layers, m.hidden);
        printf("     course: %-32s ", b->advice);
        print_mesh(&advice);
        printf("\n     tree:   %-32s ", d.strategy);
        print_mesh(&d.choice);
        printf("\n     fastest mesh that fits:          ");
        print_mesh(&fastest);
        printf("\n     verdict: %s; the course's choice takes %.2gx the fastest mesh's step,"
               " the tree's %.2gx\n", course_agreement(&advice, &d.choice),
               advice.step.total / fastest.step.total, d.choice.step.total / fastest.step.total);
    }
    printf("\n   The tree stops at the first branch that fits. ZeRO-3 holds the fewest model-state"
           " bytes of any\n   mesh (16P/N), so with full checkpointing it fits every bracket"
           " here and the tree never reaches\n   TP + PP, although FSDP gathers every"
           " parameter over InfiniBand for every micro-batch: on the two\n   largest brackets"
           " the fastest mesh (TP inside a node, PP across nodes) beats the tree's choice"
           " several\n   times over, and for 200B+ the course's 3D advice matches it. Where"
           " ZeRO-1 or 2 fits, stage 3 only\n   adds traffic (1.5x the bytes).\n\n");
}

static void print_70b(void) {
    const double P = 70e9;
    const plan_model m = plan_shape_for_params(P, 51200, 2048);
    const double layer = plan_layer_activations(&m, 1, 1, 0, RECOMPUTE_NONE);
    printf("2. \"70B: 140 GB of FP16 parameters, ~700 GB in all\": the parameters are 2 x 70e9"
           " = %.0f GB, right;\n   but mixed-precision Adam keeps 16 bytes per parameter"
           " (2 + 2 + 12, ZeRO's K = 12): %.0f GB of\n   model states before any activation,"
           " 1.6x the ~700 GB (which would be 10 bytes per parameter).\n   Activations add,"
           " per 2048-token sequence (Korthikanti, %d layers of h = %d): %.0f GB, or %.1f GB\n"
           "   with full checkpointing: %.2f TB in all for one sequence.\n\n",
           2 * P / GB, 16 * P / GB, m.layers, m.hidden, m.layers * layer / GB,
           plan_layer_activations(&m, 1, 1, 0, RECOMPUTE_FULL) * m.layers / GB,
           (16 * P + m.layers * layer) / 1e12);
}

static void print_gpt3_layer(void) {
    const double h = 12288, attention = 4 * h * h, layer = plan_layer_params(12288);
    const plan_model gpt3 = {.layers = 96, .hidden = 12288, .heads = 96, .vocab = 51200,
                             .seq = 2048};
    printf("3. \"one GPT-3 175B attention layer is 36 GB of weights, more than one card\":"
           " at h = 12288 the\n   attention weights are 4h^2 = %.3g parameters: %.2f GB in"
           " FP16, %.2f GB with gradients and Adam\n   state; the whole layer (12h^2 + 13h ="
           " %.3g) is %.2f GB in FP16, %.1f GB with Adam. One layer fits\n   an 80 GB card"
           " (its activations for one sequence add %.2f GB); 36 GB is ten times the FP16\n"
           "   weights of a whole layer. What does not fit is the model: %.0f GB of model"
           " states for %.4g\n   parameters, so the reason for TP is the model and its"
           " activations, not one layer.\n\n", attention, 2 * attention / GB,
           16 * attention / GB, layer, 2 * layer / GB, 16 * layer / GB,
           plan_layer_activations(&gpt3, 1, 1, 0, RECOMPUTE_NONE) / GB,
           16 * plan_params(&gpt3) / GB, plan_params(&gpt3));
}

static void print_links(void) {
    const plan_link nvlink = plan_link_of(LINK_NVLINK), ib = plan_link_of(LINK_IB);
    const double eth10 = 10e9 / 8, eth25 = 25e9 / 8, grads = 2 * 70e9;
    printf("4. \"Ethernet is 100 times slower than NVLink\": 900 GB/s against 10-25 Gb/s"
           " (1.25-3.125 GB/s) is\n   %.0f-%.0f times, not 100; InfiniBand's 400 Gb/s ="
           " 50 GB/s is %.0f times slower than NVLink.\n   All-reducing 70B's FP16 gradients"
           " (%.0f GB) in a ring of 8: NVLink %.2f s, InfiniBand %.1f s,\n   25 Gb/s"
           " Ethernet %.0f s, per step.\n", nvlink.bandwidth / eth25,
           nvlink.bandwidth / eth10, nvlink.bandwidth / ib.bandwidth, grads / GB,
           plan_allreduce_seconds(nvlink, 8, grads), plan_allreduce_seconds(ib, 8, grads),
           plan_allreduce_seconds(plan_link_of(LINK_ETHERNET), 8, grads));
}

void course_print(void) {
    printf("The course text's claims, checked by arithmetic\n\n");
    print_rule_of_thumb();
    print_70b();
    print_gpt3_layer();
    print_links();
}
