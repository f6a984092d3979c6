/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright (C) 2026 the snapfg authors
 *
 * nbdkit-powercut-plugin: a test-only nbdkit plugin that simulates the
 * disks of one machine, each with a volatile write cache, and a power
 * cut that hits all of them at the same instant.  Built by make check,
 * never installed.
 *
 *   nbdkit -U SOCK tests/.libs/nbdkit-powercut-plugin.so \
 *       disk=origin:origin.img disk=cow:cow.img seed=42 \
 *       [cut-after=N] [trigger=FILE] [report=FILE]
 *
 * Each disk=NAME:FILE is an export NAME backed by FILE, which holds the
 * disk's durable image.  A write (or zero, or trim, which reads back as
 * zeroes) goes into the disk's cache: reads see it at once, but FILE
 * receives it only when a flush reaches that export (on any connection:
 * the plugin advertises multi-conn) or when the write carries FUA.
 *
 * The power goes after cut-after=N requests (over all exports, counted
 * from the start of the process; request N+1 is the first to fail) or
 * within a few milliseconds of FILE of trigger= appearing, whichever
 * comes first.  At the cut, each 512-byte sector that has unflushed
 * writes keeps, at random, either its durable contents or one of the
 * versions written to it since its last flush (a disk cache may write
 * back any of them, in any order).  The choice comes from seed= (printed
 * at start and in the report), so a failure can be repeated.  After the
 * cut every request on every export fails with EIO, and report=FILE (if
 * given) is written: the seed, the request count, and per disk how many
 * sectors kept their newest version, an older one, or none.
 *
 * Restarting nbdkit on the same files is the next boot: the cache is
 * empty and FILE is what survived.
 *
 * Every request runs under one lock: the cut is one instant for every
 * disk and every connection.  The plugin does not sync FILE to the
 * host's disk; the host itself does not lose power.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#define SECTOR 512
#define MAX_DISKS 8

/* The versions written to one sector since it was last durable, oldest
 * first.
 */
struct cached_sector {
  unsigned n, cap;
  unsigned char (*v)[SECTOR];
};

struct disk {
  char *name;
  char *path;
  int fd;
  uint64_t size;                 /* bytes, a multiple of SECTOR */
  struct cached_sector **cache;  /* one per sector, NULL when clean */
  uint64_t *dirty;               /* sectors with a cache entry */
  size_t ndirty, dirty_cap;
};

static struct disk disks[MAX_DISKS];
static size_t ndisks;
static uint64_t seed;
static bool seed_given;
static uint64_t cut_after;       /* 0: only the trigger cuts */
static char *trigger;
static char *report;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t requests;
static bool dead;
static uint64_t rng_state;

