/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: restore from a repository, and reading a point's chunks
 * with several threads (restore and verify).
 *
 * Each thread takes the next chunk, reads it (fetched, decrypted,
 * decompressed, its digest checked: repo_read_chunk) and writes it out.
 * OUT is a new file (created exclusively, holes where the disk is zero),
 * a block device (every chunk written, zeroes too) or an NBD URI (zero
 * chunks as NBD zero requests), one connection per thread.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/stat.h>

#include <libnbd.h>

#include "big-buffer.h"
#include "full-io.h"
#include "snapfg-error.h"
#include "snapfg-backup-repo.h"

#define MAX_THREADS 8

struct point_reader {
  struct repo *r;
  const struct repo_index *ix;
  repo_chunk_fn fn;
  void *opaque;
  atomic_uint_fast64_t next, done;
  atomic_bool stop;
  uint64_t n;
};

struct reader_thread {
  struct point_reader *pr;
  unsigned index;
  pthread_t t;
};

static void *
reader (void *arg)
{
  struct reader_thread *rt = arg;
  struct point_reader *pr = rt->pr;
  uint32_t cs = repo_index_chunk_size (pr->ix);
  /* Kept for every chunk, in huge pages (big-buffer.h). */
  char *buf = big_alloc (cs);
  uint64_t n;

  if (buf == NULL) {
    atomic_store (&pr->stop, true);
    return NULL;
  }
  while (!atomic_load (&pr->stop) && !backup_interrupted &&
         (n = atomic_fetch_add (&pr->next, 1)) < pr->n) {
    int r;

    snapfg_clear_error ();
    r = repo_read_chunk (pr->r, pr->ix, n, buf);
    if (pr->fn (pr->opaque, rt->index, n, r < 0 ? NULL : buf, -r,
                r < 0 ? snapfg_get_error () : NULL) == -1)
      atomic_store (&pr->stop, true);
    atomic_fetch_add (&pr->done, 1);
  }
  big_free (buf, cs);
  return NULL;
}

int
repo_read_point (struct repo *r, const struct repo_index *ix,
                 unsigned threads, const char *what, repo_chunk_fn fn,
                 void *opaque)
{
  struct point_reader pr = { .r = r, .ix = ix, .fn = fn, .opaque = opaque,
                             .n = repo_index_chunks (ix) };
  struct reader_thread rt[MAX_THREADS];
  struct tool_progress prog;
  unsigned started = 0;
  uint32_t cs = repo_index_chunk_size (ix);

  if (threads < 1 || threads > MAX_THREADS)
    threads = REPO_DEFAULT_THREADS;
  atomic_init (&pr.next, 0);
  atomic_init (&pr.done, 0);
  atomic_init (&pr.stop, false);
  tool_progress_start (&prog, what);
  for (unsigned i = 0; i < threads; ++i) {
    rt[i] = (struct reader_thread) { .pr = &pr, .index = i };
    if (pthread_create (&rt[i].t, NULL, reader, &rt[i]) == 0)
      started++;
    else
      break;
  }
  if (started == 0) {
    rt[0] = (struct reader_thread) { .pr = &pr, .index = 0 };
    reader (&rt[0]);
  }
  while (started) {
    uint64_t d = atomic_load (&pr.done);
    if (d >= pr.n || atomic_load (&pr.stop) || backup_interrupted)
      break;
    tool_progress_update (&prog, d * cs, pr.n * cs);
    usleep (100000);
  }
  for (unsigned i = 0; i < started; ++i)
    pthread_join (rt[i].t, NULL);
  tool_progress_end (&prog, atomic_load (&pr.done) * cs, pr.n * cs);
  if (backup_interrupted && !atomic_load (&pr.stop)) {
    backup_error ("interrupted");
    return -1;
  }
  return atomic_load (&pr.stop) ? -1 : 0;
}

/* --- restore --- */

struct restore_out {
  const char *out;
  const struct repo_index *ix;
  uint64_t size;
  uint32_t cs;
  int fd;                       /* a file or block device, or -1 */
  int dfd;                      /* ... opened again with O_DIRECT, or -1 */
  bool write_zeroes;            /* a block device: its old data goes */
  struct nbd_handle *nbd[MAX_THREADS];
  const char *zeroes;
  pthread_mutex_t lock;
  uint64_t written;
  uint64_t rate;                /* --limit-rate: bytes/s, 0: none */
  uint64_t paced;               /* bytes handed out under the rate */
  double t0;
};

