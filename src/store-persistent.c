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

#include "store.h"
#include "rounding.h"
#include "dm-format.h"
#include "store-binding.h"
#include "snapfg-log.h"

struct persistent_store {
  struct snapfg_store base;     /* first: the engine sees only this */
  uint64_t pairs_per_area;

  /* Group commit.  'lock' protects everything below down to 'failed'. */
  pthread_mutex_t lock;
  pthread_cond_t committed;
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

  /* Statistics, for the benchmark and debug output. */
  atomic_uint_least64_t syncs;
  atomic_uint_least64_t commits;
  atomic_uint_least64_t groups;

  bool invalidated;             /* header valid=0 written (under lock) */
  bool fresh;                   /* formatted by us at open: empty table */
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

static int
ps_sync (struct persistent_store *ps)
{
  atomic_fetch_add (&ps->syncs, 1);
  return device_flush (&ps->base.dev);
}

static int
write_header (struct persistent_store *ps, uint32_t valid)
{
  unsigned char buf[512] = { 0 };
  struct dm_header h = {
    .magic = DM_SNAP_MAGIC,
    .valid = valid,
    .version = DM_SNAP_VERSION,
    .chunk_sectors = ps->base.chunk_size / 512,
    .snapfg_merging = ps->merging,
  };

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

static int
persistent_alloc_chunk (struct snapfg_store *st, uint64_t *new_chunk)
{
  struct persistent_store *ps = ps_of (st);
  uint64_t chunk = atomic_load (&st->next_chunk);
  uint64_t next;

  /* A bump pointer that hops over metadata areas, without a lock.  The
   * last data chunk of a region is only handed out if the next area fits
   * in the store too: handing it out lets the region's area fill up, and
   * a full area must be followed by a zeroed one (the table's end).
   */
  do {
    if (chunk >= st->max_chunks ||
        (dm_is_metadata_chunk (chunk + 1, ps->pairs_per_area) &&
         chunk + 1 >= st->max_chunks))
      return -ENOSPC;
    next = dm_skip_metadata (chunk + 1, ps->pairs_per_area);
  } while (!atomic_compare_exchange_weak (&st->next_chunk, &chunk, next));
  *new_chunk = chunk;
  return 0;
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

static int
queue_pair (struct persistent_store *ps, uint64_t old_chunk,
            uint64_t new_chunk)
{
  if (ps->nqueue == ps->queue_cap) {
    size_t cap = ps->queue_cap ? ps->queue_cap * 2 : 64;
    struct store_pair *q = realloc (ps->queue, cap * sizeof *q);
    if (q == NULL)
      return -ENOMEM;
    ps->queue = q;
    ps->queue_cap = cap;
  }
  ps->queue[ps->nqueue].old_chunk = old_chunk;
  ps->queue[ps->nqueue].new_chunk = new_chunk;
  ps->nqueue++;
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
      r = ps_sync (ps);
    if (r == 0) {
      pthread_mutex_lock (&ps->lock);
      ps->durable = written_upto;       /* areas written last round */
      pthread_cond_broadcast (&ps->committed);
      pthread_mutex_unlock (&ps->lock);
      r = write_pairs (ps, batch, n);   /* data of this batch is durable */
      if (r == 0 && n > 0)
        atomic_fetch_add (&ps->groups, 1);
    }

    pthread_mutex_lock (&ps->lock);
    ps->batch = batch;
    ps->batch_cap = cap;
    if (r < 0)
      ps->failed = r;
    else
      ps->written = queued_upto;
  }
}

static int
persistent_commit (struct snapfg_store *st, uint64_t old_chunk,
                   uint64_t new_chunk)
{
  struct persistent_store *ps = ps_of (st);
  uint64_t mine;
  int r;

  pthread_mutex_lock (&ps->lock);
  if (ps->failed) {
    r = ps->failed;
    pthread_mutex_unlock (&ps->lock);
    return r;
  }
  r = queue_pair (ps, old_chunk, new_chunk);
  if (r < 0) {
    pthread_mutex_unlock (&ps->lock);
    return r;
  }
  mine = ++ps->queued;

  while (ps->durable < mine && ps->failed == 0) {
    if (ps->leader_active) {
      pthread_cond_wait (&ps->committed, &ps->lock);
      continue;
    }
    ps->leader_active = true;
    lead_commits (ps, mine);
    ps->leader_active = false;
    pthread_cond_broadcast (&ps->committed);
  }
  r = ps->durable >= mine ? 0 : ps->failed;
  if (r == 0)
    atomic_fetch_add (&ps->commits, 1);
  pthread_mutex_unlock (&ps->lock);
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

  if (clean && !st->dev.readonly && !st->opened_invalid)
    device_flush (&st->dev);
  snapfg_debug ("cow=%s: %" PRIu64 " exceptions committed in %" PRIu64
                " groups with %" PRIu64 " syncs",
                st->dev.path, (uint64_t) atomic_load (&ps->commits),
                (uint64_t) atomic_load (&ps->groups),
                (uint64_t) atomic_load (&ps->syncs));
  device_close (&st->dev);
  pthread_cond_destroy (&ps->committed);
  pthread_mutex_destroy (&ps->lock);
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
  .alloc_chunk = persistent_alloc_chunk,
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
  pthread_cond_init (&ps->committed, NULL);

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
    st->opened_merging = ps->merging = h.snapfg_merging && h.valid;
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
  else if (st->opened_invalid)
    snapfg_error ("cow=%s: the store is marked Invalid (valid = 0): the "
                  "snapshot's export fails every request", params->path);
  else
    ps->binding_pending = write_binding;

  *stp = st;
  return 0;
}
