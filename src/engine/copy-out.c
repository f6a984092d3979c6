/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the exclusive path — copying an origin chunk into a snapshot's
 * COW store and publishing the exception (the A → B → C → D walk of
 * docs/design.md section 3).
 */

#include <config.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>

#include "engine-internal.h"
#include "copy-out.h"
#include "vector.h"
#include "snapfg-log.h"

#define container_of(ptr, type, member) \
  ((type *) ((char *) (ptr) - offsetof (type, member)))

/* What claim_chunk found. */
enum claim {
  CLAIM_OWNED,                  /* state A: 'pe' is now its pending exception */
  CLAIM_REMAPPED,               /* state D: nothing to copy */
  CLAIM_BUSY,                   /* someone else is copying it (no wait asked) */
};

/* Under the stripe lock, wait until the chunk is either remapped with no
 * copy in progress (state D: CLAIM_REMAPPED), or not remapped at all
 * (state A: register 'pe' as its pending exception, CLAIM_OWNED).  With
 * wait false, return CLAIM_BUSY instead of waiting for another copy-out
 * (the caller holds claims of its own and must not sleep on someone
 * else's).  Never holds the lock across the allocation done when the
 * stripe must grow.
 */
static int
claim_chunk (struct snapfg_snapshot *s, struct exception_stripe *stripe,
             struct pending_exception *pe, uint64_t chunk,
             uint64_t *new_chunk, bool wait)
{
  bool urged = false;
  int r;

  exception_stripe_lock (stripe);
  for (;;) {
    if (!snapshot_is_valid (s)) {
      exception_stripe_unlock (stripe);
      return -EIO;
    }
    if (exception_stripe_remapped (stripe, chunk, new_chunk)) {  /* D */
      exception_stripe_unlock (stripe);
      return CLAIM_REMAPPED;
    }
    if (exception_stripe_is_pending (stripe, chunk)) {  /* B or C */
      if (!wait) {
        exception_stripe_unlock (stripe);
        return CLAIM_BUSY;
      }
      if (!urged) {
        /* It may be a write-back copy waiting for the committer's
         * round: ask for that round now (no stripe lock may be held
         * with the write-back lock), then look again.
         */
        urged = true;
        exception_stripe_unlock (stripe);
        if (s->engine->copy_deferral.urge)
          s->engine->copy_deferral.urge (s->engine->copy_deferral.opaque);
        exception_stripe_lock (stripe);
        continue;
      }
      if (snapfg_debug_lock)
        snapfg_debug ("snapshot %s: chunk %" PRIu64 " is being copied, "
                      "waiting", s->name, chunk);
      stats_add (&s->stats, STAT_PENDING_WAITS, 1);
      exception_stripe_wait (stripe);
      continue;
    }
    r = exception_stripe_add_pending (&s->table, stripe, pe, chunk);  /* A → B */
    if (r == 0)
      break;
    exception_stripe_unlock (stripe);
    r = exception_stripe_grow (stripe);
    if (r < 0)
      return r;
    exception_stripe_lock (stripe);
  }
  exception_stripe_unlock (stripe);
  return CLAIM_OWNED;
}

/* Give up a claimed chunk (B → A) after a failure; waiters re-check. */
static void
abandon_chunk (struct exception_stripe *stripe, struct pending_exception *pe)
{
  exception_stripe_lock (stripe);
  exception_stripe_retire (stripe, pe);
  exception_stripe_unlock (stripe);
}

/* Say that reading origin chunks [chunk, chunk + n) for a copy-out
 * failed with r, unless the origin shrank under us (then
 * engine_origin_shrunk says that, once).
 */
static void
origin_read_failed (struct snapfg_snapshot *s, uint64_t chunk, uint64_t n,
                    uint64_t end, int r)
{
  if (!engine_origin_shrunk (s->engine, r, end))
    snapfg_error ("origin=%s: read of chunk%s %" PRIu64 "%s for a copy-out "
                  "failed: %s", s->engine->origin.path, n > 1 ? "s" : "",
                  chunk, n > 1 ? "..." : "", strerror (-r));
}

/* A copy into the COW store failed (cow_failed): the snapshot can no
 * longer keep the old data, so it becomes Invalid and the request gets
 * EIO.  Any other r (success, or the origin's own error for the client)
 * is returned as it is.
 */
