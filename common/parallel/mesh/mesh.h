/* The device mesh, one for every dimension: world = tp x cp x dp x pp ranks, in
 * Megatron-core's order (tp fastest, then cp, then dp, pp outermost)
 *
 *     rank = tp_index + t * (cp_index + c * (dp_index + d * pp_index))
 *     dp_index = shard_index + s * replicate_index     (dp = dp_replicate x dp_shard)
 *
 * Tensor-parallel ranks are consecutive, so a TP group (whose all-reduces run in every
 * layer) stays inside one node, on its fastest links. Context parallelism (each rank a
 * chunk of every sequence, cp_train.h) comes next: its K/V blocks move in every layer,
 * less often than TP's all-reduces but more than DP's gradients. Data parallelism is
 * dp_replicate x dp_shard (torchtitan's names): ZeRO shards over the shard group, HSDP
 * all-reduces across the replicas; without replicas (dp_shard 0 or dp) the shard group
 * is the dp group. Pipeline stages are outermost: one activation per micro-batch.
 *
 * Expert layers (MoE) lay the same ranks out again, as Megatron-core does: the dp x cp
 * ranks of a TP position and stage (the group that sums dense gradients) are split into
 * EP groups of e consecutive ones (the all-to-alls, inside a node) and expert-DP groups
 * across them (the ranks that hold the same experts and sum their gradients):
 *
 *     j = cp_index + c * dp_index      ep_index = j % e      expert_dp_index = j / e
 *
 *   group         members: the ranks that differ only in            size
 *   tp            tp_index (t consecutive ranks)                     t
 *   cp            cp_index (stride t)                                c
 *   dp            dp_index (stride t x c)                            d
 *   dp_shard      shard_index (stride t x c)                         s
 *   dp_replicate  replicate_index (stride t x c x s)                 d / s
 *   dp_cp         cp_index and dp_index: dense gradients             c x d
 *   dp_shard_cp   cp_index and shard_index: ZeRO's shards            c x s
 *   pp            pp_index (stride t x c x d)                        p
 *   ep            ep_index (stride t)                                e
 *   expert_dp     expert_dp_index (stride t x e)                     c x d / e
 *   embedding     the first and last stage of a pipeline (p > 1)
 *
 * Without cp, ep and replicas (0 or 1 each) the mesh is the 3D one, rank for rank; with
 * tp = cp = pp = 1 the expert layout is chapter 10's EP x DP (rank = ep + e x dp).
 *
 * The arithmetic (mesh_coord_of, mesh_group_members, mesh_check) needs no ranks, so a
 * mesh of thousands of GPUs can be laid out and checked; mesh_create makes this rank's
 * communicators. */
#ifndef MESH_H
#define MESH_H
#include <stddef.h>

#include "comm.h"

/* The sizes. tp, pp, dp first, so that shapes written {tp, pp, dp} keep their meaning;
 * cp and ep 0 are 1, dp_shard 0 is dp (no replicas). dp counts every data-parallel
 * rank: dp_replicate x dp_shard. */
typedef struct { int tp, pp, dp, cp, ep, dp_shard; } mesh_shape;
/* A rank's place: its index along every dimension (dp = dp_shard + s x dp_replicate;
 * ep and expert_dp: the expert layers' layout of cp x dp). */
typedef struct { int tp, pp, dp, cp, ep, expert_dp, dp_shard, dp_replicate; } mesh_coord;
/* The 3D mesh's kinds (MESH_KINDS of them, what chapter 5 trains on), then the rest. */
typedef enum { MESH_TP, MESH_PP, MESH_DP, MESH_KINDS, MESH_CP = MESH_KINDS, MESH_DP_SHARD,
               MESH_DP_REPLICATE, MESH_DP_CP, MESH_EP, MESH_EXPERT_DP,
               MESH_DP_SHARD_CP, MESH_ALL_KINDS } mesh_group_kind;

/* "tp", "pp", "dp", "cp", "dp_shard", "dp_replicate", "dp_cp", "ep", "expert_dp",
 * "dp_shard_cp" */
