/* DeepSpeed-Ulysses (cp_attention.h): from sequence-sharded to head-sharded and back.
 *
 *   forward, rank r of P (heads [r H/P, (r+1) H/P), Hl = H/P of them, Cl = C/P channels):
 *     qkv [B, Tc, 3C]  --all-to-all-->  qkv_h [B, T, 3 Cl]   my heads, every position
 *     out_h, att = attention(qkv_h)                           plain causal attention
 *     out_h [B, T, Cl] --all-to-all-->  out [B, Tc, C]        my positions, every head
 *   backward: dout --all-to-all--> dout_h; attention's backward; dqkv_h --all-to-all-->
 *   dqkv: the conjugate of each all-to-all is the all-to-all the other way.
 *
 * Block j of a send buffer is what goes to rank j: for the first all-to-all my rows'
 * Q, K, V columns of j's heads ([B, Tc, 3 Cl]); received, block j is j's rows of my
 * heads, which are positions [j Tc, (j+1) Tc) of every sequence. Q, K and V travel in
 * one all-to-all (three of DeepSpeed's four, the same bytes). In 16 bits every all-to-all
 * travels in the model's precision: Q, K, V and dO are 16-bit values (exact), the output
 * and d qkv are rounded once, as the attention hook rounds them anyway. */
#include <string.h>

#include "alloc.h"
#include "cp_attention.h"
#include "ops.h"
#include "ops_mixed.h"

struct cp_ulysses {
    comm *cp;
    int P, me, B, T, Tc, C, NH, Cl, Hl;
    precision wire;
    float *send, *recv;     /* all-to-all staging: B x Tc x 3C floats each */
    void *wire_send, *wire_recv;   /* 16-bit wire: the same in 16 bits */
    float *d_out_h, *d_qkv_h, *d_att;   /* backward scratch, head-sharded */
    uint64_t work;
};

/* What a layer keeps: qkv_h [B, T, 3Cl], out_h [B, T, Cl], att [B, Hl, T, T]. */
typedef struct { float *qkv_h, *out_h, *att; } saved_parts;

static saved_parts parts_of(const cp_ulysses *u, const float *saved) {
    const size_t rows = (size_t)u->B * u->T;
    float *s = (float *)saved;
    return (saved_parts){.qkv_h = s, .out_h = s + rows * 3 * u->Cl,
                         .att = s + rows * 4 * u->Cl};
}

size_t cp_ulysses_saved_numel(const cp_ulysses *u) {
    const size_t rows = (size_t)u->B * u->T;
    return rows * 4 * u->Cl + (size_t)u->B * u->Hl * u->T * u->T;
}

cp_ulysses *cp_ulysses_create(comm *cp, int B, int T, int C, int NH, precision wire) {
    cp_ulysses *u = mem_alloc(MEM_OTHER, sizeof *u);
    u->cp = cp;
    u->P = cp ? comm_size(cp) : 1;
    u->me = cp ? comm_rank(cp) : 0;
    u->B = B, u->T = T, u->Tc = T / u->P, u->C = C, u->NH = NH;
    u->Cl = C / u->P, u->Hl = NH / u->P;
    u->wire = wire;
    const size_t staging = (size_t)B * u->Tc * 3 * C, rows = (size_t)B * T;
    u->send = mem_alloc(MEM_ACTIVATIONS, staging * sizeof(float));
    u->recv = mem_alloc(MEM_ACTIVATIONS, staging * sizeof(float));
    if (wire != PRECISION_FP32 && u->P > 1) {
        u->wire_send = mem_alloc(MEM_ACTIVATIONS, staging * precision_bytes(wire));
        u->wire_recv = mem_alloc(MEM_ACTIVATIONS, staging * precision_bytes(wire));
    }
    u->d_out_h = mem_alloc(MEM_ACTIVATIONS, rows * u->Cl * sizeof(float));
    u->d_qkv_h = mem_alloc(MEM_ACTIVATIONS, rows * 3 * u->Cl * sizeof(float));
    u->d_att = mem_alloc(MEM_ACTIVATIONS, (size_t)B * u->Hl * T * T * sizeof(float));
    return u;
}

void cp_ulysses_free(cp_ulysses *u) {
    if (!u) return;
    void *all[] = {u->send, u->recv, u->wire_send, u->wire_recv, u->d_out_h, u->d_qkv_h,
                   u->d_att};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) mem_free(all[i]);
    mem_free(u);
}

