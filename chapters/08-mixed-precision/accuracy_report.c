/* Part 4's table, JSON and plot. */
#include "mixed.h"

#include <math.h>

#define WINDOWS 10

static double window_mean(const float *loss, int first, int last) {
    double sum = 0;
    for (int i = first; i < last; i++) sum += loss[i];
    return sum / (last - first);
}

static int window_length(int steps) {
    return steps >= WINDOWS ? steps / WINDOWS : 1;
}

static void print_curves(const accuracy_report *r) {
    const int w = window_length(r->steps);
    printf("\n4. Accuracy: mean loss over windows of %d steps, one rank, %d steps\n", w,
           r->steps);
    printf("%-11s", "steps");
    for (int i = 0; i < ACCURACY_CASES; i++) printf(" %18s", accuracy_cases[i].label);
    printf(" %11s\n", "loss scale");
    for (int first = 0; first + w <= r->steps; first += w) {
        char range[24];
        snprintf(range, sizeof range, "%d-%d", first + 1, first + w);
        printf("%-11s", range);
        for (int i = 0; i < ACCURACY_CASES; i++)
            printf(" %18.4f", window_mean(r->loss[i], first, first + w));
        printf(" %11g\n", (double)r->loss_scale[first]);
    }
    printf("%-11s", "d params");
    for (int i = 0; i < ACCURACY_CASES; i++) printf(" %18.2e", r->max_param_diff[i]);
    printf("   (largest |p - p_fp32| after the last step)\n");
    printf("%-11s", "skipped");
    for (int i = 0; i < ACCURACY_CASES; i++) printf(" %18d", r->skipped[i]);
    printf("\n");
}

static void print_lessons(const accuracy_report *r) {
    printf("fp16's loss scale: starts at 65536, ends at %g; %d steps skipped in all, %d after"
           " the warm-up.\n", r->final_scale, r->skipped[2], r->skipped_after_warmup);
    printf("\nUnderflow: one step of %d tokens (each token's gradient weighs 1/%d)\n",
           r->probe_tokens, r->probe_tokens);
    printf("%-20s %16s\n", "run", "||g - g32||/||g32||");
    for (int i = 1; i < ACCURACY_CASES; i++)
        printf("%-20s %16.2e\n", accuracy_cases[i].label, r->grad_error[i]);
    printf("fp32 weight gradients fp16 would flush to 0: %.3f%% unscaled, %.3f%% at scale 65536;"
           "\nfp16 without a scale lost %.3f%% of fp32's non-zero gradient elements to 0, and"
           " its error is %.1fx\nthe scaled run's: backward's values (d loss / d activation,"
           " ~1/tokens) fall below fp16's\nsmallest normal, 6.1e-5.\n",
           100 * r->flush_unscaled, 100 * r->flush_scaled, 100 * r->lost_to_zero,
           r->grad_error[3] / r->grad_error[2]);
    printf("bf16 needs no scale: it keeps fp32's 8 exponent bits (down to 1e-38), and no"
           " step skipped.\nWhere it loses is the mantissa, 8 bits: %d x %g summed in a bf16"
           " accumulator gives %g,\nin fp32 %.4f, and the bf16-rounded terms summed in fp32"
           " %.4f (each term rounds to %.6f):\nat 4 the next term is below half of bf16's"
           " spacing (2^-5) and is lost. So every sum here\n(matmul products, LayerNorm,"
           " softmax, the loss, gradient accumulation) runs in fp32.\n", r->sum_terms,
           r->sum_term, r->sum_bf16, r->sum_fp32, r->sum_bf16_inputs_fp32,
           r->sum_bf16_inputs_fp32 / r->sum_terms);
}

void accuracy_print(const accuracy_report *r) {
    print_curves(r);
    print_lessons(r);
}

static void json_floats(FILE *o, const float *v, int n) {
    fputc('[', o);
    for (int i = 0; i < n; i++) fprintf(o, "%s%.6g", i ? ", " : "", (double)v[i]);
    fputc(']', o);
}

