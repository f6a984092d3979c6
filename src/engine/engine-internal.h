/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: engine internals shared by the engine's own files (engine.c,
 * engine-snapshot.c, engine-snapshot-create.c, engine-test-hooks.c,
 * io-origin.c, io-snapshot.c, copy-out.c, merge.c) and by the parts that
 * hook into its snapshot list (lifecycle.c, checkpoint.c,
 * checkpoint-create.c, checkpoint-query.c).  Not for the plugin, the
 * control server or snapfgctl, which use engine.h.
 */
#ifndef SNAPFG_ENGINE_INTERNAL_H
#define SNAPFG_ENGINE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "engine.h"
#include "cbt-bitmap.h"
#include "device.h"
#include "exception-table.h"
#include "percpu-rwlock.h"
#include "store.h"
#include "stats.h"
#include "writeback.h"

/* log2 of the number of stripes with locking=striped.  4096 stripes of
 * 128 bytes: 512 KiB per snapshot, and two copy-outs or a copy-out and a
 * read collide on a stripe lock with probability 1/4096.
 */
#define SNAPFG_STRIPE_BITS 12

/* Test-only crash points (SNAPFG_TEST_CRASH_AT). */
enum fault_point {
  FAULT_NONE,
  FAULT_AFTER_COW_DATA,
  FAULT_AFTER_COW_RUN,         /* one run of a batch written, not committed */
  FAULT_AFTER_METADATA,
  FAULT_BEFORE_ORIGIN_WRITE,
  FAULT_MERGE_BATCH,           /* a merge batch copied, not yet forgotten */
};

/* Test-only allocation failures (SNAPFG_TEST_FAIL_AT). */
enum fail_point {
  FAIL_NONE,
  FAIL_SNAPSHOT_LIST,          /* growing the engine's list of snapshots */
};

enum snapshot_state {
  SNAPSHOT_VALID,
  SNAPSHOT_INVALID,            /* COW full during an origin write, or I/O error */
  SNAPSHOT_DROPPED,            /* removed; open connections get errors */
  SNAPSHOT_MERGING,            /* being merged into the origin (merge.c) */
};

struct snapfg_snapshot {
  char *name;
  struct snapfg_engine *engine;
  struct snapfg_store *store;
  struct exception_table table;
  uint32_t chunk_size;
  unsigned chunk_shift;
  atomic_int state;            /* enum snapshot_state */
  atomic_bool overflow;        /* a snapshot write found the store full */
  atomic_bool merged;          /* DROPPED because its merge completed */
  atomic_int refs;             /* the engine's list, and each connection */
  bool owned_cow;              /* the COW is in the state directory: ours */
  bool unrecorded;             /* the catalogue no longer lists it */
  /* Every snapshot whose store is open, listed or dropped but still
   * referenced (engine_live_lock): no file is reused while any of them
   * holds it.
   */
  struct snapfg_snapshot *live_next, **live_prevp;

  /* Merging (merge.c). */
  pthread_mutex_t merge_lock;  /* the merge thread's life */
  pthread_t merge_thread;
  bool merge_thread_running;   /* started and neither detached nor joined */
  atomic_bool merge_stop;      /* the engine is closing: stop between batches */
  atomic_uint_least64_t merge_done, merge_total;
  struct snapfg_stats stats;   /* this export's requests, copy-outs into it */
};

struct snapfg_engine {
  /* Geometry: read side on every request, write side to change it. */
  struct percpu_rwlock geometry;

  /* Protected by 'geometry'. */
  uint32_t block_size;
  struct snapfg_snapshot **snapshots;
  size_t nsnapshots;
  size_t snapshots_cap;        /* entries allocated (vector.h) */
  unsigned max_snapshots;       /* max-snapshots= */
  uint32_t min_chunk_size;     /* origin requests split at this size */
  struct snapfg_snapshot *merging;  /* being merged: origin I/O is routed */

  /* Merge threads not yet finished, detached ones included (merge.c):
   * closing the engine waits for them, since they use its locks.
   */
  pthread_mutex_t merge_threads_lock;
  pthread_cond_t merge_threads_done;
  unsigned merge_threads;

  struct snapfg_device origin;
  uint64_t size;               /* the origin's size, fixed */
  /* The origin file's size when it was last found shrunk (initially
   * 'size'): each new size is logged once, not per request.
   */
  atomic_uint_least64_t origin_size_seen;

