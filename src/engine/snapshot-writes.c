/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the bitmaps of a snapshot's own writes (snapshot-writes.h). */

#include <config.h>

#include <stdlib.h>
#include <stdatomic.h>

#include "engine-internal.h"
#include "snapshot-writes.h"

static struct snapshot_writes *
writes_of (struct snapfg_snapshot *s)
{
  return atomic_load_explicit (&s->writes, memory_order_acquire);
}

bool
snapshot_writes_prepare (struct snapfg_snapshot *s)
{
  struct snapshot_writes *w = writes_of (s), *none = NULL;
  uint64_t chunks, words;

  if (w) {
    atomic_thread_fence (memory_order_seq_cst);
    return true;
  }
  chunks = (s->engine->size + s->chunk_size - 1) >> s->chunk_shift;
  words = (chunks + 63) / 64;
  w = calloc (1, sizeof *w + 2 * words * sizeof w->bits[0]);
  if (w == NULL)
    return false;
  w->words = words;
  w->snap = w->bits;
  w->origin = w->bits + words;
  /* Two first writes at once: one set of bitmaps wins. */
  if (!atomic_compare_exchange_strong (&s->writes, &none, w))
    free (w);
  /* Pairs with the fence in snapshot_writes_mark_origin: either the
   * origin change sees these bitmaps, or this write sees its exception.
   */
  atomic_thread_fence (memory_order_seq_cst);
  return true;
}

static void
set_bit (_Atomic uint64_t *map, uint64_t bit)
{
  atomic_fetch_or (&map[bit / 64], UINT64_C (1) << (bit % 64));
}

static bool
test_bit (_Atomic uint64_t *map, uint64_t bit)
{
  return atomic_load (&map[bit / 64]) & (UINT64_C (1) << (bit % 64));
}

void
snapshot_writes_mark_snapshot (struct snapfg_snapshot *s, uint64_t chunk)
{
  struct snapshot_writes *w = writes_of (s);

  if (w && chunk / 64 < w->words)
    set_bit (w->snap, chunk);
}

void
snapshot_writes_mark_origin (struct snapfg_engine *e, uint64_t offset,
                             uint64_t count)
{
  if (count == 0)
    return;
  /* The change's exceptions are published: see snapshot_writes_prepare. */
  atomic_thread_fence (memory_order_seq_cst);
  for (size_t i = 0; i < e->nsnapshots; ++i) {
    struct snapfg_snapshot *s = e->snapshots[i];
    struct snapshot_writes *w = writes_of (s);
    uint64_t first = offset >> s->chunk_shift;
    uint64_t last = (offset + count - 1) >> s->chunk_shift;

    for (uint64_t c = first; w && c <= last && c / 64 < w->words; ++c)
      set_bit (w->origin, c);
  }
}

bool
snapshot_writes_only_snapshot (struct snapfg_snapshot *s, uint64_t chunk)
{
  struct snapshot_writes *w = writes_of (s);

  return w && chunk / 64 < w->words && test_bit (w->snap, chunk) &&
    !test_bit (w->origin, chunk);
}

void
snapshot_writes_free (struct snapfg_snapshot *s)
{
  free (atomic_exchange (&s->writes, NULL));
}
