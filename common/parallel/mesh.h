/* The device mesh: world = tp x cp x dp x pp ranks, in Megatron-LM's order
 *
 *     rank = tp_index + t * (cp_index + c * (dp_index + d * pp_index))
 *
 * Tensor-parallel ranks are consecutive, so a TP group (whose all-reduces run in every
 * layer) stays inside one node, on its fastest links; the ranks of one pipeline stage
 * come next, d TP groups of data-parallel replicas; pipeline stages are outermost,
 * since they exchange only one activation per micro-batch and suit the slowest links.
 * Context parallelism (each rank a chunk of every sequence, cp_train.h) sits between TP
 * and DP, as Megatron-LM puts it: its K/V blocks move in every layer, less often than
 * TP's all-reduces but more than DP's gradients. Without it (cp 1, or 0 in a shape
 * written before it existed) the mesh is the 3D one, rank for rank.
 *
 *   group   members: the ranks that differ only in     each rank belongs to one
 *   tp      tp_index (t consecutive ranks)             of d x p groups
 *   cp      cp_index (stride t)                        of t x d x p groups
 *   dp      dp_index (stride t x c)                    of t x c x p groups
 *   pp      pp_index (stride t x c x d)                of t x c x d groups
 *   embedding  the first and last stage of a pipeline  (p > 1)
 *
 * The arithmetic (mesh_shape, mesh_coord_of, mesh_group_members) needs no ranks, so a
 * mesh of thousands of GPUs can be laid out and checked; mesh_create makes this rank's
 * communicators. */
#ifndef MESH_H
#define MESH_H
#include <stddef.h>

#include "comm.h"

/* cp last, so that shapes written as {tp, pp, dp} keep their meaning (cp 0 is 1) */
typedef struct { int tp, pp, dp, cp; } mesh_shape;
typedef struct { int tp, pp, dp, cp; } mesh_coord;
/* The 3D mesh's kinds (MESH_KINDS of them, what chapter 5 trains on), then CP's. */
typedef enum { MESH_TP, MESH_PP, MESH_DP, MESH_KINDS, MESH_CP = MESH_KINDS,
               MESH_ALL_KINDS } mesh_group_kind;

const char *mesh_group_kind_name(mesh_group_kind kind);   /* "tp", "pp", "dp", "cp" */
int mesh_world(const mesh_shape *m);                       /* t x c x p x d */
int mesh_cp_size(const mesh_shape *m);                     /* cp, 1 when 0 */

/* Whether the mesh has `world` ranks (every size >= 1); if not, writes one line naming
 * the sizes and meshes of `world` ranks that would fit, e.g. "--tp 2 --pp 2 --dp 2
 * needs 8 ranks, not 6; with 6 ranks try --tp 2 --pp 3 --dp 1 or --tp 1 --pp 2 --dp 3".
 * fits (may be NULL) rules out suggestions the model cannot take. */
typedef int (*mesh_fits_fn)(const mesh_shape *m, const void *ctx);
int mesh_check(const mesh_shape *m, int world, mesh_fits_fn fits, const void *ctx,
               char *err, size_t err_len);
/* Sizes not given (0) completed for `world` ranks: the one missing is what the world
 * leaves; with more missing, TP 2 and PP 2 where they fit (2 divides what is left and
 * the heads; the model has 2 layers), the rest data parallel. Returns 0 with one line
 * in err when the sizes given do not divide the world. */
int mesh_complete(mesh_shape *m, int world, int heads, int layers, char *err, size_t err_len);
/* Up to `max` meshes of `world` ranks that fit, closest to `want` first, as
 * "--tp T --pp P --dp D or ..." in out ("" when none). */
void mesh_suggest(const mesh_shape *want, int world, mesh_fits_fn fits, const void *ctx,
                  int max, char *out, size_t out_len);

mesh_coord mesh_coord_of(const mesh_shape *m, int rank);
int mesh_rank_of(const mesh_shape *m, mesh_coord c);
/* Which group of its kind a rank is in (0 .. number of such groups - 1). */
int mesh_group_index(const mesh_shape *m, mesh_group_kind kind, int rank);
int mesh_group_count(const mesh_shape *m, mesh_group_kind kind);
/* The ranks of group `index` of a kind, in group order (by that coordinate); returns
 * how many (the size of that dimension). */
int mesh_group_members(const mesh_shape *m, mesh_group_kind kind, int index, int *members);

/* This rank's place in the mesh and its groups. */
typedef struct {
    mesh_shape shape;
    mesh_coord me;
    comm *tp, *pp, *dp;
    comm *cp;          /* context-parallel group (a group of one when cp is 1) */
    comm *embedding;   /* first and last stage of this rank's pipeline; NULL elsewhere
                          and when there is one stage */
} mesh;

/* Collective over world, whose size must be t x c x p x d (mesh_check first). */
void mesh_create(mesh *m, comm *world, mesh_shape shape);
void mesh_free(mesh *m);

#endif
