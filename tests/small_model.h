/* The small model the pipeline and 3D suites train (threads and MPI alike): vocab 256,
 * ctx 8, 2 heads, dim 16, a global batch of 8, 3 steps, quiet. */
#ifndef SMALL_MODEL_H
#define SMALL_MODEL_H

#include "cli.h"

/* `layers` blocks (enough for the stages and chunks a suite cuts), `ranks` ranks. */
run_config small_model_config(int layers, int ranks);

#endif
