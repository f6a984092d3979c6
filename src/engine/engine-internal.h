/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the engine's structures (a snapshot, the engine) and the
 * snapshot list, shared by the engine's own files and by the parts that
 * hook into its snapshot list (lifecycle.c, checkpoint*.c).  Each
 * subsystem's functions have their own header: copy-out.h, merge.h,
 * lifecycle.h, engine-test-hooks.h.  Not for the plugin, the control
 * server or snapfgctl, which use engine.h.
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
#include "suspend.h"
#include "engine-test-hooks.h"

/* log2 of the number of stripes with locking=striped.  4096 stripes of
 * 128 bytes: 512 KiB per snapshot, and two copy-outs or a copy-out and a
 * read collide on a stripe lock with probability 1/4096.
 */
#define SNAPFG_STRIPE_BITS 12

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
  /* Its own writes' exceptions, from its first write (snapshot-writes.h). */
  struct snapshot_writes *_Atomic writes;
};

struct deferred_copy;

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

  struct engine_test_hooks test;  /* engine-test-hooks.h */

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

  /* Write-back of first writes (src/writeback/writeback.c). */
  struct writeback *wb;
  /* Where copy-out (copy-out.c) hands an origin copy-out batch under
   * write-back, and how a writer waiting for a claimed chunk asks for
   * its round: set by writeback_open before the first request and
   * cleared by writeback_close after the last, so that copy-out never
   * calls write-back itself (no circle between the two).
   */
  struct copy_deferral {
    void (*defer) (void *opaque, struct deferred_copy *dc);
    void (*urge) (void *opaque);
    void *opaque;
  } copy_deferral;

  /* Origin writes held between a suspend and its resume (suspend.c). */
  struct engine_suspend suspend;
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

/* The kinds of origin change (io-origin.c, merge.c, writeback.c). */
enum origin_op { ORIGIN_READ, ORIGIN_WRITE, ORIGIN_ZERO, ORIGIN_TRIM };
/* "write", "zero", ... for messages. */
extern const char *origin_op_name (enum origin_op op);
/* Change the origin itself, once every snapshot holds its copy (origin-device.c;
 * the committer applies held writes with it).  Logs a failure.
 */
extern int origin_apply_change (struct snapfg_engine *e, enum origin_op op,
                                const void *buf, uint32_t count,
                                uint64_t offset, unsigned flags);

/* Replay the held writes of a held file left by an unclean stop, if
 * any (writeback.h), through the request path, then sync the origin
 * (io-origin.c).  Before the committer starts and before any client.
 * Returns 0 or -errno (logged; the file is kept).
 */
extern int origin_replay_held (struct snapfg_engine *e);

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

/* The snapshot list (engine-snapshot.c), kept under the geometry lock: the
 * snapshot named NAME (NULL: none) and the smallest chunk size (0: no
 * snapshot).  Called with the geometry lock held, either side.
 */
extern struct snapfg_snapshot *
engine_find_snapshot_locked (struct snapfg_engine *e, const char *name);
extern uint32_t engine_min_chunk_size (const struct snapfg_engine *e);
/* Is the chunk remapped in s with no copy of it in progress (state D)?
 * Takes the chunk's stripe lock (engine-snapshot.c).
 */
extern bool snapshot_chunk_is_remapped (struct snapfg_snapshot *s,
                                        uint64_t chunk);
/* On and off the list of live snapshots (engine_live_lock,
 * engine-snapshot.c), which outlives a drop while connections hold the
 * snapshot.
 */
extern void snapshot_live_insert (struct snapfg_snapshot *s);
extern void snapshot_live_remove (struct snapfg_snapshot *s);
/* Free a snapshot that no one refers to any more (engine-snapshot.c);
 * CLEAN: its store closes cleanly (persistent: flushed, transient:
 * given back).
 */
extern void snapshot_free (struct snapfg_snapshot *s, bool clean);
#endif
