/* Chapter 10: mixture of experts and expert parallelism.
 *   1. ep: the MoE model on one device (the baseline), with its experts over every rank
 *      and on an EP x DP mesh, against one device; the all-to-all bytes per rank next to
 *      the routing's and the uniform formula
 *   2. routing: pairs per expert (a histogram), their imbalance over training without and
 *      with the auxiliary loss, and the pairs dropped at capacity factors 1.0, 1.25, 2.0
 *   3. cost: parameters and FLOPs a token of the MoE model against dense models
 *
 *   make chapter10 && ./run 4 [--part all|ep|routing|cost] [--experts 4] [--top-k 2]
 *                             [--moe-every 1] [--capacity-factor 1.25] [--aux-loss 0.01]
 *                             [--curve-steps 100] [--svg imbalance.svg] [--json]
 *                             [--trace FILE] */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "ddp.h"
#include "fits.h"
#include "moe_chapter.h"
#include "report.h"

static const char *const part_names[] = {"all", "ep", "routing", "cost", NULL};
enum { PART_ALL, PART_EP, PART_ROUTING, PART_COST };

static const char *const unused_flags[] = {"profile", NULL};

typedef struct {
    int part, curve_steps;
    const char *svg;
    moe_config moe;
} chapter_flags;

typedef struct {
    ep_report ep;
    routing_report routing;
    cost_report cost;
} chapter_results;

static int runs(const chapter_flags *f, int part) {
    return f->part == PART_ALL || f->part == part;
}

/* Each flag that only some parts read is refused where none of them runs. */
static void refuse_unread_flags(const chapter_flags *f, const run_config *cfg) {
    char mode[32];
    snprintf(mode, sizeof mode, "--part %s", part_names[f->part]);
    if (!runs(f, PART_ROUTING)) {
        static const char *const routing_only[] = {"curve-steps", "svg", NULL};
        cli_refuse_in_mode(mode, routing_only, "only part routing reads it");
    }
    if (!runs(f, PART_EP)) {
        static const char *const capacity[] = {"capacity-factor", NULL}, *const trace[] = {
            "trace", NULL};
        cli_refuse_in_mode(mode, capacity, "only part ep reads it: part routing runs"
                           " capacity factors 1.0, 1.25 and 2.0 itself");
        cli_refuse_in_mode(mode, trace, "the trace is of part ep's first expert-parallel run");
    }
    if (f->part == PART_COST) {
        static const char *const training[] = {"aux-loss", "steps", NULL};
        cli_refuse_in_mode(mode, training, "part cost trains nothing");
    }
    if (runs(f, PART_EP) && cfg->comm.trace_path && cfg->comm.ranks < 2)
        cli_fail("--trace %s with 1 rank: the trace is of the first expert-parallel run,"
                 " and one rank has none (try ./run 2 or more)", cfg->comm.trace_path);
}

/* Memory: the experts are most of an MoE model's parameters, so they count too. The
 * one-device runs hold the dense model (counted with its MoE blocks' MLPs, which it does
 * not hold: a bound), the routers and every expert; a rank of an EP run holds 1/EP of
 * the experts, at least 1/ranks of them. */
static void check_fits(const run_config *cfg, const moe_config *moe) {
    const gpt_shape dense = gpt_shape_make(&cfg->model, 1, 0);
    const moe_shape s = moe_shape_make(moe, &cfg->model, 1, 0);
    const double shared = (double)gpt_num_params(&dense) + (double)moe_router_numel(&s);
    const double experts = (double)moe_expert_numel(&s) * s.moe_layers * moe->experts;
    fits_check_params_or_exit(cfg, shared + experts, shared + experts / cfg->comm.ranks);
}

static void validate(run_config *cfg, const chapter_flags *f) {
    char err[256];
    const char *refused = moe_chapter_device(cfg, cli_given_text("device"));
    if (refused) cli_fail("%s", refused);
    if (!moe_config_check(&f->moe, cfg->model.layers, 1, err, sizeof err)) cli_fail("%s", err);
    refuse_unread_flags(f, cfg);
    cli_check_at_most("experts", f->moe.experts, 1024, "1024 experts");
    cli_check_at_most("curve-steps", f->curve_steps, 100000, "100000 steps");
    if (f->svg) check_writable("svg", f->svg);   /* now, not after the runs */
    if (runs(f, PART_EP)) cli_check_batch(cfg->batch, cfg->comm.ranks, 1);
    check_fits(cfg, &f->moe);
}

/* Collective runs first (every process of an mpirun takes part), then the one-device
 * runs on world rank 0's process alone. Non-zero when a run failed: its rank said why,
 * and there is no table to print. */
static int run_parts(const run_config *cfg, const dataset *data, const chapter_flags *f,
                     chapter_results *r) {
    int status = 0;
    if (runs(f, PART_EP)) status = ep_launches(cfg, data, &f->moe, &r->ep);
    if (status || !process_hosts_rank0()) return status;
    if (runs(f, PART_ROUTING)) routing_local(cfg, data, &f->moe, f->curve_steps, &r->routing);
    if (runs(f, PART_ROUTING) && f->svg && routing_write_svg(f->svg, &r->routing)) status = 1;
    const int ep = r->ep.count > 1 ? r->ep.mesh[1].ep : cfg->comm.ranks;
    if (runs(f, PART_COST)) cost_local(cfg, &f->moe, f->moe.experts % ep ? 1 : ep, &r->cost);
    return status;
}

