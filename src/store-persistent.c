/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the persistent exception store, in Linux dm-snapshot's on-disk
 * format (dm-format.h, docs/design.md section 5).
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "store.h"
#include "rounding.h"
#include "dm-format.h"
#include "store-binding.h"
#include "snapfg-log.h"

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
  struct store_pair *queue;           /* pairs waiting for the next batch */
  size_t nqueue, queue_cap;
  struct store_pair *batch;           /* the leader's batch (swapped with queue) */
  size_t batch_cap;
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

static struct persistent_store *
ps_of (struct snapfg_store *st)
{
  return (struct persistent_store *) st;
}

static uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int
ps_sync (struct persistent_store *ps)
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

/* The header as it must be now: with the unsynced mark while
 * ps->marked (then valid = 0 on disk, whatever 'valid' says, so that the
 * kernel never opens a store a power loss may have torn).
 */
static int
write_header (struct persistent_store *ps, uint32_t valid)
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

static int
zero_area (struct persistent_store *ps, uint64_t area)
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

static void wait_zeroing (struct persistent_store *ps, uint64_t first,
                          uint64_t n);

static int
persistent_alloc_run (struct snapfg_store *st, uint64_t want,
                      uint64_t *first, uint64_t *got)
{
  struct persistent_store *ps = ps_of (st);
  const uint64_t ppa = ps->pairs_per_area;
  uint64_t chunk = atomic_load (&st->next_chunk);
  uint64_t n, next;

  /* A bump pointer that hops over metadata areas, without a lock.  A run
   * ends before the next metadata area (it is one write in the COW
   * device).  The last data chunk of a region is only handed out if the
   * next area fits in the store too: handing it out lets the region's
   * area fill up, and a full area must be followed by a zeroed one (the
   * table's end).
   */
  do {
    /* chunk is a data chunk of the region after area (chunk - 1) / (ppa + 1);
     * the next area starts at area_next.
     */
    uint64_t area_next = 1 + ((chunk - 1) / (ppa + 1) + 1) * (ppa + 1);
    uint64_t end;               /* the run ends before this chunk */

    if (area_next < st->max_chunks)
      end = area_next;
    else                        /* keep the region's last chunk back */
      end = area_next - 1 < st->max_chunks ? area_next - 1 : st->max_chunks;
    if (chunk >= end)
      return -ENOSPC;
    n = end - chunk < want ? end - chunk : want;
    next = dm_skip_metadata (chunk + n, ppa);
  } while (!atomic_compare_exchange_weak (&st->next_chunk, &chunk, next));
  wait_zeroing (ps, chunk, n);
  *first = chunk;
  *got = n;
  return 0;
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
static void
wait_zeroing (struct persistent_store *ps, uint64_t first, uint64_t n)
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

static int
write_current_area (struct persistent_store *ps)
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
    r = zero_area (ps, ps->zeroed_through + 1);
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
      r = write_current_area (ps);
      if (r < 0)
        return r;
      ps->current_area++;
      ps->area_used = 0;
      memset (ps->area_buf, 0, ps->base.chunk_size);
      atomic_store (&ps->metadata_areas, ps->current_area + 1);
    }
  }
  if (ps->area_used > 0)
    return write_current_area (ps);
  return 0;
}

/* Queue n pairs for the next batch, all or none. */
static int
queue_pairs (struct persistent_store *ps, const struct store_pair *pairs,
             size_t n)
{
  if (ps->nqueue + n > ps->queue_cap) {
    size_t cap = ps->queue_cap ? ps->queue_cap : 64;
    struct store_pair *q;

    while (cap < ps->nqueue + n)
      cap *= 2;
    q = realloc (ps->queue, cap * sizeof *q);
    if (q == NULL)
      return -ENOMEM;
    ps->queue = q;
    ps->queue_cap = cap;
  }
  memcpy (&ps->queue[ps->nqueue], pairs, n * sizeof *pairs);
  ps->nqueue += n;
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
    struct store_pair *batch = ps->queue;
    size_t n = ps->nqueue, cap = ps->queue_cap;
    uint64_t queued_upto = ps->queued, written_upto = ps->written;
    int r;

    ps->queue = ps->batch;
    ps->queue_cap = ps->batch_cap;
    ps->nqueue = 0;
    pthread_mutex_unlock (&ps->lock);

    r = zero_areas_ahead (ps, n);
    if (r == 0)
      zero_data_ahead (ps, n);
    if (r == 0)
      r = ps_sync (ps);
    if (r == 0) {
      pthread_mutex_lock (&ps->lock);
      ps->durable = written_upto;       /* areas written last round */
      wake_durable (ps);
      pthread_mutex_unlock (&ps->lock);
      r = write_pairs (ps, batch, n);   /* data of this batch is durable */
      if (r == 0 && n > 0) {
        atomic_fetch_add (&ps->groups, 1);
        if (snapfg_debug_commit)
          debug_group (ps, n);
      }
    }

    pthread_mutex_lock (&ps->lock);
    ps->batch = batch;
    ps->batch_cap = cap;
    if (r < 0) {
      ps->failed = r;
      wake_durable (ps);
    }
    else
      ps->written = queued_upto;
  }
}

