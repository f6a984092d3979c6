/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: what writers and administrators use beyond repo.h
 * (snapfg-backup's init, backup, verify, list, prune and gc).  The format
 * is docs/repository.md.
 */
#ifndef SNAPFG_REPO_ADMIN_H
#define SNAPFG_REPO_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "repo.h"
#include "repo-chunk.h"

/* The chunk size of new repositories: 4 MiB, a multiple of the
 * checkpoint granule (cbt-granularity, 64K by default), so that a
 * changed granule is always inside one chunk; a run rounds the changed
 * ranges out to whole chunks.
 */
#define REPO_CHUNK_SIZE (4u << 20)
#define REPO_CONFIG_KEY "config"
#define REPO_DISK_NAME_MAX 64

/* Make a repository at location: its directory (or bucket prefix) must
 * hold no config yet.  With encrypt, key_file is the key (its bytes).
 */
extern int repo_init (const char *location, const struct repo_s3_options *s3,
                      bool encrypt, const char *key_file, json_t **config);

/* Does location hold a repository's config?  1 yes, 0 no (no such
 * directory, or one without a config), negative errno on failure.
 */
extern int repo_exists (const char *location,
                        const struct repo_s3_options *s3);

/* The parts of an open repository. */
extern struct repo_store *repo_get_store (struct repo *r);
extern const struct repo_keys *repo_get_keys (struct repo *r);
/* Encrypted, whether or not the key was given. */
extern bool repo_is_encrypted (struct repo *r);
/* Opened with its key (or needing none): chunks can be read and written. */
extern bool repo_has_key (struct repo *r);
extern const char *repo_get_id (struct repo *r);
extern uint32_t repo_get_chunk_size (struct repo *r);
extern const char *repo_get_location (struct repo *r);

/* The object key of a chunk: chunks/XX/XXXX... (80 bytes is enough). */
#define REPO_CHUNK_KEY_LEN 80
extern void repo_chunk_key (const unsigned char id[REPO_DIGEST_LEN],
                            char key[REPO_CHUNK_KEY_LEN]);

/* Store the chunk id of plain[0..len) unless it is there already: 0 and
 * *stored the object's size when it was stored, 1 when it was there
 * (and is touched: see "Garbage collection" in docs/repository.md).
 * With replace, it is stored even if there (a damaged chunk, found by
 * verify).  Negative errno on failure.  Thread-safe.
 *
 * headroom: how many bytes before plain the call may overwrite.  With
 * REPO_PUT_HEADROOM of them, a chunk stored as it is (no zstd, no key)
 * gets its header written there, and header and data go to the store
 * as one buffer: a directory store writes it past the page cache when
 * plain - REPO_PUT_HEADROOM is 4096-byte aligned.
 */
#define REPO_PUT_HEADROOM 16    /* REPO_CHUNK_HEADER_LEN */
extern int repo_put_chunk (struct repo *r,
                           const unsigned char id[REPO_DIGEST_LEN],
                           const void *plain, size_t headroom, size_t len,
                           int zstd_level, bool replace, uint64_t *stored);

/* Make every chunk repo_put_chunk stored durable and visible under its
 * name (the store's sync; nothing to do for a store whose puts are
 * durable at once).  Called after the last repo_put_chunk of a run and
 * before its index is committed.  0 or negative errno.
 */
extern int repo_sync (struct repo *r);
/* Read and check chunk id into buf (repo_get_chunk_size bytes). */
extern int repo_read_chunk_id (struct repo *r,
                               const unsigned char id[REPO_DIGEST_LEN],
                               void *buf);

/* --- indexes --- */

/* Is name a valid disk name ([A-Za-z0-9._-], 1-64, not starting '.')? */
extern bool repo_disk_name_ok (const char *name);

/* A new index for a run of disk (all chunks zero until set). */
extern int repo_index_new (const char *disk, uint64_t disk_size,
                           uint32_t chunk_size, struct repo_index **ix);
extern uint64_t repo_index_chunks (const struct repo_index *ix);
/* Chunk n's id (32 zero bytes: a zero chunk); writable. */
extern unsigned char *repo_index_digest (struct repo_index *ix, uint64_t n);
/* The run's metadata (borrowed; writable before commit). */
extern json_t *repo_index_meta (struct repo_index *ix);
extern const char *repo_index_disk (const struct repo_index *ix);

/* Write ix as the disk's next run: the number after the highest there,
 * taken with put if_absent (another writer that took it makes this one
 * try the next).  *run is the number it got.
 */
extern int repo_index_commit (struct repo *r, struct repo_index *ix,
                              long *run);
/* The index object's key for a run. */
extern void repo_index_key (const char *disk, long run, char *key,
                            size_t len);
/* The runs of disk there are, ascending (malloc'd). */
extern int repo_list_runs (struct repo *r, const char *disk, long **runs,
                           size_t *n);
/* The disks that have runs, sorted (malloc'd array of malloc'd names). */
extern int repo_list_disks (struct repo *r, char ***disks, size_t *n);
extern void repo_free_names (char **names, size_t n);

/* --- writers: how gc knows which backups are running --- */

struct repo_writer;
/* Register a running backup (writers/ID) and keep it fresh from a
 * thread until repo_writer_end.
 */
extern int repo_writer_start (struct repo *r, const char *disk,
                              struct repo_writer **w);
extern void repo_writer_end (struct repo_writer *w);
extern const char *repo_writer_id (const struct repo_writer *w);
/* The live writers (refreshed within the stale time): how many and the
 * earliest start among them (INT64_MAX when none).
 */
extern int repo_live_writers (struct repo *r, size_t *n,
                              int64_t *oldest_start, json_t **list);
/* A writer whose registration was not refreshed for this long is taken
 * to have crashed (seconds; SNAPFG_REPO_TEST_WRITER_STALE in tests).
 */
extern int64_t repo_writer_stale_seconds (void);

/* --- damaged chunks, as verify found them --- */

extern void repo_damaged_key (const unsigned char id[REPO_DIGEST_LEN],
                              char key[REPO_CHUNK_KEY_LEN]);

/* Seconds since the epoch, by the clock a run is stamped with:
 * SNAPFG_BACKUP_TEST_TIME when set (tests of prune only).
 */
extern int64_t repo_run_time (void);

#endif