const char *mesh_group_kind_name(mesh_group_kind kind);
int mesh_world(const mesh_shape *m);                       /* t x c x d x p */
int mesh_cp_size(const mesh_shape *m);                     /* cp, 1 when 0 */
int mesh_ep_size(const mesh_shape *m);                     /* ep, 1 when 0 */
int mesh_dp_shard_size(const mesh_shape *m);               /* dp_shard, dp when 0 */
int mesh_dp_replicate_size(const mesh_shape *m);           /* dp / dp_shard */
int mesh_expert_dp_size(const mesh_shape *m);              /* c x d / e */

/* What a mesh must fit, for mesh_check. */
typedef int (*mesh_fits_fn)(const mesh_shape *m, const void *ctx);
typedef struct {
    mesh_shape shape;   /* dp 0: what the world leaves, ranks / (t x cp x p), cp >= 1 */
    int world;          /* the ranks there are */
    int experts;        /* MoE: experts per block, which ep must divide (0: dense) */
    mesh_fits_fn fits;  /* which meshes of `world` ranks to suggest (NULL: any) */
    const void *ctx;
} mesh_config;

/* Why the mesh cannot be laid out on the world (a size below 1, sizes whose product is
 * not the world, dp_shard not dividing dp, ep not dividing dp x cp or the experts; every
 * mesh that is laid out trains, what the model and the run cannot do is
 * parallelize_check's): one line in why, returned, naming the
 * sizes and what would fit, e.g. "--tp 2 --pp 2 --dp 2 needs 8 ranks, not 6; with that
 * many ranks try --tp 2 --pp 3 --dp 1 or --tp 1 --pp 2 --dp 3". NULL when it can. */
const char *mesh_check(const mesh_config *c, char *why, size_t why_len);
/* Sizes not given (0) completed for `world` ranks: the one missing is what the world
 * leaves; with more missing, TP 2 and PP 2 where they fit (2 divides what is left and
 * the heads; the model has 2 layers), the rest data parallel. Returns 0 with one line
 * in err when the sizes given do not divide the world. */
int mesh_complete(mesh_shape *m, int world, int heads, int layers, char *err, size_t err_len);
/* Up to `max` 3D meshes of `world` ranks that fit, closest to `want` first, as
 * "--tp T --pp P --dp D or ..." in out ("" when none). */
void mesh_suggest(const mesh_shape *want, int world, mesh_fits_fn fits, const void *ctx,
                  int max, char *out, size_t out_len);

mesh_coord mesh_coord_of(const mesh_shape *m, int rank);
int mesh_rank_of(const mesh_shape *m, mesh_coord c);   /* from tp, cp, dp, pp */
/* Which group of its kind a rank is in (0 .. number of such groups - 1). */
int mesh_group_index(const mesh_shape *m, mesh_group_kind kind, int rank);
int mesh_group_count(const mesh_shape *m, mesh_group_kind kind);
/* The ranks of group `index` of a kind, in group order (by the rank's index along the
 * group); returns how many (the group's size). */
int mesh_group_members(const mesh_shape *m, mesh_group_kind kind, int index, int *members);
/* A rank's index along the group of `kind` it is in (its place in members). */
int mesh_group_rank(const mesh_shape *m, mesh_group_kind kind, int rank);

/* This rank's place in the mesh and its groups (each a group of one where its size is
 * 1); made whatever the sizes, so every strategy takes the same code path. */
typedef struct {
    mesh_shape shape;
    mesh_coord me;
    comm *world;       /* borrowed: the one mesh_create was given */
    comm *tp, *pp, *dp, *cp;
    comm *dp_shard, *dp_replicate;
    comm *dp_cp;       /* the dense gradients' group: cp x dp */
    comm *dp_shard_cp; /* ZeRO's shards of them: cp x dp_shard (dp_cp without replicas) */
    comm *ep, *expert_dp;
    comm *embedding;   /* first and last stage of this rank's pipeline; NULL elsewhere
                          and when there is one stage */
} mesh;

/* Collective over world, which must have mesh_world ranks (mesh_check first). */
void mesh_create(mesh *m, comm *world, mesh_shape shape);
/* The mesh of one device without communicators (every group NULL, every index 0). */
void mesh_single(mesh *m);
void mesh_free(mesh *m);

#endif
