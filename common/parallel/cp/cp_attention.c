/* Context-parallel attention: the choice of ring or Ulysses,
 * and the bytes each sends by formula (cp_attention.h). */
#include "cp_attention.h"

#include "alloc.h"

const char *cp_attention_name(cp_attention_kind kind) {
    return cp_attention_names[kind];
}

struct cp_attention {
    cp_attention_kind kind;
    int B, T, C, NH, P;
    cp_ring *ring;
    cp_ulysses *ulysses;
};

cp_attention *cp_attention_create(comm *cp, const cp_options *opts, int B, int T, int C,
                                  int NH) {
    cp_attention *a = mem_alloc(MEM_OTHER, sizeof *a);
    *a = (cp_attention){.kind = opts->kind, .B = B, .T = T, .C = C, .NH = NH,
                        .P = cp ? comm_size(cp) : 1};
    if (opts->kind == CP_ULYSSES) a->ulysses = cp_ulysses_create(cp, B, T, C, NH, opts->wire);
    else a->ring = cp_ring_create(cp, opts, B, T, C, NH);
    return a;
}

void cp_attention_free(cp_attention *a) {
    if (!a) return;
    cp_ring_free(a->ring);
    cp_ulysses_free(a->ulysses);
    mem_free(a);
}

size_t cp_attention_rows(const cp_attention *a) { return (size_t)a->B * (a->T / a->P); }
int cp_attention_channels(const cp_attention *a) { return a->C; }

size_t cp_attention_saved_numel(const cp_attention *a) {
    if (a->ulysses) return cp_ulysses_saved_numel(a->ulysses);
    return (size_t)a->B * a->NH * (a->T / cp_ring_size(a->ring));   /* lse per query row */
}

void cp_attention_forward(cp_attention *a, float *out, float *saved, const float *qkv) {
    if (a->ulysses) cp_ulysses_forward(a->ulysses, out, saved, qkv);
    else cp_ring_forward(a->ring, out, saved, qkv);
}

void cp_attention_backward(cp_attention *a, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *saved) {
    if (a->ulysses) cp_ulysses_backward(a->ulysses, dqkv, dout, saved);
    else cp_ring_backward(a->ring, dqkv, dout, qkv, out, saved);
}

uint64_t cp_attention_work(const cp_attention *a) {
    return a->ulysses ? cp_ulysses_work(a->ulysses) : cp_ring_work(a->ring);
}

double cp_attention_bytes_formula(cp_attention_kind kind, int P, int B, int T, int C,
                                  precision wire) {
    const double chunk = (double)B * (T / P) * C;   /* B x Tc x C elements */
    const double e = precision_bytes(wire), f32 = sizeof(float);
    if (P == 1) return 0.0;
    if (kind == CP_ULYSSES) return 8.0 * (P - 1) / P * chunk * e;
    return 2.0 * chunk * (((P - 1) + (P - 1)) * e + P * f32);   /* K/V fwd and bwd, dK/dV */
}
