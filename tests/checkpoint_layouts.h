/* Synthetic checkpoint layouts for the checkpoint suites: ranks that hold a TP slice,
 * a pipeline stage and possibly a ZeRO shard of a model whose every value names its
 * place in the unsplit model (gpt_init_params of a seed: parameters, m and v from
 * three seeds), saved by checkpoint_save and loaded by checkpoint_load, on whatever
 * launch() runs (threads, or Open MPI processes under mpirun). */
#ifndef CHECKPOINT_LAYOUTS_H
#define CHECKPOINT_LAYOUTS_H
#include <stdint.h>

#include "cli.h"
#include "model.h"
#include "shard.h"

typedef struct {
    const char *name;
    int tp, pp, dp;
    int params_sharded, moments_sharded;   /* over the dp group, per slab (shard.h) */
} layout_spec;

/* baseline, zero3 x4, zero1 x3, tp2 x dp2, pp2, tp2 pp2 dp2 zero1 */
extern const layout_spec checkpoint_layouts[];
extern const int checkpoint_num_layouts;
int layout_world(const layout_spec *l);   /* ranks: tp x pp x dp */
/* The seed of vector `kind` (0 parameters, 1 m, 2 v) of the values of `seed`. */
uint64_t layout_vector_seed(uint64_t seed, int kind);

/* Saves step 5 (AdamW step 5) of the values of `seed` from layout l into dir (crash_at:
 * the test hook that stops the process before that step of the save; 0: none). */
void layout_save(const layout_spec *l, const run_config *cfg, const char *dir, uint64_t seed,
                 int crash_at);
/* The values of `seed`'s vector `kind` that a rank of shape s holds, whole or (sharded)
 * its pieces of layout, into the device vector `device`. */
void layout_upload_values(const gpt_shape *s, const shard_layout *layout, int kind,
                          int sharded, uint64_t seed, float *device);
/* Loads dir into layout l and returns the largest difference from the values of `seed`
 * over all ranks (every process gets it); asserts that AdamW's step came back as 5. */
float layout_load(const layout_spec *l, const run_config *cfg, const char *dir, uint64_t seed);

/* The checkpoint suites' small model: vocab 257 leaves one padding row under TP 2, and
 * its slabs divide by neither 3 nor 4; 4 sequences a step, 10 steps. */
run_config layout_tiny_config(void);

/* A suite's directories under one temporary root: layout_scratch_open makes the root
 * (prefix "/tmp/NAME.XXXXXX", kept by the caller), layout_scratch_dir an empty
 * directory under it (the last four names stay valid), layout_scratch_close removes it
 * all and returns status, or 1 when it could not. */
int layout_scratch_open(char *root_template);
const char *layout_scratch_dir(const char *name);
int layout_scratch_close(int status);

#endif
