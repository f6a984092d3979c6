/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: reading a point.
 *
 * What a reader of the repository needs (restore, verify, and the nbdkit
 * plugin that serves a point, plugins/snapfg-repo/): open a repository,
 * load one disk's run index, read and check one chunk.  The format is
 * docs/repository.md.  Writers (backup, prune, gc) use more of the
 * library than this; this header is the stable part the server uses.
 */
#ifndef SNAPFG_REPO_H
#define SNAPFG_REPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repo-store.h"

struct repo;                    /* an open repository */
struct repo_index;              /* one run of one disk: a full point */

/* Open the repository at location (a directory or s3://BUCKET[/PREFIX]).
 * key_file: the key of an encrypted repository, or NULL.  A wrong or
 * missing key is refused here, before any data is read.
 */
extern int repo_open (const char *location, const struct repo_s3_options *s3,
                      const char *key_file, struct repo **r);
extern void repo_close (struct repo *r);

/* Load disk's run number at (at <= 0: the latest complete run). */
extern int repo_index_load (struct repo *r, const char *disk, long at,
                            struct repo_index **ix);
extern void repo_index_free (struct repo_index *ix);

extern uint64_t repo_index_disk_size (const struct repo_index *ix);
extern uint32_t repo_index_chunk_size (const struct repo_index *ix);
extern long repo_index_run (const struct repo_index *ix);
/* Is chunk n all zeroes (stored as no chunk at all)? */
extern bool repo_index_chunk_is_zero (const struct repo_index *ix,
                                      uint64_t n);

/* Read chunk n of the point into buf (repo_index_chunk_size bytes; the
 * last chunk of a disk is padded with zeroes): fetched, decrypted,
 * decompressed and checked against its digest.  -EIO with a message
 * naming the chunk if it is damaged.  Safe to call from several threads
 * at once on one repository.
 */
extern int repo_read_chunk (struct repo *r, const struct repo_index *ix,
                            uint64_t n, void *buf);

#endif
