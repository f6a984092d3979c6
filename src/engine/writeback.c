/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: write-back of first writes (see writeback.h).
 *
 * Held writes are a FIFO in acknowledgement order.  Each has a sequence
 * number; the committer applies them in that order, so "every write
 * acknowledged before this flush is on the origin" is "applied_seq has
 * reached the last sequence number handed out when the flush began".
 *
 * Which origin ranges are held is kept in a small counting hash of 1 MiB
 * granules (the largest chunk size): a write or read that finds none of
 * its granules counted needs no further look.  A false positive only
 * costs a look (a read) or holds a write that could have gone straight
 * to the origin; it is never wrong.  The granule is the largest chunk so
 * that a later write to another part of a chunk whose exception is not
 * durable yet always finds the held write that copied the chunk out.
 *
 * A read that may overlap held writes finds them in the read index:
 * lists of the held writes over each 64 KiB granule (a write's links
 * live in its own allocation), and one list of the few that span more
 * granules than that.  Walking the whole FIFO instead cost every such
 * read the length of the queue, under the lock the writers take: with
 * a gigabyte of 4 KiB writes held, 262,144 entries per read.
 *
 * Lock order: geometry (read side) → writeback lock → a store's commit
 * lock (the committer commits with no other lock held); a stripe lock is
 * never held with the writeback lock.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "engine-internal.h"
#include "writeback.h"
#include "held-file.h"
#include "copy-out.h"
#include "snapfg-log.h"

#define GRANULE_SHIFT 20          /* SNAPFG_MAX_CHUNK_SIZE */
#define INDEX_BITS 16
#define READ_GRANULE_SHIFT 16     /* the read index's granule: 64 KiB */
#define READ_LINKS_MAX 18         /* more granules: the list of wide ones */
#define WIDE UINT64_MAX           /* a link's granule in that list */

struct held_write;

/* A held write in one list of the read index. */
struct held_link {
  struct held_link *next;
  struct held_write *h;
  uint64_t granule;               /* or WIDE */
};

struct held_list {
  struct held_link *head, **tailp;
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

struct held_write {
  struct held_write *next;
  uint64_t seq;
  int op;                         /* enum origin_op */
  unsigned flags;                 /* SNAPFG_REQ_MAY_TRIM only */
  uint64_t offset;
  uint32_t count;
  uint64_t cost;
  atomic_int refs;                /* the queue, and readers laying it over */
  atomic_bool ready;              /* acknowledged (set without the lock) */
  /* Between the writer and the committer's copies: 0 while the writer
   * does its copy-outs, 1 once it acknowledged the write, or the error
   * of a copy the committer could not make before that (the writer
   * fails the request with it).  Exactly one of the two wins.
   */
  atomic_int ack;
  bool cancelled;                 /* not done: never applied */
  unsigned nlinks;                /* in the read index */
  /* ORIGIN_WRITE: the new data, in the held file (held-file.h). */
  uint64_t data_off;
  uint64_t data_extent;           /* its pages there, or 0: none */
  /* The links, next to the header: the committer unlinks writes under
   * the lock, one place to touch each.
   */
  struct held_link links[];
};


struct writeback {
  struct snapfg_engine *e;
  bool enabled;
  uint64_t max;

  pthread_mutex_t lock;
  pthread_cond_t work;            /* the committer: something to do */
  pthread_cond_t room;            /* writers waiting for room */
  pthread_cond_t applied;         /* flushes and drains */
  struct held_write *head, **tailp;
  uint64_t last_seq;              /* the newest held write's */
  uint64_t applied_seq;           /* every held write up to it is applied */
  uint64_t held_bytes;            /* cost of what is queued, and of
                                   * copy-out batches not freed yet */
  uint64_t held_writes;
  unsigned waiting;               /* writers waiting for room now */
  unsigned urgent;                /* others waiting for applied_seq */
  atomic_bool idle;               /* the committer waits for work */
  bool gathering;                 /* the committer gathers a round */
  struct held_file file;          /* the held data */
  void *bounce;                   /* the committer's: BOUNCE_SIZE */
  /* Copy-out batches for the next round (copy-out.h). */
  struct deferred_copy *copies, *copies_last;
  /* Batches copied and published while paused (the test hook), for the
   * next round's commit.
   */
  struct deferred_copy *copied;
  bool urged;                     /* a writer waits for a batch's chunk */
  uint32_t index[1u << INDEX_BITS];
  struct held_list read_index[1u << INDEX_BITS];
  struct held_list wide;          /* over more than READ_LINKS_MAX */
  atomic_uint_least64_t nheld;    /* lock-free "anything held?" */

  pthread_t thread;
  _Atomic bool running;         /* read unlocked by flushes and drains */
  atomic_bool stop;
  /* Test hook: SNAPFG_TEST_WRITEBACK_PAUSE=FILE holds every write back
   * (none reaches the origin; copy-out batches are done when a writer
   * waits for one of their chunks) while FILE exists, except at a stop.
   */
  char *pause_path;

