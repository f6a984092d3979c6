/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the persistent store's group commit (see store-persistent.h).
 *
 * Crash safety comes from ordering.  A copy-out writes the chunk's data,
 * then commits the exception: the data is made durable, then the
 * metadata area holding the new pair is written and made durable, and
 * only then does the engine let the origin chunk be overwritten.  After
 * a crash the store reopens with every exception whose origin chunk may
 * have changed.
 *
 * Group commit: concurrent copy-outs queue their pairs; one of them (the
 * leader) syncs once for all of them and writes their areas; the next
 * round's sync makes those areas durable while also covering the next
 * batch's data (see lead_commits), while the others wait.  Pairs go into
 * the areas in commit order, which need not be allocation order; a crash
 * loses only the chunks allocated but not yet committed (they are
 * reused after a restart unless a later-allocated chunk was committed,
 * in which case they stay allocated but unused).
 *
 * Before an area fills up, the next one is zeroed and made durable: a
 * full area makes a reader go on to the next one, which must end the
 * table instead of holding stale pairs.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>

#include "store-persistent.h"
#include "scoped-lock.h"
#include "snapfg-log.h"

/* The header as it must be now: with the unsynced mark while
 * ps->marked (then valid = 0 on disk, whatever 'valid' says, so that the
 * kernel never opens a store a power loss may have torn).
 */
int
persistent_write_header (struct persistent_store *ps, uint32_t valid)
{
  unsigned char buf[512] = { 0 };
  struct dm_header h = {
    .magic = DM_SNAP_MAGIC,
    .valid = ps->marked ? 0 : valid,
    .version = DM_SNAP_VERSION,
    .chunk_sectors = ps->base.chunk_size / 512,
    .snapfg_merging = ps->merging,
  };

  if (ps->marked)
    memcpy (h.snapfg_unsynced_boot, ps->boot_id,
            strnlen (ps->boot_id, SNAPFG_UNSYNCED_BOOT_LEN));
  dm_header_encode (&h, buf);
  memcpy (buf + STORE_BINDING_OFFSET, ps->binding_raw, STORE_BINDING_SIZE);
  return device_pwrite (&ps->base.dev, buf, sizeof buf, 0);
}

int
persistent_sync (struct persistent_store *ps)
{
  uint64_t start = snapfg_debug_commit ? now_ns () : 0;
  int r;

  atomic_fetch_add (&ps->syncs, 1);
  r = device_flush (&ps->base.dev);
  if (snapfg_debug_commit) {
    uint64_t ns = now_ns () - start;

    pthread_mutex_lock (&ps->debug_lock);
    ps->debug.syncs++;
    ps->debug.sync_ns += ns;
    if (ns > ps->debug.sync_max_ns)
      ps->debug.sync_max_ns = ns;
    pthread_mutex_unlock (&ps->debug_lock);
  }
  return r;
}

/* -D snapfg.commit=1: say what the interval's commits did, and start a
 * new interval.  Called with debug_lock held.
 */
static void
report_commits (struct persistent_store *ps, uint64_t now, const char *when)
{
  struct commit_debug *d = &ps->debug;
  double secs = (now - d->since_ns) / 1e9;

  if (d->calls || d->syncs)
    snapfg_debug ("cow=%s: commit: %s %.2f s: %" PRIu64 " exceptions in %"
                  PRIu64 " commit calls (wait mean %.0f us, max %.0f us); %"
                  PRIu64 " groups (exceptions per group mean %.1f, max %"
                  PRIu64 "); %" PRIu64 " syncs (mean %.0f us, max %.0f us); "
                  "%.3f syncs per exception",
                  ps->base.dev.path, when, secs, d->exceptions, d->calls,
                  d->calls ? d->wait_ns / 1e3 / d->calls : 0.0,
                  d->wait_max_ns / 1e3, d->groups,
                  d->groups ? (double) d->exceptions / d->groups : 0.0,
                  d->group_max, d->syncs,
                  d->syncs ? d->sync_ns / 1e3 / d->syncs : 0.0,
                  d->sync_max_ns / 1e3,
                  d->exceptions ? (double) d->syncs / d->exceptions : 0.0);
  memset (d, 0, sizeof *d);
  d->since_ns = now;
}