static int
cow_write_failure (struct snapfg_snapshot *s, int r, bool cow_failed)
{
  if (r < 0 && cow_failed) {
    snapshot_invalidate (s, "write to the COW store failed", -r);
    return -EIO;
  }
  return r;
}

/* Copy n consecutive origin chunks from 'chunk' into the COW chunks from
 * nc: device_copy decides how (in the kernel for long runs where the
 * devices allow it, else through a buffer).  The origin's size need not
 * be a multiple of the chunk size: what the last chunk has past its end
 * is written as zeroes.  On failure *cow_failed says whether it was the COW store
 * (the snapshot becomes Invalid) or the origin (the error goes back to
 * the client).
 */
static int
copy_chunk_run (struct snapfg_snapshot *s, uint64_t chunk, uint64_t nc,
                uint64_t n, bool *cow_failed)
{
  struct snapfg_engine *e = s->engine;
  struct snapfg_store *st = s->store;
  uint64_t start = chunk << s->chunk_shift;
  uint64_t len = n << s->chunk_shift;
  uint64_t in_origin = start + len <= e->size ? len : e->size - start;
  uint64_t where = store_chunk_offset (st, nc);
  bool origin_failed;
  int r;

  engine_test_delay (e);        /* widen the B window in tests */
  r = device_copy (&e->origin, start, &st->dev, where, in_origin,
                   &origin_failed);
  if (r < 0 && origin_failed) {
    origin_read_failed (s, chunk, n, start + in_origin, r);
    *cow_failed = false;
    return r;
  }
  if (r == 0 && in_origin < len)
    /* Written, not zeroed with device_zero: a COW file must grow to
     * hold the whole chunk, as it would from a buffer.
     */
    r = device_pwrite (&st->dev, e->zeroes, len - in_origin,
                       where + in_origin);
  *cow_failed = r < 0;
  return r;
}

/* Write the chunk's new contents into COW chunk nc: the origin's data,
 * overlaid with the snapshot write if there is one.  *cow_failed as for
 * copy_chunk_run.
 */
static int
write_chunk_copy (struct snapfg_snapshot *s, uint64_t chunk, uint64_t nc,
                  const void *data, uint32_t count, uint32_t offset_in_chunk,
                  bool *cow_failed)
{
  struct snapfg_engine *e = s->engine;
  struct snapfg_store *st = s->store;
  uint64_t where = store_chunk_offset (st, nc);
  uint64_t start = chunk << s->chunk_shift;
  uint64_t len = s->chunk_size;
  void *buf;
  int r;

  *cow_failed = false;
  if (data && offset_in_chunk == 0 && count == s->chunk_size) {
    /* A whole-chunk snapshot write: nothing to copy from the origin. */
    engine_test_delay (e);
    r = device_pwrite (&st->dev, data == SNAPFG_ZERO_DATA ? e->zeroes : data,
                       s->chunk_size, where);
    *cow_failed = r < 0;
    return r;
  }
  if (data == NULL)
    return copy_chunk_run (s, chunk, nc, 1, cow_failed);

  /* A snapshot write over part of the chunk: the origin's data, changed
   * in a buffer, goes to the COW store with one write.
   */
  buf = device_copy_buffer (s->chunk_size);
  if (buf == NULL)
    return -ENOMEM;
  if (start + len > e->size) {
    len = e->size - start;      /* past the origin's end reads as zero */
    memset ((char *) buf + len, 0, s->chunk_size - len);
  }
  r = device_pread (&e->origin, buf, len, start);
  if (r < 0)
    origin_read_failed (s, chunk, 1, start + len, r);
  else {
    if (data == SNAPFG_ZERO_DATA)
      memset ((char *) buf + offset_in_chunk, 0, count);
    else
      memcpy ((char *) buf + offset_in_chunk, data, count);
    engine_test_delay (e);      /* widen the B window in tests */
    r = device_pwrite (&st->dev, buf, s->chunk_size, where);
    *cow_failed = r < 0;
  }
  device_copy_buffer_release (buf);
  return r;
}

