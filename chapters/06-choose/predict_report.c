/* --predict-chapters' table and JSON: every figure predicted next to the measured one. */
#include "predict_report.h"

#include <stdio.h>
#include <stdlib.h>

/* What the chapters keep per parameter and per activation in their precision. */
static const char *states_of(precision dtype) {
    return dtype == PRECISION_FP32
               ? "fp32 Adam (4 + 4 + 8 bytes per parameter, 4-byte activations)"
               : "mixed precision (16-bit weights 2 + fp32 gradients 4 + fp32 master, m, v 12"
                 " bytes per parameter, 2-byte activations)";
}

void predict_print_table(const predict_comparison *rows, int n, double gflops_2, double gflops_4,
                         int cores, precision dtype) {
    printf("Predicted against measured: bench256 (layers 4, heads 4, dim 256, ctx 64, batch 8)"
           " in %s,\n%s\nsgemm measured on this machine, one thread: %.1f GFLOP/s at 256"
           " tokens, %.1f at 128; %d cores\n\n", precision_name(dtype), states_of(dtype),
           gflops_2, gflops_4, cores);
    printf("%-6s %5s  %-24s %-24s %-24s %-29s %s\n", "", "ranks", "params pred = measured",
           "grads pred = measured", "optimizer pred = measured", "activations pred / measured",
           "ms/step pred / measured");
    for (int i = 0; i < n; i++) {
        const predict_comparison *c = &rows[i];
        const chapter_figures *p = &c->predicted, *m = &c->measured;
        printf("%-6s %5d  %10.0f %s %-10.0f %10.0f %s %-10.0f %10.0f %s %-10.0f"
               " %10.0f %10.0f %+5.1f%%  %7.1f %7.1f (x%.2f)\n", c->strategy->strategy,
               c->ranks, p->params, p->params == m->params ? "=" : "!", m->params, p->grads,
               p->grads == m->grads ? "=" : "!", m->grads, p->optimizer,
               p->optimizer == m->optimizer ? "=" : "!", m->optimizer, p->activations,
               m->activations, 100 * (p->activations / m->activations - 1), p->ms_per_step,
               m->ms_per_step, m->ms_per_step / p->ms_per_step);
    }
    printf("\nbytes: the largest rank, from the accounting allocator; model states must match"
           " exactly ('=' does), activations within 10%%.\nms/step: time is only reported."
           " Predicted = FLOPs / sgemm rate (+ the link model): it leaves out everything that"
           " is not a\nGEMM (LayerNorm, softmax, GELU, Adam, copies) and other programs on the"
           " same cores: a floor, so measured runs slower.\n");
    double load[1];
    if (getloadavg(load, 1) == 1)
        printf("load average of the last minute: %.1f on %d cores (these runs add up to 4"
               " of it; the rest is other programs)\n", load[0], cores);
}

void predict_print_json(const predict_comparison *rows, int n, precision dtype) {
    printf("{\"chapter\": \"06-choose\", \"precision\": \"%s\", \"predict_chapters\": [\n",
           precision_name(dtype));
    for (int i = 0; i < n; i++) {
        const predict_comparison *c = &rows[i];
        const chapter_figures *f[2] = {&c->predicted, &c->measured};
        printf("  {\"chapter\": %d, \"strategy\": \"%s\", \"ranks\": %d", c->strategy->chapter,
               c->strategy->strategy, c->ranks);
        for (int k = 0; k < 2; k++)
            printf(", \"%s\": {\"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f,"
                   " \"activations\": %.0f, \"ms_per_step\": %.4g}", k ? "measured" : "predicted",
                   f[k]->params, f[k]->grads, f[k]->optimizer, f[k]->activations,
                   f[k]->ms_per_step);
        printf("}%s\n", i == n - 1 ? "" : ",");
    }
    printf(" ]");
}
