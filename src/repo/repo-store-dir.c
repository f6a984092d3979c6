/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg repository: the directory back end.
 *
 * Each object is a file, its key the path under the repository's
 * directory.  The file rules of design section 6 hold: nothing is ever
 * written through a name that exists (every file is created exclusively,
 * relative to the repository's directory descriptor, never following a
 * link), and a put is durable when it returns: the new file is written
 * under a temporary name, synced, then given its name and the directory
 * synced.  With if_absent the name is given by link(2), which fails if
 * the name exists (whatever it is): two writers that put the same key
 * at once agree on one winner, and a crash never leaves a torn object
 * under its name.  Temporary files are ".tmp.*", never listed; gc removes
 * the ones a crash left (clean_partial).
 *
 * A run's chunks go in one batch (put_unsynced, then sync): each chunk
 * is written under its temporary name, past the page cache where it is
 * one aligned buffer (write_direct_part), its tail's writeback started
 * (sync_file_range) but not waited for, and only sync gives the names:
 * one syncfs(2) makes every temporary file durable, then each is linked
 * under its name, then a second syncfs makes the names durable.  An
 * fsync per chunk and per directory (measured: about half of a full
 * run's time on this machine) becomes two syncfs per run, and the rule
 * stays: a name only ever holds a complete, durable object, so an index
 * committed after sync names only durable chunks, and a crash leaves
 * only temporary files.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <dirent.h>
#include <limits.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "cleanup.h"
#include "file-create.h"
#include "full-io.h"
#include "snapfg-error.h"
#include "repo-store.h"
#include "repo-store-key.h"

#define TMP_PREFIX ".tmp."

/* A put_unsynced waiting for sync: its temporary file and its name. */
struct pending_put {
  char *tmp, *key;
};

struct dir_store {
  struct repo_store s;          /* first: the generic part */
  int dirfd;
  pthread_mutex_t lock;         /* protects pending */
  struct pending_put *pending;
  size_t npending, cap;
};

static int
dir_fd (struct repo_store *s)
{
  return ((struct dir_store *) s)->dirfd;
}

static int
bad_key (struct repo_store *s, const char *key)
{
  return snapfg_set_error (EINVAL, "%s: '%s' is not a valid object name",
                           s->location, key ? key : "(null)");
}

static int
io_error (struct repo_store *s, const char *key, const char *what, int err)
{
  return snapfg_set_error (err, "%s/%s: %s: %s", s->location, key, what,
                           strerror (err));
}

/* fsync the directory at path (relative to the store; "" the store). */
static int
sync_dir_at (int dirfd, const char *path)
{
  int fd = openat (dirfd, *path ? path : ".",
                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int r = 0;

  if (fd == -1)
    return -errno;
  if (fsync (fd) == -1)
    r = -errno;
  close (fd);
  return r;
}

/* Make the directories of key (each 0700, synced into its parent
 * unless the caller syncs the whole store later).
 */
static int
make_parents (struct repo_store *s, const char *key, bool sync_new)
{
  char path[PATH_MAX];
  char *p;

  if (snprintf (path, sizeof path, "%s", key) >= (int) sizeof path)
    return bad_key (s, key);
  for (p = strchr (path, '/'); p; p = strchr (p + 1, '/')) {
    *p = '\0';
    errno = 0;
    if (mkdirat (dir_fd (s), path, 0700) == 0 && sync_new) {
      char *slash = strrchr (path, '/');
      int r;
      if (slash) {
        *slash = '\0';
        r = sync_dir_at (dir_fd (s), path);
        *slash = '/';
      }
      else
        r = sync_dir_at (dir_fd (s), "");
      if (r < 0)
        return io_error (s, path, "fsync of its directory", -r);
    }
    else if (errno && errno != EEXIST)
      return io_error (s, path, "mkdir", errno);
    *p = '/';
  }
  return 0;
}

/* The directory part of key ("" for a top-level key) into dir. */
static void
parent_of (const char *key, char *dir, size_t len)
{
  const char *slash = strrchr (key, '/');
  size_t n = slash ? (size_t) (slash - key) : 0;

  if (n >= len)
    n = len - 1;
  memcpy (dir, key, n);
  dir[n] = '\0';
}

/* After a transfer of n bytes from v[i..iovcnt): the first piece not
 * done, with what of it was done cut off its front.  readv and writev
 * may stop short, even between pieces.
 */
static int
iov_skip (struct iovec *v, int i, int iovcnt, size_t n)
{
  while (i < iovcnt && n >= v[i].iov_len)
    n -= v[i++].iov_len;
  if (i < iovcnt) {
    v[i].iov_base = (char *) v[i].iov_base + n;
    v[i].iov_len -= n;
  }
  return i;
}

/* writev(2) of every byte of iov (at most IOV_PIECES pieces). */
#define IOV_PIECES 4
static int
full_writev (int fd, const struct iovec *iov, int iovcnt)
{
  struct iovec v[IOV_PIECES];
  int i = 0;

  if (iovcnt > IOV_PIECES) {
    errno = EINVAL;
    return -1;
  }
  memcpy (v, iov, iovcnt * sizeof *v);
  while (i < iovcnt) {
    ssize_t n = writev (fd, v + i, iovcnt - i);

    if (n == -1 && errno == EINTR)
      continue;
    if (n == -1)
      return -1;
    if (n == 0) {
      errno = EIO;
      return -1;
    }
    /* A short write: on from where it stopped. */
    i = iov_skip (v, i, iovcnt, n);
  }
  return 0;
}

/* The aligned part of an object that is one buffer (iov's parts follow
 * each other in memory) starting on a DIRECT_ALIGN boundary: written
 * with O_DIRECT, the rest (less than DIRECT_ALIGN bytes) through the
 * page cache.  The kernel then copies nothing: a 512 MiB disk's full
 * run took 0.20-0.35 s of system time with this (and its connections
 * made and closed at once) against 0.42-1.02 s before (4 paired runs,
 * /usr/bin/time), and 0.74-0.94 s against 0.90-1.21 s of wall time;
 * the run's chunks, read back only by a restore or a verify, no longer
 * push the page cache out either.
 * The syncfs before the names still waits for the device to make them
 * durable.  Returns the bytes written (0: not one aligned buffer, or
 * the file system refuses O_DIRECT: the caller writes it all) or -1
 * (errno).
 */
#define DIRECT_ALIGN 4096

static ssize_t
write_direct_part (int fd, const struct iovec *iov, int iovcnt)
{
  const char *base = iov[0].iov_base;
  size_t total = 0, aligned, done = 0;
  int fl, e;

  for (int i = 0; i < iovcnt; ++i) {
    if ((const char *) iov[i].iov_base != base + total)
      return 0;
    total += iov[i].iov_len;
  }
  aligned = total / DIRECT_ALIGN * DIRECT_ALIGN;
  if ((uintptr_t) base % DIRECT_ALIGN || aligned == 0)
    return 0;
  if ((fl = fcntl (fd, F_GETFL)) == -1 ||
      fcntl (fd, F_SETFL, fl | O_DIRECT) == -1)
    return 0;                   /* no O_DIRECT on this file system */
  while (done < aligned) {
    ssize_t n = pwrite (fd, base + done, aligned - done, done);

    if (n == -1 && errno == EINTR)
      continue;
    if (n > 0 && n % DIRECT_ALIGN == 0) {
      done += n;
      continue;
    }
    e = n == -1 ? errno : EIO;
    if (fcntl (fd, F_SETFL, fl) == -1)
      return -1;
    /* Refused at once (EINVAL: the device wants a coarser alignment):
     * the whole object through the page cache instead.
     */
    if (done == 0 && e == EINVAL)
      return 0;
    errno = e;
    return -1;
  }
  if (fcntl (fd, F_SETFL, fl) == -1)
    return -1;
  return aligned;
}

/* Write iov into a new temporary file beside key (in parent), its name
 * into tmp: synced, or with its writeback only started.
 */
static int
write_temporary (struct repo_store *s, const char *key, const char *parent,
                 const struct iovec *iov, int iovcnt, bool sync, char *tmp,
                 size_t tmp_len)
{
  unsigned char rnd[8];
  int fd;

  if (getrandom (rnd, sizeof rnd, 0) != sizeof rnd)
    return io_error (s, key, "getrandom", errno);
  snprintf (tmp, tmp_len, "%s%s" TMP_PREFIX
            "%02x%02x%02x%02x%02x%02x%02x%02x",
            parent, *parent ? "/" : "", rnd[0], rnd[1], rnd[2], rnd[3],
            rnd[4], rnd[5], rnd[6], rnd[7]);

  /* create_in_dir wants one component: open the parent first. */
  {
    CLEANUP_CLOSE int pfd = openat (dir_fd (s), *parent ? parent : ".",
                                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                    O_CLOEXEC);
    const char *base = strrchr (tmp, '/') ? strrchr (tmp, '/') + 1 : tmp;
    if (pfd == -1)
      return io_error (s, parent, "open", errno);
    fd = create_in_dir (pfd, base, O_WRONLY, 0600);
  }
  if (fd < 0)
    return io_error (s, tmp, "create", -fd);
  /* A batch's object (not synced here): its aligned part past the page
   * cache if it can, the tail after it.
   */
  ssize_t direct = sync || iovcnt > IOV_PIECES ? 0
    : write_direct_part (fd, iov, iovcnt);
  if (direct > 0) {
    struct iovec rest[IOV_PIECES];
    int i;

    memcpy (rest, iov, iovcnt * sizeof *rest);
    i = iov_skip (rest, 0, iovcnt, direct);
    if (i < iovcnt && (lseek (fd, direct, SEEK_SET) == -1 ||
                       full_writev (fd, rest + i, iovcnt - i) == -1))
      direct = -1;
  }
  if (direct == -1 ||
      (direct == 0 && full_writev (fd, iov, iovcnt) == -1) ||
      (sync ? fsync (fd)
       : sync_file_range (fd, 0, 0, SYNC_FILE_RANGE_WRITE)) == -1) {
    int e = errno;
    close (fd);
    unlinkat (dir_fd (s), tmp, 0);
    return io_error (s, key, "write", e);
  }
  close (fd);
  return 0;
}

static int
dir_put (struct repo_store *s, const char *key, const void *buf, size_t len,
         bool if_absent)
{
  char tmp[PATH_MAX + 32], parent[PATH_MAX];
  int r;

  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  if ((r = make_parents (s, key, true)) < 0)
    return r;
  parent_of (key, parent, sizeof parent);
  if ((r = write_temporary (s, key, parent,
                            &(struct iovec) { .iov_base = (void *) buf,
                                              .iov_len = len }, 1,
                            true, tmp, sizeof tmp)) < 0)
    return r;

  if (if_absent) {
    r = linkat (dir_fd (s), tmp, dir_fd (s), key, 0) == -1 ? errno : 0;
    unlinkat (dir_fd (s), tmp, 0);
    if (r == EEXIST)
      return -EEXIST;           /* not an error: the other writer won */
  }
  else
    r = renameat (dir_fd (s), tmp, dir_fd (s), key) == -1 ? errno : 0;
  if (r) {
    unlinkat (dir_fd (s), tmp, 0);
    return io_error (s, key, if_absent ? "link" : "rename", r);
  }
  if ((r = sync_dir_at (dir_fd (s), parent)) < 0)
    return io_error (s, key, "fsync of its directory", -r);
  return 0;
}

/* Open key for reading: a regular file, its size in *size. */
static int
open_object (struct repo_store *s, const char *key, uint64_t *size)
{
  struct stat st;
  int fd;

  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  fd = openat (dir_fd (s), key, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1) {
    if (errno == ENOENT)
      return snapfg_set_error (ENOENT, "%s/%s: no such object", s->location,
                               key);
    return io_error (s, key, "open", errno);
  }
  if (fstat (fd, &st) == -1) {
    int e = errno;
    close (fd);
    return io_error (s, key, "fstat", e);
  }
  if (!S_ISREG (st.st_mode)) {
    close (fd);
    return snapfg_set_error (EINVAL, "%s/%s: not a regular file: not an "
                             "object of a repository", s->location, key);
  }
  *size = st.st_size;
  return fd;
}

static int
dir_get (struct repo_store *s, const char *key, void **bufp, size_t *lenp)
{
  CLEANUP_CLOSE int fd = -1;
  uint64_t size;
  char *buf;
  int r;

  *bufp = NULL;
  *lenp = 0;
  if ((r = open_object (s, key, &size)) < 0)
    return r;
  fd = r;
  buf = malloc (size ? size : 1);
  if (buf == NULL)
    return io_error (s, key, "malloc", ENOMEM);
  if (full_read (fd, buf, size) == -1) {
    int e = errno ? errno : EIO;
    free (buf);
    return io_error (s, key, "read (the object is shorter than its size; "
                     "changed while read?)", e);
  }
  *bufp = buf;
  *lenp = size;
  return 0;
}

static int
dir_get_iov (struct repo_store *s, const char *key, const struct iovec *iov,
             int iovcnt, size_t *lenp)
{
  CLEANUP_CLOSE int fd = -1;
  uint64_t size, room = 0;
  struct iovec v[IOV_PIECES];
  int i = 0, r;

  *lenp = 0;
  if ((r = open_object (s, key, &size)) < 0)
    return r;
  fd = r;
  if (iovcnt > IOV_PIECES)
    return snapfg_set_error (EINVAL, "%s/%s: internal error: %d buffers",
                             s->location, key, iovcnt);
  for (int j = 0; j < iovcnt; ++j)
    room += iov[j].iov_len;
  if (size > room)
    return snapfg_set_error (EFBIG, "%s/%s: %" PRIu64 " bytes, more than "
                             "an object of its kind can be (%" PRIu64 ")",
                             s->location, key, size, room);
  /* Only the object's bytes: the last pieces may be partly unused. */
  memcpy (v, iov, iovcnt * sizeof *v);
  for (uint64_t left = size; i < iovcnt; ++i) {
    if (v[i].iov_len > left)
      v[i].iov_len = left;
    left -= v[i].iov_len;
  }
  while (iovcnt > 0 && v[iovcnt - 1].iov_len == 0)
    iovcnt--;
  for (i = 0; i < iovcnt; ) {
    ssize_t n = readv (fd, v + i, iovcnt - i);

    if (n == -1 && errno == EINTR)
      continue;
    if (n <= 0)
      return io_error (s, key, "read (the object is shorter than its size; "
                       "changed while read?)", n == 0 ? EIO : errno);
    i = iov_skip (v, i, iovcnt, n);
  }
  *lenp = size;
  return 0;
}

static int
dir_head (struct repo_store *s, const char *key, struct repo_object_info *info)
{
  struct stat st;

  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  if (fstatat (dir_fd (s), key, &st, AT_SYMLINK_NOFOLLOW) == -1) {
    if (errno == ENOENT)
      return -ENOENT;
    return io_error (s, key, "stat", errno);
  }
  if (!S_ISREG (st.st_mode))
    return snapfg_set_error (EINVAL, "%s/%s: not a regular file",
                             s->location, key);
  info->key = key;
  info->size = st.st_size;
  info->mtime = st.st_mtim.tv_sec;
  return 0;
}

static int
dir_touch (struct repo_store *s, const char *key)
{
  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  if (utimensat (dir_fd (s), key, NULL, AT_SYMLINK_NOFOLLOW) == -1) {
    if (errno == ENOENT)
      return -ENOENT;
    return io_error (s, key, "touch", errno);
  }
  return 0;
}

static int
dir_del (struct repo_store *s, const char *key)
{
  char parent[PATH_MAX];
  int r;

  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  if (unlinkat (dir_fd (s), key, 0) == -1) {
    if (errno == ENOENT)
      return -ENOENT;
    return io_error (s, key, "unlink", errno);
  }
  parent_of (key, parent, sizeof parent);
  if ((r = sync_dir_at (dir_fd (s), parent)) < 0)
    return io_error (s, key, "fsync of its directory", -r);
  return 0;
}

/* Open the repository's directory path ("" for its top) for a walk,
 * never through a link: 1 with *d, 0 if there is none (nothing to
 * walk), or -errno (reported).
 */
static int
open_subdir (struct repo_store *s, const char *path, DIR **d)
{
  int fd = openat (dir_fd (s), *path ? path : ".",
                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

  if (fd == -1)
    return errno == ENOENT || errno == ENOTDIR ? 0
      : io_error (s, *path ? path : ".", "open", errno);
  *d = fdopendir (fd);
  if (*d == NULL) {
    close (fd);
    return io_error (s, path, "opendir", errno);
  }
  return 1;
}

/* Walk the directory path (relative to the store), reporting every
 * regular file whose key starts with prefix.
 */
static int
walk (struct repo_store *s, const char *path, const char *prefix,
      repo_list_fn fn, void *opaque)
{
  DIR *d;
  struct dirent *e;
  int r = open_subdir (s, path, &d);

  if (r <= 0)
    return r;
  r = 0;
  while (r == 0 && (errno = 0, e = readdir (d)) != NULL) {
    char key[PATH_MAX];
    struct stat st;
    size_t plen;

    if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0 ||
        strncmp (e->d_name, TMP_PREFIX, strlen (TMP_PREFIX)) == 0)
      continue;
    if (snprintf (key, sizeof key, "%s%s%s", path, *path ? "/" : "",
                  e->d_name) >= (int) sizeof key)
      continue;
    /* Only names that can still lead to the prefix. */
    plen = strlen (key);
    if (strncmp (key, prefix, plen < strlen (prefix) ? plen
                 : strlen (prefix)) != 0)
      continue;
    if (fstatat (dir_fd (s), key, &st, AT_SYMLINK_NOFOLLOW) == -1)
      continue;                 /* removed meanwhile */
    if (S_ISDIR (st.st_mode))
      r = walk (s, key, prefix, fn, opaque);
    else if (S_ISREG (st.st_mode) && plen >= strlen (prefix) &&
             repo_key_is_valid (key)) {
      struct repo_object_info info = {
        .key = key, .size = st.st_size, .mtime = st.st_mtim.tv_sec,
      };
      r = fn (opaque, &info);
    }
  }
  if (r == 0 && errno)
    r = io_error (s, path, "readdir", errno);
  closedir (d);
  return r;
}

static int
dir_list (struct repo_store *s, const char *prefix, repo_list_fn fn,
          void *opaque)
{
  char start[PATH_MAX];

  /* Start at the deepest directory the prefix names whole. */
  parent_of (prefix, start, sizeof start);
  return walk (s, start, prefix, fn, opaque);
}

static bool
is_pending (struct dir_store *ds, const char *key)
{
  for (size_t i = 0; i < ds->npending; ++i)
    if (strcmp (ds->pending[i].key, key) == 0)
      return true;
  return false;
}

static int
dir_put_unsynced (struct repo_store *s, const char *key,
                  const struct iovec *iov, int iovcnt)
{
  struct dir_store *ds = (struct dir_store *) s;
  char tmp[PATH_MAX + 32], parent[PATH_MAX];
  struct stat st;
  struct pending_put p;
  int r;

  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  if (fstatat (dir_fd (s), key, &st, AT_SYMLINK_NOFOLLOW) == 0)
    return -EEXIST;
  /* Claimed first, so that two threads storing one chunk write it once. */
  p.key = strdup (key);
  p.tmp = NULL;
  if (p.key == NULL)
    return io_error (s, key, "malloc", ENOMEM);
  pthread_mutex_lock (&ds->lock);
  if (is_pending (ds, key)) {
    pthread_mutex_unlock (&ds->lock);
    free (p.key);
    return -EEXIST;
  }
  if (ds->npending == ds->cap) {
    size_t cap = ds->cap * 2 + 64;
    struct pending_put *n = realloc (ds->pending, cap * sizeof *n);
    if (n == NULL) {
      pthread_mutex_unlock (&ds->lock);
      free (p.key);
      return io_error (s, key, "malloc", ENOMEM);
    }
    ds->pending = n;
    ds->cap = cap;
  }
  ds->pending[ds->npending++] = p;
  pthread_mutex_unlock (&ds->lock);

  parent_of (key, parent, sizeof parent);
  if ((r = make_parents (s, key, false)) == 0)
    r = write_temporary (s, key, parent, iov, iovcnt, false, tmp,
                         sizeof tmp);
  pthread_mutex_lock (&ds->lock);
  for (size_t i = 0; i < ds->npending; ++i)
    if (strcmp (ds->pending[i].key, key) == 0) {
      if (r == 0 && (ds->pending[i].tmp = strdup (tmp)) == NULL) {
        unlinkat (dir_fd (s), tmp, 0);
        r = io_error (s, key, "malloc", ENOMEM);
      }
      if (r < 0) {
        free (ds->pending[i].key);
        ds->pending[i] = ds->pending[--ds->npending];
      }
      break;
    }
  pthread_mutex_unlock (&ds->lock);
  return r;
}

/* Forget the batch, removing the temporary files not named. */
static void
drop_pending (struct dir_store *ds)
{
  for (size_t i = 0; i < ds->npending; ++i) {
    if (ds->pending[i].tmp)
      unlinkat (ds->dirfd, ds->pending[i].tmp, 0);
    free (ds->pending[i].tmp);
    free (ds->pending[i].key);
  }
  ds->npending = 0;
}

static int
dir_sync (struct repo_store *s)
{
  struct dir_store *ds = (struct dir_store *) s;
  int r = 0;

  pthread_mutex_lock (&ds->lock);
  if (ds->npending == 0)
    goto out;
  /* 1. The contents, all at once. */
  if (syncfs (ds->dirfd) == -1) {
    r = io_error (s, ds->pending[0].key, "syncfs of the repository's "
                  "file system", errno);
    goto out;
  }
  /* 2. The names: link(2), as put with if_absent; an object another
   * writer stored under the name meanwhile has the same content.
   */
  for (size_t i = 0; i < ds->npending; ++i) {
    struct pending_put *p = &ds->pending[i];
    if (p->tmp == NULL)
      continue;                 /* a put still going: not ours to name */
    if (linkat (ds->dirfd, p->tmp, ds->dirfd, p->key, 0) == -1 &&
        errno != EEXIST && r == 0)
      r = io_error (s, p->key, "link", errno);
  }
  /* 3. The names, durable. */
  if (r == 0 && syncfs (ds->dirfd) == -1)
    r = io_error (s, ds->pending[0].key, "syncfs of the repository's "
                  "file system", errno);
 out:
  drop_pending (ds);
  pthread_mutex_unlock (&ds->lock);
  return r;
}

/* Remove the temporary files older than older_than under path, and
 * those of any age that have a second link: sync linked such a file
 * under its chunk's name and a crash came before it removed the
 * temporary name.  That name shares the chunk's inode, whose mtime every
 * run that keeps the chunk refreshes (touch), so it would never age;
 * removing it only drops a link, never data.
 */
static int
clean_walk (struct repo_store *s, const char *path, int64_t older_than,
            bool dry_run, uint64_t *count)
{
  DIR *d;
  struct dirent *e;
  int r = open_subdir (s, path, &d);

  if (r <= 0)
    return r;
  r = 0;
  while (r == 0 && (e = readdir (d)) != NULL) {
    char name[PATH_MAX];
    struct stat st;

    if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0)
      continue;
    if (snprintf (name, sizeof name, "%s%s%s", path, *path ? "/" : "",
                  e->d_name) >= (int) sizeof name)
      continue;
    if (fstatat (dir_fd (s), name, &st, AT_SYMLINK_NOFOLLOW) == -1)
      continue;
    if (S_ISDIR (st.st_mode) && e->d_name[0] != '.')
      r = clean_walk (s, name, older_than, dry_run, count);
    else if (S_ISREG (st.st_mode) &&
             strncmp (e->d_name, TMP_PREFIX, strlen (TMP_PREFIX)) == 0 &&
             (st.st_mtim.tv_sec < older_than || st.st_nlink > 1)) {
      if (!dry_run && unlinkat (dir_fd (s), name, 0) == -1 &&
          errno != ENOENT)
        r = io_error (s, name, "unlink", errno);
      else
        (*count)++;
    }
  }
  closedir (d);
  return r;
}

static int
dir_clean_partial (struct repo_store *s, int64_t older_than, bool dry_run,
                   uint64_t *count)
{
  *count = 0;
  return clean_walk (s, "", older_than, dry_run, count);
}

static void
dir_close (struct repo_store *s)
{
  struct dir_store *ds = (struct dir_store *) s;

  if (s == NULL)
    return;
  /* A batch never synced (a run that failed): its files go. */
  drop_pending (ds);
  free (ds->pending);
  pthread_mutex_destroy (&ds->lock);
  close (dir_fd (s));
  free (s->location);
  free (s);
}

/* put with if_absent, visible but not durable (repo-store.h,
 * put_volatile): the two fsyncs of put (the file, its directory) cost a
 * run 1-6 ms on a quiet machine and up to 60 ms measured beside another
 * writer, for a writer's registration that only a running process needs.
 * The same rules as write_temporary for the file itself: created new,
 * relative to the repository's directory, never through a link.
 */
static int
dir_put_volatile (struct repo_store *s, const char *key, const void *buf,
                  size_t len)
{
  char tmp[PATH_MAX + 32], parent[PATH_MAX];
  const char *base = strrchr (key, '/') ? strrchr (key, '/') + 1 : key;
  const char *what = "write";
  unsigned char rnd[8];
  int fd, r;

  if (!repo_key_is_valid (key))
    return bad_key (s, key);
  if ((r = make_parents (s, key, false)) < 0)
    return r;
  parent_of (key, parent, sizeof parent);
  if (getrandom (rnd, sizeof rnd, 0) != sizeof rnd)
    return io_error (s, key, "getrandom", errno);
  snprintf (tmp, sizeof tmp, TMP_PREFIX "%02x%02x%02x%02x%02x%02x%02x%02x",
            rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  {
    CLEANUP_CLOSE int pfd = openat (dir_fd (s), *parent ? parent : ".",
                                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                    O_CLOEXEC);
    if (pfd == -1)
      return io_error (s, parent, "open", errno);
    if ((fd = create_in_dir (pfd, tmp, O_WRONLY, 0600)) < 0)
      return io_error (s, key, "create", -fd);
    r = full_write (fd, buf, len) == -1 ? errno : 0;
    close (fd);
    if (r == 0 && linkat (pfd, tmp, pfd, base, 0) == -1) {
      r = errno;
      what = "link";
    }
    unlinkat (pfd, tmp, 0);
  }
  if (r == EEXIST)
    return -EEXIST;             /* not an error: the other writer won */
  return r ? io_error (s, key, what, r) : 0;
}

static const struct repo_store_ops dir_ops = {
  .name = "directory",
  .put = dir_put,
  .put_volatile = dir_put_volatile,
  .get = dir_get,
  .head = dir_head,
  .touch = dir_touch,
  .del = dir_del,
  .list = dir_list,
  .close = dir_close,
  .put_unsynced = dir_put_unsynced,
  .sync = dir_sync,
  .clean_partial = dir_clean_partial,
  .get_iov = dir_get_iov,
};

int
repo_store_dir_open (const char *path, bool create, struct repo_store **sp)
{
  struct dir_store *ds;
  int fd;

  *sp = NULL;
  if (create && mkdir (path, 0700) == -1 && errno != EEXIST)
    return snapfg_set_error (errno, "%s: cannot create the repository's "
                             "directory: %s", path, strerror (errno));
  if (create) {
    int r = sync_directory_of (path);
    if (r < 0)
      return snapfg_set_error (-r, "%s: fsync of its parent directory: %s",
                               path, strerror (-r));
  }
  fd = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd == -1)
    return snapfg_set_error (errno, "%s: %s%s", path, strerror (errno),
                             errno == ENOENT ? " (no repository there: "
                             "make one with snapfg-backup init)" : "");
  ds = calloc (1, sizeof *ds);
  if (ds == NULL || (ds->s.location = strdup (path)) == NULL) {
    free (ds);
    close (fd);
    return snapfg_set_error (ENOMEM, "%s: out of memory", path);
  }
  ds->s.ops = &dir_ops;
  ds->dirfd = fd;
  pthread_mutex_init (&ds->lock, NULL);
  *sp = &ds->s;
  return 0;
}