/* -D snapfg.commit=1: account one commit call of n exceptions that
 * waited wait_ns.
 */
static void
debug_commit_call (struct persistent_store *ps, size_t n, uint64_t wait_ns)
{
  uint64_t now = now_ns ();

  pthread_mutex_lock (&ps->debug_lock);
  ps->debug.calls++;
  ps->debug.exceptions += n;
  ps->debug.wait_ns += wait_ns;
  if (wait_ns > ps->debug.wait_max_ns)
    ps->debug.wait_max_ns = wait_ns;
  if (ps->debug.since_ns == 0)
    ps->debug.since_ns = now - wait_ns;
  else if (now - ps->debug.since_ns >= 1000000000)
    report_commits (ps, now, "last");
  pthread_mutex_unlock (&ps->debug_lock);
}

static void
debug_group (struct persistent_store *ps, size_t n)
{
  pthread_mutex_lock (&ps->debug_lock);
  ps->debug.groups++;
  if (n > ps->debug.group_max)
    ps->debug.group_max = n;
  pthread_mutex_unlock (&ps->debug_lock);
}

/* Under ps->lock: wake every waiter whose pairs are durable (all of
 * them if the store failed).  Tickets grow in queue order, so they are
 * at the front.
 */
static void
wake_durable (struct persistent_store *ps)
{
  struct commit_waiter *w;

  while ((w = ps->waiters) != NULL &&
         (w->ticket <= ps->durable || ps->failed)) {
    ps->waiters = w->next;
    if (ps->waiters == NULL)
      ps->waiters_tail = &ps->waiters;
    w->queued = false;
    pthread_cond_signal (&w->wake);
  }
}

static void
enqueue_waiter (struct persistent_store *ps, struct commit_waiter *w)
{
  w->next = NULL;
  w->queued = true;
  *ps->waiters_tail = w;
  ps->waiters_tail = &w->next;
}

static void
dequeue_waiter (struct persistent_store *ps, struct commit_waiter *w)
{
  struct commit_waiter **pp;

  if (!w->queued)
    return;
  for (pp = &ps->waiters; *pp != w; pp = &(*pp)->next)
    ;
  *pp = w->next;
  if (ps->waiters_tail == &w->next)
    ps->waiters_tail = pp;
  w->queued = false;
}

int
persistent_zero_area (struct persistent_store *ps, uint64_t area)
{
  struct snapfg_store *st = &ps->base;
  uint64_t chunk = dm_area_chunk (area, ps->pairs_per_area);

  /* A fresh buffer of zeroes the size of a chunk; areas are rare. */
  void *zeroes = calloc (1, st->chunk_size);
  int r;

  if (zeroes == NULL)
    return -ENOMEM;
  r = device_pwrite (&st->dev, zeroes, st->chunk_size,
                     store_chunk_offset (st, chunk));
  free (zeroes);
  return r;
}


/* Zeroing ahead of the allocator.  A sync that has to allocate blocks
 * for the chunks it makes durable costs a journal commit; chunks already
 * written (with zeroes) are plain overwrites, and their syncs measured
 * shorter here (fdatasync of 40 KiB: 0.12-0.20 ms against 0.25-0.50 ms
 * into a growing file; random first writes 1.3 x faster into a pre-zeroed
 * store).  So while commits come in small groups the leader keeps a
 * window of chunks past the allocator written with zeroes, a few MiB at a
 * time; large groups (sequential writes) amortise their syncs already and
 * skip it.  A chunk is never zeroed once allocated: the leader announces
 * the range first (zeroing_from) and gives up if the allocator has got
 * there; an allocator that takes chunks of an announced range waits until
 * the zeroes are written before its data goes there.
 */
