/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: write-back of first writes (writeback=on): what the engine
 * calls.  The component's files: writeback.c (this interface, the
 * requests' side), writeback-committer.c (the committer's rounds),
 * held-queue.c (the queue of held writes, its states and indexes),
 * held-file.c (the held data).
 *
 * A write, zero or trim to origin chunks that need a copy-out is
 * acknowledged once the old chunks are written (not synced) into every
 * snapshot's COW store and the new data is held here.  A committer
 * thread makes the queued exceptions durable in rounds as large as the
 * queue, and only then writes the held data to the origin, in the order
 * the writes were acknowledged.  See docs/design.md section 5.
 *
 * Ordering rules, which every function below keeps:
 * - A held write is registered (writeback_hold_first) before any of its
 *   copy-outs publishes an exception, so that a later writer that finds
 *   the chunk remapped also finds the held write and goes after it
 *   (writeback_order_after_held).
 * - The committer takes no geometry lock: writeback_drain may be called
 *   with the write side held (snapshot create, drop, merge start).
 * - Copy-out (copy-out.c) does not call write-back: it hands deferred
 *   batches and urges through the engine's copy_deferral, which
 *   writeback_open sets, and the committer drives the deferred_copy_*
 *   steps.
 * - Writers wait for room with no geometry lock held.
 */
#ifndef SNAPFG_WRITEBACK_H
#define SNAPFG_WRITEBACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "held-queue.h"
#include "device.h"

struct snapfg_engine;

/* Set up write-back for the engine.  With on false, or until
 * writeback_start, nothing is held and every request behaves as with
 * writeback=off.  Either way a held file left by an unclean stop of this
 * origin's server is found and checked here (refused with a message
 * naming it if it belongs to another boot, origin or is damaged) and
 * kept for writeback_replay.
 */
struct writeback_options {
  bool on;                        /* writeback=on */
  uint64_t max;                   /* writeback-max= */
  const char *held_dir;           /* held-dir=, or NULL: the default */
  bool held_on_disk;              /* held-dir-on-disk=true */
};
extern int writeback_open (struct snapfg_engine *e,
                           const struct writeback_options *o);
/* A replay after an unclean stop (writeback-replay.c): the writes of a
 * held file left by it, made by the engine's request path
 * (origin_replay_held) before the committer starts, before any client
 * and before a new snapshot is inserted (its instant must include every
 * acknowledged write).
 *
 * writeback_replay_check: nothing pending (*n 0), or the stores the file
 * is bound to are attached and every record's data passes its checksum
 * (*n records, none longer than *max_count); -errno with the refusal
 * logged (then nothing may be written).
 * writeback_replay_get: record i, in sequence order, and its data (buf:
 * *max_count bytes) unless it has none or is dropped.
 * writeback_replay_finish: after the origin is synced: the file goes, a
 * new one is made (write-back on), and the log says what was replayed.
 */
struct writeback_replayed {
  uint64_t seq;
  int op;                         /* enum origin_op */
  uint64_t offset;
  uint32_t count;
  unsigned flags;                 /* SNAPFG_REQ_MAY_TRIM */
  bool dropped;                   /* cancelled or lost: never applied */
};
extern bool writeback_replay_pending (const struct snapfg_engine *e);
extern bool writeback_replay_binds (const struct snapfg_engine *e,
                                    const char *uuid);
/* A store the pending replay's file is bound to was dropped at this
 * start on purpose (a temporary snapshot: its run ended with the
 * server): its snapshot is gone, so the replay needs no copy in it.
 */
extern void writeback_replay_release_store (struct snapfg_engine *e,
                                            const char *uuid);
extern int writeback_replay_check (struct snapfg_engine *e, size_t *n,
                                   uint32_t *max_count);
extern int writeback_replay_get (struct snapfg_engine *e, size_t i,
                                 struct writeback_replayed *w, void *buf);
extern int writeback_replay_finish (struct snapfg_engine *e,
                                    uint64_t applied, uint64_t bytes);
/* The snapshot list changed (nothing is held: it was drained): bind the
 * held file to the stores now listed.  Geometry write side held.
 */
extern int writeback_bind_stores (struct snapfg_engine *e);
/* Start the committer (after nbdkit has forked). */
extern int writeback_start (struct snapfg_engine *e);
/* Apply everything held, stop the committer and free (engine close). */
extern void writeback_close (struct snapfg_engine *e);