  struct catalogue *catalogue; /* state=, or NULL (lifecycle.c) */
  struct snapfg_snapshot *live;  /* under engine_live_lock */
  struct snapfg_stats stats;   /* the origin export's requests */
  enum snapfg_locking locking;
  enum snapfg_durability durability;  /* for the persistent stores */
  bool origin_moved;           /* origin-moved=true (store-binding.h) */

  /* Test hook: SNAPFG_TEST_DELAY_US widens the race windows. */
  unsigned test_delay_us;
  /* Test hook: SNAPFG_TEST_MERGE_DELAY_US slows each merge batch, so that
   * tests can act while a merge is still running.
   */
  unsigned test_merge_delay_us;
  /* Test hook: SNAPFG_TEST_CRASH_AT kills the process at a fault point. */
  enum fault_point fault_at;
  atomic_long fault_countdown;
  /* Test hook: SNAPFG_TEST_FAIL_AT makes an allocation fail. */
  enum fail_point fail_at;
  atomic_long fail_countdown;

  /* A chunk's worth of zeroes (the largest chunk size), for zeroing
   * snapshot chunks.  Read-only after open.
   */
  const void *zeroes;

  /* Checkpoints (checkpoint.c).  cbt_active is the newest checkpoint's
   * bitmap, which every origin change marks first; it changes only under
   * the geometry write side (and the chain's io_lock).
   */
  struct checkpoint_chain *cbt;
  struct cbt_bitmap *_Atomic cbt_active;

  /* Write-back of first writes (writeback.c). */
  struct writeback *wb;
};

/* The origin's [offset, offset+count) is about to change: record it in
 * the active checkpoint first (with the geometry read side held).  With
 * no checkpoint, or every granule marked already, a load or two.
 */
static inline void
engine_track_change (struct snapfg_engine *e, uint64_t offset,
                     uint64_t count)
{
  struct cbt_bitmap *bm = atomic_load_explicit (&e->cbt_active,
                                                memory_order_acquire);

  if (bm)
    cbt_bitmap_mark (bm, offset, count);
}

static inline bool
snapshot_is_valid (const struct snapfg_snapshot *s)
{
  return atomic_load_explicit (&s->state, memory_order_acquire)
    == SNAPSHOT_VALID;
}

/* Mark a snapshot Invalid (once), telling its store; says why. */
extern void snapshot_invalidate (struct snapfg_snapshot *s, const char *why,
                                 int err);

/* Origin requests while a snapshot is being merged (merge.c): chunks
 * not yet merged are read from and written to the COW store.  op is one
 * an origin_op.  Called with the geometry read side held.
 */
enum origin_op { ORIGIN_READ, ORIGIN_WRITE, ORIGIN_ZERO, ORIGIN_TRIM };
/* Change the origin itself, once every snapshot holds its copy (io-origin.c;
 * the committer applies held writes with it).  Logs a failure.
 */
extern int origin_apply_change (struct snapfg_engine *e, enum origin_op op,
                                const void *buf, uint32_t count,
                                uint64_t offset, unsigned flags);
extern int merge_origin_io (struct snapfg_engine *e, enum origin_op op,
                            void *buf, uint32_t count, uint64_t offset,
                            unsigned flags);
/* Start the merge thread of a snapshot in state SNAPSHOT_MERGING. */
extern int merge_start_thread (struct snapfg_snapshot *s);
/* Stop and join a merge thread (engine close). */
extern void merge_stop_thread (struct snapfg_snapshot *s);

/* An origin request ending at 'end' failed with r.  If that is because
 * the origin file shrank under the server, say so (once per new size),
 * invalidate every valid snapshot that had not copied out all of what
 * was lost, and return true: the caller need not log the request.
 * Called with the geometry read side held.
 */
extern bool engine_origin_shrunk (struct snapfg_engine *e, int r,
                                  uint64_t end);

/* Protects every engine's live list (a process has one engine; a
 * snapshot may outlive it by a connection's reference).
 */
extern pthread_mutex_t engine_live_lock;

/* lifecycle.c: the snapshot s has left the engine's list ("dropped" or
 * "merged"): mark its store, tell the catalogue, remove a COW file of
 * the state directory.
 */
extern void lifecycle_forget (struct snapfg_engine *e,
                              struct snapfg_snapshot *s, const char *event);
/* lifecycle.c: before s leaves the list, the catalogue (if any) stops
 * listing it ("dropped"), durably; on failure (e.g. -ENOSPC) it says so
 * and nothing has changed.  Called with the geometry write side held.
 */
