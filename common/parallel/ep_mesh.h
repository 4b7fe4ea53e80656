/* The expert-parallel mesh: world = ep x dp ranks, in Megatron-LM's order (expert
 * parallelism inside data parallelism, ranks of one EP group consecutive):
 *
 *     rank = ep_index + ep x dp_index
 *
 *   group       members: the ranks that differ only in    reduces
 *   ep          ep_index (ep consecutive ranks)           nothing: the all-to-alls
 *   expert_dp   dp_index (stride ep): they hold the       the experts' gradients
 *               same experts
 *   world       everyone: every rank holds the dense      the dense gradients
 *               part (attention, embeddings, routers)
 *
 * Consecutive EP ranks keep the all-to-alls, which move every token of every MoE
 * block twice a pass, inside a node. Every rank reads its own share of the global
 * batch (world rank order), as in data parallelism. */
#ifndef EP_MESH_H
#define EP_MESH_H
#include <stddef.h>

#include "comm.h"

typedef struct { int ep, dp; } ep_mesh_shape;
typedef struct { int ep, dp; } ep_mesh_coord;

ep_mesh_coord ep_mesh_coord_of(const ep_mesh_shape *m, int rank);
int ep_mesh_rank_of(const ep_mesh_shape *m, ep_mesh_coord c);
/* Whether ep x dp is `world` ranks and ep divides the experts; if not, one line in err
 * naming what would fit. */
int ep_mesh_check(const ep_mesh_shape *m, int world, int experts, char *err, size_t err_len);

/* This rank's place and its groups (made whatever the sizes: one code path). */
typedef struct {
    ep_mesh_shape shape;
    ep_mesh_coord me;
    comm *world, *ep, *expert_dp;
} ep_mesh;

/* Collective over world. */
ep_mesh ep_mesh_create(comm *world, ep_mesh_shape shape);
void ep_mesh_free(ep_mesh *m);

#endif