/* --- One copy-out path, for one chunk or for the chunks of a request ---
 *
 * An origin write of 1 MiB over 4 KiB chunks needs up to 256 copy-outs.
 * Done one by one, each waits for its own commit (two sync rounds of a
 * persistent store), so the write waits for 512 syncs in a row.  Done as
 * a batch, the chunks are claimed together (A → B each), consecutive
 * chunks are copied with one origin read and one COW write into a run of
 * consecutive COW chunks, and all of them are committed with one call:
 * one wait for the group commit.  The order of docs/design.md section 5
 * holds for the batch as a whole: every chunk's data is written before the
 * commit, and the commit returns only when data and metadata are
 * durable; the origin is changed after that.  A snapshot write is a
 * batch of one chunk with the write merged into its copy.
 *
 * With write-back (writeback.c) an origin copy-out is not done by the
 * request at all: its chunks are claimed (B) and given COW chunks, and
 * the batch is handed to the committer, which copies every batch of its
 * round (one thread writing the COW store, in long runs), publishes and
 * retires them (B → C → D), commits them, and only then lets the held
 * origin writes reach the origin.  Until then the origin chunks are
 * unchanged: snapshot reads of them go to the origin, tracked, as for
 * any pending exception, and other writers to them wait (and ask the
 * committer for its round at once: copy_deferral.urge).
 */

/* The most chunks and bytes copied out together.  A request over more
 * is done in several batches.
 */
#define COPY_BATCH_CHUNKS 256
#define COPY_BATCH_BYTES (1024 * 1024)

struct copy_batch {
  size_t n, cap;
  /* A snapshot write merged into the batch's only chunk (NULL: none;
   * SNAPFG_ZERO_DATA: zeroes).
   */
  const void *data;
  uint32_t count, offset_in_chunk;
  /* An origin copy-out under write-back: handed to the committer. */
  bool defer;
  struct exception_stripe **stripe;
  struct pending_exception *pe;
  struct store_pair *pair;
};

/* A batch waiting for the committer, with its arrays after it.  The
 * held write it was made for (owner) stays queued at least until the
 * batch is committed: it was queued before the batch, and the committer
 * applies (and frees) a held write only after the round that took its
 * batches.
 */
struct deferred_copy {
  struct deferred_copy *next;
  struct snapfg_snapshot *s;
  void *owner;                  /* the held write (opaque here) */
  /* How far the round has got with it: grouping a round's batches by
   * snapshot needs no reset walk (deferred_copy_write sets 1, then
   * deferred_copy_commit 2).
   */
  unsigned char stage;
  int read_error;               /* an origin read failed: its error */
  struct copy_batch b;
};

/* A pair's new_chunk once its origin chunk could not be read: the claim
 * is given up, the exception is not committed, and the COW chunk stays
 * unused (as when a request's copy-out fails after the allocation).
 */
#define CHUNK_NOT_COPIED UINT64_MAX

DEFINE_VECTOR_TYPE (store_pair_vector, struct store_pair);

/* The arrays of a batch copied out by the request itself. */
struct copy_batch_arrays {
  struct exception_stripe *stripe[COPY_BATCH_CHUNKS];
  struct pending_exception pe[COPY_BATCH_CHUNKS];
  struct store_pair pair[COPY_BATCH_CHUNKS];
};

static void
batch_init (struct copy_batch *b, struct copy_batch_arrays *a)
{
  b->n = 0;
  b->cap = COPY_BATCH_CHUNKS;
  b->data = NULL;
  b->defer = false;
  b->stripe = a->stripe;
  b->pe = a->pe;
  b->pair = a->pair;
}

/* A batch of up to cap chunks for the committer. */
static struct deferred_copy *
deferred_copy_new (struct snapfg_snapshot *s, void *owner,
                   size_t cap)
{
  struct deferred_copy *dc;
  char *p;

  dc = malloc (sizeof *dc + cap * (sizeof *dc->b.stripe + sizeof *dc->b.pe +
                                   sizeof *dc->b.pair));
  if (dc == NULL)
    return NULL;
  p = (char *) (dc + 1);
  dc->next = NULL;
  dc->s = s;
  dc->owner = owner;
  dc->read_error = 0;
  dc->stage = 0;
  dc->b.n = 0;
  dc->b.cap = cap;
  dc->b.data = NULL;
  dc->b.defer = true;
  dc->b.pair = (struct store_pair *) p;
  p += cap * sizeof *dc->b.pair;
  dc->b.pe = (struct pending_exception *) p;
  p += cap * sizeof *dc->b.pe;
  dc->b.stripe = (struct exception_stripe **) p;
  return dc;
}