  /* Statistics. */
  atomic_uint_least64_t rounds, round_exceptions, max_round;
  atomic_uint_least64_t room_waits, origin_errors;
  atomic_uint_least64_t not_held;   /* no memory to hold them (logged) */
};

static unsigned
index_slot (uint64_t granule)
{
  return (granule * UINT64_C (0x9E3779B97F4A7C15)) >> (64 - INDEX_BITS);
}

/* Under the lock: add (delta 1) or remove (-1) a range's granules. */
static void
index_update (struct writeback *wb, uint64_t offset, uint32_t count,
              int delta)
{
  uint64_t first = offset >> GRANULE_SHIFT;
  uint64_t last = (offset + count - 1) >> GRANULE_SHIFT;

  for (uint64_t g = first; g <= last; ++g)
    wb->index[index_slot (g)] += delta;
}

/* Under the lock: might a held write overlap the range? */
static bool
index_overlaps (const struct writeback *wb, uint64_t offset, uint32_t count)
{
  uint64_t first = offset >> GRANULE_SHIFT;
  uint64_t last = (offset + count - 1) >> GRANULE_SHIFT;

  for (uint64_t g = first; g <= last; ++g)
    if (wb->index[index_slot (g)])
      return true;
  return false;
}

static bool
ranges_overlap (uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
  return a < b + blen && b < a + alen;
}

/* Links a held write of count bytes may need, wherever it starts: one
 * per read granule it can touch, or one in the list of wide writes.
 */
static unsigned
links_needed (uint32_t count)
{
  uint64_t n = ((uint64_t) (count ? count - 1 : 0) >> READ_GRANULE_SHIFT) + 2;

  return n > READ_LINKS_MAX ? 1 : n;
}

static void
list_append (struct held_list *l, struct held_link *k)
{
  k->next = NULL;
  *l->tailp = k;
  l->tailp = &k->next;
}

/* Remove k: at the head, since writes leave in the order they came (a
 * walk only if that ever changes).
 */
static void
list_remove (struct held_list *l, struct held_link *k)
{
  struct held_link **p = &l->head;

  while (*p != k)
    p = &(*p)->next;
  *p = k->next;
  if (*p == NULL)
    l->tailp = p;
}

static struct held_list *
list_of (struct writeback *wb, uint64_t granule)
{
  return granule == WIDE ? &wb->wide : &wb->read_index[index_slot (granule)];
}

/* Under the lock: add h to the read index (enqueue) or remove it. */
static void
read_index_add (struct writeback *wb, struct held_write *h)
{
  uint64_t first = h->offset >> READ_GRANULE_SHIFT;
  uint64_t last = (h->offset + h->count - 1) >> READ_GRANULE_SHIFT;

  /* (links_needed is the span's worst case, or 1 for a wide write.) */
  if (last - first + 1 > links_needed (h->count)) {
    h->nlinks = 1;
    h->links[0].granule = WIDE;
  }
  else {
    h->nlinks = last - first + 1;
    for (unsigned i = 0; i < h->nlinks; ++i)
      h->links[i].granule = first + i;
  }
  for (unsigned i = 0; i < h->nlinks; ++i) {
    h->links[i].h = h;
    list_append (list_of (wb, h->links[i].granule), &h->links[i]);
  }
}

static void
read_index_remove (struct writeback *wb, struct held_write *h)
{
  for (unsigned i = 0; i < h->nlinks; ++i)
    list_remove (list_of (wb, h->links[i].granule), &h->links[i]);
}

/* A held write is a header with its links, from the heap, and its data
 * in the held file (see held-file.c for why not the heap).
 */
static size_t
held_header_length (uint32_t count)
{
  return sizeof (struct held_write) +
    links_needed (count) * sizeof (struct held_link);
}

/* Give h's data and header back.  Called once nobody can reach h. */
static void
held_free (struct writeback *wb, struct held_write *h)
{
  held_file_release (&wb->file, h->data_off, h->data_extent);
  free (h);
}

static void
held_put (struct writeback *wb, struct held_write *h)
{
  if (atomic_fetch_sub (&h->refs, 1) == 1)
    held_free (wb, h);
}

uint64_t
writeback_cost (int op, uint32_t count)
{
  /* The heap's overhead counts too: writeback-max bounds memory. */
  uint64_t data = op == ORIGIN_WRITE ? held_file_extent (count) : 0;

  return held_header_length (count) + 64 + data;
}

/* Held data is like the page cache's dirty pages for the bare file
 * plugin, except that it cannot be written back before its round is
 * durable, and it is the process's own (in held-file.c's memory file).
 * It lets a burst of first writes run at page-cache speed until
 * writeback-max is full; after that they go at the disk's speed (two
 * writes of every byte, the copy and the new data).  The kernel lets
 * dirty pages reach a tenth of the memory before it even starts writing
 * them back (dirty_background_ratio): a sixteenth keeps held data under
 * that, with room for the page cache's own.  1G (on a 2-core 24 GiB server,
 * a sixteenth would be 1.5G) takes a 300 MB/s disk about 7 s to commit
 * (two writes of every byte): more would only keep more at stake until
 * a flush.
 */
#define DEFAULT_MAX_MIN (64 * 1024 * 1024)
#define DEFAULT_MAX_MAX (1024 * 1024 * 1024)

uint64_t
snapfg_default_writeback_max (void)
{
  long pages = sysconf (_SC_PHYS_PAGES);
  long page = sysconf (_SC_PAGESIZE);
  uint64_t max;

  if (pages <= 0 || page <= 0)
    return DEFAULT_MAX_MIN;
  max = (uint64_t) pages * page / 16;
  max &= ~(uint64_t) (1024 * 1024 - 1);         /* whole MiB */
  if (max < DEFAULT_MAX_MIN)
    return DEFAULT_MAX_MIN;
  if (max > DEFAULT_MAX_MAX)
    return DEFAULT_MAX_MAX;
  return max;
}

uint64_t
writeback_max (const struct snapfg_engine *e)
{
  return e->wb ? e->wb->max : 0;
}

bool
writeback_active (const struct snapfg_engine *e)
{
  return e->wb && e->wb->running;
}

/* Memory for a held write could not be had (err): say so, and that the
 * write goes the way writeback=off takes, which needs no held copy.
 * The first time, then at every power of two, so that a machine short
 * of memory for a while logs a few lines, not one per write.
 */
static void
log_not_held (struct writeback *wb, int err, uint32_t count, uint64_t offset)
{
  uint64_t n = atomic_fetch_add (&wb->not_held, 1) + 1;

  if ((n & (n - 1)) != 0)
    return;
  snapfg_error ("origin=%s: the write of %" PRIu32 " bytes at %" PRIu64
                " could not be held in memory (%s): it is made as with "
                "writeback=off, after its snapshots' copies are durable and "
                "any held write it overlaps is applied (%" PRIu64 " write%s "
                "so far)",
                wb->e->origin.path, count, offset, strerror (err), n,
                n == 1 ? "" : "s");
}

/* A held write of the request, its data copied into the held file.
 * Returns NULL with *r set (-ENOMEM, or the held file's error), after
 * log_not_held: the callers then take the path that holds nothing.
 */
static struct held_write *
held_new (struct writeback *wb, int op, const void *buf, uint32_t count,
          uint64_t offset, unsigned flags, int *r)
{
  struct held_write *h = malloc (held_header_length (count));

  if (h == NULL) {
    *r = -ENOMEM;
    log_not_held (wb, ENOMEM, count, offset);
    return NULL;
  }
  h->next = NULL;
  h->nlinks = 0;
  h->op = op;
  h->flags = flags & SNAPFG_REQ_MAY_TRIM;
  h->offset = offset;
  h->count = count;
  h->cost = writeback_cost (op, count);
  atomic_init (&h->refs, 1);
  atomic_init (&h->ready, false);
  atomic_init (&h->ack, 0);
  h->cancelled = false;
  h->data_off = 0;
  h->data_extent = 0;
  if (op == ORIGIN_WRITE) {
    *r = engine_fail_point (wb->e, FAIL_HELD_DATA) ? -ENOMEM
      : held_file_store (&wb->file, buf, count, &h->data_off);
    if (*r < 0) {
      log_not_held (wb, -*r, count, offset);
      free (h);
      return NULL;
    }
    h->data_extent = held_file_extent (count);
  }
  return h;
}

/* Cancelled although acknowledged: only writeback_copy_failed does that
 * (a writer cancels its own write only when it fails the request).
 */
static bool
held_lost (struct held_write *h)
{
  return h->cancelled && atomic_load (&h->ack) == 1;
}

/* Under the lock: append h to the queue.  (The link is stored atomically:
 * the committer walks the ready front of the queue without the lock.)
 */
static void
enqueue (struct writeback *wb, struct held_write *h)
{
  h->seq = ++wb->last_seq;
  __atomic_store_n (wb->tailp, h, __ATOMIC_RELEASE);
  wb->tailp = &h->next;
  index_update (wb, h->offset, h->count, 1);
  read_index_add (wb, h);
  wb->held_bytes += h->cost;
  wb->held_writes++;
  atomic_fetch_add (&wb->nheld, 1);
}

static bool
has_room (const struct writeback *wb, uint64_t cost)
{
  /* The callers hold only requests that fit in writeback-max. */
  return wb->held_bytes + cost <= wb->max;
}

/* Under the lock: wake the committer if it waits for work, or (urgent)
 * also if it is gathering a round.  Only then: a signal per write would
 * cost the writers a futex call each and the committer a wakeup.
 */
static void
wake_committer (struct writeback *wb, bool urgent)
{
  if (wb->idle || (urgent && wb->gathering))
    pthread_cond_signal (&wb->work);
}

/* Under the lock: is enough held that a round should not wait? */
static bool
round_is_full (const struct writeback *wb)
{
  return wb->held_bytes >= wb->max / ROUND_GATHER_FULL;
}

/* Under the lock: should the committer start the round now rather than
 * gather more?
 */
static bool
round_wanted_now (const struct writeback *wb)
{
  return wb->urgent || wb->waiting || wb->urged || atomic_load (&wb->stop) ||
    round_is_full (wb);
}

/* Writes that cost this much or more look for room before their copy. */
#define LOOK_FIRST_COST (128 * 1024)

struct held_write *
writeback_hold_first (struct snapfg_engine *e, int op, const void *buf,
                      uint32_t count, uint64_t offset, unsigned flags,
                      int *r)
{
  struct writeback *wb = e->wb;
  uint64_t cost = writeback_cost (op, count);
  struct held_write *h;

  /* A large write looks first, so that a full queue costs no copy.  A
   * small one takes the lock once: when there is no room, its copy was
   * wasted.
   */
  if (cost >= LOOK_FIRST_COST) {
    pthread_mutex_lock (&wb->lock);
    if (!has_room (wb, cost)) {
      pthread_mutex_unlock (&wb->lock);
      *r = -EAGAIN;
      return NULL;
    }
    pthread_mutex_unlock (&wb->lock);
  }

  h = held_new (wb, op, buf, count, offset, flags, r);
  if (h == NULL) {
    *r = 1;                     /* no memory for it: not held */
    return NULL;
  }
  pthread_mutex_lock (&wb->lock);
  if (!has_room (wb, h->cost)) {
    pthread_mutex_unlock (&wb->lock);
    held_free (wb, h);
    *r = -EAGAIN;
    return NULL;
  }
  enqueue (wb, h);
  /* Gathering a round: start it if this makes it full (ready or not,
   * this write is not in it).
   */
  if (round_is_full (wb))
    wake_committer (wb, true);
  pthread_mutex_unlock (&wb->lock);
  return h;
}

void
writeback_wait_room (struct snapfg_engine *e, uint64_t cost)
{
  struct writeback *wb = e->wb;

  pthread_mutex_lock (&wb->lock);
  if (!has_room (wb, cost)) {
    wb->waiting++;
    atomic_fetch_add (&wb->room_waits, 1);
    wake_committer (wb, true);
    /* No room means something is held or still being freed (the
     * callers only hold requests that fit in writeback-max), and the
     * committer broadcasts room once it has freed a round.
     */
    while (!has_room (wb, cost))
      pthread_cond_wait (&wb->room, &wb->lock);
    wb->waiting--;
  }
  pthread_mutex_unlock (&wb->lock);
}

int
writeback_ready (struct snapfg_engine *e, struct held_write *h)
{
  struct writeback *wb = e->wb;
  int ack = 0;

  /* A copy of ours the committer already tried failed: the request
   * fails with its error (the caller cancels the write).
   */
  if (!atomic_compare_exchange_strong (&h->ack, &ack, 1))
    return ack;

  /* No lock unless the committer waits for work: it says so (idle)
   * before it looks at the queue a last time, and this says ready
   * before it looks at idle, so one of the two sees the other (both
   * sequentially consistent).  Taking the lock to signal then means the
   * committer is waiting, or will be once it drops the lock.
   */
  atomic_store (&h->ready, true);
  if (atomic_load (&wb->idle)) {
    pthread_mutex_lock (&wb->lock);
    wake_committer (wb, false);
    pthread_mutex_unlock (&wb->lock);
  }
  return 0;
}

void
writeback_copy_failed (struct snapfg_engine *e, struct held_write *h,
                       int err)
{
  struct writeback *wb = e->wb;
  int ack = 0;

  /* Still copying out: the writer returns the error to its client. */
  if (atomic_compare_exchange_strong (&h->ack, &ack, err))
    return;
  if (ack < 0)
    return;                     /* failed already */
  /* Acknowledged: the write must not reach the origin (the snapshot
   * would lose the chunk), and is not read any more; the committer
   * says so when its turn comes (the next flush or FUA on every
   * connection fails).
   */
  pthread_mutex_lock (&wb->lock);
  h->cancelled = true;
  pthread_mutex_unlock (&wb->lock);
}

void
writeback_cancel (struct snapfg_engine *e, struct held_write *h)
{
  struct writeback *wb = e->wb;

  pthread_mutex_lock (&wb->lock);
  h->cancelled = true;
  atomic_store (&h->ready, true);
  wake_committer (wb, false);
  pthread_mutex_unlock (&wb->lock);
}

/* Under the lock: wait until every held write up to seq is applied
 * (the committer starts its round at once for it).
 */
static void
wait_applied_locked (struct writeback *wb, uint64_t seq)
{
  if (wb->applied_seq >= seq)
    return;
  wb->urgent++;
  wake_committer (wb, true);
  while (wb->applied_seq < seq)
    pthread_cond_wait (&wb->applied, &wb->lock);
  wb->urgent--;
}

int
writeback_order_after_held (struct snapfg_engine *e, int op, const void *buf,
                            uint32_t count, uint64_t offset, unsigned flags)
{
  struct writeback *wb = e->wb;
  struct held_write *h;
  bool hold;
  int r;

  if (wb == NULL || atomic_load (&wb->nheld) == 0)
    return 0;
  pthread_mutex_lock (&wb->lock);
  if (!index_overlaps (wb, offset, count)) {
    pthread_mutex_unlock (&wb->lock);
    return 0;
  }
  /* FUA wants its own data on the origin, and a fast zero must be
   * refused if it is not fast: both go to the origin themselves, after
   * the writes they overlap.  So does a write with no room to be held.
   */
  hold = !(flags & (SNAPFG_REQ_FUA | SNAPFG_REQ_FAST_ZERO)) &&
    has_room (wb, writeback_cost (op, count));
  if (!hold) {
    wait_applied_locked (wb, wb->last_seq);
    pthread_mutex_unlock (&wb->lock);
    return 0;
  }
  pthread_mutex_unlock (&wb->lock);

  h = held_new (wb, op, buf, count, offset, flags, &r);
  pthread_mutex_lock (&wb->lock);
  if (h == NULL) {
    /* No memory to hold it: it goes to the origin itself, after the
     * writes it overlaps, as one with no room does.
     */
    wait_applied_locked (wb, wb->last_seq);
    pthread_mutex_unlock (&wb->lock);
    return 0;
  }
  if (!index_overlaps (wb, offset, count)) {
    /* Applied meanwhile: nothing to go after any more. */
    pthread_mutex_unlock (&wb->lock);
    held_free (wb, h);
    return 0;
  }
  /* Held now even past writeback-max: by at most this one write per
   * client request, since the check above found room.
   */
  atomic_store (&h->ready, true);
  enqueue (wb, h);
  wake_committer (wb, round_is_full (wb));
  pthread_mutex_unlock (&wb->lock);
  return 1;
}

void
writeback_defer_copy (struct snapfg_engine *e, struct deferred_copy *dc)
{
  struct writeback *wb = e->wb;

  deferred_copy_link (dc, NULL);
  pthread_mutex_lock (&wb->lock);
  /* Counted in writeback-max until its round frees it (commit_round);
   * past it by at most this request's batches, since its held write
   * found room.
   */
  wb->held_bytes += deferred_copy_size (dc);
  if (wb->copies_last)
    deferred_copy_link (wb->copies_last, dc);
  else
    wb->copies = dc;
  wb->copies_last = dc;
  pthread_mutex_unlock (&wb->lock);
}

void
writeback_urge (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL || !wb->running)
    return;
  pthread_mutex_lock (&wb->lock);
  wb->urged = true;
  wake_committer (wb, true);
  pthread_mutex_unlock (&wb->lock);
}

