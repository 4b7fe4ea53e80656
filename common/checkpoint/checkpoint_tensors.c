/* The tensors of each slab under their names in the unsplit model, and the box of the
 * unsplit tensor that a TP slice holds (the same slicing as tp_slices.c). */
#include <stdio.h>
#include <string.h>

#include "checkpoint.h"

typedef struct {
    ckpt_tensor *out;
    int count;
    size_t offset;   /* in the slab, of the next tensor */
} table;

/* Adds a tensor of global rows x cols whose slice is the box at (row0, col0) of
 * nrows x ncols; it takes `local` elements of the slab (>= the box: wte's padding). */
static void add(table *t, const char *name, int ndim, size_t rows, size_t cols, size_t row0,
                size_t nrows, size_t col0, size_t ncols, size_t local) {
    ckpt_tensor *x = &t->out[t->count++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = ndim;
    x->global[0] = rows;
    x->global[1] = cols;
    x->box_start[0] = row0;
    x->box_start[1] = col0;
    x->box_len[0] = nrows;
    x->box_len[1] = ncols;
    x->local_offset = t->offset;
    x->replicated = nrows == rows && ncols == cols;
    t->offset += local;
}

static void add_whole(table *t, const char *name, int ndim, size_t rows, size_t cols) {
    add(t, name, ndim, rows, cols, 0, rows, 0, cols, rows * cols);
}

static void add_wte(table *t, const gpt_shape *s) {
    const size_t V = (size_t)s->cfg.vocab, C = (size_t)s->cfg.dim;
    const size_t start = (size_t)s->vocab_start, local = (size_t)s->vocab_local;
    const size_t rows = start >= V ? 0 : (V - start < local ? V - start : local);
    add(t, "wte.weight", 2, V, C, start, rows, 0, C, local * C);
}

static void add_block(table *t, const gpt_shape *s, int layer) {
    const size_t C = (size_t)s->cfg.dim, Cl = (size_t)s->dim_local, Hl = (size_t)s->hidden_local;
    const size_t r = (size_t)s->tp_rank;
    char name[CKPT_NAME_LEN];
#define NAME(suffix) (snprintf(name, sizeof name, "blocks.%d.%s", layer, suffix), name)
    add_whole(t, NAME("ln_1.weight"), 1, 1, C);
    add_whole(t, NAME("ln_1.bias"), 1, 1, C);
    add(t, NAME("attn.q.weight"), 2, C, C, r * Cl, Cl, 0, C, Cl * C);
    add(t, NAME("attn.k.weight"), 2, C, C, r * Cl, Cl, 0, C, Cl * C);
    add(t, NAME("attn.v.weight"), 2, C, C, r * Cl, Cl, 0, C, Cl * C);
    add(t, NAME("attn.q.bias"), 1, 1, C, 0, 1, r * Cl, Cl, Cl);
    add(t, NAME("attn.k.bias"), 1, 1, C, 0, 1, r * Cl, Cl, Cl);
    add(t, NAME("attn.v.bias"), 1, 1, C, 0, 1, r * Cl, Cl, Cl);
    add(t, NAME("attn.proj.weight"), 2, C, C, 0, C, r * Cl, Cl, C * Cl);
    add_whole(t, NAME("attn.proj.bias"), 1, 1, C);
    add_whole(t, NAME("ln_2.weight"), 1, 1, C);
    add_whole(t, NAME("ln_2.bias"), 1, 1, C);
    add(t, NAME("mlp.fc.weight"), 2, 4 * C, C, r * Hl, Hl, 0, C, Hl * C);
    add(t, NAME("mlp.fc.bias"), 1, 1, 4 * C, 0, 1, r * Hl, Hl, Hl);
    add(t, NAME("mlp.proj.weight"), 2, C, 4 * C, 0, C, r * Hl, Hl, C * Hl);
    add_whole(t, NAME("mlp.proj.bias"), 1, 1, C);
#undef NAME
}

int ckpt_slab_tensors(const gpt_shape *s, int slab, ckpt_tensor *out) {
    table t = {.out = out};
    const size_t C = (size_t)s->cfg.dim;
    switch (gpt_slab_kind_of(s, slab)) {
    case GPT_SLAB_EMBED:
        add_wte(&t, s);
        add_whole(&t, "wpe.weight", 2, (size_t)s->cfg.ctx, C);
        break;
    case GPT_SLAB_HEAD: add_wte(&t, s); break;
    case GPT_SLAB_FINAL:
        add_whole(&t, "ln_f.weight", 1, 1, C);
        add_whole(&t, "ln_f.bias", 1, 1, C);
        break;
    default: add_block(&t, s, s->layer_begin + slab - s->has_embed); break;
    }
    return t.count;
}