static int
persistent_commit (struct snapfg_store *st, const struct store_pair *pairs,
                   size_t n)
{
  struct persistent_store *ps = ps_of (st);
  uint64_t start = snapfg_debug_commit ? now_ns () : 0;
  struct commit_waiter w;
  uint64_t mine;
  int r = 0;

  if (n == 0)
    return 0;
  pthread_mutex_lock (&ps->lock);
  if (ps->failed) {
    r = ps->failed;
    pthread_mutex_unlock (&ps->lock);
    return r;
  }
  if (ps->unsynced) {
    /* durability=flush: the pairs go into their areas now, after their
     * data (a process crash keeps both, in this order, in the page
     * cache), and become durable at the next flush.  A power loss before
     * that is caught by the unsynced mark.
     */
    r = zero_areas_ahead (ps, n);
    if (r == 0)
      r = write_pairs (ps, pairs, n);
    if (r < 0)
      ps->failed = r;
    else {
      atomic_fetch_add (&ps->commits, n);
      atomic_fetch_add (&ps->commit_calls, 1);
      atomic_fetch_add (&ps->groups, 1);
    }
    pthread_mutex_unlock (&ps->lock);
    if (snapfg_debug_commit && r == 0) {
      debug_group (ps, n);
      debug_commit_call (ps, n, now_ns () - start);
    }
    return r;
  }
  r = queue_pairs (ps, pairs, n);
  if (r < 0) {
    pthread_mutex_unlock (&ps->lock);
    return r;
  }
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
  r = ps->durable >= mine ? 0 : ps->failed;
  if (r == 0) {
    atomic_fetch_add (&ps->commits, n);
    atomic_fetch_add (&ps->commit_calls, 1);
  }
  pthread_mutex_unlock (&ps->lock);
  if (snapfg_debug_commit)
    debug_commit_call (ps, n, now_ns () - start);
  return r;
}

static int
persistent_load (struct snapfg_store *st, store_exception_fn fn, void *opaque)
{
  struct persistent_store *ps = ps_of (st);
  struct dm_load_result res;
  char why[256];
  int r;

  if (st->opened_invalid || ps->fresh)
    return 0;                   /* nothing to load, or not to be used */
  r = dm_load_exceptions (&st->dev, st->chunk_size,
                          div_round_up (st->origin_size, st->chunk_size),
                          fn, opaque, &res, why, sizeof why);
  if (r < 0) {
    snapfg_error ("cow=%s: %s; refusing to use it (the file is left "
                  "unchanged)", st->dev.path, why);
    return r;
  }
  if (res.next_free > st->max_chunks) {
    /* Accepting it would make the next copy-out find the store "full"
     * and invalidate the snapshot.
     */
    snapfg_error ("cow=%s: cow-size= allows %" PRIu64 " bytes, less than "
                  "the %" PRIu64 " bytes the store already uses (%" PRIu64
                  " chunks of %" PRIu32 "); give cow-size=%" PRIu64
                  " or more, or no cow-size= (the file is left unchanged)",
                  st->dev.path, st->max_chunks << st->chunk_shift,
                  res.next_free << st->chunk_shift, res.next_free,
                  st->chunk_size, res.next_free << st->chunk_shift);
    return -EINVAL;
  }
  ps->current_area = res.current_area;
  ps->area_used = res.area_used;
  ps->zeroed_through = res.current_area;
  atomic_store (&ps->metadata_areas, res.current_area + 1);
  atomic_store (&st->next_chunk, res.next_free);
  /* The current area's pairs: the next commit rewrites the area whole. */
  r = device_pread (&st->dev, ps->area_buf, st->chunk_size,
                    store_chunk_offset (st, dm_area_chunk (res.current_area,
                                                           ps->pairs_per_area)));
  if (r < 0) {
    snapfg_error ("cow=%s: cannot read metadata area %" PRIu64 ": %s",
                  st->dev.path, res.current_area, strerror (-r));
    return r;
  }
  /* Anything after the terminator is stale (the kernel would revive it
   * on its next append to this area): it must not be written back.
   */
  memset (ps->area_buf + ps->area_used * DM_SNAP_PAIR_SIZE, 0,
          st->chunk_size - ps->area_used * DM_SNAP_PAIR_SIZE);
  if (ps->binding_pending) {
    r = write_header (ps, 1);
    if (r == 0)
      r = ps_sync (ps);
    if (r < 0) {
      snapfg_error ("cow=%s: cannot write the binding record into the "
                    "header: %s", st->dev.path, strerror (-r));
      return r;
    }
    ps->binding_pending = false;
  }
  snapfg_debug ("cow=%s: reopened persistent store: %" PRIu64
                " exceptions, %" PRIu64 " metadata areas, next free chunk %"
                PRIu64, st->dev.path, res.exceptions, res.current_area + 1,
                res.next_free);
  return 0;
}

