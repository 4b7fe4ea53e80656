#include <stdio.h>
#include <string.h>

#include "planner.h"

plan_precision plan_precision_of(precision dtype) {
    return dtype == PRECISION_FP32 ? PLAN_FP32_ADAM : PLAN_MIXED_ADAM;
}

plan_precision plan_precision_for(const plan_request *r) {
    plan_precision p = plan_precision_of(r->dtype);
    if (r->fp8) p.gathered = PLAN_FP8_GATHERED;
    return p;
}

const char *plan_precision_line(const plan_request *r, char *line, size_t size) {
    const plan_precision bytes = plan_precision_for(r), *p = &bytes;
    char fp8[160] = "";
    if (r->fp8)
        snprintf(fp8, sizeof fp8, "; fp8: ZeRO-3 gathers weights at %.4f B (a byte and a scale"
                 " a 128 x 128 block), and the step time assumes the GPU's FP8 peak", p->gathered);
    snprintf(line, size, "precision %s: %s weights %g B + gradients %g B + %s %g B per"
             " parameter, %g B activations and messages of weights and activations%s",
             r->fp8 ? "fp8" : precision_name(r->dtype), r->dtype == PRECISION_FP32 ? "fp32" : "16-bit",
             p->params, p->grads, r->dtype == PRECISION_FP32 ? "Adam m, v" : "fp32 master, m, v",
             p->optimizer, p->activation, fp8);
    return line;
}

static plan_row evaluate_with(const plan_request *r, const char *name, plan_mesh mesh) {
    plan_row row = {.mesh = mesh};
    snprintf(row.name, sizeof row.name, "%s", name);
    row.feasible = plan_micro_batches(&mesh) > 0;
    if (!row.feasible) return row;
    const plan_precision bytes = plan_precision_for(r);
    row.memory = plan_memory_per_gpu(&r->model, &mesh, bytes);
    row.fits = plan_total(row.memory) <= r->gpu_bytes;
    row.step = plan_step_time(&r->model, &mesh, &r->cluster, bytes);
    return row;
}

plan_row plan_evaluate(const plan_request *r, const char *name, plan_mesh mesh) {
    mesh.micro_batch = r->micro_batch;
    mesh.global_batch = r->global_batch;
    mesh.sequence_parallel = mesh.tp > 1;
    mesh.gather = r->gather;
    mesh.activations = r->activations;
    mesh.tp_count = r->tp_count;
    if (r->recompute >= 0) {
        mesh.recompute = (plan_recompute)r->recompute;
        return evaluate_with(r, name, mesh);
    }
    /* recompute no more than it takes to fit: none, then selective, then full */
    plan_row row = {0};
    for (int mode = RECOMPUTE_NONE; mode <= RECOMPUTE_FULL; mode++) {
        mesh.recompute = (plan_recompute)mode;
        row = evaluate_with(r, name, mesh);
        if (!row.feasible || row.fits) break;
    }
    return row;
}

static int divides_heads(const plan_request *r, int tp) { return r->model.heads % tp == 0; }

/* Keeps row when it fits and is faster than what *best holds (found: *best holds one). */
static void keep_fastest(const plan_row *row, plan_row *best, int *found) {
    if (!row->fits) return;
    if (!*found || row->step.total < best->step.total) *best = *row;
    *found = 1;
}

/* The fastest fitting mesh with context parallelism cp (1: none): tp a power of 2
 * inside a node, any pp that divides, the ZeRO stages a pipeline allows, and for ZeRO-3
 * every HSDP shard group of a power of 2 that divides dp; dp the rest. */
static int best_mesh_with_cp(const plan_request *r, int cp, plan_row *best) {
    const int gpus = r->cluster.gpus / cp;
    int found = 0;
    for (int tp = 1; tp <= gpus && tp <= r->cluster.gpus_per_node; tp *= 2) {
        if (gpus % tp || !divides_heads(r, tp)) continue;
        for (int pp = 1; pp <= gpus / tp && pp <= r->model.layers; pp++) {
            if ((gpus / tp) % pp) continue;
            const int dp = gpus / (tp * pp);
            const int top_stage = pp > 1 ? 1 : 3;   /* ZeRO-2/3 do not pipeline */
            for (int stage = 0; stage <= top_stage; stage++) {
                if (dp == 1 && stage > 0) break;
                plan_mesh mesh = {.tp = tp, .pp = pp, .dp = dp, .zero_stage = stage, .cp = cp,
                                  .cp_attention = CP_RING};
                plan_row row = plan_evaluate(r, "3d", mesh);
                keep_fastest(&row, best, &found);
                for (int shard = 2; stage == 3 && shard < dp; shard *= 2) {
                    if (dp % shard) break;
                    mesh.dp_shard = shard;
                    row = plan_evaluate(r, "3d", mesh);
                    keep_fastest(&row, best, &found);
                }
            }
        }
    }
    return found;
}

