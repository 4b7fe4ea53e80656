/* Where each number of a TP rank's slice sits in the unsplit model: the inverse of the
 * slicing that gpt_init_params applies (common/model.c), for moving parameters and
 * gradients between a TP layout and the whole model (comparisons, checkpoints). */
#ifndef TP_SLICES_H
#define TP_SLICES_H

#include "comm.h"
#include "model.h"

typedef enum { SLICE_TAKE, SLICE_PUT } slice_direction;   /* whole -> part, part -> whole */
/* Copies rank part->tp_rank's pieces of one block slab (with its MLP) between the
 * unsplit layout and the slice. with_replicated: also copy LayerNorms and row-parallel
 * biases. */
void tp_slice_block(const gpt_shape *part, float *whole_block, float *part_block,
                    slice_direction dir, int with_replicated);
/* The same for the whole parameter (or gradient) vector, embedding included; an MoE
 * shape's (gpt_shape_drop_moe_mlps) to and from the whole MoE shape's. */
void tp_slice_model(const gpt_shape *part, float *whole, float *part_vec,
                    slice_direction dir, int with_replicated);
/* Gathers every tp rank's slice and reassembles the unsplit vector on tp rank 0
 * (whole: gpt_num_params of the unsplit shape; may be NULL on the other ranks).
 * Replicated tensors are taken from rank 0; the return value (on rank 0) is the
 * largest difference between rank 0's copies and the other ranks' (0 when the ranks
 * stayed in step). Collective over tp. */
double tp_gather_whole(comm *tp, const gpt_shape *mine, const float *local, float *whole);

#endif