/* splitmix64: small, good enough, and the same on every platform. */
static uint64_t
next_random (void)
{
  uint64_t z = (rng_state += UINT64_C (0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static void
powercut_unload (void)
{
  size_t i;
  uint64_t s;

  for (i = 0; i < ndisks; i++) {
    if (disks[i].cache) {
      for (s = 0; s < disks[i].size / SECTOR; s++) {
        if (disks[i].cache[s]) {
          free (disks[i].cache[s]->v);
          free (disks[i].cache[s]);
        }
      }
    }
    free (disks[i].cache);
    free (disks[i].dirty);
    free (disks[i].name);
    free (disks[i].path);
    if (disks[i].fd >= 0)
      close (disks[i].fd);
  }
  free (trigger);
  free (report);
}

static int
powercut_config (const char *key, const char *value)
{
  if (strcmp (key, "disk") == 0) {
    const char *colon = strchr (value, ':');
    struct disk *d;

    if (colon == NULL || colon == value || colon[1] == '\0') {
      nbdkit_error ("disk=%s: expected disk=NAME:FILE", value);
      return -1;
    }
    if (ndisks == MAX_DISKS) {
      nbdkit_error ("disk=%s: at most %d disks", value, MAX_DISKS);
      return -1;
    }
    d = &disks[ndisks];
    d->fd = -1;
    d->name = strndup (value, colon - value);
    d->path = nbdkit_realpath (colon + 1);
    if (d->name == NULL || d->path == NULL) {
      nbdkit_error ("disk=%s: %m", value);
      free (d->name);
      free (d->path);
      return -1;
    }
    ndisks++;
  }
  else if (strcmp (key, "seed") == 0) {
    if (nbdkit_parse_uint64_t ("seed", value, &seed) == -1)
      return -1;
    seed_given = true;
  }
  else if (strcmp (key, "cut-after") == 0) {
    if (nbdkit_parse_uint64_t ("cut-after", value, &cut_after) == -1)
      return -1;
  }
  else if (strcmp (key, "trigger") == 0) {
    free (trigger);
    trigger = nbdkit_absolute_path (value);
    if (trigger == NULL)
      return -1;
  }
  else if (strcmp (key, "report") == 0) {
    free (report);
    report = nbdkit_absolute_path (value);
    if (report == NULL)
      return -1;
  }
  else {
    nbdkit_error ("unknown parameter '%s'", key);
    return -1;
  }
  return 0;
}

static int
powercut_config_complete (void)
{
  size_t i, j;

  if (ndisks == 0) {
    nbdkit_error ("give at least one disk=NAME:FILE");
    return -1;
  }
  for (i = 0; i < ndisks; i++)
    for (j = 0; j < i; j++)
      if (strcmp (disks[i].name, disks[j].name) == 0) {
        nbdkit_error ("disk=%s: the export name is given twice",
                      disks[i].name);
        return -1;
      }
  if (!seed_given)
    seed = (uint64_t) time (NULL) ^ ((uint64_t) getpid () << 32);
  rng_state = seed;
  return 0;
}

#define powercut_config_help \
  "disk=NAME:FILE     An export NAME whose durable image is FILE (repeat).\n" \
  "seed=N             Seed of the choice of surviving sectors.\n" \
  "cut-after=N        The power goes after N requests.\n" \
  "trigger=FILE       The power goes when FILE appears.\n" \
  "report=FILE        Written after the cut."

static int
powercut_get_ready (void)
{
  size_t i;

  for (i = 0; i < ndisks; i++) {
    struct disk *d = &disks[i];
    struct stat st;

    d->fd = open (d->path, O_RDWR | O_CLOEXEC);
    if (d->fd == -1 || fstat (d->fd, &st) == -1) {
      nbdkit_error ("disk=%s:%s: %m", d->name, d->path);
      return -1;
    }
    if (st.st_size % SECTOR != 0) {
      nbdkit_error ("disk=%s:%s: the size %" PRIu64 " is not a multiple "
                    "of %d bytes", d->name, d->path,
                    (uint64_t) st.st_size, SECTOR);
      return -1;
    }
    d->size = st.st_size;
    d->cache = calloc (d->size / SECTOR + 1, sizeof *d->cache);
    if (d->cache == NULL) {
      nbdkit_error ("disk=%s: %m", d->name);
      return -1;
    }
  }
  fprintf (stderr, "powercut: seed %" PRIu64 ", %zu disk(s), cut after %"
           PRIu64 " requests%s%s\n", seed, ndisks, cut_after,
           trigger ? " or when this appears: " : "", trigger ? trigger : "");
  return 0;
}

/* The sector's durable contents, from the file. */
static int
read_durable (struct disk *d, uint64_t s, unsigned char *buf)
{
  if (pread (d->fd, buf, SECTOR, s * SECTOR) != SECTOR) {
    nbdkit_error ("%s: read of sector %" PRIu64 ": %m", d->path, s);
    return -1;
  }
  return 0;
}

static int
write_durable (struct disk *d, uint64_t s, const unsigned char *buf)
{
  if (pwrite (d->fd, buf, SECTOR, s * SECTOR) != SECTOR) {
    nbdkit_error ("%s: write of sector %" PRIu64 ": %m", d->path, s);
    return -1;
  }
  return 0;
}

static void
drop_cached (struct disk *d, uint64_t s)
{
  if (d->cache[s]) {
    free (d->cache[s]->v);
    free (d->cache[s]);
    d->cache[s] = NULL;         /* its entry in d->dirty is skipped later */
  }
}

/* A new version of sector s goes into the cache. */
static int
cache_sector (struct disk *d, uint64_t s, const unsigned char *buf)
{
  struct cached_sector *c = d->cache[s];

  if (c == NULL) {
    if (d->ndirty == d->dirty_cap) {
      size_t cap = d->dirty_cap ? 2 * d->dirty_cap : 1024;
      uint64_t *p = realloc (d->dirty, cap * sizeof *p);
      if (p == NULL) {
        nbdkit_error ("realloc: %m");
        return -1;
      }
      d->dirty = p;
      d->dirty_cap = cap;
    }
    c = calloc (1, sizeof *c);
    if (c == NULL) {
      nbdkit_error ("calloc: %m");
      return -1;
    }
    d->cache[s] = c;
    d->dirty[d->ndirty++] = s;
  }
  if (c->n == c->cap) {
    unsigned cap = c->cap ? 2 * c->cap : 1;
    void *p = realloc (c->v, cap * sizeof *c->v);
    if (p == NULL) {
      nbdkit_error ("realloc: %m");
      return -1;
    }
    c->v = p;
    c->cap = cap;
  }
  memcpy (c->v[c->n++], buf, SECTOR);
  return 0;
}

/* What a read of sector s sees now. */
static int
current_sector (struct disk *d, uint64_t s, unsigned char *buf)
{
  struct cached_sector *c = d->cache[s];

  if (c) {
    memcpy (buf, c->v[c->n - 1], SECTOR);
    return 0;
  }
  return read_durable (d, s, buf);
}

/* A flush of d: every cached sector's newest version becomes durable. */
static int
flush_disk (struct disk *d)
{
  size_t i;

  for (i = 0; i < d->ndirty; i++) {
    uint64_t s = d->dirty[i];
    struct cached_sector *c = d->cache[s];

    if (c == NULL)
      continue;
    if (write_durable (d, s, c->v[c->n - 1]) == -1)
      return -1;
    drop_cached (d, s);
  }
  d->ndirty = 0;
  return 0;
}

/* The power goes.  Called with the lock held. */
static void
power_cut (const char *why)
{
  FILE *fp = NULL;
  char *tmp = NULL;
  size_t i, j;

  dead = true;
  if (report && asprintf (&tmp, "%s.tmp", report) >= 0)
    fp = fopen (tmp, "w");
  fprintf (stderr, "powercut: power cut (%s) after %" PRIu64
           " requests, seed %" PRIu64 "\n", why, requests, seed);
  if (fp)
    fprintf (fp, "why %s\nrequests %" PRIu64 "\nseed %" PRIu64 "\n",
             why, requests, seed);
  for (i = 0; i < ndisks; i++) {
    struct disk *d = &disks[i];
    uint64_t newest = 0, older = 0, lost = 0, versions = 0;

    for (j = 0; j < d->ndirty; j++) {
      uint64_t s = d->dirty[j];
      struct cached_sector *c = d->cache[s];
      unsigned k;

      if (c == NULL)
        continue;
      /* 0: the durable contents stay; k: version k-1 reached the disk. */
      k = next_random () % (c->n + 1);
      versions += c->n;
      if (k == 0)
        lost++;
      else {
        if (k == c->n)
          newest++;
        else
          older++;
        write_durable (d, s, c->v[k - 1]);
      }
      drop_cached (d, s);
    }
    d->ndirty = 0;
    fprintf (stderr, "powercut: disk %s: %" PRIu64 " unflushed sectors "
             "(%" PRIu64 " versions): %" PRIu64 " kept the newest, %" PRIu64
             " an older one, %" PRIu64 " none\n",
             d->name, newest + older + lost, versions, newest, older, lost);
    if (fp)
      fprintf (fp, "disk %s sectors %" PRIu64 " newest %" PRIu64
               " older %" PRIu64 " lost %" PRIu64 "\n",
               d->name, newest + older + lost, newest, older, lost);
  }
  if (fp) {
    if (fclose (fp) == 0)
      rename (tmp, report);
  }
  free (tmp);
}

/* Polls for the trigger file, so that the test can cut the power at a
 * moment of its choosing, with or without requests going on.
 */
static void *
trigger_thread (void *arg)
{
  const struct timespec ts = { .tv_sec = 0, .tv_nsec = 5000000 };

  for (;;) {
    if (access (trigger, F_OK) == 0) {
      pthread_mutex_lock (&lock);
      if (!dead)
        power_cut ("trigger");
      pthread_mutex_unlock (&lock);
      return NULL;
    }
    nanosleep (&ts, NULL);
  }
}

static int
powercut_after_fork (void)
{
  pthread_t t;
  int err;

  if (trigger == NULL)
    return 0;
  err = pthread_create (&t, NULL, trigger_thread, NULL);
  if (err) {
    errno = err;
    nbdkit_error ("pthread_create: %m");
    return -1;
  }
  pthread_detach (t);
  return 0;
}

static int
powercut_list_exports (int readonly, int is_tls, struct nbdkit_exports *e)
{
  size_t i;

  for (i = 0; i < ndisks; i++)
    if (nbdkit_add_export (e, disks[i].name, NULL) == -1)
      return -1;
  return 0;
}

static void *
powercut_open (int readonly)
{
  const char *name = nbdkit_export_name ();
  size_t i;

  for (i = 0; i < ndisks; i++)
    if (name && strcmp (name, disks[i].name) == 0)
      return &disks[i];
  nbdkit_error ("no disk named '%s' (the exports are given with disk=)",
                name ? name : "");
  return NULL;
}

static int64_t
powercut_get_size (void *handle)
{
  struct disk *d = handle;
  return d->size;
}

static int powercut_can (void *handle) { return 1; }
static int powercut_cannot (void *handle) { return 0; }
static int powercut_can_fua (void *handle) { return NBDKIT_FUA_NATIVE; }

/* Every request starts here, under the lock: a dead machine answers
 * nothing, and request cut_after + 1 is the one that meets the cut.
 */
static int
begin_request (void)
{
  if (!dead && cut_after && requests == cut_after)
    power_cut ("cut-after");
  if (dead) {
    nbdkit_set_error (EIO);
    return -1;
  }
  requests++;                   /* served: the report counts these */
  return 0;
}

static int
powercut_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
                uint32_t flags)
{
  struct disk *d = handle;
  unsigned char *out = buf;
  uint64_t s, first = offset / SECTOR, last = (offset + count - 1) / SECTOR;
  int r = 0;

  pthread_mutex_lock (&lock);
  if (begin_request () == -1) {
    r = -1;
    goto out;
  }
  if (pread (d->fd, buf, count, offset) != (ssize_t) count) {
    nbdkit_error ("%s: read of %" PRIu32 " bytes at %" PRIu64 ": %m",
                  d->path, count, offset);
    nbdkit_set_error (EIO);
    r = -1;
    goto out;
  }
  /* The cache overlays the durable image. */
  for (s = first; s <= last; s++) {
    struct cached_sector *c = d->cache[s];
    uint64_t from, to;

    if (c == NULL)
      continue;
    from = s * SECTOR > offset ? s * SECTOR : offset;
    to = (s + 1) * SECTOR < offset + count ? (s + 1) * SECTOR : offset + count;
    memcpy (out + (from - offset), c->v[c->n - 1] + (from - s * SECTOR),
            to - from);
  }
 out:
  pthread_mutex_unlock (&lock);
  return r;
}

/* Write count bytes of buf (or zeroes if buf is NULL) at offset: each
 * sector touched gets a new version, in the cache or, with FUA, on the
 * durable image (which supersedes what the cache held for it).
 */
static int
write_range (struct disk *d, const unsigned char *buf, uint32_t count,
             uint64_t offset, uint32_t flags)
{
  uint64_t s, first = offset / SECTOR, last = (offset + count - 1) / SECTOR;
  unsigned char sector[SECTOR];
  int r = 0;

  pthread_mutex_lock (&lock);
  if (begin_request () == -1) {
    r = -1;
    goto out;
  }
  for (s = first; s <= last; s++) {
    uint64_t from = s * SECTOR > offset ? s * SECTOR : offset;
    uint64_t to = (s + 1) * SECTOR < offset + count
      ? (s + 1) * SECTOR : offset + count;

    if (to - from < SECTOR && current_sector (d, s, sector) == -1)
      goto error;
    if (buf)
      memcpy (sector + (from - s * SECTOR), buf + (from - offset), to - from);
    else
      memset (sector + (from - s * SECTOR), 0, to - from);
    if (flags & NBDKIT_FLAG_FUA) {
      drop_cached (d, s);
      if (write_durable (d, s, sector) == -1)
        goto error;
    }
    else if (cache_sector (d, s, sector) == -1)
      goto error;
  }
 out:
  pthread_mutex_unlock (&lock);
  return r;
 error:
  nbdkit_set_error (EIO);
  r = -1;
  goto out;
}

static int
powercut_pwrite (void *handle, const void *buf, uint32_t count,
                 uint64_t offset, uint32_t flags)
{
  return write_range (handle, buf, count, offset, flags);
}

static int
powercut_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return write_range (handle, NULL, count, offset, flags);
}

static int
powercut_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return write_range (handle, NULL, count, offset, flags);
}

