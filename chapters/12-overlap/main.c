/* Chapter 12: hiding communication under compute and shrinking it, on a two-tier
 * network: ./run 8 is 2 nodes of 4 ranks, NVLink inside a node, InfiniBand and then
 * Ethernet between (--link-intra, --link-inter, --ranks-per-node choose others).
 *   layer   TP's collective matmul (--tp-overlap K chunks): exposed communication per
 *           layer without and with chunks, against alpha-beta, TP across two nodes
 *   table   TP + SP with and without overlap, FSDP across two nodes and inside one,
 *           HSDP, ZeRO++'s pieces and all three: tokens/s, exposed communication and
 *           bytes per tier next to their predictions, each run against the
 *           single-device baseline; --svg FILE: time per step against the inter-node
 *           bandwidth for FSDP, HSDP and ZeRO++ with the predicted crossings */
#include <stdio.h>
#include <stdlib.h>

#include "overlap.h"
#include "report.h"
#include "tp_overlap.h"
#include "tp_train.h"

static const char *const part_names[] = {"all", "layer", "table", NULL};
enum { PART_ALL, PART_LAYER, PART_TABLE };

typedef struct {
    int part, chunks;
    const char *svg;
} chapter_flags;

static int runs(const chapter_flags *f, int part) { return f->part == PART_ALL || f->part == part; }

/* Two nodes unless the tier flags say otherwise; one tier (--link) is refused. */
static void take_network(run_config *cfg) {
    if (cli_given("link"))
        cli_fail("--link %s: chapter 12 runs on two tiers of links; give --link-intra,"
                 " --link-inter and --ranks-per-node instead", cli_given_text("link"));
    if (cfg->comm.ranks_per_node > 0) return;
    if (cfg->comm.ranks < 4 || cfg->comm.ranks % 2)
        cli_fail("./run %d: chapter 12 runs 2 nodes of 2 or more ranks (valid: an even number"
                 " from 4, or --ranks-per-node)", cfg->comm.ranks);
    cfg->comm.link = LINK_NVLINK;
    cfg->comm.ranks_per_node = cfg->comm.ranks / 2;
}

static void validate(run_config *cfg, const chapter_flags *f) {
    char err[512];
    if (launch_mpi_world_size() > 0)
        cli_fail("chapter 12 models two tiers of links on the threads backend: run it without"
                 " mpirun (./run N on a build without MPI=1)");
    const int t = cfg->comm.ranks_per_node, n = cfg->comm.ranks;
    if (t < 2 || n / t < 2)
        cli_fail("--ranks-per-node %d of %d ranks: chapter 12 needs 2 or more nodes of 2 or"
                 " more ranks (TP inside a node, a second node to cross to)", t, n);
    if (!tp_check_sizes(cfg, n, t, err, sizeof err) || !tp_sequence_check(cfg, t, err, sizeof err))
        cli_fail("%s", err);
    if (tp_overlap_check(f->chunks, cfg->model.ctx, t, err, sizeof err) ||
        tp_overlap_check(f->chunks, cfg->model.ctx, 2, err, sizeof err))   /* and part layer's */
        cli_fail("--tp-overlap %s", err);
    if (f->svg && f->part == PART_LAYER)
        cli_fail("--svg %s with --part layer: the plot is the table's (--part all or table)",
                 f->svg);
    if (f->svg) check_writable("svg", f->svg);   /* now, not after the runs */
    if (runs(f, PART_TABLE) && cfg->precision != PRECISION_FP32)
        cli_fail("--precision %s: chapter 12's table trains ZeRO++, whose int8 and int4 block"
                 " codecs take fp32 weights (valid: --precision fp32, or --part layer)",
                 precision_name(cfg->precision));
    cli_cpu_only(cfg, "chapter 12's ZeRO++ block codecs and timed layer products read");
    if (f->part == PART_LAYER) {
        static const char *const table_only[] = {"steps", "seed", "lr", "data", NULL};
        cli_refuse_in_mode("--part layer", table_only, "it trains nothing");
    }
}

/* The layer part: TP of 2 ranks stretched across two nodes, on each inter link: the
 * case a collective matmul must hide. The link slowed down (--link-scale, or chosen
 * here) so that a collective without chunks takes 20 ms: threads on a shared machine
 * time a ring step to about a millisecond. */
