/* The small model the pipeline and 3D suites train (threads and MPI alike): vocab 256,
 * ctx 8, 2 heads, dim 16, a global batch of 8, 3 steps, quiet. */
#ifndef SMALL_MODEL_H
#define SMALL_MODEL_H

#include "cli.h"

/* `layers` blocks (enough for the stages and chunks a suite cuts), `ranks` ranks. */
run_config small_model_config(int layers, int ranks);

/* The ZeRO suites' model, whose slabs divide by neither 3 nor 4 (embedding 256*25 +
 * 7*25 = 6575, block 12*625 + 13*25 = 7825, final LayerNorm 50), with a batch of 5
 * sequences, uneven on 2, 3 and 4 ranks: vocab 256, ctx 7, 2 layers, 5 heads, dim 25,
 * 5 steps, quiet, a 30 s communication timeout. */
run_config uneven_model_config(int ranks);

/* The sequence-parallel suites' model (chapter 9, TP's collective matmul): 12 heads and
 * 24 channels divide by 2 and 4, and so do the 8 positions of a sequence (a rank holds
 * B T / t rows of the sequence-parallel region): vocab 256, 2 layers, a batch of 2,
 * TOL_STEPS steps, quiet, a 30 s communication timeout. */
run_config sequence_model_config(int ranks);

#endif
