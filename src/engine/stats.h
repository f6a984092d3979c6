/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: per-export statistics.
 *
 * Counters are kept per CPU (one cache-line-aligned slot each, picked by
 * the CPU the thread runs on, sched_getcpu) and summed when someone asks,
 * so that counting on the hot path rarely shares a cache line between
 * CPUs.  Unlike the geometry lock's per-thread slots (percpu-rwlock.h),
 * a slot may be written by several threads (one after another on a CPU,
 * or a thread migrated mid-update), so the counters are atomic.
 */
#ifndef SNAPFG_STATS_H
#define SNAPFG_STATS_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cachealign.h"

/* Latency histogram: 4 buckets per power of two of nanoseconds. */
#define STATS_SUB_BUCKETS 4
#define STATS_BUCKETS (64 * STATS_SUB_BUCKETS)

enum stats_counter {
  STAT_REQUESTS,
  STAT_BYTES_READ,
  STAT_BYTES_WRITTEN,
  STAT_COPY_OUTS,
  STAT_BYTES_COPIED,
  STAT_PENDING_WAITS,       /* a request waited for a copy-out in progress */
  STAT_ERRORS,
  STAT_NCOUNTERS
};

struct stats_slot {
  atomic_uint_least64_t counter[STAT_NCOUNTERS];
  atomic_uint_least64_t latency[STATS_BUCKETS];
} SNAPFG_CACHE_ALIGNED;

struct snapfg_stats {
  struct stats_slot *slots;
  unsigned slot_mask;
  atomic_int connections;
};

/* A summary, as reported. */
struct stats_summary {
  uint64_t counter[STAT_NCOUNTERS];
  uint64_t latency_p50_ns;
  uint64_t latency_p99_ns;
  int connections;
};

extern int stats_init (struct snapfg_stats *st);
extern void stats_destroy (struct snapfg_stats *st);

extern struct stats_slot *stats_slot (struct snapfg_stats *st);

static inline void
stats_add (struct snapfg_stats *st, enum stats_counter c, uint64_t n)
{
  atomic_fetch_add_explicit (&stats_slot (st)->counter[c], n,
                             memory_order_relaxed);
}

static inline uint64_t
stats_now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Record one finished request. */
extern void stats_request (struct snapfg_stats *st, uint64_t start_ns,
                           enum stats_counter bytes_counter, uint64_t bytes,
                           int result);

extern void stats_summarize (struct snapfg_stats *st,
                             struct stats_summary *sum);

#endif