static int
persistent_flush (struct snapfg_store *st)
{
  return ps_sync (ps_of (st));
}

static void
persistent_invalidate (struct snapfg_store *st)
{
  struct persistent_store *ps = ps_of (st);
  int r;

  /* Say it on disk, durably, so that a restart keeps it Invalid.  The
   * commit lock orders this header write with the other header writers
   * (set_merge_mark) and makes the 'invalidated' check-and-set atomic.  It
   * does not stop a commit leader, which writes metadata areas with the
   * lock dropped; that is harmless, since the header is chunk 0 and no
   * area ever is.  Pairs committed after this are never read back: a
   * store whose header says valid = 0 is reopened without its table.
   */
  pthread_mutex_lock (&ps->lock);
  if (!ps->invalidated && !st->dev.readonly) {
    ps->invalidated = true;
    ps->marked = false;         /* Invalid for good, not just unsynced */
    r = write_header (ps, 0);
    if (r == 0)
      r = ps_sync (ps);
    if (r < 0)
      snapfg_error ("cow=%s: could not mark the store Invalid on disk: %s",
                    st->dev.path, strerror (-r));
  }
  pthread_mutex_unlock (&ps->lock);
}

static int
persistent_mark_dropped (struct snapfg_store *st)
{
  struct persistent_store *ps = ps_of (st);
  struct store_binding b;
  int r = 0;

  /* valid = 0 is what the kernel understands too; the binding says why. */
  pthread_mutex_lock (&ps->lock);
  if (!st->dev.readonly) {
    if (binding_decode (ps->binding_raw, &b) == 0 && b.present) {
      b.state = BINDING_DROPPED;
      binding_encode (&b, ps->binding_raw);
    }
    ps->invalidated = true;
    ps->marked = false;         /* dropped for good, not just unsynced */
    r = write_header (ps, 0);
    if (r == 0)
      r = ps_sync (ps);
    if (r < 0)
      snapfg_error ("cow=%s: could not mark the dropped store on disk: %s",
                    st->dev.path, strerror (-r));
  }
  pthread_mutex_unlock (&ps->lock);
  return r;
}

static void
persistent_usage (const struct snapfg_store *st, uint64_t *allocated,
                  uint64_t *total, uint64_t *metadata)
{
  struct persistent_store *ps = ps_of ((struct snapfg_store *) st);
  uint64_t next = atomic_load (&((struct snapfg_store *) st)->next_chunk);
  uint64_t sectors_per_chunk = st->chunk_size / 512;

  /* As dm reports it: allocated counts every chunk up to the next free
   * one, header and metadata included; metadata is the header and the
   * areas in use.
   */
  if (next > st->max_chunks)
    next = st->max_chunks;
  *allocated = next * sectors_per_chunk;
  *total = st->max_chunks * sectors_per_chunk;
  *metadata = (1 + atomic_load (&ps->metadata_areas)) * sectors_per_chunk;
}

