/* The mesh as tables: rank -> (tp, pp, dp), every group's members, a summary for
 * meshes of thousands of ranks (--mesh-only, with its checks), the JSON of the layout,
 * and the course text's examples worked out (--examples). */
#ifndef MESH_TABLE_H
#define MESH_TABLE_H

#include "mesh.h"

/* rank -> coordinates and the groups, all of them for small meshes. */
void print_mesh(mesh_shape shape);
/* Checks the layout of any size against Megatron's order and prints the summary (first
 * and last groups of each kind, counts), or with json one object with every rank and
 * group. Returns 0 when every check holds. */
int mesh_only(mesh_shape shape, int json);
/* GPT-3 175B on 1024 GPUs and MT-NLG 530B, as the course text gives them and as
 * published. */
void print_examples(void);

#endif
