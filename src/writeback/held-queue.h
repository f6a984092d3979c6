/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the queue of held writes and its indexes
 * (held-queue.c).  Pure data: no threads, no I/O, no engine.  Every
 * function named held_queue_* runs under the write-back lock
 * (writeback-internal.h), which the caller holds; held_write_transition
 * and held_view_* need no lock.
 *
 * A held write is a first write (or zero, or trim) to the origin that
 * was acknowledged before it reached the origin: its data waits in the
 * held file until the committer has made the exceptions it needs
 * durable (docs/design.md section 5).  Its state:
 *
 * | state     | acknowledged | reads see it | committer        | next      |
 * |-----------|--------------|--------------|------------------|-----------|
 * | COPYING   | not yet      | no           | waits at it      | READY, REFUSED, CANCELLED |
 * | READY     | yes          | yes          | applies it       | LOST      |
 * | REFUSED   | never        | no           | waits at it      | CANCELLED |
 * | CANCELLED | never        | no           | skips it         | (freed)   |
 * | LOST      | yes          | no           | skips it, counts | (freed)   |
 *
 * - COPYING -> READY: the writer's copy-outs are done; the request is
 *   acknowledged (writeback_ready).
 * - COPYING -> REFUSED: the committer could not read the origin for one
 *   of its copies before the writer finished; the writer fails the
 *   request with that error (h->error) and then cancels.
 * - COPYING or REFUSED -> CANCELLED: the writer failed the request; the
 *   write is never applied (writeback_cancel).
 * - READY -> LOST: a copy of it failed after the acknowledgement: it must
 *   never reach the origin (the snapshot would lose the chunk); the
 *   committer logs it and the next flush or FUA fails.
 * - A write held behind others (writeback_order_after_held) is made
 *   READY at once: it has no copy-out.
 * Every state but COPYING and REFUSED is *settled*: the committer may
 * take it out of the queue.  A held write leaves the queue only from
 * its front, in sequence order, once applied or skipped.
 */
#ifndef SNAPFG_HELD_QUEUE_H
#define SNAPFG_HELD_QUEUE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum held_state {
  HELD_COPYING,
  HELD_READY,
  HELD_REFUSED,
  HELD_CANCELLED,
  HELD_LOST,
};

/* Operations, as the engine's enum origin_op numbers them. */
struct held_write;

/* A held write in one list of the read index. */
struct held_link {
  struct held_link *next;
  struct held_write *h;
  uint64_t granule;               /* or HELD_LINK_WIDE */
};
#define HELD_LINK_WIDE UINT64_MAX

struct held_list {
  struct held_link *head, **tailp;
};

struct held_write {
  /* The queue's link: set under the lock, read without it by the
   * committer walking the settled front (atomically).
   */
  struct held_write *next;
  uint64_t seq;                   /* set by held_queue_append */
  /* Set when made, then read only. */
  int op;                         /* enum origin_op */
  unsigned flags;                 /* SNAPFG_REQ_MAY_TRIM only */
  uint64_t offset;
  uint32_t count;
  uint64_t cost;                  /* as writeback-max counts it */
  /* ORIGIN_WRITE: the new data in the held file (held-file.h);
   * data_extent 0: no data (zero, trim).
   */
  uint64_t data_off;
  uint64_t data_extent;
  uint32_t data_crc;              /* CRC-32C of the data (its record's) */
  /* enum held_state; changed only by held_write_transition. */
  atomic_int state;
  /* REFUSED: the error the writer returns (set before the transition). */
  int error;
  /* References: the queue's, and each reader's laying it over. */
  atomic_int refs;
  unsigned nlinks;                /* in the read index (under the lock) */
  struct held_link links[];       /* next to the header: one allocation */
};

/* Move h from state 'from' to 'to' if it is in 'from' (atomic compare
 * and exchange).  Returns true if this call made the transition.  A
 * transition not in the table above aborts: it is a bug.
 */
extern bool held_write_transition (struct held_write *h,
                                   enum held_state from, enum held_state to);