static void
persistent_close (struct snapfg_store *st, bool clean)
{
  struct persistent_store *ps = ps_of (st);

  if (clean && !st->dev.readonly && !st->opened_invalid) {
    int r = ps_sync (ps);

    pthread_mutex_lock (&ps->lock);
    if (r == 0 && ps->marked && !ps->invalidated && ps->failed == 0) {
      /* Everything is durable now: the store is whole without the mark. */
      ps->marked = false;
      r = write_header (ps, 1);
      if (r == 0)
        r = ps_sync (ps);
      if (r < 0)
        snapfg_error ("cow=%s: could not clear the unsynced mark: %s (the "
                      "snapshot will open as Invalid after a reboot)",
                      st->dev.path, strerror (-r));
    }
    pthread_mutex_unlock (&ps->lock);
  }
  if (snapfg_debug_commit) {
    pthread_mutex_lock (&ps->debug_lock);
    report_commits (ps, now_ns (), "at close, last");
    pthread_mutex_unlock (&ps->debug_lock);
  }
  snapfg_debug ("cow=%s: %" PRIu64 " exceptions committed in %" PRIu64
                " groups with %" PRIu64 " syncs (%" PRIu64 " commit calls)",
                st->dev.path, (uint64_t) atomic_load (&ps->commits),
                (uint64_t) atomic_load (&ps->groups),
                (uint64_t) atomic_load (&ps->syncs),
                (uint64_t) atomic_load (&ps->commit_calls));
  device_close (&st->dev);
  pthread_mutex_destroy (&ps->debug_lock);
  pthread_cond_destroy (&ps->zeroed);
  pthread_mutex_destroy (&ps->lock);
  free (ps->zero_buf);
  free (ps->queue);
  free (ps->batch);
  free (ps->area_buf);
  free (ps);
}

/* --- merging (see store.h) --- */

static int
set_merge_mark (struct persistent_store *ps, bool merging)
{
  int r;

  pthread_mutex_lock (&ps->lock);
  ps->merging = merging;
  r = write_header (ps, 1);
  if (r == 0)
    r = ps_sync (ps);
  pthread_mutex_unlock (&ps->lock);
  if (r < 0)
    snapfg_error ("cow=%s: cannot write the merge mark in the header: %s",
                  ps->base.dev.path, strerror (-r));
  return r;
}

static int
persistent_merge_begin (struct snapfg_store *st)
{
  return set_merge_mark (ps_of (st), true);
}

static int
persistent_merge_end (struct snapfg_store *st)
{
  return set_merge_mark (ps_of (st), false);
}

static int
persistent_merge_last (struct snapfg_store *st, struct store_pair *pairs,
                       size_t max, size_t *n)
{
  struct persistent_store *ps = ps_of (st);
  int r = 0;

  pthread_mutex_lock (&ps->lock);
  if (ps->area_used == 0 && ps->current_area > 0) {
    /* The current area is empty: the table now ends with the previous,
     * full one.
     */
    uint64_t area = ps->current_area - 1;
    r = device_pread (&st->dev, ps->area_buf, st->chunk_size,
                      store_chunk_offset (st, dm_area_chunk
                                          (area, ps->pairs_per_area)));
    if (r == 0) {
      ps->current_area = area;
      ps->area_used = ps->pairs_per_area;
      atomic_store (&ps->metadata_areas, area + 1);
    }
  }
  *n = 0;
  while (r == 0 && *n < max && *n < ps->area_used) {
    size_t i = ps->area_used - 1 - *n;
    dm_pair_decode (ps->area_buf + i * DM_SNAP_PAIR_SIZE,
                    &pairs[*n].old_chunk, &pairs[*n].new_chunk);
    (*n)++;
  }
  pthread_mutex_unlock (&ps->lock);
  return r;
}

static int
persistent_merge_forget (struct snapfg_store *st, size_t n)
{
  struct persistent_store *ps = ps_of (st);
  int r;

  /* Zero the last n pairs: the table ends earlier, and every area stays
   * zero past its last pair.
   */
  pthread_mutex_lock (&ps->lock);
  ps->area_used -= n;
  memset (ps->area_buf + ps->area_used * DM_SNAP_PAIR_SIZE, 0,
          n * DM_SNAP_PAIR_SIZE);
  r = write_current_area (ps);
  if (r == 0)
    r = ps_sync (ps);
  pthread_mutex_unlock (&ps->lock);
  return r;
}

