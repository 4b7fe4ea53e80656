/* Sharded checkpoints that load into any layout.
 *
 * A checkpoint is a directory DIR/step-NNNNNN (DIR/latest names the newest, and
 * DIR/latest-STRATEGY the newest of each strategy that saved there):
 *   rank-RRRRR.safetensors   what world rank R owned: pieces of parameters and of
 *                            AdamW's m and v ("optimizer.m.<name>", "optimizer.v.<name>")
 *   index.json               the config and layout it was saved from, every file's
 *                            size and CRC-32, and per piece: its tensor, the tensor's
 *                            global shape, the box of the unsplit tensor it is a part of
 *                            (global start and length per dimension: a TP slice) and the
 *                            flat range of that box it holds (a ZeRO piece; the whole box
 *                            otherwise); last, its own CRC-32 (index_crc32)
 * Tensors are named in the unsplit model (wte.weight, blocks.3.attn.q.weight, ...;
 * checkpoint_tensors.c): q, k and v are separate so that every TP slice is a box.
 *
 * A rank's state is a list of parts (a pipeline rank may hold several stages): each a
 * gpt_shape (TP slice, stage) with parameters and moments either whole or sharded by
 * a shard_layout. Saving, each rank writes only what it owns, each element once over
 * all ranks; loading, each rank copies from every saved piece the intersection with
 * what it holds. The step is the data position (dataset_batch is indexed by it) and
 * the RNG is counter-based from the seed, so step, seed and AdamW's step counter are
 * all the rest of the state, with, in mixed precision, the run's precision and fp16's
 * loss scale (ckpt_run_state). The parameters saved are always fp32: the masters in
 * mixed precision, so any precision resumes any other. */
#ifndef CHECKPOINT_H
#define CHECKPOINT_H
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "run_config.h"
#include "comm.h"
#include "model.h"
#include "shard.h"

typedef struct {
    gpt_shape shape;
    const shard_layout *layout;   /* NULL: nothing sharded */
    float *params, *adam_m, *adam_v;   /* device vectors: whole (gpt_num_params) or
                                          this rank's shard (layout->shard_len) */
    int params_sharded, moments_sharded;
    int writes;   /* without a layout: this rank writes the part (one replica does) */
} ckpt_part;

enum { CKPT_MAX_PARTS = 16 };

/* Elements of one of a part's vectors, and where element i of slab `slab` sits in it. */
static inline size_t ckpt_vector_len(const ckpt_part *p, int sharded) {
    return sharded ? p->layout->shard_len : gpt_num_params(&p->shape);
}
static inline size_t ckpt_element_index(const ckpt_part *p, int sharded, int slab, size_t i) {
    if (sharded) return p->layout->shard_pos[slab] + (i - p->layout->piece_offset[slab]);
    return gpt_slab_offset(&p->shape, slab) + i;
}

/* The index's metadata beyond the tensors: the precision of the run that saved and,
 * when it had fp16's dynamic loss scale (loss_scale.h), that scale's state. A checkpoint
 * without them (saved before precisions) is fp32 without a loss scale. */
typedef struct {
    precision precision;
    int has_loss_scale;        /* 0: no dynamic loss scale (scale 1, nothing to restore) */
    float loss_scale;          /* S */
    int clean_steps, skipped_steps;
    int precision_listed;      /* on load: the metadata named the precision */
    int fp8, fp8_recipe;       /* --precision fp8 (precision bf16) and its fp8_recipe */
    int fp8_format;            /* and its format (fp8_linear.h; e4m3 where none is listed) */
} ckpt_run_state;

typedef struct {
    ckpt_part parts[CKPT_MAX_PARTS];
    int count;
    /* The training loop's (NULL: saved as fp32 without a loss scale, not read back):
     * written into the metadata by a save, filled from it by a load. */
    ckpt_run_state *run;
    /* Every counter of AdamW's step the strategy keeps (NULL-terminated): the first is
     * saved, all are set on load. */
    int *adam_steps[CKPT_MAX_PARTS + 1];
} ckpt_state;

/* Collective over world (NULL: one rank alone). Writes step `step` under dir with the
 * temporary directory, fsync and rename protocol, then points dir/latest-STRATEGY and
 * dir/latest at it. A save that fails removes its temporary directory; each save first
 * removes those that killed saves left (checkpoint_clear_stale). */
void checkpoint_save(comm *world, const run_config *cfg, const char *strategy,
                     const ckpt_state *state, int step);

/* Removes dir's .tmp-step-* directories and .latest*.tmp: what a killed save leaves. */
void checkpoint_clear_stale(const char *dir);

/* A test seam: each step of a save (mkdir, write, fsync, remove, rename of one path) is
 * numbered in its process as it starts. run_config.save_test_crash = N ends the process
 * with status 3 just before step N; an observer, when set, sees every step first (from
 * every rank's thread: it must be thread-safe). */
