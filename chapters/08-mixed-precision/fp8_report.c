/* Part 6's tables and JSON: (a) the grids, drawn, (b) the product's error per recipe,
 * (e) the bytes. */
#include "mixed.h"

#include <math.h>

#include "fp8.h"
#include "fp8_scaling.h"
#include "report.h"

enum { LOW = -16, HIGH = 15 };   /* binades drawn: [2^-16, 2^16) */

/* Positive finite values of f in each binade [2^k, 2^(k+1)); subnormals apart. */
static void per_binade(fp8_format f, int normal[HIGH - LOW + 1], int subnormal[HIGH - LOW + 1]) {
    for (int k = 0; k <= HIGH - LOW; k++) normal[k] = subnormal[k] = 0;
    const fp8_format_info *in = fp8_info(f);
    for (int c = 1; c < 128; c++) {
        const float v = fp8_decode(f, (uint8_t)c);
        if (!isfinite(v)) continue;
        const int k = (int)floor(log2(v)) - LOW;
        if (v < in->min_normal) subnormal[k]++;
        else normal[k]++;
    }
}

static void bars(char *out, int normal, int subnormal) {
    int n = 0;
    for (int i = 0; i < normal; i++) out[n++] = '|';
    for (int i = 0; i < subnormal; i++) out[n++] = '.';
    out[n] = 0;
}

static void print_grids(void) {
    printf("\na. The grids: values a binade, | normal, . subnormal\n");
    printf("%-6s %-6s %9s %15s %18s %8s %8s %7s\n", "format", "layout", "max", "smallest normal",
           "smallest subnormal", "a binade", "spacing", "finite");
    for (int f = 0; f < FP8_FORMATS; f++) {
        const fp8_format_info *in = fp8_info((fp8_format)f);
        printf("%-6s 1.%d.%d  %9g %8s2^%-4d %11s2^%-4d %8d %7.1f%% %7d\n", in->name,
               in->exponent_bits, in->mantissa_bits, in->max, "", 1 - in->bias, "",
               1 - in->bias - in->mantissa_bits, 1 << in->mantissa_bits,
               100.0 * ldexp(1, -in->mantissa_bits), in->finite_codes);
    }
    printf("%-6s 1.8.7  %9.2g %8s2^%-4d %11s2^%-4d %8d %7.2f%%\n", "bf16", 3.39e38, "", -126, "",
           -133, 128, 100.0 * ldexp(1, -7));
    int n4[HIGH - LOW + 1], s4[HIGH - LOW + 1], n5[HIGH - LOW + 1], s5[HIGH - LOW + 1];
    per_binade(FP8_E4M3, n4, s4);
    per_binade(FP8_E5M2, n5, s5);
    printf("%-14s %-10s %-10s\n", "binade", "e4m3", "e5m2");
    for (int k = HIGH; k >= LOW; k--) {
        char a[16], b[16], range[24];
        bars(a, n4[k - LOW], s4[k - LOW]);
        bars(b, n5[k - LOW], s5[k - LOW]);
        snprintf(range, sizeof range, "[2^%d, 2^%d)", k, k + 1);
        printf("%-14s %-10s %-10s%s\n", range, a, b,
               k == 8 ? "  e4m3's max 448 = 1.75 x 2^8"
               : k == 15 ? "  e5m2's max 57344 = 1.75 x 2^15" : "");
    }
    printf("E4M3 spends its bits on precision (8 values a binade, 18 binades), E5M2 on range (4 a"
           " binade, 32\nbinades): forward tensors in E4M3, gradients in E5M2 in the 'hybrid'"
           " recipe. A scale moves a\ntensor onto the grid; what it cannot do is widen it: a"
           " tensor whose values span more than\nthe grid's binades loses its smallest ones.\n");
}

