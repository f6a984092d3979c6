/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbdkit-snapfg-repo-plugin: one point of a snapfg backup repository
 * served as a read-only NBD export, without restoring it first.
 *
 *   nbdkit snapfg-repo repo=LOCATION disk=NAME [at=N] [key-file=F]
 *          [cache=SIZE]
 *
 * Thin glue over the repository's reader interface (src/repo/repo.h):
 * the run's index is loaded at start-up; a read fetches only the chunks
 * it touches (repo_read_chunk: fetched, decrypted, decompressed and
 * checked), keeping the last few in a small cache, so that a client
 * reading a file system's metadata or booting from the point does not
 * fetch the disk.  Chunks the index records as zero are never fetched:
 * they read as zeroes and are holes in the extents.  Writes are refused
 * (snapfg-backup serve --writable puts nbdkit's cow filter in front).
 *
 * With -v, each chunk fetched is a debug line "fetched chunk N", which
 * tests count; the total is logged at exit.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cleanup.h"
#include "scoped-lock.h"
#include "repo.h"

static const char *location;
static const char *disk;
static long at = 0;             /* 0: the latest complete run */
static const char *key_file;
static int64_t cache_bytes = 64 * 1024 * 1024;

static struct repo *repo;
static struct repo_index *ix;
static uint64_t disk_size;
static uint32_t chunk_size;

/* The cache: the last chunks fetched, least recently used replaced. */
struct cached_chunk {
  uint64_t n;
  uint64_t used;                /* last use, from the clock below */
  bool valid;
  char *data;
};
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cached_chunk *cache;
static size_t cache_slots;
static uint64_t cache_clock;
static atomic_uint_least64_t chunks_fetched;

static int
repo_config (const char *key, const char *value)
{
  if (strcmp (key, "repo") == 0)
    location = value;
  else if (strcmp (key, "disk") == 0)
    disk = value;
  else if (strcmp (key, "at") == 0) {
    char *end;
    errno = 0;
    at = strtol (value, &end, 10);
    if (errno || end == value || *end || at < 1) {
      nbdkit_error ("at=%s: not a run number (1 or more)", value);
      return -1;
    }
  }
  else if (strcmp (key, "key-file") == 0)
    key_file = value;
  else if (strcmp (key, "cache") == 0) {
    cache_bytes = nbdkit_parse_size (value);
    if (cache_bytes < 0)
      return -1;
  }
  else {
    nbdkit_error ("unknown parameter '%s' (repo=, disk=, at=, key-file=, "
                  "cache=)", key);
    return -1;
  }
  return 0;
}

static int
repo_config_complete (void)
{
  if (location == NULL || disk == NULL) {
    nbdkit_error ("repo=LOCATION and disk=NAME are required");
    return -1;
  }
  return 0;
}

#define repo_config_help \
  "repo=LOCATION   (required) the repository: a directory or s3://...\n" \
  "disk=NAME       (required) the disk\n" \
  "at=N            its run N (default: the latest)\n" \
  "key-file=F      the key of an encrypted repository\n" \
  "cache=SIZE      chunks kept in memory (default 64M)"

static int
repo_get_ready (void)
{
  int r = repo_open (location, NULL, key_file, &repo);

  if (r < 0) {
    nbdkit_error ("repo=%s: cannot open the repository: %s", location,
                  strerror (-r));
    return -1;
  }
  r = repo_index_load (repo, disk, at, &ix);
  if (r < 0) {
    if (at > 0)
      nbdkit_error ("repo=%s: disk %s has no run %ld: %s", location, disk,
                    at, strerror (-r));
    else
      nbdkit_error ("repo=%s: disk %s has no complete run: %s", location,
                    disk, strerror (-r));
    return -1;
  }
  disk_size = repo_index_disk_size (ix);
  chunk_size = repo_index_chunk_size (ix);
  cache_slots = cache_bytes / chunk_size;
  if (cache_slots < 2)
    cache_slots = 2;
  cache = calloc (cache_slots, sizeof *cache);
  if (cache == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  for (size_t i = 0; i < cache_slots; ++i) {
    cache[i].data = malloc (chunk_size);
    if (cache[i].data == NULL) {
      nbdkit_error ("no memory for a cache of %zu chunks of %" PRIu32
                    " bytes (cache=)", cache_slots, chunk_size);
      return -1;
    }
  }
  nbdkit_debug ("repo=%s disk=%s run %ld: %" PRIu64 " bytes in chunks of %"
                PRIu32 ", cache of %zu chunks", location, disk,
                repo_index_run (ix), disk_size, chunk_size, cache_slots);
  return 0;
}

static void
repo_unload (void)
{
  if (ix)
    nbdkit_debug ("chunks fetched: %" PRIu64, (uint64_t) chunks_fetched);
  for (size_t i = 0; cache && i < cache_slots; ++i)
    free (cache[i].data);
  free (cache);
  repo_index_free (ix);
  repo_close (repo);
}

static void *
repo_open_conn (int readonly)
{
  static int handle;
  return &handle;
}

static int64_t
repo_get_size (void *handle)
{
  return disk_size;
}

static int
repo_can_write (void *handle)
{
  return 0;
}

static int
repo_can_multi_conn (void *handle)
{
  return 1;
}

static int
repo_can_extents (void *handle)
{
  return 1;
}

/* Copy [off, off+len) of chunk n into buf: from the cache, or fetched
 * (with no lock held) and put in the cache.
 */
static int
read_chunk_part (uint64_t n, uint32_t off, uint32_t len, char *buf)
{
  CLEANUP_FREE char *fresh = NULL;
  size_t victim = 0;
  int r;

  {
    SCOPED_MUTEX_LOCK (&cache_lock);
    for (size_t i = 0; i < cache_slots; ++i)
      if (cache[i].valid && cache[i].n == n) {
        cache[i].used = ++cache_clock;
        memcpy (buf, cache[i].data + off, len);
        return 0;
      }
  }
  fresh = malloc (chunk_size);
  if (fresh == NULL) {
    nbdkit_error ("malloc: %m");
    return -1;
  }
  r = repo_read_chunk (repo, ix, n, fresh);
  if (r < 0) {
    nbdkit_error ("repo=%s disk=%s: chunk %" PRIu64 " (offset %" PRIu64
                  "): %s", location, disk, n, n * chunk_size, strerror (-r));
    errno = -r;
    return -1;
  }
  atomic_fetch_add (&chunks_fetched, 1);
  nbdkit_debug ("fetched chunk %" PRIu64, n);
  memcpy (buf, fresh + off, len);

  SCOPED_MUTEX_LOCK (&cache_lock);
  for (size_t i = 0; i < cache_slots; ++i) {
    if (!cache[i].valid) {
      victim = i;
      break;
    }
    if (cache[i].used < cache[victim].used)
      victim = i;
  }
  /* Swap buffers: the cache keeps the fresh one. */
  {
    char *old = cache[victim].data;
    cache[victim].data = fresh;
    fresh = old;
  }
  cache[victim].n = n;
  cache[victim].valid = true;
  cache[victim].used = ++cache_clock;
  return 0;
}

static int
repo_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
            uint32_t flags)
{
  char *p = buf;

  while (count > 0) {
    uint64_t n = offset / chunk_size;
    uint32_t off = offset % chunk_size;
    uint32_t len = chunk_size - off < count ? chunk_size - off : count;

    if (repo_index_chunk_is_zero (ix, n))
      memset (p, 0, len);
    else if (read_chunk_part (n, off, len, p) == -1)
      return -1;
    p += len;
    offset += len;
    count -= len;
  }
  return 0;
}

static int
repo_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
              struct nbdkit_extents *extents)
{
  uint64_t end = offset + count;

  while (offset < end) {
    uint64_t n = offset / chunk_size;
    uint64_t next = (n + 1) * chunk_size;
    uint32_t type = repo_index_chunk_is_zero (ix, n)
      ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0;

    if (next > disk_size)
      next = disk_size;
    if (nbdkit_add_extent (extents, offset, next - offset, type) == -1)
      return -1;
    offset = next;
    if (flags & NBDKIT_FLAG_REQ_ONE)
      break;
  }
  return 0;
}

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct nbdkit_plugin plugin = {
  .name              = "snapfg-repo",
  .longname          = "snapfg backup repository point",
  .version           = PACKAGE_VERSION,
  .config            = repo_config,
  .config_complete   = repo_config_complete,
  .config_help       = repo_config_help,
  .magic_config_key  = "repo",
  .get_ready         = repo_get_ready,
  .unload            = repo_unload,
  .open              = repo_open_conn,
  .get_size          = repo_get_size,
  .can_write         = repo_can_write,
  .can_multi_conn    = repo_can_multi_conn,
  .can_extents       = repo_can_extents,
  .pread             = repo_pread,
  .extents           = repo_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
