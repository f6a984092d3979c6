/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the persistent exception store's private state, shared by
 * its three parts:
 *
 *   store-persistent.c         the store operations: allocation, loading
 *                              the table, usage, invalidation, merging,
 *                              close
 *   store-persistent-commit.c  group commit (the ordering of
 *                              docs/design.md section 5), writing the
 *                              header and metadata areas, and zeroing
 *                              ahead of the allocator
 *   store-persistent-open.c    opening and formatting a store, the binding
 *                              checks and the unsynced mark
 *
 * The calls go one way: the open file and the operations call the
 * commit file, the open file fills in the operations' table; nothing
 * calls back up.
 *
 * Nothing outside these files includes this header: the engine sees a
 * struct snapfg_store (store.h).
 */
#ifndef SNAPFG_STORE_PERSISTENT_H
#define SNAPFG_STORE_PERSISTENT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdatomic.h>
#include <pthread.h>
#include <time.h>

#include "store.h"
#include "dm-format.h"
#include "store-binding.h"
#include "vector.h"

DEFINE_VECTOR_TYPE (pair_vector, struct store_pair);

/* A commit call asleep until its pairs are durable, or until it is its
 * turn to lead.  Each has its own condition variable, so that a round
 * wakes only the commits it made durable (plus, when the leader stops,
 * the oldest waiter to take over): with 16-128 commits waiting, one
 * broadcast per round would wake them all to find most not done yet.
 */
struct commit_waiter {
  struct commit_waiter *next;
  uint64_t ticket;              /* durable once ps->durable >= ticket */
  bool queued;
  pthread_cond_t wake;
};

/* What -D snapfg.commit=1 reports, once a second under load and at close:
 * over the interval, commit calls and their wait, rounds (groups), their
 * sizes, and the syncs' latency.
 */
struct commit_debug {
  uint64_t since_ns;            /* start of the interval */
  uint64_t calls, exceptions, wait_ns, wait_max_ns;
  uint64_t groups, group_max;
  uint64_t syncs, sync_ns, sync_max_ns;
};

struct persistent_store {
  struct snapfg_store base;     /* first: the engine sees only this */
  uint64_t pairs_per_area;

  /* Group commit.  'lock' protects everything below down to 'failed'. */
  pthread_mutex_t lock;
  struct commit_waiter *waiters;      /* sleeping commits, oldest first */
  struct commit_waiter **waiters_tail;
  bool leader_active;           /* someone is writing a batch */
  pair_vector queue;            /* pairs waiting for the next batch */
  pair_vector batch;            /* the leader's batch (swapped with queue) */
  uint64_t queued;              /* pairs ever queued */
  uint64_t written;             /* pairs ever written into their areas */
  uint64_t durable;             /* pairs ever made durable */
  int failed;                   /* sticky -errno after a failed commit */

  /* The leader's on-disk state (only the leader touches these). */
  unsigned char *area_buf;      /* the current area's contents */
  uint64_t current_area;
  uint64_t area_used;           /* pairs in the current area */
  uint64_t zeroed_through;      /* areas up to this are zero or in use */
  atomic_uint_least64_t metadata_areas; /* for usage: current_area + 1 */

  /* Zeroing ahead of the allocator (see zero_data_ahead). */
  atomic_uint_least64_t zeroing_from;  /* first chunk being zeroed, or none */
  uint64_t zeroed_end;          /* chunks below are written (leader only) */
  bool zero_ahead_off;          /* a zeroing write failed: stop trying */
  void *zero_buf;               /* ZERO_AHEAD_IO bytes of zeroes */
  pthread_cond_t zeroed;        /* zeroing_from cleared (under lock) */

  /* Statistics, for the benchmark and debug output. */
  pthread_mutex_t debug_lock;
  struct commit_debug debug;    /* -D snapfg.commit=1 (under debug_lock) */
  atomic_uint_least64_t syncs;
  atomic_uint_least64_t commits;       /* exceptions committed */
  atomic_uint_least64_t commit_calls;  /* batches of them (one wait each) */
  atomic_uint_least64_t groups;

  /* durability=flush: commits are written in order but not synced; the
   * header carries the unsynced mark (valid = 0 and this boot's id)
   * until a clean close has synced everything.
   */
  bool unsynced;
  bool marked;                  /* the header on disk carries the mark */
  char boot_id[SNAPFG_BOOT_ID_MAX];

  bool invalidated;             /* header valid=0 written (under lock) */
  bool fresh;                   /* formatted by us at open: empty table */
  bool recovered;               /* opened unsynced from this boot: whole */
  bool torn;                    /* opened unsynced from an earlier boot */
  bool merging;                 /* the header carries snapfg's merge mark */

  /* Header bytes past dm's and the merge mark: the binding record
   * (store-binding.h), or whatever was there, rewritten as it is with
   * every header write.
   */
  unsigned char binding_raw[STORE_BINDING_SIZE];
  /* binding_raw changed for an existing store: written by
   * persistent_load once the store is known to be usable, so that a
   * store refused there is left unchanged.
   */
  bool binding_pending;
};

static inline struct persistent_store *
ps_of (struct snapfg_store *st)
{
  return (struct persistent_store *) st;
}

static inline uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The store operations (store-persistent.c). */
extern const struct snapfg_store_ops persistent_ops;

/* --- store-persistent-commit.c --- */

/* Set up and tear down the group commit's state in ps. */
extern void persistent_commit_init (struct persistent_store *ps);
extern void persistent_commit_destroy (struct persistent_store *ps);

/* The commit operation (struct snapfg_store_ops.commit). */
extern int persistent_commit (struct snapfg_store *st,
                              const struct store_pair *pairs, size_t n);

/* Sync the COW device, counted for the statistics. */
extern int persistent_sync (struct persistent_store *ps);

/* Write zeroes over metadata area 'area' (not synced). */
extern int persistent_zero_area (struct persistent_store *ps, uint64_t area);

/* Write the current area from area_buf (not synced). */
extern int persistent_write_current_area (struct persistent_store *ps);

/* After the allocator took [first, first + n): wait while the commit
 * leader is zeroing a range these chunks are in.
 */
extern void persistent_wait_zeroing (struct persistent_store *ps,
                                     uint64_t first, uint64_t n);

/* Write the header as it must be now (see there), not synced. */
extern int persistent_write_header (struct persistent_store *ps,
                                    uint32_t valid);

#endif
