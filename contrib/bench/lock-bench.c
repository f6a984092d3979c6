/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Lock microbenchmark: the read side of snapfg's per-CPU reader/writer
 * lock against pthread_rwlock_t and pthread_mutex_t.
 *
 *   lock-bench [SECONDS] [THREADS...]
 *
 * Each thread acquires and releases the read side (the mutex: lock and
 * unlock) in a loop, with a little work in between as a request would
 * have; prints ns per acquire+release pair per thread, and the ratio of
 * the per-CPU lock's throughput to the others'.  For instruction counts
 * run one thread under valgrind --tool=callgrind with LOCK_BENCH_ITERS
 * set (a fixed iteration count instead of a time limit).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <pthread.h>
#include <time.h>

#include "percpu-rwlock.h"

enum kind { PERCPU, RWLOCK, MUTEX };
static const char *kind_name[] = { "percpu-rwlock", "pthread_rwlock", "pthread_mutex" };

static struct percpu_rwlock percpu;
static pthread_rwlock_t rwlock = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool stop;
static long fixed_iters;

struct worker {
  pthread_t thread;
  enum kind kind;
  long ops;
} __attribute__ ((aligned (64)));

static inline void
one_op (enum kind kind)
{
  switch (kind) {
  case PERCPU: {
    percpu_rwlock_token t = percpu_rwlock_read_lock (&percpu);
    __asm__ volatile ("" ::: "memory");
    percpu_rwlock_read_unlock (&percpu, t);
    break;
  }
  case RWLOCK:
    pthread_rwlock_rdlock (&rwlock);
    __asm__ volatile ("" ::: "memory");
    pthread_rwlock_unlock (&rwlock);
    break;
  case MUTEX:
    pthread_mutex_lock (&mutex);
    __asm__ volatile ("" ::: "memory");
    pthread_mutex_unlock (&mutex);
    break;
  }
}

static void *
run (void *arg)
{
  struct worker *w = arg;
  long ops = 0;

  if (fixed_iters) {
    for (long i = 0; i < fixed_iters; ++i)
      one_op (w->kind);
    ops = fixed_iters;
  }
  else {
    while (!atomic_load_explicit (&stop, memory_order_relaxed)) {
      for (int i = 0; i < 1000; ++i)
        one_op (w->kind);
      ops += 1000;
    }
  }
  w->ops = ops;
  return NULL;
}

static double
measure (enum kind kind, int nthreads, double seconds)
{
  struct worker *w = aligned_alloc (64, nthreads * sizeof *w);
  struct timespec t0, t1;
  long total = 0;
  double elapsed;

  atomic_store (&stop, false);
  clock_gettime (CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < nthreads; ++i) {
    w[i].kind = kind;
    pthread_create (&w[i].thread, NULL, run, &w[i]);
  }
  if (!fixed_iters) {
    struct timespec ts = { .tv_sec = (time_t) seconds,
                           .tv_nsec = (long) ((seconds - (time_t) seconds) * 1e9) };
    nanosleep (&ts, NULL);
    atomic_store (&stop, true);
  }
  for (int i = 0; i < nthreads; ++i) {
    pthread_join (w[i].thread, NULL);
    total += w[i].ops;
  }
  clock_gettime (CLOCK_MONOTONIC, &t1);
  elapsed = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  free (w);
  /* ns per operation per thread (wall time x threads / ops) */
  return elapsed * 1e9 * nthreads / total;
}

int
main (int argc, char *argv[])
{
  double seconds = argc > 1 ? atof (argv[1]) : 1.0;
  int default_threads[] = { 1, 2, 4, 8, 16 };
  int *threads = default_threads, nthreads = 5;
  const char *env = getenv ("LOCK_BENCH_ITERS");

  if (env)
    fixed_iters = atol (env);
  if (argc > 2) {
    nthreads = argc - 2;
    threads = calloc (nthreads, sizeof *threads);
    for (int i = 0; i < nthreads; ++i)
      threads[i] = atoi (argv[i + 2]);
  }
  if (percpu_rwlock_init (&percpu) < 0)
    return EXIT_FAILURE;

  printf ("| threads | percpu-rwlock ns/op | pthread_rwlock ns/op | pthread_mutex ns/op | rwlock/percpu | mutex/percpu |\n");
  printf ("|---|---|---|---|---|---|\n");
  for (int i = 0; i < nthreads; ++i) {
    double ns[3];
    for (int k = 0; k < 3; ++k)
      ns[k] = measure (k, threads[i], seconds);
    printf ("| %d | %.1f | %.1f | %.1f | %.2f | %.2f |\n", threads[i],
            ns[PERCPU], ns[RWLOCK], ns[MUTEX], ns[RWLOCK] / ns[PERCPU],
            ns[MUTEX] / ns[PERCPU]);
    fflush (stdout);
  }
  (void) kind_name;
  percpu_rwlock_destroy (&percpu);
  return EXIT_SUCCESS;
}
