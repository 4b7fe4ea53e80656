/* This rank's experts on the rows they received, expert by expert (moe.h): each an
 * MLP of the model's shape, y = fc2(gelu(fc(x))), through sgemm in fp32, or in 16 bits
 * through the mixed ops (16-bit products summed in fp32, each output rounded once, as
 * the model's own 16-bit MLP computes), h_act and h_gelu then holding 16-bit values. */
#include "moe_internal.h"
#include "ops.h"
#include "ops_mixed.h"

/* Rows of local expert j: from every source, in expert order. */
static size_t expert_rows(const moe_layer *m, const moe_block_state *b, int j) {
    size_t rows = 0;
    for (int s = 0; s < m->s.ep_size; s++) rows += b->recv_per_source[s * m->s.experts_local + j];
    return rows;
}

/* The 16-bit weights of an expert's tensors (fp32 pointers w into the masters). */
typedef struct { const void *fc_w, *fc_b, *fc2_w, *fc2_b; } expert_weights16;
static expert_weights16 weights16(const moe_layer *m, moe_expert_tensors w) {
    return (expert_weights16){moe_mixed_weight(m, w.fc_w), moe_mixed_weight(m, w.fc_b),
                              moe_mixed_weight(m, w.fc2_w), moe_mixed_weight(m, w.fc2_b)};
}

/* One expert's rows in 16 bits: x [rows, C] fp32 (16-bit values) -> y [rows, C] fp32. */
static void expert_forward16(moe_layer *m, moe_block_state *b, moe_expert_tensors w, size_t at,
                             int rows, float *y) {
    const precision p = m->p;
    const int C = m->s.dim, H = m->s.hidden;
    const expert_weights16 v = weights16(m, w);
    void *h_act = precision_at(p, b->h_act, at * H), *h_gelu = precision_at(p, b->h_gelu, at * H);
    mixed_round(p, m->x16, b->x_in + at * C, (size_t)rows * C);   /* exact */
    mixed_linear_forward(p, h_act, m->x16, v.fc_w, v.fc_b, rows, C, H);
    mixed_gelu_forward(p, h_gelu, h_act, (size_t)rows * H);
    mixed_linear_forward(p, m->y16, h_gelu, v.fc2_w, v.fc2_b, rows, H, C);
    mixed_widen(p, y, m->y16, (size_t)rows * C);
}

/* Its backward: dy [rows, C] fp32, rounded to 16 bits as the model's activation
 * gradients are; dx [rows, C] fp32; the weight gradients (g) fp32, accumulated. */
static void expert_backward16(moe_layer *m, moe_block_state *b, moe_expert_tensors w,
                              moe_expert_tensors g, size_t at, int rows, const float *dy,
                              float *dx) {
    const precision p = m->p;
    const int C = m->s.dim, H = m->s.hidden;
    const expert_weights16 v = weights16(m, w);
    const void *h_act = precision_at(p, b->h_act, at * H);
    const void *h_gelu = precision_at(p, b->h_gelu, at * H);
    mixed_round(p, m->y16, dy, (size_t)rows * C);
    mixed_linear_backward(p, m->h16, g.fc2_w, g.fc2_b, m->y16, h_gelu, v.fc2_w, rows, H, C);
    mixed_gelu_backward(p, m->h16, h_act, m->h16, (size_t)rows * H);
    mixed_round(p, m->x16, b->x_in + at * C, (size_t)rows * C);
    mixed_linear_backward(p, m->y16, g.fc_w, g.fc_b, m->h16, m->x16, v.fc_w, rows, C, H);
    mixed_widen(p, dx, m->y16, (size_t)rows * C);
}

void moe_experts_forward(moe_layer *m, moe_block_state *b, int moe_layer, float *y_rows) {
    const int C = m->s.dim, H = m->s.hidden;
    size_t at = 0;
    for (int j = 0; j < m->s.experts_local; j++) {
        const int rows = (int)expert_rows(m, b, j);
        const moe_expert_tensors w = moe_expert_view(&m->s, (float *)m->experts, moe_layer, j);
        if (m->p != PRECISION_FP32) {
            if (rows > 0) expert_forward16(m, b, w, at, rows, y_rows + at * C);
            at += rows;
            continue;
        }
        const float *x = b->x_in + at * C;
        float *h_act = b->h_act + at * H, *h_gelu = b->h_gelu + at * H;
        linear_forward(h_act, x, w.fc_w, w.fc_b, rows, C, H);                 /* [rows, H] */
        gelu_forward(h_gelu, h_act, (size_t)rows * H);   /* h_act: GELU's derivative now */
        linear_forward(y_rows + at * C, h_gelu, w.fc2_w, w.fc2_b, rows, H, C);  /* [rows, C] */
        at += rows;
    }
}

void moe_experts_backward(moe_layer *m, moe_block_state *b, int moe_layer,
                          const float *dy_rows, float *dx_rows) {
    const int C = m->s.dim, H = m->s.hidden;
    size_t at = 0;
    for (int j = 0; j < m->s.experts_local; j++) {
        const int rows = (int)expert_rows(m, b, j);
        const moe_expert_tensors w = moe_expert_view(&m->s, (float *)m->experts, moe_layer, j);
        const moe_expert_tensors g = moe_expert_view(&m->s, m->expert_grads, moe_layer, j);
        if (rows > 0 && m->p != PRECISION_FP32) {
            expert_backward16(m, b, w, g, at, rows, dy_rows + at * C, dx_rows + at * C);
        } else if (rows > 0) {
            linear_backward(m->d_h, g.fc2_w, g.fc2_b, dy_rows + at * C, b->h_gelu + at * H,
                            w.fc2_w, rows, H, C);
            gelu_backward(m->d_h, b->h_act + at * H, m->d_h, (size_t)rows * H);
            linear_backward(dx_rows + at * C, g.fc_w, g.fc_b, m->d_h, b->x_in + at * C, w.fc_w,
                            rows, C, H);
        }
        at += rows;
    }
}
