/* serve_report.c: the serving benchmark's output: a table on stdout, the targets one by one,
 * a CSV, and a gnuplot PNG of decode-step latency against batch size, eager and graph. */
#include <stdlib.h>

#include "bench/serve.h"

/* Graph static memory of the Llama-3.1-8B config at max_seq_len 131072, all four modes. */
static uint64_t graph_static_bytes(void) {
  fattn_config cfg;
  fattn_model m;
  fattn_shape_llama8b(&cfg, &m, 0);
  cfg.spec_topk = 4, cfg.spec_steps = 5, cfg.spec_draft_tokens = 8;
  cfg.graph_modes = (1u << FATTN_MODE_DECODE) | (1u << FATTN_MODE_DRAFT_DECODE) | (1u << FATTN_MODE_TARGET_VERIFY) |
                    (1u << FATTN_MODE_DRAFT_EXTEND);
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
  char detail[256];
  if (fattn_memory_plan(&cfg, &m, &r, detail, sizeof detail)) return 0;
  return r.region_bytes[FATTN_REGION_GRAPH_STATIC];
}

static void plot(const serve_result *r) {
  FILE *d = fopen("build/serve_sweep.dat", "w");
  if (!d) return;
  for (uint32_t i = 0; i < r->sweep_n; i++)
    fprintf(d, "%u %.6f %.6f\n", r->sweep_bs[i], r->sweep_eager_ms[i], r->sweep_graph_ms[i]);
  fclose(d);
  int rc = system("command -v gnuplot >/dev/null && gnuplot -e \"set terminal png size 900,540; "
                  "set output 'build/serve.png'; set logscale x 2; set xlabel 'batch size'; "
                  "set ylabel 'decode step, ms (32 layers)'; set key left top; set grid; "
                  "plot 'build/serve_sweep.dat' using 1:2 with linespoints title 'eager', "
                  "'' using 1:3 with linespoints title 'CUDA graph'\"");
  printf("%s\n", rc == 0 ? "plot: build/serve.png" : "plot: gnuplot not available, data in build/serve_sweep.dat");
}

void fattn_bench_report(serve *s, const serve_result *r) {
  const serve_shape *p = &s->p;
  double tok_eager = p->batch / (r->decode_eager_ms / 1e3), tok_graph = r->decode_graph_ms > 0 ? p->batch / (r->decode_graph_ms / 1e3) : 0;
  char g[64];
  printf("\n%-34s %12s %12s\n", "phase", "eager", s->gpu ? "graph" : "graph (GPU)");
  printf("%-34s %9.3f ms %12s\n", "prefill (batch x input)", r->prefill_ms, "-");
  snprintf(g, sizeof g, s->gpu ? "%9.3f ms" : "-", r->decode_graph_ms);
  printf("%-34s %9.3f ms %12s\n", "decode step (median)", r->decode_eager_ms, g);
  snprintf(g, sizeof g, s->gpu ? "%8.0f t/s" : "-", tok_graph);
  printf("%-34s %8.0f t/s %12s\n", "decode throughput", tok_eager, g);
  const char *spec[4] = {"draft decode (5 steps, 1 layer)", "target verify (8 drafts)", "draft extend (1 layer)",
                         "speculative round"};
  for (int i = 0; i < 4; i++) {
    snprintf(g, sizeof g, s->gpu ? "%9.3f ms" : "-", r->spec_graph_ms[i]);
    printf("%-34s %9.3f ms %12s\n", spec[i], r->spec_eager_ms[i], g);
  }
  FILE *csv = fopen("build/serve.csv", "w");
  if (csv) {
    fprintf(csv, "metric,eager_ms,graph_ms\nprefill,%.6f,\ndecode_step,%.6f,%.6f\n", r->prefill_ms,
            r->decode_eager_ms, r->decode_graph_ms);
    for (int i = 0; i < 4; i++) fprintf(csv, "spec_%d,%.6f,%.6f\n", i, r->spec_eager_ms[i], r->spec_graph_ms[i]);
    for (uint32_t i = 0; i < r->sweep_n; i++)
      fprintf(csv, "decode_bs%u,%.6f,%.6f\n", r->sweep_bs[i], r->sweep_eager_ms[i], r->sweep_graph_ms[i]);
    if (s->gpu) { /* the targets' other figures, in ms: the host's side of an eager bs 1 step and
                     of a bs 256 graph launch (idle, busy), and the one-batch step's kernel sum */
      fprintf(csv, "host_issue_bs1,%.6f,\nhost_launch_bs256,,%.6f\nhost_launch_busy_bs256,,%.6f\n",
              r->eager_issue_us_bs1 / 1e3, r->launch_host_us_bs256 / 1e3, r->launch_busy_us_bs256 / 1e3);
      fprintf(csv, "kernel_sum,,%.6f\n", r->kernel_sum_ms);
    }
    fclose(csv);
    printf("csv: build/serve.csv\n");
  }
  uint64_t gs = graph_static_bytes();
  printf("\ntargets\n");
  if (s->gpu) {
    printf("  graph replay / sum of kernel times (bs %u): %.3f / %.3f ms = %.3f (target <= 1.05)\n", p->batch,
           r->decode_graph_ms, r->kernel_sum_ms, r->decode_graph_ms / r->kernel_sum_ms);
    printf("    a layer's kernels, each alone (20 in a graph): store %.2f, attend %.2f, mix %.2f us at bs %u; "
           "%.2f, %.2f, %.2f us at bs 1\n", r->kernel_us[0], r->kernel_us[1], r->kernel_us[2], p->batch,
           r->kernel_us_bs1[0], r->kernel_us_bs1[1], r->kernel_us_bs1[2]);
    if (r->sweep_n) {
      printf("  graph speed-up at bs 1: %.2fx (target >= 1.5)\n", r->sweep_eager_ms[0] / r->sweep_graph_ms[0]);
      /* When the host issues an eager step faster than the device runs it, eager is bound by
       * the device and a graph can save only the launch gaps the device still sees. */
      printf("    the host issues an eager bs 1 step in %.3f ms; the device runs it in %.3f ms eager, %.3f ms as a graph\n",
             r->eager_issue_us_bs1 / 1e3, r->sweep_eager_ms[0], r->sweep_graph_ms[0]);
    }
    printf("  host plan + launch at bs 256: %.2f us after an idle wait, %.2f us while the step before runs "
           "(%llu staging waits) (target <= 10)\n",
           r->launch_host_us_bs256, r->launch_busy_us_bs256, (unsigned long long)r->launch_busy_waits);
    printf("    timed apart: the plan %.2f us, cudaGraphLaunch of the %u-layer step %.2f us with the device idle; "
           "%.2f and %.2f us while the step before runs\n",
           r->launch_idle_halves_us_bs256[0], s->layers, r->launch_idle_halves_us_bs256[1],
           r->launch_busy_halves_us_bs256[0], r->launch_busy_halves_us_bs256[1]);
    plot(r);
  } else {
    printf("  graph targets need a CUDA device (this run was eager on the CPU backend)\n");
  }
  printf("  graph static memory, Llama-3.1-8B at max_seq_len 131072, 4 modes, default buckets: %.2f MiB "
         "(target < 256)\n", (double)gs / (1 << 20));
}