/* --limit-rate: a chunk fetched is written no sooner than the rate
 * allows for every byte fetched before it, on average from the start
 * (the threads take their turns under the lock, then wait apart).
 */
static void
pace (struct restore_out *ro, uint64_t len)
{
  double due;

  if (ro->rate == 0)
    return;
  pthread_mutex_lock (&ro->lock);
  ro->paced += len;
  due = (double) ro->paced / ro->rate - (tool_now () - ro->t0);
  pthread_mutex_unlock (&ro->lock);
  if (due > 0)
    usleep ((useconds_t) (due * 1e6));
}

/* The O_DIRECT writes' alignment: a block of any disk's. */
#define DIRECT_ALIGN 4096

/* A chunk into the file or block device: with O_DIRECT when it is
 * whole blocks (the restored data is not copied into the page cache,
 * fresh memory each page, only to be written back and fsync'd at the
 * end: measured, a 4 MiB buffered pwrite took 10 ms of the restore
 * threads' time), else (the disk's tail, a file system that refuses
 * it) buffered, its writeback started at once.
 */
static int
write_out (struct restore_out *ro, const char *buf, uint64_t len,
           uint64_t off)
{
  if (ro->dfd >= 0 && off % DIRECT_ALIGN == 0 && len % DIRECT_ALIGN == 0 &&
      (uintptr_t) buf % DIRECT_ALIGN == 0 &&
      full_pwrite (ro->dfd, buf, len, off) == 0)
    return 0;
  if (full_pwrite (ro->fd, buf, len, off) == -1) {
    backup_error ("%s: writing offset %" PRIu64 ": %m", ro->out, off);
    return -1;
  }
  /* Its writeback started now, not all of it at the closing fsync: the
   * disk writes while the next chunks are read.  Only a hint: a file
   * system without it still gets the fsync.
   */
  sync_file_range (ro->fd, off, len, SYNC_FILE_RANGE_WRITE);
  return 0;
}

/* The output (fd, a file or block device we opened) opened again for
 * O_DIRECT writes, through /proc so that it is the same file whatever
 * its name points to now; -1 if that cannot be (no /proc, a file system
 * without O_DIRECT): then every write is buffered.
 */
static int
reopen_direct (int fd)
{
  char path[64];

  snprintf (path, sizeof path, "/proc/self/fd/%d", fd);
  return open (path, O_WRONLY | O_DIRECT | O_CLOEXEC);
}

static int
restore_chunk (void *opaque, unsigned thread, uint64_t n, const char *buf,
               int err, const char *msg)
{
  struct restore_out *ro = opaque;
  uint64_t off = n * ro->cs, len = ro->cs;
  bool zero;

  if (buf == NULL) {
    backup_error ("chunk %" PRIu64 " (offset %" PRIu64 "): %s", n, off,
                  msg ? msg : strerror (err));
    return -1;
  }
  if (off + len > ro->size)
    len = ro->size - off;
  /* A zero chunk of the index is zero: not scanned again. */
  zero = repo_index_chunk_is_zero (ro->ix, n) ||
    (buf[0] == 0 && memcmp (buf, buf + 1, len - 1) == 0);
  if (!zero)                    /* a zero chunk is not fetched */
    pace (ro, len);
  if (ro->nbd[0]) {
    struct nbd_handle *h = ro->nbd[thread];
    if ((zero ? nbd_zero (h, len, off, 0)
              : nbd_pwrite (h, buf, len, off, 0)) == -1) {
      backup_error ("%s: writing offset %" PRIu64 ": %s", ro->out, off,
                    nbd_get_error ());
      return -1;
    }
  }
  else if ((!zero || ro->write_zeroes) &&
           write_out (ro, buf, len, off) == -1)
    return -1;
  pthread_mutex_lock (&ro->lock);
  ro->written += len;
  pthread_mutex_unlock (&ro->lock);
  return 0;
}

static bool
is_nbd_uri (const char *s)
{
  return strncmp (s, "nbd://", 6) == 0 || strncmp (s, "nbds://", 7) == 0 ||
    strncmp (s, "nbd+unix://", 11) == 0 || strncmp (s, "nbds+unix://", 12) == 0
    || strncmp (s, "nbd+vsock://", 12) == 0;
}

