/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: garbage collection (mark and sweep). */
#ifndef SNAPFG_REPO_GC_H
#define SNAPFG_REPO_GC_H

#include <stdbool.h>
#include <stdint.h>

#include "repo.h"

struct repo_gc_result {
  uint64_t indexes;             /* indexes read */
  uint64_t referenced;          /* distinct chunks they reference */
  uint64_t missing;             /* ... of which no object exists */
  uint64_t chunks, chunk_bytes; /* chunk objects found */
  uint64_t removed, removed_bytes;
  uint64_t recent;              /* unreferenced, kept: newer than cutoff */
  uint64_t writers;             /* live backups seen */
  uint64_t partial;             /* files of puts a crash cut short,
                                 * older than cutoff: removed */
  int64_t cutoff;               /* unreferenced chunks older are removed */
};

/* Mark every chunk an index references (touch), then remove every chunk
 * not referenced whose mtime is older than the cutoff: the earlier of
 * gc's start and the start of the oldest live writer, less grace
 * seconds.  See "Garbage collection" in docs/repository.md for why a
 * running backup never loses a chunk.  The partial files of puts a
 * crash cut short (directory back end), older than the cutoff, go too.
 * An index that cannot be read
 * stops gc before anything is removed.
 */
extern int repo_gc (struct repo *r, int64_t grace, bool dry_run,
                    struct repo_gc_result *res);

#endif