static const struct snapfg_store_ops persistent_ops = {
  .name = "persistent",
  .load = persistent_load,
  .alloc_run = persistent_alloc_run,
  .commit = persistent_commit,
  .flush = persistent_flush,
  .invalidate = persistent_invalidate,
  .mark_dropped = persistent_mark_dropped,
  .usage = persistent_usage,
  .merge_begin = persistent_merge_begin,
  .merge_last = persistent_merge_last,
  .merge_forget = persistent_merge_forget,
  .merge_end = persistent_merge_end,
  .close = persistent_close,
};

/* The kernel's id of this boot (SNAPFG_TEST_BOOT_ID for tests).  Returns
 * false if it cannot be read.
 */
static bool
read_boot_id (char *id, size_t len)
{
  const char *env = getenv ("SNAPFG_TEST_BOOT_ID");
  FILE *fp;
  bool ok;

  if (env && *env) {
    snprintf (id, len, "%s", env);
    return true;
  }
  fp = fopen ("/proc/sys/kernel/random/boot_id", "r");
  if (fp == NULL)
    return false;
  ok = fgets (id, len, fp) != NULL;
  fclose (fp);
  if (ok)
    id[strcspn (id, "\n")] = '\0';
  return ok && id[0] != '\0';
}

/* The header carries the unsynced mark: a server wrote the store with
 * durability=flush and did not close it cleanly.  If this is still the
 * boot it names, only that process died: the page cache holds every
 * write it made, in order, so the store is whole.  Otherwise the system
 * stopped (power loss, crash, reboot) while writes were not durable: the
 * table may point at data that never reached the disk, or miss chunks
 * whose origin did.  Then the snapshot is Invalid, for good.
 */
static int
check_unsynced_mark (struct persistent_store *ps, const char *path,
                     struct dm_header *h)
{
  struct snapfg_store *st = &ps->base;
  char now[SNAPFG_BOOT_ID_MAX] = "";

  if (h->valid != 0) {
    snapfg_error ("cow=%s: the header says valid = %" PRIu32 " and carries "
                  "snapfg's unsynced mark, which only a store with valid = 0 "
                  "can; refusing to use it (the file is left unchanged)",
                  path, h->valid);
    return -EINVAL;
  }
  if (read_boot_id (now, sizeof now) &&
      strncmp (now, h->snapfg_unsynced_boot, SNAPFG_UNSYNCED_BOOT_LEN) == 0) {
    snapfg_debug ("cow=%s: the server that wrote this store with "
                  "durability=flush stopped without closing it, in this "
                  "boot: the store is whole", path);
    st->opened_invalid = false;
    h->valid = 1;               /* what it says once the mark is gone */
    ps->recovered = true;
    /* Until set_unsynced_mark has synced, any header written keeps the
     * mark (and valid = 0 on disk).
     */
    ps->marked = true;
    snprintf (ps->boot_id, sizeof ps->boot_id, "%s", h->snapfg_unsynced_boot);
    return 0;
  }
  snapfg_error ("cow=%s: the system stopped uncleanly (boot %s, now %s) "
                "while this store was written with durability=flush, so "
                "its table may not match its data: the snapshot is now "
                "Invalid and its export fails every request", path,
                h->snapfg_unsynced_boot, now[0] ? now : "unknown");
  st->opened_invalid = true;
  ps->torn = true;              /* set_unsynced_mark drops the mark */
  return 0;
}

/* At the end of opening (after the binding checks, which may refuse
 * the store without anything written): a store found unsynced from an
 * earlier boot becomes Invalid for good, without the mark, so that no
 * later boot id can match.  With durability=flush, mark the store
 * unsynced (this boot's id, valid = 0 on disk) before anything is
 * written without a sync.  Without it, a store found unsynced from a
 * process crash of this boot is made durable and unmarked first, since
 * commits will be synced from now on.
 */
