/* The course's decision tree, walked with the planner's numbers:
 *
 *   fits one card?  -- yes --> DDP
 *        | no
 *   fits N cards with ZeRO / FSDP?  -- yes --> the lowest ZeRO stage that fits
 *        | no                                  (stage 3 moves 1.5x the bytes)
 *   one layer fits one card?  (either way: Megatron TP + PP, with DP over the rest;
 *        |                      a layer that does not fit needs TP to split it)
 *   the fastest fitting (tp, pp, dp) mesh, or "does not fit this cluster". */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "planner.h"
#include "report.h"

#define GB 1e9

static void add_step(plan_decision *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_step(plan_decision *d, const char *fmt, ...) {
    if (d->num_steps >= PLAN_MAX_STEPS) return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(d->steps[d->num_steps++], sizeof d->steps[0], fmt, args);
    va_end(args);
}

static const char *with_recompute(const plan_row *row) {
    static const char *const notes[] = {"", " + selective recomputation",
                                        " + activation checkpointing"};
    return notes[row->mesh.recompute];
}

static void choose(plan_decision *d, const char *strategy, const plan_row *row) {
    d->found = 1;
    d->choice = *row;
    snprintf(d->strategy, sizeof d->strategy, "%s%s", strategy, with_recompute(row));
}

/* "65.61 GB (states 21.52 GB + activations 44.09 GB, recompute selective)" */
static const char *row_memory(const plan_row *row, char buf[128]) {
    const double states = row->memory.params + row->memory.grads + row->memory.optimizer;
    char total[32], held[32], acts[32];
    snprintf(buf, 128, "%s (states %s + activations %s, recompute %s)",
             report_bytes(plan_total(row->memory), total), report_bytes(states, held),
             report_bytes(row->memory.activations, acts),
             plan_recompute_names[row->mesh.recompute]);
    return buf;
}

static int try_ddp(const plan_request *r, const plan_row *ddp, plan_decision *d) {
    char mem[128];
    const double card = r->gpu_bytes / GB;
    if (!ddp->feasible) {
        add_step(d, "1. fits one card? global batch %d cannot give %d GPUs %d sequences each;"
                 " DDP is out", r->global_batch, r->cluster.gpus, r->micro_batch);
        return 0;
    }
    add_step(d, "1. fits one card? DDP needs %s of %.0f GB: %s", row_memory(ddp, mem), card,
             ddp->fits ? "yes -> DDP" : "no");
    if (ddp->fits) choose(d, "DDP", ddp);
    return ddp->fits;
}

/* "tp 8 x pp 4 x dp 32, ZeRO-1", with "cp 2 x " and ", HSDP: shards of 8 x 4 replicas"
 * where the mesh has them */
static const char *mesh_words(const plan_mesh *m, char buf[128]) {
    char cp[24] = "", hsdp[48] = "";
    if (m->cp > 1) snprintf(cp, sizeof cp, " x cp %d", m->cp);
    if (plan_dp_replicas(m) > 1)
        snprintf(hsdp, sizeof hsdp, ", HSDP: shards of %d x %d replicas", plan_dp_shard_size(m),
                 plan_dp_replicas(m));
    snprintf(buf, 128, "tp %d%s x pp %d x dp %d, ZeRO-%d%s", m->tp, cp, m->pp, m->dp,
             m->zero_stage, hsdp);
    return buf;
}

/* FSDP fits: HSDP instead when it fits too and is faster (its gathers stay inside a
 * group of nodes; only the gradient shards cross between the groups, once a step). */
static void prefer_hsdp(const plan_request *r, const plan_row *rows, int n, plan_decision *d) {
    const plan_row *hsdp = plan_find_row(rows, n, "hsdp");
    if (!hsdp || !hsdp->fits || hsdp->step.total >= d->choice.step.total) return;
    char mem[128];
    add_step(d, "   HSDP fits too: ZeRO-3 inside %d GPUs (%d node(s)), replicated %d times,"
             " %s, %.3g s per step against FSDP's %.3g s: its all-gathers and reduce-scatters"
             " stay inside the group -> HSDP", plan_dp_shard_size(&hsdp->mesh),
             plan_dp_shard_size(&hsdp->mesh) / r->cluster.gpus_per_node,
             plan_dp_replicas(&hsdp->mesh), row_memory(hsdp, mem), hsdp->step.total,
             d->choice.step.total);
    choose(d, "HSDP (ZeRO-3 in node groups)", hsdp);
}

static int try_zero(const plan_request *r, const plan_row *rows, int n, plan_decision *d) {
    static const char *const names[] = {"zero1", "zero2", "zero3"};
    static const char *const labels[] = {"ZeRO-1", "ZeRO-2", "FSDP (ZeRO-3)"};
    char line[448] = "", mem[128];
    for (int i = 0; i < 3; i++) {
        const plan_row *row = plan_find_row(rows, n, names[i]);
        if (!row || !row->feasible) continue;
        snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s %s", *line ? "; " : "",
                 labels[i], row_memory(row, mem));
        if (row->fits) {
            add_step(d, "2. fits %d cards with ZeRO? %s: yes -> %s%s", r->cluster.gpus, line,
                     labels[i], i < 2 ? " (the lowest stage that fits: stage 3 would move"
                                        " 1.5x the bytes)" : "");
            choose(d, labels[i], row);
            if (i == 2) prefer_hsdp(r, rows, n, d);
            return 1;
        }
    }
    add_step(d, "2. fits %d cards with ZeRO? %s: no", r->cluster.gpus,
             *line ? line : "batch too small to split over every GPU");
    return 0;
}

