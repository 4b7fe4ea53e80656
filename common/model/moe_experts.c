/* This rank's experts on the rows they received, expert by expert (moe.h): each an
 * MLP of the model's shape, y = fc2(gelu(fc(x))), through sgemm. */
#include "moe_internal.h"
#include "ops.h"

/* Rows of local expert j: from every source, in expert order. */
static size_t expert_rows(const moe_layer *m, const moe_block_state *b, int j) {
    size_t rows = 0;
    for (int s = 0; s < m->s.ep_size; s++) rows += b->recv_per_source[s * m->s.experts_local + j];
    return rows;
}

void moe_experts_forward(moe_layer *m, moe_block_state *b, int moe_layer, float *y_rows) {
    const int C = m->s.dim, H = m->s.hidden;
    size_t at = 0;
    for (int j = 0; j < m->s.experts_local; j++) {
        const int rows = (int)expert_rows(m, b, j);
        const moe_expert_tensors w = moe_expert_view(&m->s, (float *)m->experts, moe_layer, j);
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
        if (rows > 0) {
            linear_backward(m->d_h, g.fc2_w, g.fc2_b, dy_rows + at * C, b->h_gelu + at * H,
                            w.fc2_w, rows, H, C);
            gelu_backward(m->d_h, b->h_act + at * H, m->d_h, (size_t)rows * H);
            linear_backward(dx_rows + at * C, g.fc_w, g.fc_b, m->d_h, b->x_in + at * C, w.fc_w,
                            rows, C, H);
        }
        at += rows;
    }
}