static int
powercut_flush (void *handle, uint32_t flags)
{
  struct disk *d = handle;
  int r = 0;

  pthread_mutex_lock (&lock);
  if (begin_request () == -1)
    r = -1;
  else if (flush_disk (d) == -1) {
    nbdkit_set_error (EIO);
    r = -1;
  }
  pthread_mutex_unlock (&lock);
  return r;
}

static struct nbdkit_plugin plugin = {
  .name              = "powercut",
  .longname          = "snapfg's test disk with a volatile cache and a power cut",
  .unload            = powercut_unload,
  .config            = powercut_config,
  .config_complete   = powercut_config_complete,
  .config_help       = powercut_config_help,
  .magic_config_key  = NULL,
  .get_ready         = powercut_get_ready,
  .after_fork        = powercut_after_fork,
  .list_exports      = powercut_list_exports,
  .open              = powercut_open,
  .get_size          = powercut_get_size,
  .can_write         = powercut_can,
  .can_flush         = powercut_can,
  .can_trim          = powercut_can,
  .can_zero          = powercut_can,
  .can_multi_conn    = powercut_can,
  .can_fua           = powercut_can_fua,
  .can_fast_zero     = powercut_cannot,
  .pread             = powercut_pread,
  .pwrite            = powercut_pwrite,
  .zero              = powercut_zero,
  .trim              = powercut_trim,
  .flush             = powercut_flush,
  .errno_is_preserved = 0,
};

/* Requests run in parallel up to the one lock above, which every
 * request takes. */
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
