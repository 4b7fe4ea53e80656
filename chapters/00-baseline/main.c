/* The single-device baseline: the reference every chapter compares itself with.
 *   make baseline && ./run 1 [--steps 100] [--preset bench256] [--data FILE] [--json] */
#include <stdio.h>

#include "cli.h"
#include "fits.h"
#include "report.h"
#include "baseline.h"
#include "replica.h"

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.fp8_training = 1;   /* --precision fp8: bf16 with FP8 linears (fp8_linear.h) */
    cli_parse(argc, argv, &cfg, NULL, argv[0],
              "Trains the tiny GPT-2 on one rank: the baseline of every chapter.");
    if (cfg.comm.ranks != 1)
        cli_fail("the baseline runs on 1 rank, not %d (./run 1)", cfg.comm.ranks);
    if (cfg.comm.trace_path)
        cli_fail("--trace %s: the baseline has no ranks or communication to trace; a"
                 " chapter's --trace draws its ranks", cfg.comm.trace_path);
    fits_check_or_exit(&cfg, 0);
    dataset *data = dataset_from_config(&cfg);
    report_header(&cfg, "Single-device baseline", 1, 0);
    baseline_run *b = baseline_train(&cfg, data);
    if (cfg.json) {
        report_json(&cfg, "00-baseline", 1, "none", &b->result, 1, NULL);
    } else {
        report_table(&cfg, &b->result, 1);
        double flops = gpt_flops_per_step(&cfg.model, cfg.batch, cfg.model.ctx);
        printf("\nmodel FLOPs per step %.3g; achieved %.2f GFLOP/s\n", flops,
               flops / (run_ms_per_step(&b->result) * 1e-3) / 1e9);
    }
    baseline_free(b);
    dataset_free(data);
    return 0;
}