/* Give every claim of the batch up (B → A) after a failure. */
static void
abandon_batch (struct copy_batch *b)
{
  for (size_t i = 0; i < b->n; ++i)
    abandon_chunk (b->stripe[i], &b->pe[i]);
  b->n = 0;
}

/* Write the batch's copies: the snapshot write's chunk, or one read and
 * one write per run of chunks consecutive both in the origin and in the
 * COW store.  *cow_failed as for copy_chunk_run.
 */
static int
write_batch_copies (struct snapfg_snapshot *s, struct copy_batch *b,
                    bool *cow_failed)
{
  size_t i, j;
  int r = 0;

  *cow_failed = false;
  if (b->data)
    return write_chunk_copy (s, b->pair[0].old_chunk, b->pair[0].new_chunk,
                             b->data, b->count, b->offset_in_chunk,
                             cow_failed);
  for (i = 0; i < b->n; i = j) {
    for (j = i + 1; j < b->n; ++j)
      if (b->pair[j].old_chunk != b->pair[j - 1].old_chunk + 1 ||
          b->pair[j].new_chunk != b->pair[j - 1].new_chunk + 1)
        break;
    r = copy_chunk_run (s, b->pair[i].old_chunk, b->pair[i].new_chunk,
                        j - i, cow_failed);
    if (r < 0)
      break;
    engine_fault_point (s->engine, FAULT_AFTER_COW_RUN);
  }
  return r;
}

/* Copy out and commit every chunk claimed in the batch, then publish and
 * retire them (B → C → D).  On failure every claim is given up.  Returns
 * 0, -ENOSPC (store full; for a snapshot write, Overflow: the snapshot
 * stays valid), -EIO (the snapshot became Invalid), the origin's read
 * error, or -ENOMEM.
 */
static void publish_batch (struct snapfg_snapshot *s, struct copy_batch *b);

static int
copy_out_batch (struct snapfg_snapshot *s, struct copy_batch *b)
{
  struct snapfg_engine *e = s->engine;
  struct snapfg_store *st = s->store;
  bool cow_failed = false;
  size_t i, j;
  int r = 0;

  /* A snapshot write found the store full before (Overflow, as sticky
   * as dm's): refuse it before taking a chunk, so that retried writes
   * do not use up the chunks origin copy-outs still need.
   */
  if (b->data && atomic_load (&s->overflow)) {
    r = -ENOSPC;
    goto abandon;
  }

  /* COW chunks, in runs as long as the store's allocation allows. */
  for (i = 0; i < b->n; ) {
    uint64_t first, got;

    r = st->ops->alloc_run (st, b->n - i, &first, &got);
    if (r < 0)
      goto abandon;             /* -ENOSPC: the caller decides what it means */
    for (j = 0; j < got; ++j)
      b->pair[i + j].new_chunk = first + j;
    i += got;
  }

  if (b->defer) {
    /* The committer copies, publishes, retires and commits. */
    e->copy_deferral.defer (e->copy_deferral.opaque,
                            container_of (b, struct deferred_copy, b));
    return 0;
  }

  r = write_batch_copies (s, b, &cow_failed);
  /* The file system holding the store is full.  For a snapshot write
   * that is Overflow (docs/design.md section 6): the write fails with
   * ENOSPC, and nothing refers to the chunk it may have half written.
   * For an origin write the snapshot cannot keep the old data: Invalid.
   */
  if (r == -ENOSPC && cow_failed && b->data)
    goto abandon;
  r = cow_write_failure (s, r, cow_failed);
  if (r < 0)
    goto abandon;
  engine_fault_point (e, FAULT_AFTER_COW_DATA);

  /* One commit (one wait for the group commit) for the whole batch. */
  r = st->ops->commit (st, b->pair, b->n);
  if (r == -ENOSPC && b->data)
    /* No room for the exception table to grow: the store can take no
     * new exception, but every one it holds is intact (Overflow).
     */
    goto abandon;
  if (r < 0) {
    snapshot_invalidate (s, "committing an exception failed", -r);
    r = -EIO;
    goto abandon;
  }
  engine_fault_point (e, FAULT_AFTER_METADATA);
  publish_batch (s, b);
  return 0;

 abandon:
  abandon_batch (b);
  return r;
}