static void print_errors(const fp8_report *r) {
    printf("\nb. One product in FP8 against fp32: ||y - y_fp32|| / ||y_fp32||, y = x w^T of fc2 in block"
           " %d\n   (x: GELU's output [%d, %d] after %d fp32 steps, amax %.2f, rms %.3f; w [%d, %d])\n",
           r->layer, r->M, r->K, FP8_TRAIN_STEPS, r->amax, r->rms, r->N, r->K);
    printf("%-22s", "recipe");
    for (int c = 0; c < FP8_ERROR_CASES; c++) {
        char head[32];
        const double f = fp8_outlier_factors[c];
        if (c == 0) snprintf(head, sizeof head, "real");
        else if (f < 1000) snprintf(head, sizeof head, "outliers x%g", f);
        else snprintf(head, sizeof head, "outliers x1e%.0f", log10(f));
        printf(" %14s", head);
    }
    printf("\n");
    for (int row = 0; row < FP8_ERROR_ROWS; row++) {
        printf("%-22s", fp8_error_rows[row].label);
        for (int c = 0; c < FP8_ERROR_CASES; c++) printf(" %14.4f", r->error[row][c]);
        printf("\n");
    }
    printf("(outliers: 4 of the %d channels, all in the first 1 x 128 tile, multiplied by the"
           " factor and w's\n columns divided by it: the same product, so only the scaling sees"
           " them; delayed: scaled from the\n largest amax of the %d batches before; the"
           " products are emulated: codes rounded with their scales,\n multiplied in fp32,"
           " blockwise rescaled every 128 of the inner dimension)\n", r->K, FP8_HISTORY);
    printf("Per-tensor scaling gives the outliers log2(factor) of E4M3's 18 binades: at 100x"
           " (6.6 binades)\nthe other channels keep their 3 mantissa bits and the error hardly"
           " moves; from 1e4x they sink\ninto the subnormals and per-tensor scaling loses them"
           " (row-wise less: a row's scale follows its\ntoken's outliers), while 1 x 128 tiles"
           " lose only the outliers' tile. E5M2's 32 binades hold\nthem all, at twice the"
           " error: 2 mantissa bits.\n");
}

static void print_spike(const fp8_report *r) {
    printf("\nd. Delayed scaling when the amax jumps: the same product over %d batches, the"
           " activations x%d at\n   batch %d; E4M3, history %d batches, relative error against"
           " fp32\n", FP8_SPIKE_STEPS, FP8_SPIKE_FACTOR, FP8_SPIKE_AT + 1, FP8_HISTORY);
    printf("%-6s %8s %10s %18s %18s\n", "batch", "amax", "current", "delayed, margin 0",
           "delayed, margin 4");
    for (int s = 0; s < FP8_SPIKE_STEPS; s++) {
        const int near = s <= FP8_SPIKE_AT + 2 || (s >= FP8_SPIKE_AT + FP8_HISTORY - 1 &&
                                                   s <= FP8_SPIKE_AT + FP8_HISTORY + 1);
        if (!near) {
            if (s == FP8_SPIKE_AT + 3) printf("...\n");
            continue;
        }
        printf("%-6d %8.2f %10.4f %18.4f %18.4f%s\n", s + 1, r->spike_amax[s],
               r->spike_error[0][s], r->spike_error[1][s], r->spike_error[2][s],
               s == FP8_SPIKE_AT ? "  <- the jump" : "");
    }
    printf("Delayed scaling sets this batch's scale from the amax of the %d before: the jump"
           " saturates\n(its values above the old amax come out at it) and the product is"
           " wrong for that batch;\nthen the jump's amax sits in the history for %d batches"
           " and every tensor is scaled %dx too\nsmall, harmless in E4M3's range. Current"
           " scaling sees the jump; a margin of 4 (scales 16x\nsmaller) absorbs it, and"
           " costs nothing measurable in the other batches here.\n", FP8_HISTORY, FP8_HISTORY, FP8_SPIKE_FACTOR);
}

static const char *const bytes_labels[FP8_BYTES_ROWS] = {"fp32", "bf16", "fp8 tensorwise",
                                                         "fp8 rowwise", "fp8 blockwise"};