#define ZERO_AHEAD_WINDOW (8 * 1024 * 1024)  /* bytes zeroed at a time */
#define ZERO_AHEAD_LOW (4 * 1024 * 1024)     /* start when less is left */
#define ZERO_AHEAD_IO (1024 * 1024)
#define ZERO_AHEAD_MAX_GROUP 64              /* pairs per round, at most */
#define ZEROING_NONE UINT64_MAX

static void
zero_data_ahead (struct persistent_store *ps, size_t group)
{
  struct snapfg_store *st = &ps->base;
  uint64_t next = atomic_load (&st->next_chunk);
  uint64_t start, end, window = ZERO_AHEAD_WINDOW >> st->chunk_shift;
  int r = 0;

  /* A fixed-size disk (block device, NBD export) has no file system
   * here allocating its blocks: nothing to gain.
   */
  if (ps->zero_ahead_off || group > ZERO_AHEAD_MAX_GROUP ||
      st->dev.fixed_size || window == 0)
    return;
  if (ps->zeroed_end >= next + (ZERO_AHEAD_LOW >> st->chunk_shift))
    return;                     /* enough zeroed space ahead */
  start = ps->zeroed_end > next ? ps->zeroed_end : next;
  end = start + window < st->max_chunks ? start + window : st->max_chunks;
  if (start >= end)
    return;

  /* Announce, then look again: an allocator that got past 'start' in
   * between wins (these chunks are its now), and one that gets there
   * later sees the announcement and waits.
   */
  atomic_store (&ps->zeroing_from, start);
  if (atomic_load (&st->next_chunk) > start) {
    pthread_mutex_lock (&ps->lock);
    atomic_store (&ps->zeroing_from, ZEROING_NONE);
    pthread_cond_broadcast (&ps->zeroed);
    pthread_mutex_unlock (&ps->lock);
    return;
  }
  if (ps->zero_buf == NULL)
    ps->zero_buf = calloc (1, ZERO_AHEAD_IO);
  if (ps->zero_buf == NULL)
    r = -ENOMEM;
  for (uint64_t off = start << st->chunk_shift;
       r == 0 && off < end << st->chunk_shift; off += ZERO_AHEAD_IO) {
    uint64_t len = (end << st->chunk_shift) - off;

    r = device_pwrite (&st->dev, ps->zero_buf,
                       len < ZERO_AHEAD_IO ? len : ZERO_AHEAD_IO, off);
  }
  if (r == 0)
    ps->zeroed_end = end;
  else {
    /* Only an optimisation: never let it fail a commit. */
    snapfg_debug ("cow=%s: zeroing ahead of the allocator failed (%s); "
                  "not trying again", st->dev.path, strerror (-r));
    ps->zero_ahead_off = true;
  }
  pthread_mutex_lock (&ps->lock);
  atomic_store (&ps->zeroing_from, ZEROING_NONE);
  pthread_cond_broadcast (&ps->zeroed);
  pthread_mutex_unlock (&ps->lock);
}

/* After taking [first, first + n): wait while the leader is zeroing a
 * range these chunks are in.
 */
void
persistent_wait_zeroing (struct persistent_store *ps, uint64_t first,
                         uint64_t n)
{
  uint64_t from = atomic_load (&ps->zeroing_from);

  if (from == ZEROING_NONE || first + n <= from)
    return;
  pthread_mutex_lock (&ps->lock);
  while ((from = atomic_load (&ps->zeroing_from)) != ZEROING_NONE &&
         first + n > from)
    pthread_cond_wait (&ps->zeroed, &ps->lock);
  pthread_mutex_unlock (&ps->lock);
}

static void
write_area_pair (struct persistent_store *ps, const struct store_pair *p)
{
  dm_pair_encode (ps->area_buf + ps->area_used * DM_SNAP_PAIR_SIZE,
                  p->old_chunk, p->new_chunk);
  ps->area_used++;
}

