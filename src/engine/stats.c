/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: per-export statistics (see stats.h). */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sched.h>
#include <sys/sysinfo.h>

#include "stats.h"
#include "power-of-two.h"

int
stats_init (struct snapfg_stats *st)
{
  /* A power of two, so that a CPU number picks a slot with a mask. */
  unsigned ncpus = get_nprocs_conf ();
  unsigned n = next_power_of_two (ncpus < 2 ? 2 : ncpus);

  st->slots = aligned_alloc (SNAPFG_CACHELINE, n * sizeof *st->slots);
  if (st->slots == NULL)
    return -ENOMEM;
  memset (st->slots, 0, n * sizeof *st->slots);
  st->slot_mask = n - 1;
  atomic_init (&st->connections, 0);
  return 0;
}

void
stats_destroy (struct snapfg_stats *st)
{
  free (st->slots);
  st->slots = NULL;
}

struct stats_slot *
stats_slot (struct snapfg_stats *st)
{
  int cpu = sched_getcpu ();

  return &st->slots[(cpu < 0 ? 0 : (unsigned) cpu) & st->slot_mask];
}

/* Bucket of a latency: 4 per power of two. */
static unsigned
latency_bucket (uint64_t ns)
{
  unsigned log2, sub;

  if (ns < STATS_SUB_BUCKETS)
    return ns;
  log2 = 63 - __builtin_clzll (ns);
  sub = (ns >> (log2 - 2)) & (STATS_SUB_BUCKETS - 1);
  return log2 * STATS_SUB_BUCKETS + sub;
}

/* The upper bound of a bucket, in ns. */
static uint64_t
bucket_limit (unsigned bucket)
{
  unsigned log2 = bucket / STATS_SUB_BUCKETS, sub = bucket % STATS_SUB_BUCKETS;

  if (log2 < 2)
    return bucket + 1;
  return ((uint64_t) (STATS_SUB_BUCKETS + sub + 1)) << (log2 - 2);
}

void
stats_request (struct snapfg_stats *st, uint64_t start_ns,
               enum stats_counter bytes_counter, uint64_t bytes, int result)
{
  struct stats_slot *slot = stats_slot (st);
  uint64_t elapsed = stats_now_ns () - start_ns;

  atomic_fetch_add_explicit (&slot->counter[STAT_REQUESTS], 1,
                             memory_order_relaxed);
  if (result < 0)
    atomic_fetch_add_explicit (&slot->counter[STAT_ERRORS], 1,
                               memory_order_relaxed);
  else if (bytes)
    atomic_fetch_add_explicit (&slot->counter[bytes_counter], bytes,
                               memory_order_relaxed);
  atomic_fetch_add_explicit (&slot->latency[latency_bucket (elapsed)], 1,
                             memory_order_relaxed);
}

static uint64_t
percentile (const uint64_t *hist, uint64_t total, unsigned permille)
{
  uint64_t want = (total * permille + 999) / 1000, seen = 0;

  if (total == 0)
    return 0;
  for (unsigned b = 0; b < STATS_BUCKETS; ++b) {
    seen += hist[b];
    if (seen >= want)
      return bucket_limit (b);
  }
  return bucket_limit (STATS_BUCKETS - 1);
}

void
stats_summarize (struct snapfg_stats *st, struct stats_summary *sum)
{
  uint64_t hist[STATS_BUCKETS];
  uint64_t total = 0;

  memset (sum, 0, sizeof *sum);
  memset (hist, 0, sizeof hist);
  for (unsigned i = 0; i <= st->slot_mask; ++i) {
    for (unsigned c = 0; c < STAT_NCOUNTERS; ++c)
      sum->counter[c] += atomic_load_explicit (&st->slots[i].counter[c],
                                               memory_order_relaxed);
    for (unsigned b = 0; b < STATS_BUCKETS; ++b)
      hist[b] += atomic_load_explicit (&st->slots[i].latency[b],
                                       memory_order_relaxed);
  }
  for (unsigned b = 0; b < STATS_BUCKETS; ++b)
    total += hist[b];
  sum->latency_p50_ns = percentile (hist, total, 500);
  sum->latency_p99_ns = percentile (hist, total, 990);
  sum->connections = atomic_load (&st->connections);
}