uint64_t cp_ulysses_work(const cp_ulysses *u) { return u->work; }

static void alltoall(cp_ulysses *u, size_t block) {
    const size_t n = block * u->P;
    if (u->wire_send) {
        mixed_round(u->wire, u->wire_send, u->send, n);
        comm_alltoall(u->cp, u->wire_send, u->wire_recv, block, comm_dtype_of(u->wire));
        mixed_widen(u->wire, u->recv, u->wire_recv, n);
    } else if (u->P > 1) {
        comm_alltoall(u->cp, u->send, u->recv, block, COMM_F32);
    } else {
        memcpy(u->recv, u->send, block * sizeof(float));
    }
}

/* Sequence-sharded [B, Tc, groups x C] (each group C wide: Q, K, V, or one) to
 * head-sharded [B, T, groups x Cl]: block j of send is my rows' columns of j's heads. */
static void to_heads(cp_ulysses *u, float *heads, const float *seq, int groups) {
    const int Tc = u->Tc, C = u->C, Cl = u->Cl, G = groups;
    const size_t block = (size_t)u->B * Tc * G * Cl;
    for (int j = 0; j < u->P; j++)
        for (size_t row = 0; row < (size_t)u->B * Tc; row++)
            for (int g = 0; g < G; g++)
                memcpy(u->send + j * block + (row * G + g) * Cl,
                       seq + row * G * C + (size_t)g * C + (size_t)j * Cl, Cl * sizeof(float));
    alltoall(u, block);
    for (int j = 0; j < u->P; j++)   /* block j: positions [j Tc, (j+1) Tc) */
        for (int b = 0; b < u->B; b++)
            memcpy(heads + ((size_t)b * u->T + (size_t)j * Tc) * G * Cl,
                   u->recv + j * block + (size_t)b * Tc * G * Cl,
                   (size_t)Tc * G * Cl * sizeof(float));
}

/* The way back: head-sharded [B, T, groups x Cl] to sequence-sharded [B, Tc, groups x C]. */
static void to_sequence(cp_ulysses *u, float *seq, const float *heads, int groups) {
    const int Tc = u->Tc, C = u->C, Cl = u->Cl, G = groups;
    const size_t block = (size_t)u->B * Tc * G * Cl;
    for (int j = 0; j < u->P; j++)   /* to rank j: its positions, my heads */
        for (int b = 0; b < u->B; b++)
            memcpy(u->send + j * block + (size_t)b * Tc * G * Cl,
                   heads + ((size_t)b * u->T + (size_t)j * Tc) * G * Cl,
                   (size_t)Tc * G * Cl * sizeof(float));
    alltoall(u, block);
    for (int j = 0; j < u->P; j++)   /* from rank j: my positions, j's heads */
        for (size_t row = 0; row < (size_t)u->B * Tc; row++)
            for (int g = 0; g < G; g++)
                memcpy(seq + row * G * C + (size_t)g * C + (size_t)j * Cl,
                       u->recv + j * block + (row * G + g) * Cl, Cl * sizeof(float));
}

/* Score entries of causal attention over B x Hl heads of T: the lower triangle. */
static uint64_t causal_entries(const cp_ulysses *u) {
    return (uint64_t)u->B * u->Hl * u->T * (u->T + 1) / 2;
}

void cp_ulysses_forward(cp_ulysses *u, float *out, float *saved, const float *qkv) {
    saved_parts s = parts_of(u, saved);
    to_heads(u, s.qkv_h, qkv, 3);
    attention_forward(s.out_h, s.att, s.qkv_h, u->B, u->T, u->Cl, u->Hl);
    to_sequence(u, out, s.out_h, 1);
    u->work += causal_entries(u);
}

void cp_ulysses_backward(cp_ulysses *u, float *dqkv, const float *dout, const float *saved) {
    saved_parts s = parts_of(u, saved);
    to_heads(u, u->d_out_h, dout, 1);
    attention_backward(u->d_qkv_h, u->d_att, u->d_out_h, s.qkv_h, s.att, u->B, u->T, u->Cl,
                       u->Hl);
    to_sequence(u, dqkv, u->d_qkv_h, 3);
    u->work += causal_entries(u);
}