static int layer_part(const run_config *cfg, const chapter_flags *f, const comm_link *inter,
                      int links, int *within) {
    for (int i = 0; i < links; i++) {
        exposed_setup s = {.t = 2, .chunks = f->chunks, .B = cfg->batch, .T = cfg->model.ctx,
                           .C = cfg->model.dim, .layers = 2, .p = cfg->precision,
                           .comm = cfg->comm};
        s.comm.link_inter = inter[i];
        s.comm.ranks_per_node = 1;
        if (!cli_given("link-scale")) exposed_slow_links(&s, 0.020);
        s.model_flops = exposed_rate_for(&s, 1.5);   /* a chunk's product: 1.5x its wire */
        exposed_result r;
        const int status = exposed_measure(&s, &r);
        if (status) return status;
        if (!process_hosts_rank0()) continue;
        exposed_print(&s, &r);
        if (!exposed_within(&r, 0.2))   /* wall-clock: reported, not a verdict */
            printf("  (more than 20%% off alpha-beta: a busy machine adds time to every"
                   " wait; rerun on a quiet one)\n");
        *within &= exposed_at_least(&r, 0.2);
    }
    return 0;
}

static int table_part(const run_config *cfg, const dataset *data, const chapter_flags *f,
                      const comm_link *inter, int links, int *passed) {
    tier_table t[2];
    for (int i = 0; i < links; i++) {
        const int status = tier_table_run(cfg, data, f->chunks, inter[i], &t[i]);
        if (status) return status;
        if (!process_hosts_rank0()) continue;
        tier_table_print(cfg, &t[i]);
        run_config on = *cfg;
        on.comm.link_inter = inter[i];
        plot_print_crossings(&on, &t[i]);
        *passed &= tier_table_passed(cfg, &t[i]);
    }
    if (!f->svg || !process_hosts_rank0()) return 0;
    if (plot_write_svg(f->svg, cfg, t, links)) {
        fprintf(stderr, "chapter12: error: --svg %s: cannot write there\n", f->svg);
        return 1;
    }
    printf("\nplot written to %s\n", f->svg);
    return 0;
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    cfg.model = (gpt_config){.vocab = 256, .ctx = 64, .layers = 2, .heads = 8, .dim = 64};
    cfg.batch = 32;
    cfg.steps = 3;
    cfg.comm.link_scale = 100;   /* a tiny model's messages on links 100 times slower */
    chapter_flags f = {.chunks = 4};
    const cli_option options[] = {
        {"part", OPT_CHOICE, &f.part, "which part to run", part_names, 0},
        {"tp-overlap", OPT_INT, &f.chunks, "chunks of TP's collective matmuls (default 4)", NULL, 1},
        {"svg", OPT_STRING, &f.svg, "write time per step against inter-node bandwidth (FSDP,"
         " HSDP, ZeRO++) as SVG", NULL, 0},
        {0},
    };
    static const char *const unused[] = {"json", "trace", NULL};
    cfg.unused_flags = unused;
    cfg.unused_why = "chapter 12 prints the tables of many runs, no JSON or trace of one yet";
    cfg.no_checkpoints = "chapter 12 compares short runs, none of them to keep";
    cfg.fp32_grads_only = "chapter 12 keeps fp32 gradients";
    cli_parse(argc, argv, &cfg, options, argv[0],
              "Hiding and shrinking communication on two tiers of links: TP's collective"
              " matmul, FSDP across nodes and inside one.");
    dataset *data = dataset_from_config(&cfg);
    const comm_link given = cli_given("link-inter") ? cfg.comm.link_inter : LINK_NONE;
    take_network(&cfg);
    validate(&cfg, &f);
    const comm_link both[2] = {LINK_IB, LINK_ETHERNET}, *inter = given ? &given : both;
    const int links = given ? 1 : 2;
    cfg.comm.link_inter = inter[0];
    if (process_hosts_rank0())
        report_header(&cfg, "Chapter 12: hiding and shrinking communication", cfg.comm.ranks, 1);
    int ok = 1, status = 0;
    if (runs(&f, PART_LAYER)) status = layer_part(&cfg, &f, inter, links, &ok);
    if (!status && runs(&f, PART_TABLE)) status = table_part(&cfg, data, &f, inter, links, &ok);
    dataset_free(data);
    if (!status && process_hosts_rank0() && !ok) {
        printf("\nsome result is off its formula or its tolerance (above)\n");
        status = 1;
    }
    return status;
}