extern int lifecycle_unrecord_locked (struct snapfg_engine *e,
                                      struct snapfg_snapshot *s,
                                      const char *event);
/* lifecycle.c: record a new snapshot in the catalogue (if any); called
 * with the geometry write side held, just before it is published.
 */
extern int lifecycle_record (struct snapfg_engine *e,
                             struct snapfg_snapshot *s,
                             const struct snapfg_snapshot_options *o,
                             const char *store_type);
/* lifecycle.c: the catalogue (if any) records that s is being merged. */
extern int lifecycle_merging (struct snapfg_engine *e,
                              struct snapfg_snapshot *s);
/* lifecycle.c: may path become a new COW store?  Refuses (saying why)
 * this server's own sockets, files still held by any snapshot, dropped
 * ones included, and (unless owned: the server picked the name in the
 * state directory) the files of the catalogue.
 */
extern int lifecycle_check_cow (struct snapfg_engine *e, const char *path,
                                bool owned);
/* merge.c: mark a snapshot as merging (store mark, catalogue, origin
 * routing) with the geometry write side held; NULL or a problem.
 */
extern const char *merge_prepare_locked (struct snapfg_engine *e,
                                         struct snapfg_snapshot *s, int *r);

/* Die here if the test hook asks for it. */
/* Read SNAPFG_TEST_CRASH_AT / SNAPFG_TEST_FAIL_AT's value SPEC (NULL:
 * not set) into the engine (engine-test-hooks.c).
 */
extern void engine_parse_fault_point (struct snapfg_engine *e,
                                      const char *spec);
extern void engine_parse_fail_point (struct snapfg_engine *e,
                                     const char *spec);
/* The snapshot list (engine.c), kept under the geometry lock: the
 * snapshot named NAME (NULL: none) and the smallest chunk size (0: no
 * snapshot).  Called with the geometry lock held, either side.
 */
extern struct snapfg_snapshot *
engine_find_snapshot_locked (struct snapfg_engine *e, const char *name);
extern uint32_t engine_min_chunk_size (const struct snapfg_engine *e);
/* On the list of live snapshots (engine_live_lock), which outlives a
 * drop while connections hold the snapshot.
 */
extern void snapshot_live_insert (struct snapfg_snapshot *s);
/* Free a snapshot that no one refers to any more; CLEAN: its store
 * closes cleanly (persistent: flushed, transient: given back).
 */
extern void snapshot_free (struct snapfg_snapshot *s, bool clean);
extern void engine_fault_point (struct snapfg_engine *e,
                                enum fault_point where);

/* Should the allocation at 'where' fail, as the test hook asks? */
extern bool engine_fail_point (struct snapfg_engine *e, enum fail_point where);

/* Sleep for the test hook, if set. */
extern void engine_test_delay (const struct snapfg_engine *e);

/* Copy origin chunk 'chunk' of snapshot s into its COW store and publish
 * the exception, unless it is already remapped.  'data', if not NULL, is a
 * snapshot write of 'count' bytes at 'offset_in_chunk' to be merged into
 * the copy (SNAPFG_ZERO_DATA: zeroes).  Returns 0 if the chunk is (now)
 * remapped and the write, if any, is done; 1 if the chunk was already
 * remapped and a write was NOT done (the caller takes the fast path);
 * -ENOSPC if the store is full, -EIO on an I/O error or Invalid snapshot.
 */
#define SNAPFG_ZERO_DATA ((const void *) 1)
extern int snapshot_copy_out (struct snapfg_snapshot *s, uint64_t chunk,
                              const void *data, uint32_t count,
                              uint32_t offset_in_chunk, uint64_t *new_chunk);

/* Copy out every chunk from 'first' to 'last' (inclusive) that snapshot s
 * does not hold yet, before an origin change: together, in batches (one
 * commit per batch, consecutive chunks in one read and one write).
 * With defer (write-back), the commit is left to the committer
 * (writeback_defer_commit) instead of waited for.
 * Returns 0 once every chunk is remapped, -ENOSPC if the store is full,
 * -EIO if the snapshot is (or became) Invalid, or the origin's read
 * error.
 */
extern int snapshot_copy_out_range (struct snapfg_snapshot *s,
                                    uint64_t first, uint64_t last,
                                    bool defer);

/* Is the chunk remapped in s with no copy of it in progress (state D)?
 * Takes the chunk's stripe lock.
 */
extern bool snapshot_chunk_is_remapped (struct snapfg_snapshot *s,
                                        uint64_t chunk);

#endif
