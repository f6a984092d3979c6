/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: what writeback.c (the requests' side) and
 * writeback-committer.c (the committer thread) share.
 *
 * Lock order (docs/design.md section 4): the geometry lock (read side)
 * -> wb->lock -> a store's commit lock.  The committer takes no geometry
 * lock and commits with no other lock held; a stripe lock is never held
 * with wb->lock.
 */
#ifndef SNAPFG_WRITEBACK_INTERNAL_H
#define SNAPFG_WRITEBACK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine-internal.h"
#include "held-file.h"
#include "held-queue.h"

struct deferred_copy;

struct writeback {
  /* Set by writeback_open, then read only. */
  struct snapfg_engine *e;
  bool enabled;
  uint64_t max;                   /* writeback-max */

  pthread_mutex_t lock;
  pthread_cond_t work;            /* the committer: something to do */
  pthread_cond_t room;            /* writers waiting for room */
  pthread_cond_t applied;         /* flushes and drains */

  /* Under lock. */
  struct held_queue q;
  unsigned room_waiters;          /* writers waiting for room now */
  unsigned flush_waiters;         /* others waiting for applied_seq */
  bool gathering;                 /* the committer gathers a round */
  /* Copy-out batches queued for the next round (copy-out.h). */
  struct deferred_copy *round_copies, *round_copies_last;
  /* Batches copied and published while paused (the test hook), for the
   * next round's commit.
   */
  struct deferred_copy *paused_copies;
  bool copy_wanted;               /* a writer waits for a batch's chunk */

  /* Written under lock, read without it (see writeback_ready). */
  atomic_bool idle;               /* the committer waits for work */

  /* The held file (held-file.h): writers store data and write records
   * (under lock), the committer and readers load, the committer marks
   * what was applied.  file_ours: this server created it (only then is it
   * removed at a clean stop).
   */
  struct held_file file;
  bool file_ours;
  struct held_binding binding;
  /* A held file left by an unclean stop, checked and waiting to be
   * replayed before any new snapshot or client (writeback-replay.c).
   */
  bool replay_pending;
  struct held_replay replay;
  uint32_t replay_nstores;
  char (*replay_stores)[HELD_UUID_LEN];
  /* The committer's own. */
  void *bounce;                   /* BOUNCE_SIZE */
  pthread_t thread;

  _Atomic bool running;         /* read unlocked by flushes and drains */
  atomic_bool stop;

  /* Held writes that failed after their acknowledgement
   * (writeback-errors.c), under lock: failed_seq is the sequence number
   * of the latest (the committer meets them in sequence order and
   * publishes them with applied_seq), told_seq the one up to which every
   * failure has been reported to some client (a new connection starts
   * there).
   */
  uint64_t failed_seq, told_seq;

  /* Statistics, atomics (origin_errors and errors_seen written under
   * lock, with failed_seq and told_seq).
   */
  atomic_uint_least64_t rounds, round_exceptions, max_round;
  atomic_uint_least64_t room_waits, origin_errors;
  /* origin_errors as last reported to a client (writeback-errors.c). */
  atomic_uint_least64_t errors_seen;
  atomic_uint_least64_t not_held;   /* no memory to hold them (logged) */
};

/* Group commit.  A round costs two syncs of every COW store it touches
 * whatever its size, and the writes arriving while one round syncs make
 * the next one: with a few writes in flight the rounds stay as small as
 * the clients' queues (23 exceptions a round at 16 in flight, measured),
 * and the syncs, not the writes, take the CPU and the disk.  So a round
 * that nobody waits for is gathered for up to ROUND_GATHER_NS after its
 * first write became ready.  Nobody waiting is the point: a flush, a FUA
 * or overlapping write that waits for the origin, a writer waiting for
 * room, a drain or a stop starts the round at once, and so does a queue
 * holding ROUND_GATHER_FULL of writeback-max (so that writers never come
 * to wait for room because of the gathering).  Held writes that no flush
 * covers may stay that much longer in memory: within the NBD contract.
 */
#define ROUND_GATHER_NS (10 * 1000 * 1000)
#define ROUND_GATHER_FULL 2             /* a half of writeback-max */

/* The committer's buffer for held data on its way to the origin. */
#define BOUNCE_SIZE (4 * 1024 * 1024)

/* Under the lock: wake the committer if it waits for work, or (urgent)
 * also if it is gathering a round.
 */
extern void writeback_wake_committer (struct writeback *wb, bool urgent);
/* Under the lock: is enough held that a round should not wait? */
extern bool writeback_round_is_full (const struct writeback *wb);

/* Free a held write nobody can reach any more: its data, then it. */
extern void writeback_held_free (struct writeback *wb, struct held_write *h);
/* Drop a reference (freeing h if it was the last). */
extern void writeback_held_put (struct writeback *wb, struct held_write *h);

/* The uuids of the snapshots' stores that held writes may copy into
 * (those with a binding), into a malloc'd array.  With the geometry lock
 * held (either side).
 */
extern int writeback_bound_stores (struct snapfg_engine *e,
                                   char (**stores)[HELD_UUID_LEN],
                                   uint32_t *n);

/* The committer's thread (writeback-committer.c). */
extern void *writeback_committer (void *wb);

#endif