void
writeback_wait_all (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL || !wb->running)
    return;
  pthread_mutex_lock (&wb->lock);
  wait_applied_locked (wb, wb->last_seq);
  pthread_mutex_unlock (&wb->lock);
}

void
writeback_drain (struct snapfg_engine *e)
{
  /* With the geometry write side held no copy-out is in progress: every
   * held write is ready, and the committer (which takes no geometry
   * lock) applies them all.
   */
  writeback_wait_all (e);
}

/* Under the lock: take h into the view if a read must lay it over. */
static void
view_add (struct held_view *v, struct held_write *h, uint32_t count,
          uint64_t offset)
{
  if (v->failed || !atomic_load (&h->ready) || h->cancelled ||
      !ranges_overlap (h->offset, h->count, offset, count))
    return;
  if (v->n == v->cap) {
    size_t cap = v->cap * 2;
    struct held_write **w = malloc (cap * sizeof *w);

    if (w == NULL) {
      v->failed = true;
      return;
    }
    memcpy (w, v->w, v->n * sizeof *w);
    if (v->w != v->inline_w)
      free (v->w);
    v->w = w;
    v->cap = cap;
  }
  atomic_fetch_add (&h->refs, 1);
  v->w[v->n++] = h;
}

static int
compare_seq (const void *a, const void *b)
{
  const struct held_write *x = *(struct held_write *const *) a;
  const struct held_write *y = *(struct held_write *const *) b;

  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* In queue order, as writeback_read_end lays them over (the lists give
 * each granule's in order, the granules one after another).
 */
static void
view_sort (struct held_view *v)
{
  if (v->n > 16) {
    qsort (v->w, v->n, sizeof *v->w, compare_seq);
    return;
  }
  for (size_t i = 1; i < v->n; ++i) {
    struct held_write *h = v->w[i];
    size_t j = i;

    for (; j > 0 && v->w[j - 1]->seq > h->seq; --j)
      v->w[j] = v->w[j - 1];
    v->w[j] = h;
  }
}

int
writeback_read_begin (struct snapfg_engine *e, uint32_t count,
                      uint64_t offset, struct held_view *v)
{
  struct writeback *wb = e->wb;

  v->n = 0;
  v->w = v->inline_w;
  v->cap = sizeof v->inline_w / sizeof v->inline_w[0];
  v->failed = false;
  if (wb == NULL || atomic_load (&wb->nheld) == 0)
    return 0;
  pthread_mutex_lock (&wb->lock);
  if (index_overlaps (wb, offset, count)) {
    uint64_t first = offset >> READ_GRANULE_SHIFT;
    uint64_t last = (offset + count - 1) >> READ_GRANULE_SHIFT;

    for (uint64_t g = first; g <= last; ++g)
      for (struct held_link *k = list_of (wb, g)->head; k; k = k->next) {
        uint64_t h_first;

        if (k->granule != g)
          continue;             /* another granule's, in the same list */
        /* Each write once: from the first granule it shares with the
         * read.
         */
        h_first = k->h->offset >> READ_GRANULE_SHIFT;
        if (g == (first > h_first ? first : h_first))
          view_add (v, k->h, count, offset);
      }
    for (struct held_link *k = wb->wide.head; k; k = k->next)
      view_add (v, k->h, count, offset);
    view_sort (v);
  }
  pthread_mutex_unlock (&wb->lock);
  if (v->failed) {
    /* Without every held write it overlaps, the read would be stale. */
    writeback_read_end (e, v, NULL, count, offset, false);
    return -ENOMEM;
  }
  return 0;
}

int
writeback_read_end (struct snapfg_engine *e, struct held_view *v, void *buf,
                    uint32_t count, uint64_t offset, bool ok)
{
  int r = 0;

  /* In queue order: a later held write wins over an earlier one.  One
   * that was applied to the origin after it was taken is laid over the
   * same data again.
   */
  for (size_t i = 0; i < v->n; ++i) {
    struct held_write *h = v->w[i];

    if (ok && r == 0) {
      uint64_t from = h->offset > offset ? h->offset : offset;
      uint64_t to = h->offset + h->count < offset + count
        ? h->offset + h->count : offset + count;
      char *dst = (char *) buf + (from - offset);

      if (h->op == ORIGIN_WRITE) {
        r = held_file_load (&e->wb->file, dst, to - from,
                            h->data_off + (from - h->offset));
        if (r < 0)
          snapfg_error ("origin=%s: read at %" PRIu64 " failed: cannot "
                        "read back the held write at %" PRIu64 ": %s",
                        e->origin.path, offset, h->offset, strerror (-r));
      }
      else
        memset (dst, 0, to - from);     /* zero, or trim (reads as zero) */
    }
    held_put (e->wb, h);
  }
  if (v->w != v->inline_w)
    free (v->w);
  return r;
}

/* --- the committer --- */

/* Under the lock: take the queued copy-out batches. */
static struct deferred_copy *
take_copies (struct writeback *wb)
{
  struct deferred_copy *copies = wb->copies;

  wb->copies = wb->copies_last = NULL;
  wb->urged = false;
  return copies;
}

/* Copy and publish a round's copy-out batches (copy-out.h).  A failed
 * COW write makes that snapshot Invalid (as dm does when a copy fails)
 * and the origin writes go ahead; a failed origin read keeps the
 * snapshot and drops the held writes over the chunks it could not copy
 * (writeback_copy_failed).
 */
static void
copy_round (struct deferred_copy *copies)
{
  if (copies == NULL)
    return;
  deferred_copy_write (copies);
  deferred_copy_publish (copies);
}

/* Make them durable, with those published while paused (wb->copied,
 * taken under the lock by the caller and linked before 'copies').
 */
static void
commit_round (struct writeback *wb, struct deferred_copy *list)
{
  size_t committed;
  uint64_t freed;

  if (list == NULL)
    return;
  committed = deferred_copy_commit (list);
  freed = deferred_copy_free (list);
  pthread_mutex_lock (&wb->lock);
  wb->held_bytes -= freed;
  pthread_cond_broadcast (&wb->room);
  pthread_mutex_unlock (&wb->lock);
  if (committed) {
    uint64_t max = atomic_load (&wb->max_round);

    atomic_fetch_add (&wb->rounds, 1);
    atomic_fetch_add (&wb->round_exceptions, committed);
    while (committed > max &&
           !atomic_compare_exchange_weak (&wb->max_round, &max, committed))
      ;
  }
}

/* Append list b to list a; returns the joined list. */
static struct deferred_copy *
join_copies (struct deferred_copy *a, struct deferred_copy *a_last,
             struct deferred_copy *b)
{
  if (a == NULL)
    return b;
  deferred_copy_link (a_last, b);
  return a;
}

/* The end of the ready front of the queue from first (ready): walked
 * without the lock, which writers appending need meanwhile.  Only the
 * committer takes writes out, so the front stays; the links are read
 * atomically since a writer may be appending to the last one.
 */
static struct held_write *
ready_front_end (struct held_write *first)
{
  struct held_write *last = first, *next;

  while ((next = __atomic_load_n (&last->next, __ATOMIC_ACQUIRE)) &&
         atomic_load (&next->ready))
    last = next;
  return last;
}

/* Apply the ready writes from h on, up to APPLY_BATCH of them and no
 * further than last.  Returns the last one applied.
 *
 * Their data comes back from the held file into the committer's buffer
 * (bounce), neighbours together: writes held one after another lie side
 * by side in the file, and reading a run of them costs one pread, about
 * what a single 4 KiB one does.  A write larger than the buffer is
 * applied a buffer at a time (readers lay the whole held write over
 * what they read until it is retired, so nobody sees it half done).
 */
#define APPLY_BATCH 256
#define BOUNCE_SIZE (4 * 1024 * 1024)

/* What the buffer holds now: [from, to) of the held file. */
struct bounce_window {
  uint64_t from, to;
};

/* The end (in the held file) of h's data and of its neighbours after it
 * in the batch (at most n more, none past last) that fit in the buffer
 * together.
 */
static uint64_t
run_end (struct held_write *h, struct held_write *last, unsigned n)
{
  uint64_t from = h->data_off, to = h->data_off + h->count;
  uint64_t next_off = h->data_off + h->data_extent;

  while (h != last && n-- > 0) {
    h = h->next;
    if (h->data_extent == 0 || h->data_off != next_off ||
        h->data_off + h->count - from > BOUNCE_SIZE)
      break;
    to = h->data_off + h->count;
    next_off = h->data_off + h->data_extent;
  }
  return to;
}

/* Write h's data to the origin.  Returns 0 or -errno (logged). */
static int
apply_data (struct writeback *wb, struct held_write *h,
            struct held_write *last, unsigned left,
            struct bounce_window *win)
{
  struct snapfg_engine *e = wb->e;
  uint32_t done = 0;
  int r;

  if (h->data_off >= win->from && h->data_off + h->count <= win->to)
    return origin_apply_change (e, h->op,
                                (char *) wb->bounce + (h->data_off - win->from),
                                h->count, h->offset, h->flags);
  while (done < h->count) {
    uint32_t n = h->count - done;
    uint64_t to;

    if (n > BOUNCE_SIZE)
      n = BOUNCE_SIZE;
    to = done == 0 && n == h->count
      ? run_end (h, last, left) : h->data_off + done + n;
    win->from = win->to = 0;
    r = held_file_load (&wb->file, wb->bounce, to - (h->data_off + done),
                        h->data_off + done);
    if (r < 0) {
      snapfg_error ("origin=%s: write of %" PRIu32 " bytes at %" PRIu64
                    " was acknowledged but is not applied: its held data "
                    "cannot be read back: %s; the next flush fails",
                    e->origin.path, h->count, h->offset, strerror (-r));
      return r;
    }
    win->from = h->data_off + done;
    win->to = to;
    r = origin_apply_change (e, h->op, wb->bounce, n, h->offset + done,
                             h->flags);
    if (r < 0)
      return r;                 /* logged by origin_apply_change */
    done += n;
  }
  return 0;
}

static struct held_write *
apply_batch (struct writeback *wb, struct held_write *h,
             struct held_write *last)
{
  struct snapfg_engine *e = wb->e;
  struct bounce_window win = { 0, 0 };

  for (unsigned n = 1; ; ++n, h = h->next) {
    if (held_lost (h)) {
      snapfg_error ("origin=%s: %s of %" PRIu32 " bytes at %" PRIu64
                    " was acknowledged but is not applied: reading the "
                    "old data for a snapshot failed; the next flush "
                    "fails", e->origin.path, origin_op_name (h->op),
                    h->count, h->offset);
      atomic_fetch_add (&wb->origin_errors, 1);
    }
    else if (!h->cancelled) {
      int r = h->data_extent
        ? apply_data (wb, h, last, APPLY_BATCH - n, &win)
        : origin_apply_change (e, h->op, NULL, h->count, h->offset,
                               h->flags);
      if (r < 0)
        /* Logged; the next flush or FUA on every connection fails. */
        atomic_fetch_add (&wb->origin_errors, 1);
    }
    if (h == last || n == APPLY_BATCH)
      return h;
  }
}

/* Take the applied writes first .. last (the front of the queue) out of
 * the queue and its indexes, then free them.  Without the lock on entry
 * and return.
 */
static void
retire_batch (struct writeback *wb, struct held_write *first,
              struct held_write *last)
{
  struct held_write *h, *next;
  uint64_t freed = 0, run_off = 0, run_len = 0;

  pthread_mutex_lock (&wb->lock);
  wb->head = last->next;
  if (wb->head == NULL)
    wb->tailp = &wb->head;
  wb->applied_seq = last->seq;
  for (h = first; ; h = h->next) {
    index_update (wb, h->offset, h->count, -1);
    read_index_remove (wb, h);
    freed += h->cost;
    wb->held_writes--;
    atomic_fetch_sub (&wb->nheld, 1);
    if (h == last)
      break;
  }
  pthread_cond_broadcast (&wb->applied);

  /* Freed with the lock dropped.  Nobody else follows the chain from
   * first to last any more (readers hold references of their own, and
   * last->next is no writer's tail now).  Neighbours in the held file
   * give their pages back together.  The room is given back only once
   * the memory is: were it given back first, writers could hold a new
   * round's worth while this one is still allocated, and the peak would
   * reach twice writeback-max.
   */
  pthread_mutex_unlock (&wb->lock);
  for (h = first; ; h = next) {
    bool end = h == last;

    next = h->next;
    /* Only the queue's reference: no reader can take one now (it is out
     * of the queue and the read index).
     */
    if (atomic_load (&h->refs) == 1) {
      if (run_len && h->data_off == run_off + run_len)
        run_len += h->data_extent;
      else if (h->data_extent) {
        held_file_release (&wb->file, run_off, run_len);
        run_off = h->data_off;
        run_len = h->data_extent;
      }
      free (h);
    }
    else
      held_put (wb, h);
    if (end)
      break;
  }
  held_file_release (&wb->file, run_off, run_len);
  pthread_mutex_lock (&wb->lock);
  wb->held_bytes -= freed;
  pthread_cond_broadcast (&wb->room);
  pthread_mutex_unlock (&wb->lock);
}

static void *
committer (void *arg)
{
  struct writeback *wb = arg;

  pthread_mutex_lock (&wb->lock);
  for (;;) {
    struct held_write *first, *last, *h;
    struct deferred_copy *copies;

    for (;;) {
      atomic_store (&wb->idle, true);     /* before the look: see ready */
      if ((wb->head && atomic_load (&wb->head->ready)) || wb->copies ||
          (atomic_load (&wb->stop) && !wb->head))
        break;
      pthread_cond_wait (&wb->work, &wb->lock);
    }
    atomic_store (&wb->idle, false);
    if (wb->head == NULL && wb->copies == NULL)
      break;                    /* stopping, and nothing is held */
    if (!round_wanted_now (wb)) {
      struct timespec until;

      clock_gettime (CLOCK_MONOTONIC, &until);
      until.tv_nsec += ROUND_GATHER_NS;
      if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
      }
      wb->gathering = true;
      while (!round_wanted_now (wb) &&
             pthread_cond_timedwait (&wb->work, &wb->lock, &until) == 0)
        ;
      wb->gathering = false;
    }
    if (wb->pause_path && !atomic_load (&wb->stop) &&
        access (wb->pause_path, F_OK) == 0) {
      /* Paused: no held write reaches the origin, but copy-out batches
       * are done once a writer waits for one of their chunks, so that
       * it goes on (as a slow disk would let it).  Only then, so that a
       * test decides when the copies are made.
       */
      struct deferred_copy *last_copy = wb->copies_last;

      copies = wb->urged ? take_copies (wb) : NULL;
      pthread_mutex_unlock (&wb->lock);
      copy_round (copies);
      usleep (10000);
      pthread_mutex_lock (&wb->lock);
      if (copies)
        wb->copied = join_copies (copies, last_copy, wb->copied);
      continue;
    }

    /* This round: the ready writes at the front of the queue (maybe
     * none: a write waiting for a batch's chunk is not ready), and every
     * copy-out batch queued so far (theirs were queued before they
     * became ready; others' early is harmless, and is what lets a write
     * waiting for one of their chunks go on).
     */
    first = wb->head && atomic_load (&wb->head->ready) ? wb->head : NULL;
    pthread_mutex_unlock (&wb->lock);
    last = first ? ready_front_end (first) : NULL;
    {
      struct deferred_copy *last_copy, *copied;

      /* Taken after the walk saw the writes ready: their batches were
       * queued before that.
       */
      pthread_mutex_lock (&wb->lock);
      last_copy = wb->copies_last;
      copied = wb->copied;
      wb->copied = NULL;
      copies = take_copies (wb);
      pthread_mutex_unlock (&wb->lock);
      copy_round (copies);
      commit_round (wb, join_copies (copies, last_copy, copied));
    }
    /* Applied, taken out of the queue and freed APPLY_BATCH at a time:
     * the lock is held for that many at most (a round can be hundreds
     * of thousands), so readers and writers get it in between, and the
     * room and the flushes waiting for them come as each part lands.
     */
    for (h = first; h; ) {
      struct held_write *batch_last = apply_batch (wb, h, last);
      struct held_write *next = batch_last == last ? NULL : batch_last->next;

      retire_batch (wb, h, batch_last);
      h = next;
    }
    pthread_mutex_lock (&wb->lock);
  }
  pthread_mutex_unlock (&wb->lock);
  return NULL;
}

/* Free what writeback_open made (nothing held, no committer). */
static void
writeback_free (struct writeback *wb)
{
  held_file_close (&wb->file);
  free (wb->bounce);
  free (wb->pause_path);
  pthread_cond_destroy (&wb->applied);
  pthread_cond_destroy (&wb->room);
  pthread_cond_destroy (&wb->work);
  pthread_mutex_destroy (&wb->lock);
  free (wb);
}

int
writeback_open (struct snapfg_engine *e, bool on, uint64_t max)
{
  struct writeback *wb = calloc (1, sizeof *wb);
  pthread_condattr_t ca;
  const char *env;

  if (wb == NULL)
    return -ENOMEM;
  wb->e = e;
  wb->enabled = on && !e->origin.readonly;
  wb->max = max;
  pthread_mutex_init (&wb->lock, NULL);
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);   /* the gathering */
  pthread_cond_init (&wb->work, &ca);
  pthread_condattr_destroy (&ca);
  pthread_cond_init (&wb->room, NULL);
  pthread_cond_init (&wb->applied, NULL);
  wb->tailp = &wb->head;
  for (size_t i = 0; i < sizeof wb->read_index / sizeof wb->read_index[0]; ++i)
    wb->read_index[i].tailp = &wb->read_index[i].head;
  wb->wide.tailp = &wb->wide.head;
  wb->file.fd = -1;
  if (wb->enabled) {
    int r = held_file_open (&wb->file);

    if (r < 0) {
      snapfg_error ("writeback=on: cannot create the memory file for held "
                    "writes (memfd_create): %s; writeback=off works "
                    "without it", strerror (-r));
      writeback_free (wb);
      return r;
    }
    /* Page-aligned, as a device opened with O_DIRECT may want. */
    if (posix_memalign (&wb->bounce, 4096, BOUNCE_SIZE) != 0) {
      writeback_free (wb);
      return -ENOMEM;
    }
  }
  env = getenv ("SNAPFG_TEST_WRITEBACK_PAUSE");
  if (env && *env && (wb->pause_path = strdup (env)) == NULL) {
    writeback_free (wb);
    return -ENOMEM;
  }
  e->wb = wb;
  return 0;
}