/* B → C for all, so that new snapshot reads go to the COW store, then
 * drain the snapshot reads sent to the origin earlier and retire each
 * (C → D).  One stripe lock at a time.  (A deferred batch's chunks that
 * could not be copied were given up before: they are skipped.)
 */
static void
publish_batch (struct snapfg_snapshot *s, struct copy_batch *b)
{
  size_t i, copied = 0;

  for (i = 0; i < b->n; ++i) {
    if (b->pair[i].new_chunk == CHUNK_NOT_COPIED)
      continue;
    copied++;
    exception_stripe_lock (b->stripe[i]);
    exception_stripe_publish (b->stripe[i], &b->pe[i], b->pair[i].new_chunk);
    exception_stripe_unlock (b->stripe[i]);
  }
  for (i = 0; i < b->n; ++i) {
    if (b->pair[i].new_chunk == CHUNK_NOT_COPIED)
      continue;
    exception_stripe_lock (b->stripe[i]);
    while (exception_stripe_has_tracked_reads (b->stripe[i],
                                               b->pair[i].old_chunk)) {
      if (snapfg_debug_lock)
        snapfg_debug ("snapshot %s: chunk %" PRIu64 " copied, draining "
                      "snapshot reads from the origin", s->name,
                      b->pair[i].old_chunk);
      exception_stripe_wait (b->stripe[i]);
    }
    exception_stripe_retire (b->stripe[i], &b->pe[i]);
    exception_stripe_unlock (b->stripe[i]);
  }

  if (snapfg_debug_cow && copied)
    snapfg_debug ("snapshot %s: %zu chunk%s from %" PRIu64 " -> COW chunks "
                  "from %" PRIu64 "%s", s->name, copied,
                  copied > 1 ? "s" : "", b->pair[0].old_chunk,
                  b->pair[0].new_chunk,
                  b->data ? " (snapshot write)" : b->defer ? " (write-back)"
                  : "");
  stats_add (&s->stats, STAT_COPY_OUTS, copied);
  stats_add (&s->stats, STAT_BYTES_COPIED, (uint64_t) copied * s->chunk_size);
  b->n = 0;
}

int
snapshot_copy_out (struct snapfg_snapshot *s, uint64_t chunk,
                   const void *data, uint32_t count,
                   uint32_t offset_in_chunk, uint64_t *new_chunk)
{
  struct exception_stripe *stripe;
  struct pending_exception pe;
  struct store_pair pair;
  struct copy_batch b = {
    .n = 0, .cap = 1, .stripe = &stripe, .pe = &pe, .pair = &pair,
  };
  int r;

  stripe = exception_table_stripe (&s->table, chunk);
  r = claim_chunk (s, stripe, &pe, chunk, new_chunk, true);
  if (r != CLAIM_OWNED)
    return r;                   /* remapped already (1), or an error */

  /* We own the chunk: every writer to it, origin or snapshot, waits for
   * us.  Snapshot reads still go to the origin (its data is unchanged)
   * and are tracked.
   */
  b.n = 1;
  b.data = data;
  b.count = count;
  b.offset_in_chunk = offset_in_chunk;
  b.defer = false;
  pair.old_chunk = chunk;
  r = copy_out_batch (s, &b);
  if (r == 0)
    *new_chunk = pair.new_chunk;
  return r;
}

/* The batch is complete: copy it out (or, deferred, hand it to the
 * committer, which then owns *dc; on failure it is freed here).
 */
static int
batch_done (struct snapfg_snapshot *s, struct copy_batch *b,
            struct deferred_copy **dc)
{
  int r = copy_out_batch (s, b);

  if (*dc) {
    if (r < 0)
      free (*dc);
    *dc = NULL;
  }
  return r;
}