static void print_bytes(const fp8_report *r) {
    printf("\ne. Bytes per parameter (P = %.0f: %.0f in the linears' weights, FP8; %.0f in the\n"
           "   embedding, LayerNorms and biases, bf16) and ZeRO-3's bytes per rank per step on %d"
           " ranks\n",
           r->P, r->linear, r->other, r->ranks);
    printf("%-15s %8s %8s %6s %9s %6s | %13s %6s %14s\n", "precision", "scales", "weights", "grads",
           "optimizer", "total", "all-gather", "x fp32", "reduce-scatter");
    for (int i = 0; i < FP8_BYTES_ROWS; i++) {
        const double w = r->weight_bytes[i] / r->P, opt = i == 0 ? 8 : 12;
        char g[32], rs[32], x[16] = "     -";   /* one rank gathers nothing: no ratio */
        if (r->gather_bytes[0] > 0)
            snprintf(x, sizeof x, "%5.3fx", r->gather_bytes[i] / r->gather_bytes[0]);
        printf("%-15s %8.0f %8.3f %6d %9.0f %6.2f | %13s %6s %14s\n", bytes_labels[i],
               r->scales[i], w, 4, opt, w + 4 + opt, report_bytes(r->gather_bytes[i], g), x,
               report_bytes(r->reduce_bytes, rs));
    }
    printf("(weights: the compute copy forward and backward read, FP8 codes + 4-byte scales for the"
           " linears;\n grads fp32 as Megatron keeps them; optimizer: fp32 masters (mixed"
           " precision) and AdamW's m, v;\n all-gather: ZeRO-3 gathers every block twice a step;"
           " in FP8 forward's as E4M3 codes with the whole weights'\n scales (their amaxes and the"
           " blocks' bf16 LayerNorms and biases all-reduced, counted), backward's in bf16,\n as"
           " its products are; chapter 2 --precision fp8 --stage 3 measures these bytes)\n");
    printf("FP8 halves the weights' copy and forward's all-gather (about 1 byte of 2 for the"
           " linears), not\nthe model state: the fp32 masters, gradients and AdamW stay. Scales"
           " cost little: one a tensor, a\nrow, or a 128 x 128 block.\n");
}

void fp8_print(const fp8_report *r) {
    printf("\n6. FP8, numerically: no CPU here has FP8 units, so this part is about accuracy"
           " and bytes,\n   never speed (the products are emulated exactly, in fp32)\n");
    print_grids();
    print_errors(r);
    fp8_curves_print(r);
    fp8_gradient_errors_print(r);
    print_spike(r);
    print_bytes(r);
}

void fp8_json(FILE *o, const fp8_report *r) {
    fprintf(o, "\"fp8\": {\"product\": {\"layer\": %d, \"M\": %d, \"N\": %d, \"K\": %d,"
               " \"amax\": %.6g, \"rms\": %.6g, \"errors\": [", r->layer, r->M, r->N, r->K,
            r->amax, r->rms);
    for (int row = 0; row < FP8_ERROR_ROWS; row++)
        for (int c = 0; c < FP8_ERROR_CASES; c++)
            fprintf(o, "%s\n  {\"recipe\": \"%s\", \"outlier_factor\": %g, \"relative_error\": %.6e}",
                    row || c ? "," : "", fp8_error_rows[row].label, fp8_outlier_factors[c],
                    r->error[row][c]);
    fprintf(o, "]},\n ");
    fp8_curves_json(o, r);
    fprintf(o, ",\n ");
    fp8_gradient_errors_json(o, r);
    fprintf(o, ",\n \"spike\": {\"factor\": %d, \"at_batch\": %d, \"history\": %d,"
               " \"margin\": %d, \"steps\": [", FP8_SPIKE_FACTOR, FP8_SPIKE_AT + 1,
            FP8_HISTORY, FP8_SPIKE_MARGIN);
    for (int s = 0; s < FP8_SPIKE_STEPS; s++)
        fprintf(o, "%s\n  {\"amax\": %.6g, \"current\": %.6e, \"delayed\": %.6e,"
                   " \"delayed_margin\": %.6e}", s ? "," : "", r->spike_amax[s],
                r->spike_error[0][s], r->spike_error[1][s], r->spike_error[2][s]);
    fprintf(o, "]},\n \"bytes\": {\"num_params\": %.0f, \"linear_params\": %.0f, \"ranks\": %d,"
               " \"reduce_scatter_bytes\": %.0f, \"rows\": [", r->P, r->linear, r->ranks,
            r->reduce_bytes);
    for (int i = 0; i < FP8_BYTES_ROWS; i++)
        fprintf(o, "%s\n  {\"weights\": \"%s\", \"scales\": %.0f, \"weight_bytes\": %.0f,"
                   " \"allgather_bytes\": %.0f}", i ? "," : "", bytes_labels[i], r->scales[i],
                r->weight_bytes[i], r->gather_bytes[i]);
    fprintf(o, "]}}");
}