int
persistent_write_current_area (struct persistent_store *ps)
{
  struct snapfg_store *st = &ps->base;
  uint64_t chunk = dm_area_chunk (ps->current_area, ps->pairs_per_area);

  return device_pwrite (&st->dev, ps->area_buf, st->chunk_size,
                        store_chunk_offset (st, chunk));
}

/* Before a batch of n pairs is written, every area it could fill must
 * be followed by a zeroed area (made durable by the sync that precedes
 * the area writes).
 */
static int
zero_areas_ahead (struct persistent_store *ps, size_t n)
{
  uint64_t last_area = ps->current_area
    + (ps->area_used + n) / ps->pairs_per_area;
  int r;

  while (ps->zeroed_through < last_area + 1) {
    /* An area past the end of the store is never needed: the allocator
     * keeps the area before it from filling up.
     */
    if (dm_area_chunk (ps->zeroed_through + 1, ps->pairs_per_area)
        >= ps->base.max_chunks)
      break;
    r = persistent_zero_area (ps, ps->zeroed_through + 1);
    if (r < 0)
      return r;
    ps->zeroed_through++;
  }
  return 0;
}

/* Put a batch of pairs into the areas, in commit order, and write every
 * area touched.  Not durable until the next sync.
 */
static int
write_pairs (struct persistent_store *ps, const struct store_pair *pairs, size_t n)
{
  int r;

  for (size_t i = 0; i < n; ++i) {
    write_area_pair (ps, &pairs[i]);
    if (ps->area_used == ps->pairs_per_area) {
      r = persistent_write_current_area (ps);
      if (r < 0)
        return r;
      ps->current_area++;
      ps->area_used = 0;
      memset (ps->area_buf, 0, ps->base.chunk_size);
      atomic_store (&ps->metadata_areas, ps->current_area + 1);
    }
  }
  if (ps->area_used > 0)
    return persistent_write_current_area (ps);
  return 0;
}

/* Queue n pairs for the next batch, all or none. */
static int
queue_pairs (struct persistent_store *ps, const struct store_pair *pairs,
             size_t n)
{
  int r = pair_vector_reserve (&ps->queue, n);

  if (r < 0)
    return r;
  memcpy (&ps->queue.ptr[ps->queue.len], pairs, n * sizeof *pairs);
  ps->queue.len += n;
  return 0;
}

/* The leader's loop, entered and left with ps->lock held.  Each round
 * takes the queued pairs, syncs once, and then writes them into their
 * areas.  That one sync makes the queued pairs' data durable *and* the
 * areas written in the previous round durable, so under load a commit
 * costs one sync per round, shared by every pair in it.  The leader
 * stops when its own pair is durable; a waiter takes over any rest.
 */
static void
lead_commits (struct persistent_store *ps, uint64_t mine)
{
  while (ps->durable < mine && ps->failed == 0) {
    /* The queue becomes this round's batch; new pairs go into the
     * (empty) vector of the last one.
     */
    pair_vector batch = ps->queue;
    size_t n = batch.len;
    uint64_t queued_upto = ps->queued, written_upto = ps->written;
    int r;

    ps->queue = ps->batch;
    pair_vector_clear (&ps->queue);
    pthread_mutex_unlock (&ps->lock);

    r = zero_areas_ahead (ps, n);
    if (r == 0)
      zero_data_ahead (ps, n);
    if (r == 0)
      r = persistent_sync (ps);
    if (r == 0) {
      pthread_mutex_lock (&ps->lock);
      ps->durable = written_upto;       /* areas written last round */
      wake_durable (ps);
      pthread_mutex_unlock (&ps->lock);
      r = write_pairs (ps, batch.ptr, n);   /* data of this batch is durable */
      if (r == 0 && n > 0) {
        atomic_fetch_add (&ps->groups, 1);
        if (snapfg_debug_commit)
          debug_group (ps, n);
      }
    }

    pthread_mutex_lock (&ps->lock);
    ps->batch = batch;
    if (r < 0) {
      ps->failed = r;
      wake_durable (ps);
    }
    else
      ps->written = queued_upto;
  }
}

