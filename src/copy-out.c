/* snapfg: the exclusive path — copying an origin chunk into a snapshot's
 * COW store and publishing the exception (the A → B → C → D walk of
 * DESIGN.md section 3).
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>

#include "engine-internal.h"
#include "snapfg-log.h"

/* Under the stripe lock, wait until the chunk is either remapped with no
 * copy in progress (state D: return 1), or not remapped at all (state A:
 * register 'pe' as its pending exception and return 0).  Never holds the
 * lock across the allocation done when the stripe must grow.
 */
static int
claim_chunk (struct snapfg_snapshot *s, struct exception_stripe *stripe,
             struct pending_exception *pe, uint64_t chunk,
             uint64_t *new_chunk)
{
  int r;

  exception_stripe_lock (stripe);
  for (;;) {
    bool completed, pending;

    if (!snapshot_is_valid (s)) {
      exception_stripe_unlock (stripe);
      return -EIO;
    }
    completed = exception_stripe_lookup (stripe, chunk, new_chunk);
    pending = exception_stripe_is_pending (stripe, chunk);
    if (completed && !pending) {                      /* D */
      exception_stripe_unlock (stripe);
      return 1;
    }
    if (pending) {                                    /* B or C */
      if (snapfg_debug_lock)
        snapfg_debug ("snapshot %s: chunk %" PRIu64 " is being copied, "
                      "waiting", s->name, chunk);
      stats_add (&s->stats, STAT_PENDING_WAITS, 1);
      exception_stripe_wait (stripe);
      continue;
    }
    r = exception_stripe_add_pending (stripe, pe, chunk);  /* A → B */
    if (r == 0)
      break;
    exception_stripe_unlock (stripe);
    r = exception_stripe_grow (stripe);
    if (r < 0)
      return r;
    exception_stripe_lock (stripe);
  }
  exception_stripe_unlock (stripe);
  return 0;
}

/* Give up a claimed chunk (B → A) after a failure; waiters re-check. */
static void
abandon_chunk (struct exception_stripe *stripe, struct pending_exception *pe)
{
  exception_stripe_lock (stripe);
  exception_stripe_retire (stripe, pe);
  exception_stripe_unlock (stripe);
}

/* Build the chunk's new contents in buf: the origin's data, overlaid with
 * the snapshot write if there is one.  Returns a pointer to the data to
 * write (buf, or the caller's data when it covers the whole chunk).
 */
static int
prepare_chunk_data (struct snapfg_snapshot *s, uint64_t chunk,
                    const void *data, uint32_t count,
                    uint32_t offset_in_chunk, void **bufp,
                    const void **outp)
{
  struct snapfg_engine *e = s->engine;
  uint64_t start = chunk << s->chunk_shift;
  uint64_t len = s->chunk_size;
  void *buf;
  int r;

  if (data && offset_in_chunk == 0 && count == s->chunk_size) {
    /* A whole-chunk snapshot write: nothing to copy from the origin. */
    *bufp = NULL;
    *outp = data == SNAPFG_ZERO_DATA ? e->zeroes : data;
    return 0;
  }

  buf = malloc (s->chunk_size);
  if (buf == NULL)
    return -ENOMEM;
  /* The last chunk may run past the end of the origin. */
  if (start + len > e->size) {
    len = e->size - start;
    memset ((char *) buf + len, 0, s->chunk_size - len);
  }
  r = device_pread (&e->origin, buf, len, start);
  if (r < 0) {
    snapfg_error ("origin=%s: read of chunk %" PRIu64 " for a copy-out "
                  "failed: %s", e->origin.path, chunk, strerror (-r));
    free (buf);
    return r;
  }
  if (data == SNAPFG_ZERO_DATA)
    memset ((char *) buf + offset_in_chunk, 0, count);
  else if (data)
    memcpy ((char *) buf + offset_in_chunk, data, count);
  *bufp = buf;
  *outp = buf;
  return 0;
}

int
snapshot_copy_out (struct snapfg_snapshot *s, uint64_t chunk,
                   const void *data, uint32_t count,
                   uint32_t offset_in_chunk, uint64_t *new_chunk)
{
  struct snapfg_engine *e = s->engine;
  struct snapfg_store *st = s->store;
  struct exception_stripe *stripe = exception_table_stripe (&s->table, chunk);
  struct pending_exception pe;
  void *buf = NULL;
  const void *out;
  uint64_t nc;
  int r;

  r = claim_chunk (s, stripe, &pe, chunk, new_chunk);
  if (r != 0)
    return r;                   /* remapped already (1), or an error */

  /* We own the chunk: every writer to it, origin or snapshot, waits for
   * us.  Snapshot reads still go to the origin (its data is unchanged)
   * and are tracked.
   */
  r = st->ops->alloc_chunk (st, &nc);
  if (r < 0)
    goto abandon;               /* -ENOSPC: the caller decides what it means */

  r = prepare_chunk_data (s, chunk, data, count, offset_in_chunk, &buf, &out);
  if (r < 0)
    goto abandon;
  engine_test_delay (e);        /* widen the B window in tests */

  r = device_pwrite (&st->dev, out, s->chunk_size,
                     store_chunk_offset (st, nc));
  if (r < 0) {
    snapshot_invalidate (s, "write to the COW store failed", -r);
    r = -EIO;
    goto abandon;
  }
  engine_fault_point (e, FAULT_AFTER_COW_DATA);
  r = st->ops->commit (st, chunk, nc);
  if (r < 0) {
    snapshot_invalidate (s, "committing an exception failed", -r);
    r = -EIO;
    goto abandon;
  }
  engine_fault_point (e, FAULT_AFTER_METADATA);
  free (buf);

  exception_stripe_lock (stripe);
  /* B → C: from now on snapshot reads of this chunk go to the COW store. */
  exception_stripe_publish (stripe, &pe, nc);
  /* Snapshot reads sent to the origin earlier must finish before anyone
   * may overwrite the origin chunk.
   */
  while (exception_stripe_has_tracked_reads (stripe, chunk)) {
    if (snapfg_debug_lock)
      snapfg_debug ("snapshot %s: chunk %" PRIu64 " copied, draining "
                    "snapshot reads from the origin", s->name, chunk);
    exception_stripe_wait (stripe);
  }
  exception_stripe_retire (stripe, &pe);          /* C → D */
  exception_stripe_unlock (stripe);

  if (snapfg_debug_cow)
    snapfg_debug ("snapshot %s: chunk %" PRIu64 " -> COW chunk %" PRIu64
                  "%s", s->name, chunk, nc, data ? " (snapshot write)" : "");
  stats_add (&s->stats, STAT_COPY_OUTS, 1);
  stats_add (&s->stats, STAT_BYTES_COPIED, s->chunk_size);
  *new_chunk = nc;
  return 0;

 abandon:
  free (buf);
  abandon_chunk (stripe, &pe);
  return r;
}
