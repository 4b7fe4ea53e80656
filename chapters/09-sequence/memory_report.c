/* Part memory's table, --json and --svg. */
#include <stdio.h>

#include "report.h"
#include "sequence.h"

void memory_print(const memory_report *r) {
    const gpt_config *m = &r->model;
    char a[32], b[32], c[32], expression[96];
    printf("\nActivation memory per layer per rank (Korthikanti et al. 2022, Table 2, "
           "re-derived for this model)\n");
    printf("  s = %d tokens, b = %d sequences, h = %d, a = %d heads, t = %d, e = %zu B"
           " (%s); LayerNorm statistics fp32\n", m->ctx, r->B, m->dim, m->heads, r->tp,
           precision_bytes(r->precision), precision_name(r->precision));
    printf("  %-21s %12s %12s  %-32s %12s %7s\n", "configuration", "measured", "re-derived",
           "expression", "paper (2 B)", "vs none");
    for (int i = 0; i < MEMORY_SETUPS; i++) {
        activation_expression(r->setup[i], expression, sizeof expression);
        printf("  %-21s %12s %12s  %-32s %12s %6.2fx%s\n", memory_setup_names[i],
               report_bytes(r->measured[i], a), report_bytes(r->derived[i], b), expression,
               report_bytes(r->paper[i], c), r->measured[i] / r->measured[0],
               r->measured[i] == r->derived[i] ? "" : "  MISMATCH");
    }
    printf("  measured = re-derived to the byte for all six -> %s\n",
           memory_passed(r) ? "yes" : "NO");
    printf("  (the paper's s b h (34 + 5 a s / h) in 16 bits with dropout; here no dropout:"
           " 32 for its 34,\n   2 a s / h for its 5 a s / h, in 2-byte units, plus 16 s b of"
           " LayerNorm statistics)\n");
}

void memory_json(FILE *o, const memory_report *r) {
    fprintf(o, "\"memory\": {\"tp\": %d, \"batch_per_group\": %d, \"setups\": [", r->tp, r->B);
    for (int i = 0; i < MEMORY_SETUPS; i++) {
        const activation_setup *c = &r->setup[i];
        char expression[96];
        activation_expression(*c, expression, sizeof expression);
        fprintf(o, "%s\n  {\"name\": \"%s\", \"tp\": %d, \"sp\": %s, \"recompute\": \"%s\","
                " \"measured_bytes_per_layer\": %.0f, \"derived_bytes_per_layer\": %.0f,"
                " \"paper_bytes_per_layer\": %.0f, \"expression\": \"%s\"}", i ? "," : "",
                memory_setup_names[i], c->tp, c->sp ? "true" : "false",
                plan_recompute_names[c->recompute], r->measured[i], r->derived[i], r->paper[i],
                expression);
    }
    fprintf(o, "],\n \"equal\": %s}", memory_passed(r) ? "true" : "false");
}

/* One bar per configuration: measured bytes, the re-derived value as a tick. */
int memory_write_svg(const char *path, const memory_report *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    const int width = 720, bar_h = 28, left = 190, top = 40;
    const double scale = (width - left - 120) / r->measured[0];
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\""
            " font-family=\"sans-serif\" font-size=\"13\">\n", width,
            top + MEMORY_SETUPS * (bar_h + 10) + 20);
    fprintf(f, "<text x=\"10\" y=\"22\" font-size=\"15\">Activation bytes per layer per"
            " rank (t = %d): measured bars, re-derived ticks</text>\n", r->tp);
    for (int i = 0; i < MEMORY_SETUPS; i++) {
        const int y = top + i * (bar_h + 10);
        char bytes[32];
        fprintf(f, "<text x=\"10\" y=\"%d\">%s</text>\n", y + 19, memory_setup_names[i]);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#4a7ab5\"/>\n",
                left, y, r->measured[i] * scale, bar_h);
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#c03030\""
                " stroke-width=\"2\"/>\n", left + r->derived[i] * scale,
                left + r->derived[i] * scale, y - 3, y + bar_h + 3);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\">%s</text>\n", left + r->measured[i] * scale + 8,
                y + 19, report_bytes(r->measured[i], bytes));
    }
    fprintf(f, "</svg>\n");
    return fclose(f) != 0;
}