/* durability=flush: the pairs go into their areas now, after their data
 * (a process crash keeps both, in this order, in the page cache), and
 * become durable at the next flush.  A power loss before that is caught
 * by the unsynced mark.  Called with ps->lock held.
 */
static int
commit_unsynced (struct persistent_store *ps, const struct store_pair *pairs,
                 size_t n)
{
  int r = zero_areas_ahead (ps, n);

  if (r == 0)
    r = write_pairs (ps, pairs, n);
  if (r < 0) {
    ps->failed = r;
    return r;
  }
  atomic_fetch_add (&ps->groups, 1);
  if (snapfg_debug_commit)
    debug_group (ps, n);
  return 0;
}

/* Queue the pairs and wait until they are durable, leading rounds of the
 * group commit while no one else does.  Called with ps->lock held.
 */
static int
commit_synced (struct persistent_store *ps, const struct store_pair *pairs,
               size_t n)
{
  struct commit_waiter w;
  uint64_t mine;
  int r;

  r = queue_pairs (ps, pairs, n);
  if (r < 0)
    return r;
  ps->queued += n;
  mine = ps->queued;

  w.ticket = mine;
  w.queued = false;
  pthread_cond_init (&w.wake, NULL);
  while (ps->durable < mine && ps->failed == 0) {
    if (ps->leader_active) {
      if (!w.queued)
        enqueue_waiter (ps, &w);
      pthread_cond_wait (&w.wake, &ps->lock);
      continue;
    }
    dequeue_waiter (ps, &w);
    ps->leader_active = true;
    lead_commits (ps, mine);
    ps->leader_active = false;
    /* Pairs of others may still be queued: the oldest waiter leads on. */
    if (ps->waiters)
      pthread_cond_signal (&ps->waiters->wake);
  }
  dequeue_waiter (ps, &w);
  pthread_cond_destroy (&w.wake);
  return ps->durable >= mine ? 0 : ps->failed;
}

int
persistent_commit (struct snapfg_store *st, const struct store_pair *pairs,
                   size_t n)
{
  struct persistent_store *ps = ps_of (st);
  uint64_t start = snapfg_debug_commit ? now_ns () : 0;
  int r;

  if (n == 0)
    return 0;
  {
    SCOPED_MUTEX_LOCK (&ps->lock);

    r = ps->failed;
    if (r == 0)
      r = ps->unsynced ? commit_unsynced (ps, pairs, n)
                       : commit_synced (ps, pairs, n);
  }
  if (r == 0) {
    atomic_fetch_add (&ps->commits, n);
    atomic_fetch_add (&ps->commit_calls, 1);
    if (snapfg_debug_commit)
      debug_commit_call (ps, n, now_ns () - start);
  }
  return r;
}

/* --- setting up and tearing down --- */

void
persistent_commit_init (struct persistent_store *ps)
{
  pthread_mutex_init (&ps->lock, NULL);
  pthread_mutex_init (&ps->debug_lock, NULL);
  pthread_cond_init (&ps->zeroed, NULL);
  atomic_init (&ps->zeroing_from, ZEROING_NONE);
  ps->waiters_tail = &ps->waiters;
}

void
persistent_commit_destroy (struct persistent_store *ps)
{
  if (snapfg_debug_commit) {
    pthread_mutex_lock (&ps->debug_lock);
    report_commits (ps, now_ns (), "at close, last");
    pthread_mutex_unlock (&ps->debug_lock);
  }
  pthread_mutex_destroy (&ps->debug_lock);
  pthread_cond_destroy (&ps->zeroed);
  pthread_mutex_destroy (&ps->lock);
  free (ps->zero_buf);
  pair_vector_reset (&ps->queue);
  pair_vector_reset (&ps->batch);
}