int
snapshot_copy_out_range (struct snapfg_snapshot *s, uint64_t first,
                         uint64_t last, void *held)
{
  bool defer = held != NULL;
  struct copy_batch_arrays arrays;
  struct copy_batch local, *b = &local;
  struct deferred_copy *dc = NULL;
  size_t max = COPY_BATCH_BYTES >> s->chunk_shift;
  uint64_t chunk = first;
  int r = 0;

  if (max > COPY_BATCH_CHUNKS)
    max = COPY_BATCH_CHUNKS;
  if (max == 0)
    max = 1;
  if (!defer)
    batch_init (&local, &arrays);
  while (chunk <= last) {
    struct exception_stripe *stripe =
      exception_table_stripe (&s->table, chunk);
    uint64_t nc;

    if (defer && dc == NULL) {
      /* A batch the committer will own: as long as the request needs. */
      uint64_t left = last - chunk + 1;

      dc = deferred_copy_new (s, held, left < max ? left : max);
      if (dc == NULL) {
        r = -ENOMEM;
        break;
      }
      b = &dc->b;
    }
    /* Claim without waiting while the batch holds claims: waiting for
     * someone else's copy-out while holding ours could deadlock with a
     * request that claims in another order.  A busy chunk ends the
     * batch; it is waited for once the batch is done.
     */
    r = claim_chunk (s, stripe, &b->pe[b->n], chunk, &nc, b->n == 0);
    if (r < 0)
      break;
    if (r == CLAIM_BUSY) {
      r = batch_done (s, b, &dc);
      if (r < 0)
        return r;
      continue;                 /* claim this chunk again, waiting */
    }
    if (r == CLAIM_OWNED) {
      b->stripe[b->n] = stripe;
      b->pair[b->n].old_chunk = chunk;
      b->n++;
      if (b->n == max || b->n == b->cap) {
        r = batch_done (s, b, &dc);
        if (r < 0)
          return r;
      }
    }
    chunk++;
  }
  if (r < 0) {
    if (dc || !defer)
      abandon_batch (b);
    free (dc);
    return r;
  }
  if (dc && b->n)
    return batch_done (s, b, &dc);
  free (dc);                    /* allocated, nothing claimed in it */
  return !defer && b->n ? copy_out_batch (s, b) : 0;
}

/* --- the committer's side of deferred batches --- */

/* The committer's copies.  The pairs of a round, in queue order, make
 * runs of consecutive COW chunks across batches (their chunks were
 * allocated in about that order).  A run whose origin chunks are
 * consecutive too is one copy (copy_chunk_run); one whose origin chunks
 * are scattered (random first writes) is read into a buffer, neighbours
 * together, and written with one write: one COW write per run instead
 * of one per chunk, from one thread instead of every writer contending
 * for the COW file.
 */
#define GATHER_BYTES (1024 * 1024)
#define GATHER_MAX_CHUNKS (GATHER_BYTES / SNAPFG_MIN_CHUNK_SIZE)

struct gather {
  struct snapfg_snapshot *s;
  char *buf;                    /* GATHER_BYTES, or NULL: copy each run */
  uint64_t max;                 /* chunks in a run at most */
  uint64_t new0, n;             /* the run: COW chunks new0 .. new0+n-1 */
  struct {
    struct store_pair *pair;
    struct deferred_copy *dc;
  } slot[GATHER_MAX_CHUNKS];
  int r;                        /* the first COW write failure */
};

/* Read origin chunks [chunk, chunk+n) into buf; past the origin's end
 * they read as zeroes (as copy_chunk_run writes them).
 */
static int
read_origin_chunks (struct snapfg_snapshot *s, char *buf, uint64_t chunk,
                    uint64_t n)
{
  struct snapfg_engine *e = s->engine;
  uint64_t start = chunk << s->chunk_shift;
  uint64_t len = n << s->chunk_shift;
  uint64_t in_origin = start + len <= e->size ? len
    : start < e->size ? e->size - start : 0;
  int r = device_pread (&e->origin, buf, in_origin, start);

  if (r < 0) {
    origin_read_failed (s, chunk, n, start + in_origin, r);
    return r;
  }
  memset (buf + in_origin, 0, len - in_origin);
  return 0;
}

static uint64_t
slot_old (const struct gather *g, uint64_t i)
{
  return g->slot[i].pair->old_chunk;
}

/* Reading the origin for the gathered run failed.  The copies are
 * already acknowledged, so the error cannot go back to a request; and
 * the snapshot has lost nothing yet, since no held write over those
 * chunks has reached the origin.  So copy the run chunk by chunk, and
 * mark each chunk whose read fails: its claim is given up, and its held
 * write is never applied (deferred_copy_each_read_failure), so that the snapshot
 * stays valid.  A COW write failure on the way is one for the snapshot.
 * Returns 0 or that failure.
 */