void accuracy_json(FILE *o, const accuracy_report *r) {
    fprintf(o, "\"curves\": [");
    for (int i = 0; i < ACCURACY_CASES; i++) {
        fprintf(o, "%s\n  {\"run\": \"%s\", \"skipped_steps\": %d, \"max_param_diff\": %.6e,"
                   " \"loss\": ", i ? "," : "", accuracy_cases[i].label, r->skipped[i],
                r->max_param_diff[i]);
        json_floats(o, r->loss[i], r->steps);
        fputc('}', o);
    }
    fprintf(o, "],\n \"loss_scale_per_step\": ");
    json_floats(o, r->loss_scale, r->steps);
    fprintf(o, ", \"final_loss_scale\": %g, \"skipped_after_warmup\": %d,\n"
               " \"underflow\": {\"tokens\": %d, \"flush_share_unscaled\": %.6e,"
               " \"flush_share_scaled\": %.6e, \"lost_to_zero\": %.6e,"
               " \"grad_error\": {\"bf16\": %.6e, \"fp16_scaled\": %.6e,"
               " \"fp16_unscaled\": %.6e}},\n \"bf16_sum\": {\"terms\": %d, \"term\": %g,"
               " \"bf16\": %.6g, \"fp32\": %.6g, \"bf16_inputs_fp32\": %.6g}",
            r->final_scale, r->skipped_after_warmup, r->probe_tokens, r->flush_unscaled,
            r->flush_scaled, r->lost_to_zero, r->grad_error[1], r->grad_error[2],
            r->grad_error[3], r->sum_terms, r->sum_term, r->sum_bf16, r->sum_fp32,
            r->sum_bf16_inputs_fp32);
}

/* ---- --svg: the four loss curves ------------------------------------------------------ */
enum { WIDTH = 720, HEIGHT = 440, LEFT = 60, RIGHT = 170, TOP = 40, BOTTOM = 50 };
static const char *const colours[ACCURACY_CASES] = {"#000000", "#1f77b4", "#2ca02c",
                                                    "#d62728"};

static void loss_range(const accuracy_report *r, double *lo, double *hi) {
    *lo = 1e30;
    *hi = -1e30;
    for (int i = 0; i < ACCURACY_CASES; i++)
        for (int s = 0; s < r->steps; s++)
            if (isfinite(r->loss[i][s])) {
                *lo = fmin(*lo, r->loss[i][s]);
                *hi = fmax(*hi, r->loss[i][s]);
            }
    *lo = floor(*lo);
    *hi = ceil(*hi);
    if (*hi <= *lo) *hi = *lo + 1;
}

int accuracy_write_svg(const char *path, const accuracy_report *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return -1;
    }
    double lo, hi;
    loss_range(r, &lo, &hi);
    const double xs = (double)(WIDTH - LEFT - RIGHT) / (r->steps > 1 ? r->steps - 1 : 1);
    const double ys = (HEIGHT - TOP - BOTTOM) / (hi - lo);
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d'"
               " font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n"
               "<text x='%d' y='24' font-size='14'>Training loss per step, %d steps</text>\n"
               "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n"
               "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n",
            WIDTH, HEIGHT, LEFT, r->steps, LEFT, HEIGHT - BOTTOM, WIDTH - RIGHT,
            HEIGHT - BOTTOM, LEFT, TOP, LEFT, HEIGHT - BOTTOM);
    for (double v = lo; v <= hi + 1e-9; v += 1)
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end' font-size='11'>%.0f</text>\n",
                LEFT - 6, HEIGHT - BOTTOM - (v - lo) * ys + 4, v);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle' font-size='12'>step</text>\n",
            (LEFT + WIDTH - RIGHT) / 2, HEIGHT - 16);
    for (int i = 0; i < ACCURACY_CASES; i++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.5' points='", colours[i]);
        for (int s = 0; s < r->steps; s++)
            if (isfinite(r->loss[i][s]))
                fprintf(f, "%.1f,%.1f ", LEFT + s * xs,
                        HEIGHT - BOTTOM - (r->loss[i][s] - lo) * ys);
        fprintf(f, "'/>\n<text x='%d' y='%d' font-size='13' fill='%s'>%s</text>\n",
                WIDTH - RIGHT + 12, TOP + 20 + 20 * i, colours[i], accuracy_cases[i].label);
    }
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
