/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: striped exception tables.
 *
 * One table per snapshot maps an origin chunk ("old chunk") to the chunk of
 * the COW store holding its copy ("new chunk").  The table is split into
 * stripes chosen by hash(old chunk); one mutex per stripe covers that
 * stripe's completed exceptions, its pending exceptions (copy-outs in
 * progress) and its tracked reads (snapshot reads that were sent to the
 * origin and are still in flight).  Together they give the four chunk
 * states of docs/design.md section 3:
 *
 *   A  no completed, no pending     snapshot reads go to the origin
 *   B  pending only                 being copied; writers wait
 *   C  pending + completed          published; earlier origin reads drain
 *   D  completed only               remapped; origin writes go through
 *
 * Rules (docs/design.md section 4): no I/O, allocation or sleeping under a
 * stripe lock, except waiting on the stripe's condition variable; re-check
 * both tables after every wait; hold at most one stripe lock.  That is why
 * growing a stripe's hash is done by exception_stripe_grow() with the lock
 * dropped, and why pending exceptions and tracked reads are owned by the
 * caller (usually on its stack) instead of being allocated here.
 *
 * Pending exceptions live in the stripe's hash too, under keys of their
 * own, so that asking whether a chunk is being copied, and retiring a
 * copy, is one probe however many copies a stripe has in progress
 * (write-back keeps a whole commit round of them pending: a list walked
 * per claim and per retire cost a quarter of the CPU of random first
 * writes).
 *
 * With a single stripe the table is the pre-2019 dm-snapshot scheme: one
 * mutex over all exception state (locking=global).
 */
#ifndef SNAPFG_EXCEPTION_TABLE_H
#define SNAPFG_EXCEPTION_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "cachealign.h"

/* A copy-out in progress.  Owned by the thread doing the copy. */
struct pending_exception {
  uint64_t old_chunk;
};

/* A snapshot read routed to the origin.  Owned by the reading thread. */
struct tracked_read {
  struct tracked_read *next, *prev;
  uint64_t old_chunk;
};

/* A completed exception, as stored in a stripe's open-addressing hash.
 * Key 0 means an empty slot, so keys are old_chunk + 1.  12 bytes, so
 * that a table stays under 32 bytes per exception at its average load;
 * the price is that a COW store may hold at most 2^32 - 1 chunks
 * (SNAPFG_MAX_COW_CHUNKS in store.h; 16 TiB with 4 KiB chunks).
 */
struct completed_slot {
  uint64_t key;
  uint32_t new_chunk;
} __attribute__ ((packed));

struct exception_stripe {
  pthread_mutex_t lock;
  pthread_cond_t changed;           /* a pending retired or a read drained */
  struct completed_slot *slots;     /* capacity is a power of two, or 0 */
  uint32_t capacity;
  uint32_t ncompleted;
  /* Pending exceptions: each has a slot and reserves one more for its
   * completed exception.
   */
  uint32_t npending;
  uint32_t contended;               /* lock acquisitions that had to wait */
  uint16_t nwaiters;                /* threads in exception_stripe_wait */
  struct tracked_read *tracked;
} SNAPFG_CACHE_ALIGNED;

/* Chunks per region of the touched-region map: 4 MiB with 4 KiB chunks. */
#define EXCEPTION_REGION_SHIFT 10

struct exception_table {
  struct exception_stripe *stripes;
  unsigned stripe_bits;             /* log2 (number of stripes) */
  /* One bit per region of 2^EXCEPTION_REGION_SHIFT chunks, set (and
   * never cleared) before the first exception of the region, pending or
   * completed, is added: a clear bit means no chunk of the region has
   * ever differed from the origin, so the origin's allocation is the
   * snapshot's.  NULL (exception_table_map_regions not called) counts
   * every region as touched.
   */
  _Atomic uint64_t *touched;
  uint64_t nregions;
};

/* Create a table with 2^stripe_bits stripes.  Returns 0 or -errno. */
extern int exception_table_init (struct exception_table *t,
                                 unsigned stripe_bits);
extern void exception_table_destroy (struct exception_table *t);

/* Keep the touched-region map for the first nchunks chunks (chunks past
 * them count as touched).  Call before any exception is added.  Returns
 * 0 or -ENOMEM.
 */
extern int exception_table_map_regions (struct exception_table *t,
                                        uint64_t nchunks);

/* Has no exception ever been added in the regions of chunks [first,
 * end)?  Lock-free.  A reader that asks the origin about those chunks
 * first and this second may trust the origin's answer when this says
 * true: the origin changes under a chunk only after its pending
 * exception is added, which marks its region first.
 */