static int
gather_copy_each (struct gather *g, uint64_t n, bool *cow_failed)
{
  struct snapfg_snapshot *s = g->s;

  for (uint64_t i = 0; i < n; ++i) {
    int r = copy_chunk_run (s, slot_old (g, i), g->new0 + i, 1, cow_failed);

    if (r < 0 && *cow_failed)
      return r;
    if (r < 0) {
      g->slot[i].pair->new_chunk = CHUNK_NOT_COPIED;
      if (g->slot[i].dc->read_error == 0)
        g->slot[i].dc->read_error = r;
    }
  }
  return 0;
}

/* Write the gathered run, if any. */
static void
gather_flush (struct gather *g)
{
  struct snapfg_snapshot *s = g->s;
  uint64_t n = g->n, i, j;
  bool consecutive = true, cow_failed = false;
  int r = 0;

  g->n = 0;
  if (n == 0 || g->r < 0)
    return;
  for (i = 1; i < n && consecutive; ++i)
    consecutive = slot_old (g, i) == slot_old (g, i - 1) + 1;
  if (consecutive || g->buf == NULL) {
    for (i = 0; i < n && r == 0; i = j) {
      for (j = i + 1; j < n && slot_old (g, j) == slot_old (g, j - 1) + 1; ++j)
        ;
      r = copy_chunk_run (s, slot_old (g, i), g->new0 + i, j - i,
                          &cow_failed);
    }
  }
  else {
    for (i = 0; i < n && r == 0; i = j) {
      for (j = i + 1; j < n && slot_old (g, j) == slot_old (g, j - 1) + 1; ++j)
        ;
      r = read_origin_chunks (s, g->buf + (i << s->chunk_shift),
                              slot_old (g, i), j - i);
    }
    if (r == 0) {
      engine_test_delay (s->engine);    /* widen the B window in tests */
      r = device_pwrite_uncached (&s->store->dev, g->buf,
                                  n << s->chunk_shift,
                                  store_chunk_offset (s->store, g->new0));
      cow_failed = r < 0;
    }
  }
  if (r < 0 && !cow_failed)
    r = gather_copy_each (g, n, &cow_failed);
  if (r < 0)
    g->r = r;
  else
    engine_fault_point (s->engine, FAULT_AFTER_COW_RUN);
}

/* Add one pair to the gathered run (flushing the run if it ends). */
static void
gather_add (struct gather *g, struct deferred_copy *dc, struct store_pair *p)
{
  if (g->n && (p->new_chunk != g->new0 + g->n || g->n == g->max))
    gather_flush (g);
  if (g->n == 0)
    g->new0 = p->new_chunk;
  g->slot[g->n].pair = p;
  g->slot[g->n].dc = dc;
  g->n++;
}

/* Grouping a round's batches by snapshot, one walk for each: is d a
 * batch of s?  Then it is marked as past stage.  If not, and it is the
 * first batch of a snapshot not walked for yet, its snapshot is the next
 * one (*next_s, NULL before the walk).  A round's batches are thousands,
 * and almost always all of one snapshot: then one walk does it.
 */
static bool
batch_of (struct deferred_copy *d, struct snapfg_snapshot *s,
          unsigned char stage, struct snapfg_snapshot **next_s)
{
  if (d->s != s) {
    if (*next_s == NULL && d->stage < stage)
      *next_s = d->s;
    return false;
  }
  d->stage = stage;
  return true;
}

void
deferred_copy_write (struct deferred_copy *list)
{
  struct gather *g = malloc (sizeof *g);
  /* (Aligned for device_pwrite_uncached.) */
  char *buf = aligned_alloc (DEVICE_UNCACHED_ALIGN, GATHER_BYTES);
  struct snapfg_snapshot *s, *next_s;

  for (s = list ? list->s : NULL; s; s = next_s) {
    struct snapfg_engine *e = s->engine;
    bool valid = snapshot_is_valid (s);
    struct gather local;

    if (g == NULL) {
      /* No memory for the run's bookkeeping: chunk by chunk. */
      g = &local;
      local.max = 1;
    }
    else
      g->max = GATHER_BYTES >> s->chunk_shift;
    g->s = s;
    g->buf = g == &local ? NULL : buf;
    g->n = 0;
    g->r = 0;
    next_s = NULL;
    for (struct deferred_copy *d = list; d; d = d->next)
      if (batch_of (d, s, 1, &next_s) && valid && g->r == 0)
        for (size_t i = 0; i < d->b.n; ++i)
          gather_add (g, d, &d->b.pair[i]);
    if (valid)
      gather_flush (g);
    if (valid && g->r < 0)
      /* The snapshot cannot keep the old data: Invalid (the origin
       * writes go ahead, acknowledged already).
       */
      cow_write_failure (s, g->r, true);
    else if (valid) {
      /* (A walk only for the test hook.) */
      if (engine_fault_armed (e, FAULT_AFTER_COW_DATA))
        for (struct deferred_copy *d = list; d; d = d->next)
          if (d->s == s)
            engine_fault_point (e, FAULT_AFTER_COW_DATA);
    }
    if (g == &local)
      g = NULL;
  }
  free (buf);
  free (g);
}