/* Is write-back holding first writes now? */
extern bool writeback_active (const struct snapfg_engine *e);

/* The cost of holding a request of count bytes, as writeback-max counts. */
extern uint64_t writeback_cost (int op, uint32_t count);
extern uint64_t writeback_max (const struct snapfg_engine *e);

/* Register a first write (op: enum origin_op) as held, before its
 * copy-outs.  NULL with *r = -EAGAIN when there is no room (release the
 * geometry lock, writeback_wait_room, try again), or with *r = 1 when
 * there is no memory to hold it (logged): the caller changes the origin
 * as writeback=off does, its copies made durable first.
 */
extern struct held_write *writeback_hold_first (struct snapfg_engine *e,
                                                int op, const void *buf,
                                                uint32_t count,
                                                uint64_t offset,
                                                unsigned flags, int *r);
/* Wait until a request costing cost could be held (no geometry lock). */
extern void writeback_wait_room (struct snapfg_engine *e, uint64_t cost);
/* The held write's copy-outs are done: it is acknowledged, and the
 * committer may apply it once its exceptions are durable.  Returns 0,
 * or the error of one of its copies that the committer already found
 * failed (then the write is not done: writeback_cancel it and fail the
 * request).
 */
extern int writeback_ready (struct snapfg_engine *e, struct held_write *h);
/* Its copy-outs failed: the write is not done and never applied. */
extern void writeback_cancel (struct snapfg_engine *e, struct held_write *h);

/* An origin change whose chunks need no copy-out (any more): if it
 * overlaps held writes it must reach the origin after them.  Returns 1
 * if it is now held behind them (done, as far as the client goes), 0 if
 * the caller applies it to the origin itself (nothing held overlaps, or
 * this waited until the overlapping writes were applied, or there was
 * no memory to hold it: logged).
 */
extern int writeback_order_after_held (struct snapfg_engine *e, int op,
                                       const void *buf, uint32_t count,
                                       uint64_t offset, unsigned flags);

/* An origin copy-out batch under write-back (copy-out.h): the committer
 * copies, commits and publishes it in its next round, before any held
 * write of that round reaches the origin.
 */
struct deferred_copy;
extern void writeback_defer_copy (struct snapfg_engine *e,
                                  struct deferred_copy *dc);
/* The committer could not read the origin for a copy of h's (err): h
 * must never reach the origin.  Before h is acknowledged (COPYING ->
 * REFUSED), its writer gets err (writeback_ready); after (READY ->
 * LOST), h is dropped and the next flush or FUA on every connection
 * fails.
 */
extern void writeback_copy_failed (struct snapfg_engine *e,
                                   struct held_write *h, int err);
/* A writer waits for a chunk that may be in a queued batch: start the
 * round now rather than gather more.  No stripe lock held.
 */
extern void writeback_urge (struct snapfg_engine *e);

/* Flush: wait until every write acknowledged so far is on the origin
 * (with its exceptions durable before it).  No geometry lock held.
 */
extern void writeback_wait_all (struct snapfg_engine *e);
/* With the geometry write side held: apply everything held. */
extern void writeback_drain (struct snapfg_engine *e);

/* Origin reads: the held writes overlapping [offset, offset+count),
 * taken before the origin is read and laid over what it returned after.
 * writeback_read_begin returns 0, or -ENOMEM (no view: fail the read).
 * writeback_read_end (ok: the origin read succeeded) returns 0, or the
 * error of reading a held write back (logged: fail the read).
 */
extern int writeback_read_begin (struct snapfg_engine *e, uint32_t count,
                                  uint64_t offset, struct held_view *v);
extern int writeback_read_end (struct snapfg_engine *e,
                               struct held_view *v, void *buf,
                               uint32_t count, uint64_t offset, bool ok);

/* The writeback-max to use: requested (0: the default), no more than a
 * half of what the process's memory cgroup has free at start-up (logged
 * once when a requested value is lowered).  writeback-limit.c.
 */
extern uint64_t writeback_max_for_memory (bool on, uint64_t requested);

/* Block status of the origin: the device's extents, with every part a
 * held write covers reported as data, never a hole or zero
 * (writeback-extents.c).  Returns fn's error or the device's.
 */
extern int writeback_origin_extents (struct snapfg_engine *e,
                                     uint32_t count, uint64_t offset,
                                     snapfg_extent_fn fn, void *opaque);

#endif
