/* bench.h: the subcommands of fattn-bench and what they share (timing, output tables).
 * Each subcommand lives in its own file and returns a process exit code. */
#ifndef FATTN_BENCH_H
#define FATTN_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fattn.h"
#include "tests/shapes.h"

int fattn_bench_run(int argc, char **argv);  /* the main job: memory plan + scheduler simulation */
int fattn_bench_plan(int argc, char **argv); /* host time of fattn_plan */
int fattn_bench_serve(int argc, char **argv); /* the serving-step benchmark */
int fattn_bench_decode(int argc, char **argv); /* decode attention vs a pure-read roofline */
int fattn_bench_prefill(int argc, char **argv); /* prefill attention, FA3 paper shapes */
int fattn_bench_mla(int argc, char **argv);     /* MLA decode, DeepSeek-V3 shapes */
int fattn_bench_copies(int argc, char **argv); /* tools/copies.cu: paged KV copy paths */
int fattn_bench_steps(void);                 /* real steps on the CPU backend vs a dense check */

double fattn_bench_now(void);                 /* monotonic seconds */
/* Median of n samples (sorts them in place); 0 when n is 0. */
double fattn_bench_median(double *v, size_t n);
int fattn_bench_has_gpu(void);
/* A GPU context's KV budget: want, or 90% of device 0's free memory where that is less (an
 * 80 GB H100 holds under the 80 GiB of the Llama-3.1-8B plan); the rest covers the other
 * regions (tens of MiB at that shape) and the CUDA context. */
uint64_t fattn_bench_kv_budget(uint64_t want);
void fattn_bench_print_plan(const fattn_memory_report *r, FILE *out);
/* fattn_graph_launch's two halves timed apart, in microseconds: the plan into the batch's
 * bucket, then cudaGraphLaunch of its graph (the bucket lookup before them untimed). The
 * caller drains the stream first where it wants an idle device. Exits on an error. */
void fattn_bench_graph_halves(fattn_ctx *ctx, const fattn_batch *b, void *stream, double *plan_us,
                              double *launch_us);

#endif /* FATTN_BENCH_H */
