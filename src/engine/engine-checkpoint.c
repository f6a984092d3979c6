/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what the engine offers its checkpoints (engine-checkpoint.h). */

#include <config.h>

#include <stdatomic.h>

#include "engine-checkpoint.h"
#include "engine-internal.h"

struct checkpoint_chain *
snapfg_engine_checkpoints (struct snapfg_engine *e)
{
  return e->cbt;
}

void
snapfg_engine_set_checkpoints (struct snapfg_engine *e,
                               struct checkpoint_chain *c)
{
  e->cbt = c;
}

struct cbt_bitmap *
snapfg_engine_active_bitmap (struct snapfg_engine *e)
{
  return atomic_load (&e->cbt_active);
}

void
snapfg_engine_set_active_bitmap (struct snapfg_engine *e,
                                 struct cbt_bitmap *bm)
{
  atomic_store (&e->cbt_active, bm);
}

void
snapfg_engine_hold_requests (struct snapfg_engine *e)
{
  percpu_rwlock_write_lock (&e->geometry);
}

void
snapfg_engine_release_requests (struct snapfg_engine *e)
{
  percpu_rwlock_write_unlock (&e->geometry);
}

bool
snapfg_origin_moved (struct snapfg_engine *e)
{
  return e->origin_moved;
}

int
snapfg_snapshot_remapped_chunks (struct snapfg_snapshot *s, uint64_t **chunks,
                                 size_t *n, uint32_t *chunk_size)
{
  *chunk_size = s->chunk_size;
  return exception_table_collect (&s->table, chunks, n);
}