typedef void (*ckpt_save_observer)(const char *action, const char *path);
void checkpoint_observe_saves(ckpt_save_observer observer);

/* index.json's last member, index_crc32: the CRC-32 of every byte before this line. */
#define CKPT_INDEX_CRC_LINE "\n  \"index_crc32\": "


/* Per rank, after checkpoint_check passed: fills the state from the checkpoint and
 * returns its step (a piece it needs that is missing now, after that check: one line,
 * exit status 1, as on any failure of the run). */
int checkpoint_load(const char *dir, const ckpt_state *state);

/* The line a resumed run starts with: the checkpoint, its step, the precision it was
 * saved in (when its metadata lists one; fp8 with its recipe) and whether its loss scale
 * was restored. */
void checkpoint_print_resumed(FILE *out, const char *dir, int step, const ckpt_run_state *saved,
                              int scale_restored);

/* The longest --save or --resume directory: the command line refuses a longer one
 * (checkpoint_dir_check), so every path made under it, with the names a checkpoint's
 * files have, fits the 4096-byte buffers here. */
enum { CKPT_DIR_MAX = 2048 };

/* Why `dir` (given as --flag) cannot hold checkpoints' paths, or NULL when it can. */
const char *checkpoint_dir_check(const char *flag, const char *dir, char *why, size_t why_len);

/* For snprintf into a path or name buffer whose parts are bounded (CKPT_DIR_MAX, the
 * names this code makes): one that does not fit is a bug here, not bad input. */
static inline void ckpt_fits(int written, size_t capacity) {
    if (written < 0 || (size_t)written >= capacity) {
        fprintf(stderr, "checkpoint: a path or tensor name is too long\n");
        abort();
    }
}

/* ---- the names and places of tensors (checkpoint_tensors.c) ---------------------- */
enum { CKPT_NAME_LEN = 64, CKPT_MAX_TENSORS = 16 };
typedef struct {
    char name[CKPT_NAME_LEN];
    int ndim;                 /* 1 or 2; a 1-D tensor is one row */
    size_t global[2];         /* the unsplit tensor: rows, columns */
    size_t box_start[2], box_len[2];   /* the part this slice holds, row-major locally */
    size_t local_offset;      /* where the slice starts in its slab */
    int replicated;           /* every TP rank holds all of it */
} ckpt_tensor;

/* The tensors of a slab of s (a HEAD slab lists the tied wte). Returns how many. */
int ckpt_slab_tensors(const gpt_shape *s, int slab, ckpt_tensor *out);
static inline size_t ckpt_box_numel(const ckpt_tensor *t) {
    return t->box_len[0] * t->box_len[1];
}

/* dir/latest's target, or dir itself when it is a checkpoint (has index.json). */
int checkpoint_resolve(const char *dir, char *path, size_t path_len, char *err, size_t err_len);

/* The checkpoint dir/pointer names (a file holding one directory name): 1 with its path,
 * 0 with why in err. */
int checkpoint_read_pointer(const char *dir, const char *pointer, char *path, size_t path_len,
                            char *err, size_t err_len);

/* Before any rank starts: the checkpoint that `--resume dir` names, checked whole
 * (index, every file's size and CRC-32, headers, the model's shape and seed). Returns
 * its step; on any problem writes one line to err naming the file and returns -1. */
int checkpoint_check(const char *dir, const run_config *cfg, char *err, size_t err_len);
/* The same with a step up to last_step accepted (a restart: a strategy that had finished). */
int checkpoint_check_until(const char *dir, const run_config *cfg, int last_step, char *err,
                           size_t err_len);

/* ---- each strategy's own newest checkpoint (checkpoint_latest.c) --------------------- */

/* The file in DIR naming the newest checkpoint of `strategy`: "latest-<strategy>", with
 * any character but letters, digits and ._+- as '_'. */
void checkpoint_own_pointer(const char *strategy, char *name, size_t len);

/* dir/latest-<strategy>'s checkpoint: 1 with it in path, 0 when dir has none, -1 with
 * why in err when the file is there but names no checkpoint. */
int checkpoint_own_latest(const char *dir, const char *strategy, char *path, size_t path_len,
                          char *err, size_t err_len);

/* Whether checkpoint `path` was in --save DIR as the job began (restart.saves_before):
 * another job's, which a restart never resumes (a save never reuses a name). */
int checkpoint_saved_before(const run_config *cfg, const char *path);

/* Before any rank starts: every dir/latest-* checked whole (checkpoint_check_until) but
 * the checkpoint `checked` (a path as checkpoint_resolve gives it; "" for none), which
 * was, and with `this_job_only` those saved before the job began. Returns 0, or -1 with
 * one line in err. */
int checkpoint_check_own_latests(const char *dir, const run_config *cfg, int last_step,
                                 const char *checked, int this_job_only, char *err,
                                 size_t err_len);

#endif