/* Context parallelism only when no mesh fits without it (a long sequence): what it buys
 * is memory, the sequence's activations split cp ways, and it costs a K/V exchange in
 * every layer; then the fastest mesh over every cp that fits. Ring attention,
 * load-balanced: the sequence splits into 2 cp equal chunks. */
int plan_best_mesh(const plan_request *r, plan_row *best) {
    if (best_mesh_with_cp(r, 1, best)) return 1;
    int found = 0;
    plan_row row;
    for (int cp = 2; cp <= r->cluster.gpus; cp *= 2) {
        if (r->cluster.gpus % cp || r->model.seq % (2 * cp)) break;
        if (best_mesh_with_cp(r, cp, &row)) keep_fastest(&row, best, &found);
    }
    return found;
}

/* HSDP: ZeRO-3 inside a group of whole nodes (a power of 2 of them), replicated across
 * the groups: the fastest group that fits, or when none fits one node's, marked as not
 * fitting. */
static plan_row hsdp_row(const plan_request *r) {
    const int gpus = r->cluster.gpus;
    plan_mesh mesh = {.tp = 1, .pp = 1, .dp = gpus, .zero_stage = 3};
    plan_row best = {0};
    int found = 0;
    for (int shard = r->cluster.gpus_per_node; shard < gpus && gpus % shard == 0; shard *= 2) {
        mesh.dp_shard = shard;
        const plan_row row = plan_evaluate(r, "hsdp", mesh);
        if (!best.mesh.dp_shard) best = row;
        keep_fastest(&row, &best, &found);
    }
    return best;
}

/* The largest power of 2 that divides n, the heads and fits a node. */
static int tp_inside_node(const plan_request *r) {
    int tp = 1;
    while (tp * 2 <= r->cluster.gpus_per_node && r->cluster.gpus % (tp * 2) == 0 &&
           divides_heads(r, tp * 2))
        tp *= 2;
    return tp;
}

/* The deepest pipeline of at most one layer per stage that divides the GPUs. */
static int pp_deepest(const plan_request *r) {
    int pp = r->cluster.gpus < r->model.layers ? r->cluster.gpus : r->model.layers;
    while (r->cluster.gpus % pp) pp--;
    return pp;
}

int plan_strategies(const plan_request *r, plan_row rows[PLAN_MAX_ROWS]) {
    const int gpus = r->cluster.gpus;
    int n = 0;
    static const char *const zero_names[] = {"ddp", "zero1", "zero2", "zero3"};
    for (int stage = 0; stage <= 3; stage++)
        rows[n++] = plan_evaluate(r, zero_names[stage],
                                  (plan_mesh){.tp = 1, .pp = 1, .dp = gpus, .zero_stage = stage});
    const int tp = tp_inside_node(r), pp = pp_deepest(r);
    rows[n++] = plan_evaluate(r, "tp", (plan_mesh){.tp = tp, .pp = 1, .dp = gpus / tp});
    rows[n++] = plan_evaluate(r, "pp", (plan_mesh){.tp = 1, .pp = pp, .dp = gpus / pp});
    const plan_row hsdp = hsdp_row(r);
    if (hsdp.mesh.dp_shard) rows[n++] = hsdp;   /* more than one node */
    plan_row best;
    if (plan_best_mesh(r, &best)) {
        rows[n++] = best;
    } else {
        /* nothing fits: show the most model-parallel mesh, and that it does not fit */
        const int deepest = (gpus / tp) < r->model.layers ? gpus / tp : r->model.layers;
        int p = deepest;
        while ((gpus / tp) % p) p--;
        rows[n++] = plan_evaluate(r, "3d", (plan_mesh){.tp = tp, .pp = p, .dp = gpus / (tp * p)});
    }
    if (r->mesh.tp > 0) rows[n++] = plan_evaluate(r, "mesh", r->mesh);
    return n;
}

const plan_row *plan_find_row(const plan_row *rows, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].name, name) == 0) return &rows[i];
    return NULL;
}