extern bool exception_table_untouched (const struct exception_table *t,
                                       uint64_t first, uint64_t end);

static inline struct exception_stripe *
exception_table_stripe (const struct exception_table *t, uint64_t old_chunk)
{
  /* Fibonacci hashing: neighbouring chunks land on different stripes. */
  uint64_t h = old_chunk * UINT64_C (0x9E3779B97F4A7C15);
  return &t->stripes[t->stripe_bits ? h >> (64 - t->stripe_bits) : 0];
}

_Static_assert (sizeof (struct exception_stripe) == 2 * SNAPFG_CACHELINE,
                "a stripe should fill exactly two cache lines");

static inline void
exception_stripe_lock (struct exception_stripe *s)
{
  /* Count contention (reported by snapfgctl stats) at the cost of a
   * trylock, which is what an uncontended lock does anyway.
   */
  if (pthread_mutex_trylock (&s->lock) != 0) {
    pthread_mutex_lock (&s->lock);
    s->contended++;
  }
}

static inline void
exception_stripe_unlock (struct exception_stripe *s)
{
  pthread_mutex_unlock (&s->lock);
}

/* --- Called with the stripe lock held. --- */

extern bool exception_stripe_lookup (const struct exception_stripe *s,
                                     uint64_t old_chunk, uint64_t *new_chunk);
extern bool exception_stripe_is_pending (const struct exception_stripe *s,
                                         uint64_t old_chunk);

/* State D: the chunk is remapped and no copy of it is in progress.  The
 * one test of it, called with the stripe lock held; *new_chunk (if not
 * NULL) is where the copy is.
 */
static inline bool
exception_stripe_remapped (const struct exception_stripe *stripe,
                           uint64_t chunk, uint64_t *new_chunk)
{
  return exception_stripe_lookup (stripe, chunk, new_chunk) &&
    !exception_stripe_is_pending (stripe, chunk);
}
extern bool exception_stripe_has_tracked_reads (const struct exception_stripe *s,
                                                uint64_t old_chunk);

/* A → B (the chunk must not be pending).  Returns 0, or -EAGAIN if the
 * stripe must grow first so that publishing cannot need an allocation:
 * drop the lock, call exception_stripe_grow, take the lock and re-check.
 * s is t's stripe of old_chunk; t's touched-region map is marked.
 */
extern int exception_stripe_add_pending (struct exception_table *t,
                                         struct exception_stripe *s,
                                         struct pending_exception *pe,
                                         uint64_t old_chunk);
/* B → C: publish the completed exception (space was reserved). */
extern void exception_stripe_publish (struct exception_stripe *s,
                                      struct pending_exception *pe,
                                      uint64_t new_chunk);
/* C → D (or B → A when a copy-out failed): retire the pending exception
 * and wake the waiters.
 */
extern void exception_stripe_retire (struct exception_stripe *s,
                                     struct pending_exception *pe);

/* Remove a completed exception (a merged chunk).  Returns true if it
 * was there.
 */
extern bool exception_stripe_remove (struct exception_stripe *s,
                                     uint64_t old_chunk);

extern void exception_stripe_track_read (struct exception_stripe *s,
                                         struct tracked_read *tr,
                                         uint64_t old_chunk);
extern void exception_stripe_untrack_read (struct exception_stripe *s,
                                           struct tracked_read *tr);

/* Sleep until something in the stripe changes.  The caller re-checks. */
extern void exception_stripe_wait (struct exception_stripe *s);

/* --- Called without the stripe lock. --- */

/* Make room for at least one more pending exception (so also for a
 * completed one).  Returns 0 or -ENOMEM.
 */
extern int exception_stripe_grow (struct exception_stripe *s);

/* Insert a completed exception directly (loading a store, tests).
 * Returns 0, -EEXIST if old_chunk is already remapped, or -ENOMEM.
 */
extern int exception_table_insert (struct exception_table *t,
                                   uint64_t old_chunk, uint64_t new_chunk);

/* Non-blocking lookup of a completed exception, taking the stripe lock. */
extern bool exception_table_lookup (const struct exception_table *t,
                                    uint64_t old_chunk, uint64_t *new_chunk);

/* Number of completed exceptions (takes every stripe lock in turn). */
extern uint64_t exception_table_count (struct exception_table *t);

/* Lock acquisitions that had to wait, over all stripes. */
extern uint64_t exception_table_contention (struct exception_table *t);

/* Every remapped old chunk, in no particular order, in a malloc'd array
 * (*chunksp, *np).  Returns 0 or -ENOMEM.
 */
extern int exception_table_collect (struct exception_table *t,
                                    uint64_t **chunksp, size_t *np);

#endif
