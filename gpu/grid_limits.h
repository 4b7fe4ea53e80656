/* The launch shape of the column sums (ops_cuda_kernels.cu), where a grid dimension
 * meets the hardware's limit: gridDim.y may not exceed 65535, and one chunk of 128 rows
 * per block row passes it at 8.4M rows. Block row y then takes chunks y, y + grid_y,
 * y + 2 grid_y ... in that order, so the sums still depend only on the shape. C and
 * CUDA C++, host code, checked on any machine by tests/test_gpu_host.c. */
#ifndef GRID_LIMITS_H
#define GRID_LIMITS_H
#include <stddef.h>

#define CUDA_GRID_Y_MAX 65535u
#define COLUMN_CHUNK_ROWS 128   /* rows one block sums per chunk */

static inline size_t column_chunks(size_t rows) {
    return (rows + COLUMN_CHUNK_ROWS - 1) / COLUMN_CHUNK_ROWS;
}

/* Block rows of the grid for `chunks` chunks: also the partial sums per column. */
static inline unsigned column_grid_y(size_t chunks) {
    return chunks < CUDA_GRID_Y_MAX ? (unsigned)(chunks ? chunks : 1) : CUDA_GRID_Y_MAX;
}

#endif