static void try_3d(const plan_request *r, const plan_row *rows, int n, plan_decision *d) {
    const double h = r->model.hidden;
    const plan_precision adam = plan_precision_for(r);
    const double layer_states = (adam.params + adam.grads + adam.optimizer) *
                                plan_layer_params(r->model.hidden);
    /* Korthikanti counts 2-byte elements */
    const double layer_acts = adam.activation / 2 *
                              plan_layer_activations(&r->model, r->micro_batch, 1, 0,
                                                     RECOMPUTE_NONE);
    const int layer_fits = layer_states + layer_acts <= r->gpu_bytes;
    add_step(d, "3. one layer fits one card? 12h^2 = %.3g parameters at h = %.0f: %.2f GB of"
             " states + %.2f GB of activations: %s", plan_layer_params(r->model.hidden), h,
             layer_states / GB, layer_acts / GB,
             layer_fits ? "yes, but the whole model needs model parallelism -> Megatron"
                          " TP + PP + DP"
                        : "no: TP must split each layer -> Megatron TP + PP + DP");
    const plan_row *mesh = plan_find_row(rows, n, "3d");
    if (mesh && mesh->fits) {
        char mem[128], words[128];
        const int cp = mesh->mesh.cp > 1;
        add_step(d, "4. %s %s, %s per GPU, %.3g s per step",
                 cp ? "no mesh fits without splitting the sequence (its activations): the"
                      " fastest with context parallelism is"
                    : "fastest fitting mesh:",
                 mesh_words(&mesh->mesh, words), row_memory(mesh, mem), mesh->step.total);
        choose(d, cp ? "TP + CP + PP + DP" : "TP + PP + DP", mesh);
    } else {
        /* a long sequence: even the most model-parallel mesh, with SP and recomputation,
         * is mostly activations, which only a split of the sequence divides */
        const int long_sequence = mesh && mesh->feasible &&
                                  mesh->memory.activations > plan_total(mesh->memory) / 2;
        add_step(d, "4. no mesh of %d GPUs with %.0f GB fits this model: more GPUs (or"
                 " offloading) needed%s", r->cluster.gpus, r->gpu_bytes / GB,
                 long_sequence ? "; activations are most of it even with TP + SP and"
                                 " recomputation: split the sequence too (context"
                                 " parallelism, --cp N)"
                               : "");
        snprintf(d->strategy, sizeof d->strategy, "does not fit");
    }
}

/* The tree stops at the first branch that fits; say when a mesh further down is faster. */
static void note_fastest(const plan_row *rows, int n, plan_decision *d) {
    const plan_row *mesh = plan_find_row(rows, n, "3d");
    if (!mesh || !mesh->fits || mesh->step.total >= 0.95 * d->choice.step.total) return;
    char words[128];
    add_step(d, "   (the tree stops here; the fastest fitting mesh, %s, takes %.3g s per step"
             " against %.3g s)", mesh_words(&mesh->mesh, words), mesh->step.total,
             d->choice.step.total);
}

void plan_decide(const plan_request *r, const plan_row *rows, int n, plan_decision *d) {
    memset(d, 0, sizeof *d);
    const plan_row *ddp = plan_find_row(rows, n, "ddp");
    if ((ddp && try_ddp(r, ddp, d)) || try_zero(r, rows, n, d)) {
        note_fastest(rows, n, d);
        return;
    }
    try_3d(r, rows, n, d);
}