int
repo_cmd_restore (struct repo_options *o, const char *location,
                  const char *out)
{
  struct restore_out ro = { .out = out, .fd = -1, .dfd = -1 };
  struct repo *r = NULL;
  struct repo_index *ix = NULL;
  unsigned threads = o->threads ? o->threads : REPO_DEFAULT_THREADS;
  bool created = false;
  double t0 = tool_now ();
  int status, ret;
  struct stat st;

  if ((status = repo_open_for (o, location, true, &r)) != 0)
    return status;
  status = EXIT_FAILED;
  snapfg_clear_error ();
  if ((ret = repo_index_load (r, o->disk, o->b.at, &ix)) < 0) {
    repo_fail (ret, NULL);
    goto out;
  }
  ro.ix = ix;
  ro.size = repo_index_disk_size (ix);
  ro.cs = repo_index_chunk_size (ix);
  ro.rate = o->b.limit_rate;
  ro.t0 = tool_now ();
  pthread_mutex_init (&ro.lock, NULL);

  if (is_nbd_uri (out)) {
    for (unsigned i = 0; i < threads; ++i) {
      struct nbd_handle *h = nbd_create ();
      if (h == NULL || nbd_connect_uri (h, out) == -1) {
        backup_error ("cannot connect to %s: %s", out, nbd_get_error ());
        nbd_close (h);
        status = EXIT_UNREACHABLE;
        goto out;
      }
      ro.nbd[i] = h;
      if (nbd_get_size (h) < (int64_t) ro.size) {
        backup_error ("%s: %" PRId64 " bytes, smaller than the disk (%"
                      PRIu64 ")", out, nbd_get_size (h), ro.size);
        goto out;
      }
    }
  }
  else if (stat (out, &st) == 0 && S_ISBLK (st.st_mode)) {
    uint64_t dev_size = 0;
    ro.fd = open (out, O_WRONLY | O_CLOEXEC);
    if (ro.fd == -1) {
      backup_error ("%s: %m", out);
      goto out;
    }
    dev_size = lseek (ro.fd, 0, SEEK_END);
    if (dev_size < ro.size) {
      backup_error ("%s: %" PRIu64 " bytes, smaller than the disk (%" PRIu64
                    ")", out, dev_size, ro.size);
      goto out;
    }
    ro.write_zeroes = true;
  }
  else {
    /* A new file: never one that is there (it is someone's). */
    ro.fd = open (out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  0600);
    if (ro.fd == -1) {
      backup_error ("%s: %m%s", out, errno == EEXIST ? " (restore writes a "
                    "new file, a block device or an NBD URI; it never "
                    "overwrites a file)" : "");
      goto out;
    }
    created = true;
    if (ftruncate (ro.fd, ro.size) == -1) {
      backup_error ("%s: truncate to %" PRIu64 " bytes: %m", out, ro.size);
      goto out;
    }
  }
  if (ro.fd >= 0)
    ro.dfd = reopen_direct (ro.fd);
  {
    char what[128];
    snprintf (what, sizeof what, "restore of run %ld",
              repo_index_run (ix));
    if (repo_read_point (r, ix, ro.nbd[0] ? threads : threads, what,
                         restore_chunk, &ro) == -1)
      goto out;
  }
  if (ro.nbd[0]) {
    if (nbd_flush (ro.nbd[0], 0) == -1) {
      backup_error ("%s: flush: %s", out, nbd_get_error ());
      goto out;
    }
  }
  else if (fsync (ro.fd) == -1) {
    backup_error ("%s: fsync: %m", out);
    goto out;
  }
  status = EXIT_OK;
  {
    double secs = tool_now () - t0;
    char rate[128];
    tool_format_rate (rate, sizeof rate, ro.size, secs);
    if (o->b.json)
      tool_json_result (json_pack ("{s:s, s:s, s:s, s:i, s:s, s:I, s:f}",
                                   "command", "restore",
                                   "repository", location, "disk", o->disk,
                                   "run", (int) repo_index_run (ix),
                                   "output", out,
                                   "size", (json_int_t) ro.size,
                                   "seconds", secs), 0);
    else
      printf ("snapfg-backup: restored disk %s run %ld to %s: %s\n",
              o->disk, repo_index_run (ix), out, rate);
  }
 out:
  for (unsigned i = 0; i < MAX_THREADS; ++i)
    if (ro.nbd[i]) {
      nbd_shutdown (ro.nbd[i], 0);
      nbd_close (ro.nbd[i]);
    }
  if (ro.dfd >= 0)
    close (ro.dfd);
  if (ro.fd >= 0)
    close (ro.fd);
  if (status != EXIT_OK && created)
    unlink (out);
  repo_index_free (ix);
  repo_close (r);
  return status;
}