void
deferred_copy_each_read_failure (struct deferred_copy *list,
                                 void (*fn) (void *opaque, void *owner,
                                             int err),
                                 void *opaque)
{
  for (struct deferred_copy *d = list; d; d = d->next)
    /* Unless the snapshot became Invalid meanwhile (then the write may
     * go ahead: nothing is left to protect).
     */
    if (d->read_error && snapshot_is_valid (d->s))
      fn (opaque, d->owner, d->read_error);
}

size_t
deferred_copy_commit (struct deferred_copy *list)
{
  store_pair_vector pairs = { 0 };
  size_t committed = 0;
  struct snapfg_snapshot *s, *next_s;

  for (s = list ? list->s : NULL; s; s = next_s) {
    bool whole = true;
    int r;

    store_pair_vector_clear (&pairs);
    next_s = NULL;
    for (struct deferred_copy *d = list; d; d = d->next)
      if (batch_of (d, s, 2, &next_s))
        for (size_t i = 0; i < d->b.n && whole; ++i)
          if (d->b.pair[i].new_chunk != CHUNK_NOT_COPIED)
            whole = store_pair_vector_append (&pairs, d->b.pair[i]) == 0;
    if (!snapshot_is_valid (s))
      continue;
    /* Out of memory for the list: the snapshot cannot be kept (its
     * batches are given up by deferred_copy_finish), never wrong.
     */
    r = whole ? s->store->ops->commit (s->store, pairs.ptr, pairs.len)
      : -ENOMEM;
    if (r < 0) {
      snapshot_invalidate (s, "committing an exception failed", -r);
      continue;
    }
    committed += pairs.len;
  }
  store_pair_vector_reset (&pairs);
  /* The crash point after the metadata counts batches, as it does with
   * writeback=off: the round's are all durable here, and none of its
   * held writes has reached the origin.
   */
  if (list && engine_fault_armed (list->s->engine, FAULT_AFTER_METADATA))
    for (struct deferred_copy *dc = list; dc; dc = dc->next)
      engine_fault_point (dc->s->engine, FAULT_AFTER_METADATA);
  return committed;
}

void
deferred_copy_link (struct deferred_copy *dc, struct deferred_copy *next)
{
  dc->next = next;
}

void
deferred_copy_publish (struct deferred_copy *list)
{
  /* Copied unless the snapshot became Invalid (a failed copy, or
   * anything else): then the claims are given up.  The pairs stay for
   * the commit (publish_batch and abandon_batch empty the batch).
   */
  for (struct deferred_copy *dc = list; dc; dc = dc->next) {
    size_t n = dc->b.n;

    if (snapshot_is_valid (dc->s)) {
      if (dc->read_error)
        for (size_t i = 0; i < n; ++i)
          if (dc->b.pair[i].new_chunk == CHUNK_NOT_COPIED)
            abandon_chunk (dc->b.stripe[i], &dc->b.pe[i]);
      publish_batch (dc->s, &dc->b);
    }
    else
      abandon_batch (&dc->b);
    dc->b.n = n;
  }
}

uint64_t
deferred_copy_free (struct deferred_copy *list)
{
  uint64_t freed = 0;

  while (list) {
    struct deferred_copy *next = list->next;

    freed += deferred_copy_size (list);
    free (list);
    list = next;
  }
  return freed;
}

uint64_t
deferred_copy_size (const struct deferred_copy *dc)
{
  /* As deferred_copy_new allocates it, and the allocation's overhead
   * as writeback_cost counts a small held write's.
   */
  return sizeof *dc + dc->b.cap * (sizeof *dc->b.stripe + sizeof *dc->b.pe +
                                   sizeof *dc->b.pair) + 64;
}
