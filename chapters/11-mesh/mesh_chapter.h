/* Chapter 11's arguments and its tables (mesh_report.c). */
#ifndef MESH_CHAPTER_H
#define MESH_CHAPTER_H

#include "mesh_train.h"
#include "run_config.h"

typedef struct {
    run_config cfg;
    mesh_shape shape;          /* tp, pp, cp, dp (= replicate x shard), dp_shard, ep */
    int dp_replicate, dp_shard;
    int sp, cp_attention, schedule, micro, zero, experts, moe_every, top_k;
    double capacity_factor, aux_loss;   /* MoE (with --ep 2 or more), as chapter 10's */
    int mesh_only, world;
} mesh_args;

/* Rank -> its index along every dimension, in rank order (the first 32 ranks of a
 * larger mesh, then its last), and each group kind's size, count and first group. */
void mesh_print_layout(const mesh_shape *shape);
/* --mesh-only: the layout, or with json one object of the sizes and groups. */
void mesh_print_only(const mesh_shape *shape, int json);
/* Every rank's bytes a step on every group kind next to its formula. */
void mesh_print_bytes(const mesh_extra *x, int world);
/* Every rank's model state by tag next to its formula, and its activations' peak. */
void mesh_print_memory(const mesh_extra *x, int world, const run_config *cfg);
/* The --json row's extra: the mesh, bytes and state, largest rank by kind (malloc'd). */
char *mesh_json(const mesh_extra *x, int world, const mesh_args *a);

#endif
