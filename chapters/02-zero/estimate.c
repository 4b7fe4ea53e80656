#include "estimate.h"

#include <stdio.h>

/* ---- --estimate ------------------------------------------------------------------- */

static const char *const stage_names[ZERO_STAGES] = {
    "0 (DDP)", "1 (+optimizer)", "2 (+gradients)", "3 (+params) FSDP"};
static const char *const paper_formulas[ZERO_STAGES] = {
    "2P + 2P + KP", "2P + 2P + KP/N", "2P + (2+K)P/N", "(2+2+K)P/N"};
static const char *const stored_formulas[ZERO_STAGES] = {
    "4P + 4P + 8P", "4P + 4P + 8P/N", "4P + (4+8)P/N", "(4+4+8)P/N"};

static void print_stage_table(const char *title, double P, int N, double gpu_gb,
                              int stored) {
    const double K = 12.0, GB = 1e9;
    char largest_header[32];
    snprintf(largest_header, sizeof largest_header, "largest on %.4g GB", gpu_gb);
    printf("%s\n", title);
    printf("  %-17s %-15s %9s %9s %10s %10s %8s %5s %17s\n", "stage", "formula", "params",
           "grads", "optimizer", "total", "saving", "fits", largest_header);
    double base = 0;
    for (int stage = 0; stage < ZERO_STAGES; stage++) {
        state_bytes b = stored ? zero_stored_bytes(stage, P, N, PRECISION_FP32) : zero_paper_bytes(stage, P, N, K);
        double total = state_total(b);
        if (stage == 0) base = total;
        double largest = stored ? gpu_gb * GB / state_total(zero_stored_bytes(stage, 1, N, PRECISION_FP32))
                                : zero_largest_model(stage, gpu_gb * GB, N, K);
        printf("  %-17s %-15s %6.2f GB %6.2f GB %7.2f GB %7.2f GB %7.1fx %5s %9.3g billion\n",
               stage_names[stage], stored ? stored_formulas[stage] : paper_formulas[stage],
               b.params / GB, b.grads / GB, b.optimizer / GB, total / GB, base / total,
               total <= gpu_gb * GB ? "yes" : "no", largest / 1e9);
    }
}

void estimate_print(double P, int N, double gpu_gb) {
    printf("Model state per device for P = %.4g parameters on N = %d devices"
           " (activations not included)\n\n", P, N);
    print_stage_table("ZeRO paper: fp16 parameters and gradients, K = 12 bytes per"
                      " parameter of fp32 optimizer state (master weights, Adam m, v)",
                      P, N, gpu_gb, 0);
    printf("  as N grows the savings tend to 16/4 = 4x, 16/2 = 8x and N x: the course's"
           " 4x / 8x / Nx\n\n");
    print_stage_table("As this program stores it: fp32 parameters, gradients, Adam m and v"
                      " (16 bytes per parameter)", P, N, gpu_gb, 1);
    printf("  as N grows: 16/8 = 2x, 16/4 = 4x and N x\n");
    printf("  fits: the model state fits in %.4g GB per device (--gpu-mem); largest: the P"
           " whose model state fills it\n\n", gpu_gb);

    /* fp16 traffic, as the paper counts it: 2P elements per step, 3P for stage 3 */
    const double ring = N > 1 ? (double)(N - 1) / N : 0.0;
    const double ddp_bytes = 2 * P * 2 * ring, fsdp_bytes = 3 * P * 2 * ring;
    printf("Communication per device per step (fp16, ring): stages 0-2 move 2P x (N-1)/N ="
           " %.3g GB, stage 3 moves 3P x (N-1)/N = %.3g GB (1.5x)\n", ddp_bytes / 1e9,
           fsdp_bytes / 1e9);
    printf("  %-24s %14s %14s\n", "link", "stages 0-2", "stage 3");
    for (comm_link k = LINK_NVLINK; k <= LINK_ETHERNET; k++) {   /* the communicator's figures */
        const comm_link_figures link = comm_link_spec(k);
        printf("  %-24s %12.3g s %12.3g s\n", link.title, ddp_bytes / link.bandwidth,
               fsdp_bytes / link.bandwidth);
    }
    printf("  (compare with the compute of one step: 6 P FLOPs per token; e.g. 16k tokens per"
           " device at 400 TFLOP/s take %.3g s)\n", 6 * P * 16384 / 400e12);
}