static int
set_unsynced_mark (struct persistent_store *ps,
                   const struct snapfg_store_params *params)
{
  struct snapfg_store *st = &ps->base;
  int r;

  if (ps->torn && !st->dev.readonly) {
    ps->marked = false;
    ps->merging = false;
    r = write_header (ps, 0);
    if (r == 0)
      r = ps_sync (ps);
    if (r < 0)
      snapfg_error ("cow=%s: could not write the Invalid header: %s",
                    params->path, strerror (-r));
    return 0;
  }
  if (st->opened_invalid || st->dev.readonly)
    return 0;
  if (params->unsynced) {
    if (!read_boot_id (ps->boot_id, sizeof ps->boot_id)) {
      snapfg_error ("cow=%s: durability=flush needs the kernel's boot id "
                    "(/proc/sys/kernel/random/boot_id) to tell a process "
                    "crash from a power loss, and it cannot be read "
                    "(use durability=sync)", params->path);
      return -EINVAL;
    }
    ps->unsynced = true;
    ps->marked = true;
  }
  else if (ps->recovered)
    ps->marked = false;
  else
    return 0;
  /* Whatever an earlier process left in the page cache becomes durable
   * before the header changes.
   */
  r = ps_sync (ps);
  if (r == 0)
    r = write_header (ps, 1);
  if (r == 0)
    r = ps_sync (ps);
  if (r < 0)
    snapfg_error ("cow=%s: cannot write the header: %s",
                  params->path, strerror (-r));
  return r;
}

/* Read the binding record of an existing store and decide, for the
 * opener in params->bind, whether it may be attached; prepare the
 * record to write (*write_binding: an existing store's record changes).
 */
static int
check_binding (struct persistent_store *ps,
               const struct snapfg_store_params *params,
               const struct dm_header *h, enum dm_header_kind kind,
               bool *write_binding)
{
  const struct binding_want *want = params->bind;
  struct store_binding found = { 0 }, b;
  unsigned char sector[512], encoded[STORE_BINDING_SIZE];
  int r;

  if (kind == DM_HEADER_VALID) {
    r = device_pread (&ps->base.dev, sector, sizeof sector, 0);
    if (r < 0) {
      snapfg_error ("cow=%s: cannot read the header: %s", params->path,
                    strerror (-r));
      return r;
    }
    memcpy (ps->binding_raw, sector + STORE_BINDING_OFFSET,
            STORE_BINDING_SIZE);
    if (binding_decode (ps->binding_raw, &found) < 0) {
      snapfg_error ("cow=%s: the snapfg binding record in the header is "
                    "damaged (checksum mismatch); refusing to use the "
                    "store (the file is left unchanged; snapfgctl inspect "
                    "shows the rest of it)", params->path);
      return -EINVAL;
    }
    if (found.present)
      snprintf (ps->base.uuid, sizeof ps->base.uuid, "%s", found.uuid);
  }
  if (want == NULL || want->request == BIND_NONE)
    return 0;

  if (kind == DM_HEADER_EMPTY) {
    if (want->request == BIND_RESTORE) {
      snapfg_error ("cow=%s: the catalogue's snapshot \"%s\" should be in "
                    "this file, but it holds no store (empty or all "
                    "zero); put the store back, or remove the snapshot's "
                    "record from the catalogue", params->path, want->name);
      return -EINVAL;
    }
    binding_make (want, NULL, &b);
    binding_encode (&b, ps->binding_raw);
    snprintf (ps->base.uuid, sizeof ps->base.uuid, "%s", b.uuid);
    return 0;
  }

  r = binding_check (want, params->path, &found,
                     h->snapfg_merging && h->valid, h->valid != 0);
  if (r < 0 || h->valid == 0)
    return r;                   /* an Invalid store is not written to */
  binding_make (want, &found, &b);
  binding_encode (&b, encoded);
  if (memcmp (encoded, ps->binding_raw, STORE_BINDING_SIZE) != 0) {
    memcpy (ps->binding_raw, encoded, STORE_BINDING_SIZE);
    *write_binding = true;
  }
  snprintf (ps->base.uuid, sizeof ps->base.uuid, "%s", b.uuid);
  return 0;
}

/* Start a new store in an empty or all-zero COW device. */
static int
format_new_store (struct persistent_store *ps)
{
  struct snapfg_store *st = &ps->base;
  int r;

  /* Area 0 (and area 1, if the store has room for it) zero first, then
   * the header, then sync: a crash before the header is durable leaves
   * an all-zero (new) store.
   */
  r = zero_area (ps, 0);
  if (r == 0 && dm_area_chunk (1, ps->pairs_per_area) < st->max_chunks)
    r = zero_area (ps, 1);
  if (r == 0)
    r = ps_sync (ps);
  if (r == 0)
    r = write_header (ps, 1);
  if (r == 0)
    r = ps_sync (ps);
  if (r < 0) {
    snapfg_error ("cow=%s: cannot write a new store: %s",
                  st->dev.path, strerror (-r));
    return r;
  }
  ps->fresh = true;
  ps->current_area = 0;
  ps->area_used = 0;
  ps->zeroed_through =
    dm_area_chunk (1, ps->pairs_per_area) < st->max_chunks ? 1 : 0;
  atomic_store (&ps->metadata_areas, 1);
  atomic_store (&st->next_chunk, 2);
  return 0;
}