/* After the tables: an EP run that is not the one-device run, or bytes its routing
 * does not explain, is one line on stderr and exit status 1 (the table shows which). */
static int ep_disagreement(const chapter_flags *f, const ep_report *r) {
    if (!runs(f, PART_EP) || ep_report_agrees(r)) return 0;
    fprintf(stderr, "%s: part ep: an expert-parallel run differs from one device by %.2g of"
            " its tolerance, or its all-to-all bytes from its routing's (see the table)\n",
            cli_program_name(), r->worst_fraction);
    return 1;
}

static void print_tables(const chapter_flags *f, const chapter_results *r) {
    if (runs(f, PART_EP)) ep_print(&r->ep, &f->moe);
    if (runs(f, PART_ROUTING)) routing_print(&r->routing);
    if (runs(f, PART_ROUTING) && f->svg) printf("  imbalance curves written to %s\n", f->svg);
    if (runs(f, PART_COST)) cost_print(&r->cost, &f->moe);
}

static void print_json(const run_config *cfg, const chapter_flags *f, const chapter_results *r) {
    char *extra = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&extra, &len);
    if (!o) abort();
    fprintf(o, "\"part\": \"%s\", \"moe\": {\"experts\": %d, \"top_k\": %d, \"every\": %d,"
            " \"capacity_factor\": %g, \"aux_loss\": %g}", part_names[f->part], f->moe.experts,
            f->moe.top_k, f->moe.every, f->moe.capacity_factor, f->moe.aux_coef);
    if (runs(f, PART_EP)) { fputs(",\n ", o); ep_json(o, &r->ep); }
    if (runs(f, PART_ROUTING)) { fputs(",\n ", o); routing_json(o, &r->routing); }
    if (runs(f, PART_COST)) { fputs(",\n ", o); cost_json(o, &r->cost); }
    fclose(o);
    report_json(cfg, "10-moe", cfg->comm.ranks, launch_mpi_world_size() > 0 ? "mpi" : "threads",
                runs(f, PART_EP) ? r->ep.result : NULL, runs(f, PART_EP) ? r->ep.count : 0,
                extra);
    free(extra);
}

int main(int argc, char **argv) {
    run_config cfg = run_config_default();
    moe_chapter_defaults(&cfg);
    chapter_flags f = {.curve_steps = 100,
                       .moe = {.experts = 4, .top_k = 2, .every = 1, .capacity_factor = 1.25,
                               .aux_coef = 0.01f}};
    double capacity_factor = 1.25, aux_loss = 0.01;   /* OPT_FLOAT writes a double */
    const cli_option options[] = {
        {"part", OPT_CHOICE, &f.part, "which part to run", part_names, 0},
        {"experts", OPT_INT, &f.moe.experts, "experts in every MoE block", NULL, 1},
        {"top-k", OPT_INT, &f.moe.top_k, "experts a token goes to: 1 or 2", NULL, 1},
        {"moe-every", OPT_INT, &f.moe.every, "MoE in every block (1) or every other (2)",
         NULL, 1},
        {"capacity-factor", OPT_FLOAT, &capacity_factor,
         "ep: an expert takes ceil(factor x tokens x k / E) pairs (0: no dropping)", NULL, 0},
        {"aux-loss", OPT_FLOAT, &aux_loss,
         "the load-balancing loss's coefficient (Switch: 0.01)", NULL, 0},
        {"curve-steps", OPT_INT, &f.curve_steps,
         "routing: steps of the imbalance curves", NULL, 2},
        {"svg", OPT_STRING, &f.svg, "routing: write the imbalance curves as SVG", NULL, 0},
        {0},
    };
    cfg.no_checkpoints = "chapter 10 trains short runs to compare, none of them to keep"
                         " (save and resume in chapters 1-5)";
    cfg.unused_flags = unused_flags;
    cfg.unused_why = "chapter 10 compares many runs; profile one in chapters 1-5";
    cli_parse(argc, argv, &cfg, options, argv[0],
              "Mixture of experts: expert parallelism against one device, the all-to-all's"
              " bytes, tokens per expert, dropping, the auxiliary loss, active parameters.");
    f.moe.capacity_factor = capacity_factor;
    f.moe.aux_coef = (float)aux_loss;
    validate(&cfg, &f);
    dataset *data = dataset_from_config(&cfg);   /* refused before the header */
    if (!cfg.json && process_hosts_rank0()) {
        const moe_shape whole = moe_shape_make(&f.moe, &cfg.model, 1, 0);
        report_header_counting(&cfg, "Chapter 10: mixture of experts and expert parallelism",
                               cfg.comm.ranks, 1, moe_total_params(&whole, &cfg.model));
    }
    chapter_results r = {0};
    int status = run_parts(&cfg, data, &f, &r);
    if (!status && process_hosts_rank0()) {
        if (cfg.json) print_json(&cfg, &f, &r);
        else print_tables(&f, &r);
        status = ep_disagreement(&f, &r.ep);
    }
    routing_free(&r.routing);
    ep_report_free(&r.ep);
    dataset_free(data);
    return status;
}
