/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: block status of the origin with held writes laid
 * over it (writeback_origin_extents in writeback.h).
 *
 * A held write is acknowledged data that the origin device does not
 * have yet: where it lands in a hole, the device reports HOLE|ZERO, and
 * a reader that trusts block status (nbdcopy, qemu-img convert, QEMU's
 * mirror and backup jobs) would copy zeroes where the client wrote
 * data.  So every part of an extent that a READY held WRITE covers is
 * reported as data (type 0).  Held zeroes and trims are left as the
 * device says: data where they will zero is still correct (data may
 * always read as zero), and a hole under them reads as zero already.
 */

#include <config.h>

#include <stdlib.h>
#include <errno.h>

#include "writeback-internal.h"
#include "writeback.h"
#include "scoped-lock.h"

/* [from, to) of the origin, data because of held writes. */
struct data_range {
  uint64_t from, to;
};

struct overlay {
  snapfg_extent_fn fn;
  void *opaque;
  struct data_range *ranges;      /* sorted by from, not overlapping */
  size_t n;
  size_t next;                    /* the first range not wholly passed */
};

static int
compare_from (const void *a, const void *b)
{
  const struct data_range *x = a, *y = b;

  return x->from < y->from ? -1 : x->from > y->from;
}

/* The held writes' ranges, clipped to the request, sorted and merged.
 * Returns 0 or -ENOMEM.
 */
static int
data_ranges (const struct held_view *v, uint32_t count, uint64_t offset,
             struct overlay *o)
{
  size_t n = 0;

  o->ranges = malloc ((v->n ? v->n : 1) * sizeof *o->ranges);
  if (o->ranges == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < v->n; ++i) {
    if (v->w[i]->op != ORIGIN_WRITE)
      continue;
    held_view_clip (v->w[i], offset, count,
                    &o->ranges[n].from, &o->ranges[n].to);
    n++;
  }
  if (n > 1)
    qsort (o->ranges, n, sizeof *o->ranges, compare_from);
  o->n = 0;
  for (size_t i = 0; i < n; ++i) {
    if (o->n && o->ranges[i].from <= o->ranges[o->n - 1].to) {
      if (o->ranges[i].to > o->ranges[o->n - 1].to)
        o->ranges[o->n - 1].to = o->ranges[i].to;
    }
    else
      o->ranges[o->n++] = o->ranges[i];
  }
  o->next = 0;
  return 0;
}

/* What device_extents reports, in order: pass data through, split a
 * hole or zero extent where held writes lie in it.
 */
static int
overlay_extent (void *opaque, uint64_t offset, uint64_t length,
                uint32_t type)
{
  struct overlay *o = opaque;
  uint64_t end = offset + length;

  while (o->next < o->n && o->ranges[o->next].to <= offset)
    o->next++;
  if (type == 0)
    return o->fn (o->opaque, offset, length, 0);
  for (size_t i = o->next; i < o->n && offset < end; ++i) {
    const struct data_range *d = &o->ranges[i];
    uint64_t from = d->from > offset ? d->from : offset;
    uint64_t to = d->to < end ? d->to : end;
    int r;

    if (from >= end)
      break;
    if (from > offset &&
        (r = o->fn (o->opaque, offset, from - offset, type)) < 0)
      return r;
    if ((r = o->fn (o->opaque, from, to - from, 0)) < 0)
      return r;
    offset = to;
  }
  if (offset < end)
    return o->fn (o->opaque, offset, end - offset, type);
  return 0;
}

int
writeback_origin_extents (struct snapfg_engine *e, uint32_t count,
                          uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  struct held_view held;
  struct overlay o = { .fn = fn, .opaque = opaque };
  int r;

  /* Taken before the device is asked, as reads do: a held write that
   * the committer applies meanwhile is then data in one or the other.
   */
  r = writeback_read_begin (e, count, offset, &held);
  if (r == 0 && held.n == 0) {
    writeback_read_end (e, &held, NULL, count, offset, false);
    return device_extents (&e->origin, count, offset, fn, opaque);
  }
  if (r == 0 && data_ranges (&held, count, offset, &o) < 0) {
    writeback_read_end (e, &held, NULL, count, offset, false);
    r = -ENOMEM;
  }
  if (r < 0)
    /* Without the list of held writes, data is the answer that is
     * never wrong.
     */
    return fn (opaque, offset, count, 0);
  /* The references keep nothing the overlay needs: drop them now. */
  writeback_read_end (e, &held, NULL, count, offset, false);
  r = device_extents (&e->origin, count, offset, overlay_extent, &o);
  free (o.ranges);
  return r;
}