extern enum held_state held_write_state (const struct held_write *h);
/* May the committer take it out of the queue? */
extern bool held_write_settled (const struct held_write *h);
extern const char *held_state_name (enum held_state s);

/* A new held write (state COPYING, or READY with ready), one reference,
 * not queued, with no data yet.  NULL if there is no memory.
 */
extern struct held_write *held_write_new (int op, unsigned flags,
                                          uint64_t offset, uint32_t count,
                                          bool ready);
/* What holding a request of count bytes costs, as writeback-max counts
 * it: the header with its links, the allocation's overhead, and data
 * (with_data) in whole pages of the held file.
 */
extern uint64_t held_write_cost (bool with_data, uint32_t count);

/* The queue: a FIFO in sequence (acknowledgement) order, with two
 * indexes of the ranges it holds.
 */
#define HELD_INDEX_BITS 16
struct held_queue {
  struct held_write *head, **tailp;
  uint64_t last_seq;              /* the newest queued write's */
  uint64_t applied_seq;           /* every write up to it is retired */
  uint64_t held_bytes;            /* cost of what is queued, and of
                                   * anything else the owner counts
                                   * (held_queue_charge) */
  uint64_t held_writes;
  /* "Anything held?" read without the lock (a hint: recheck under it). */
  atomic_uint_least64_t nheld;
  /* How many queued writes touch each 1 MiB granule (a counting hash:
   * a false positive costs a look, never a wrong answer).
   */
  uint32_t overlap_count[1u << HELD_INDEX_BITS];
  /* The read index: the writes over each 64 KiB granule, and one list
   * of the writes wider than that many granules.
   */
  struct held_list read_lists[1u << HELD_INDEX_BITS];
  struct held_list wide;
};

extern void held_queue_init (struct held_queue *q);

/* Append h (sequence number last_seq + 1) and index it. */
extern void held_queue_append (struct held_queue *q, struct held_write *h);

/* Might a queued write overlap [offset, offset + count)? */
extern bool held_queue_overlaps (const struct held_queue *q,
                                 uint64_t offset, uint32_t count);

/* Would a request costing cost fit beside what is held, in max? */
extern bool held_queue_has_room (const struct held_queue *q, uint64_t cost,
                                 uint64_t max);

/* Count (delta > 0) or give back (delta < 0) bytes held outside the
 * queue (copy-out batches waiting for a round).
 */
extern void held_queue_charge (struct held_queue *q, int64_t delta);

/* The last of the settled writes from first on (first settled), walked
 * WITHOUT the lock: only the committer takes writes out, so the front
 * stays; the links are read atomically (a writer may be appending).
 */
extern struct held_write *held_queue_settled_end (struct held_write *first);

/* Take first .. last (the front of the queue) out of the queue and its
 * indexes; applied_seq becomes last's.  Returns the bytes they cost,
 * which stay counted in held_bytes until the caller gives them back
 * (held_queue_charge) once their memory is freed.
 */
extern uint64_t held_queue_remove_front (struct held_queue *q,
                                         struct held_write *first,
                                         struct held_write *last);

/* What an origin read lays over what it read: the READY writes that
 * overlap it, each with a reference, in sequence order.
 */
struct held_view {
  struct held_write **w;
  size_t n, cap;
  bool failed;                    /* no memory for one of them */
  struct held_write *inline_w[8];
};
extern void held_view_init (struct held_view *v);
/* Under the lock: collect them.  v->failed if memory ran out (the view
 * is then incomplete: the read must fail).
 */
extern void held_queue_collect (const struct held_queue *q,
                                uint64_t offset, uint32_t count,
                                struct held_view *v);
/* The part of h that lies in [offset, offset + count): [*from, *to). */
extern void held_view_clip (const struct held_write *h, uint64_t offset,
                            uint32_t count, uint64_t *from, uint64_t *to);

/* Drop a reference; returns true if it was the last (the caller frees
 * h's data, then h).
 */
extern bool held_write_put (struct held_write *h);

#endif