int
persistent_store_open (const struct snapfg_store_params *params,
                       struct snapfg_store **stp)
{
  struct persistent_store *ps;
  struct snapfg_store *st;
  struct dm_header h;
  enum dm_header_kind kind;
  uint64_t origin_chunks, areas;
  bool write_binding = false;
  char why[256];
  int r;

  ps = calloc (1, sizeof *ps);
  if (ps == NULL)
    return -ENOMEM;
  st = &ps->base;
  st->ops = &persistent_ops;
  st->origin_size = params->origin_size;
  pthread_mutex_init (&ps->lock, NULL);
  pthread_mutex_init (&ps->debug_lock, NULL);
  pthread_cond_init (&ps->zeroed, NULL);
  atomic_init (&ps->zeroing_from, ZEROING_NONE);
  ps->waiters_tail = &ps->waiters;

  r = store_open_device (params, st);
  if (r < 0) {
    free (ps);
    return r;
  }
  if (!st->dev.can_flush) {
    /* Crash safety orders COW data, then metadata, then the origin by
     * flushing the store between them.
     */
    snapfg_error ("cow=%s: the NBD server cannot flush, and a persistent "
                  "store needs flushes for crash safety (use store=transient "
                  "or a server that supports flush)", params->path);
    store_discard_new (st);
    return -EINVAL;
  }

  r = dm_read_header (&st->dev, &h, &kind, why, sizeof why);
  if (r < 0) {
    snapfg_error ("cow=%s: %s; refusing to use it (the file is left "
                  "unchanged)", params->path, why);
    store_discard_new (st);
    return r;
  }

  /* The store's own chunk size wins over chunk-size=. */
  st->chunk_size = params->chunk_size;
  if (kind == DM_HEADER_VALID) {
    uint32_t stored = h.chunk_sectors * 512;
    if (stored != params->chunk_size)
      snapfg_debug ("cow=%s: the store's chunk size %" PRIu32 " overrides "
                    "chunk-size=%" PRIu32, params->path, stored,
                    params->chunk_size);
    st->chunk_size = stored;
    st->opened_invalid = h.valid == 0;
    if (h.snapfg_unsynced_boot[0]) {
      r = check_unsynced_mark (ps, params->path, &h);
      if (r < 0) {
        store_discard_new (st);
        return r;
      }
    }
    st->opened_merging = ps->merging =
      h.snapfg_merging && !st->opened_invalid;
  }
  st->chunk_shift = log2_of_power_of_two (st->chunk_size);
  ps->pairs_per_area = dm_pairs_per_area (st->chunk_size);

  /* Who may attach this store (store-binding.c).  Refused: nothing is
   * written.
   */
  r = check_binding (ps, params, &h, kind, &write_binding);
  if (r < 0) {
    store_discard_new (st);
    return r;
  }

  ps->area_buf = calloc (1, st->chunk_size);
  if (ps->area_buf == NULL) {
    store_discard_new (st);
    return -ENOMEM;
  }

  /* Default size: the header, a copy of every origin chunk, the areas
   * describing them and the zeroed area after the last one.
   */
  origin_chunks = div_round_up (params->origin_size, st->chunk_size);
  areas = div_round_up (origin_chunks, ps->pairs_per_area);
  r = store_set_size (params, st,
                      (1 + origin_chunks + areas + 1) << st->chunk_shift);
  if (r < 0) {
    free (ps->area_buf);
    store_discard_new (st);
    return r;
  }

  if (kind == DM_HEADER_EMPTY) {
    r = format_new_store (ps);
    if (r < 0) {
      free (ps->area_buf);
      store_discard_new (st);
      return r;
    }
  }
  else if (st->opened_invalid && !ps->torn)
    snapfg_error ("cow=%s: the store is marked Invalid (valid = 0): the "
                  "snapshot's export fails every request", params->path);
  else
    ps->binding_pending = write_binding;

  r = set_unsynced_mark (ps, params);
  if (r < 0) {
    free (ps->area_buf);
    store_discard_new (st);
    return r;
  }
  *stp = st;
  return 0;
}