int
writeback_start (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;
  int err;

  if (wb == NULL || !wb->enabled || wb->running)
    return 0;
  err = pthread_create (&wb->thread, NULL, committer, wb);
  if (err) {
    snapfg_error ("writeback=on: cannot start the committer thread: %s",
                  strerror (err));
    return -err;
  }
  /* Its name shows in top -H and ps -L. */
  pthread_setname_np (wb->thread, "snapfg-commit");
  wb->running = true;
  return 0;
}

void
writeback_close (struct snapfg_engine *e)
{
  struct writeback *wb = e->wb;

  if (wb == NULL)
    return;
  if (wb->running) {
    pthread_mutex_lock (&wb->lock);
    atomic_store (&wb->stop, true);
    pthread_cond_signal (&wb->work);    /* idle or gathering */
    pthread_mutex_unlock (&wb->lock);
    pthread_join (wb->thread, NULL);
    wb->running = false;
  }
  deferred_copy_free (wb->copied);      /* none: a stop commits them */
  writeback_free (wb);
  e->wb = NULL;
}

/* --- what the plugin and the control socket see --- */

void
snapfg_writeback_stats (struct snapfg_engine *e,
                        struct snapfg_writeback_stats *ws)
{
  struct writeback *wb = e->wb;

  memset (ws, 0, sizeof *ws);
  if (wb == NULL)
    return;
  ws->enabled = wb->enabled;
  ws->max_bytes = wb->max;
  pthread_mutex_lock (&wb->lock);
  ws->held_bytes = wb->held_bytes;
  ws->held_writes = wb->held_writes;
  ws->waiting = wb->waiting;
  pthread_mutex_unlock (&wb->lock);
  ws->rounds = atomic_load (&wb->rounds);
  ws->round_exceptions = atomic_load (&wb->round_exceptions);
  ws->max_round = atomic_load (&wb->max_round);
  ws->room_waits = atomic_load (&wb->room_waits);
  ws->origin_errors = atomic_load (&wb->origin_errors);
}

uint64_t
snapfg_writeback_errors (struct snapfg_engine *e)
{
  return e->wb ? atomic_load (&e->wb->origin_errors) : 0;
}

int
snapfg_writeback_check (struct snapfg_engine *e, uint64_t *seen)
{
  uint64_t now = snapfg_writeback_errors (e);

  if (now == *seen)
    return 0;
  *seen = now;
  return -EIO;
}
