/* Context-parallel attention: the splits of a sequence, ring attention,
 * and the bytes each sends by formula (cp_attention.h). */
#include "cp_attention.h"

#include "alloc.h"

const char *cp_attention_name(cp_attention_kind kind) {
    (void)kind;
    return "ring";
}

const char *cp_split_name(cp_split split) {
    return split == CP_BALANCED ? "balanced" : "contiguous";
}

position_span cp_span_of(int T, int P, int rank, cp_split split) {
    if (split == CP_CONTIGUOUS || P == 1)
        return (position_span){.pieces = 1, .start = {rank * (T / P)}, .len = {T / P}};
    const int piece = T / (2 * P);   /* pieces rank and 2P-1-rank, in position order */
    return (position_span){.pieces = 2, .start = {rank * piece, (2 * P - 1 - rank) * piece},
                           .len = {piece, piece}};
}

struct cp_attention {
    cp_attention_kind kind;
    int B, T, NH;
    cp_ring *ring;
};

cp_attention *cp_attention_create(comm *cp, const cp_options *opts, int B, int T, int C,
                                  int NH) {
    cp_attention *a = mem_alloc(MEM_OTHER, sizeof *a);
    *a = (cp_attention){.kind = opts->kind, .B = B, .T = T, .NH = NH};
    a->ring = cp_ring_create(cp, opts, B, T, C, NH);
    return a;
}

void cp_attention_free(cp_attention *a) {
    if (!a) return;
    cp_ring_free(a->ring);
    mem_free(a);
}

size_t cp_attention_saved_numel(const cp_attention *a) {
    return (size_t)a->B * a->NH * (a->T / cp_ring_size(a->ring));   /* lse per query row */
}

void cp_attention_forward(cp_attention *a, float *out, float *saved, const float *qkv) {
    cp_ring_forward(a->ring, out, saved, qkv);
}

void cp_attention_backward(cp_attention *a, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *saved) {
    cp_ring_backward(a->ring, dqkv, dout, qkv, out, saved);
}

uint64_t cp_attention_work(const cp_attention *a) {
    return cp_ring_work(a->ring);
}

double cp_attention_bytes_formula(cp_attention_kind kind, int P, int B, int T, int C) {
    const double chunk = (double)B * (T / P) * C * sizeof(float);   /* B x Tc x C floats */
    (void)kind;
    if (P == 1) return 0.0;
    return 2.0 * chunk * ((P - 1) + (P - 1) + P);   /* K/V fwd, K/V and dK/dV bwd */
}
