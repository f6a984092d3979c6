/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the regular file and block device backends (see device.h).
 *
 * Both work through one descriptor opened on the path, with positioned
 * I/O, and share everything but what the kind of disk decides: how it is
 * identified (device and inode numbers, or the device number), how it
 * deallocates and zeroes (fallocate, or the block device ioctls), whether
 * it can report holes, change size and copy inside the kernel, and how a
 * store whose contents die with it gives its space back.
 *
 * A bounded device (the origin) ends at the size it had when it was
 * opened, and may end sooner if something shrinks it under us: I/O past
 * its current end fails with -EIO instead of reading zeroes, growing the
 * file, or punching nothing (docs/design.md section 6).
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <linux/fs.h>
#include <linux/falloc.h>

#include "device.h"
#include "snapfg-error.h"
#include "file-lock.h"

/* Each device's own state (dev->priv). */
struct fd_device {
  int fd;
  bool block;                   /* a block device, else a regular file */
  struct device_identity id;
  /* copy_file_range into this device said "not supported" once: copies
   * go through a buffer from then on without asking again.
   */
  atomic_bool no_copy_range;
  /* Large writes into a regular file, one at a time (see
   * large_write_lock).
   */
  pthread_mutex_t write_lock;
  /* The same file opened with O_DIRECT for uncached writes: -1 until
   * the first, -2 if it cannot be (no O_DIRECT here, or it refused a
   * write).  Under write_lock.
   */
  int direct_fd;
};

/* Writes of at least this many bytes into a regular file take its
 * write_lock first.  A buffered write holds the file's inode lock
 * exclusively for its whole length (ext4 and XFS alike), so such writes
 * run one at a time whatever we do; but a thread waiting in the kernel
 * for that lock spins while the holder runs, and a large write holds it
 * long.  All copy-outs write one COW file, so with several connections
 * of large writes the spinning was 17-24 % of nbdkit's CPU (perf, ext4, 2
 * CPUs).  Waiting here instead sleeps.  Measured (4 connections of 1 MiB
 * sequential first writes over 1 GiB, 6 paired rounds, medians): nbdkit
 * CPU per pass 4.86 -> 1.55 s with a transient store, 1.43 -> 1.19 s with
 * durability=flush, 1.66 -> 1.53 s persistent, 0.70 -> 0.57 s without a
 * snapshot; MiB/s against the bare file plugin 0.21 -> 0.43, 0.49 ->
 * 0.55, 0.36 -> 0.35 and 0.96 -> 1.05.  Short writes (4 KiB copy-outs,
 * random writes) hold the inode lock briefly, where spinning is the
 * cheaper wait: they do not take it.  A block device has no such lock.
 */
#define LARGE_WRITE_MIN (64 * 1024)

static pthread_mutex_t *
large_write_lock (const struct snapfg_device *dev, size_t count)
{
  struct fd_device *f = dev->priv;

  if (f->block || count < LARGE_WRITE_MIN)
    return NULL;
  pthread_mutex_lock (&f->write_lock);
  return &f->write_lock;
}

static void
large_write_unlock (pthread_mutex_t *lock)
{
  if (lock)
    pthread_mutex_unlock (lock);
}

static struct fd_device *
fd_of (const struct snapfg_device *dev)
{
  return dev->priv;
}

/* A regular file is known by its device and inode numbers, a block
 * device by its device number alone (any node for it names it).
 */
static void
identity_of (const struct stat *st, struct device_identity *id)
{
  if (S_ISBLK (st->st_mode)) {
    id->dev = 0;
    id->ino = st->st_rdev;
  }
  else {
    id->dev = st->st_dev;
    id->ino = st->st_ino;
  }
}

/* --- opening and closing --- */

/* Take over fd as dev's descriptor if it is the kind of disk the backend
 * serves (block: a block device, else a regular file).
 */
static int
init_from_fd (struct snapfg_device *dev, int fd, bool block)
{
  struct fd_device *f;
  struct stat st;
  uint64_t size;

  if (fstat (fd, &st) == -1)
    return -errno;
  if (block ? !S_ISBLK (st.st_mode) : !S_ISREG (st.st_mode)) {
    snapfg_set_error (EINVAL, "not a regular file or block device");
    return -EINVAL;
  }
  if (block) {
    if (ioctl (fd, BLKGETSIZE64, &size) == -1)
      return -errno;
  }
  else
    size = st.st_size;

  f = calloc (1, sizeof *f);
  if (f == NULL)
    return -ENOMEM;
  f->fd = fd;
  f->block = block;
  identity_of (&st, &f->id);
  atomic_init (&f->no_copy_range, false);
  pthread_mutex_init (&f->write_lock, NULL);
  f->direct_fd = -1;
  dev->priv = f;
  dev->size = size;
  dev->fixed_size = block;
  return 0;
}

static int
open_path (struct snapfg_device *dev, const char *path, bool readonly,
           bool block)
{
  int fd, r;

  fd = open (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1)
    return -errno;
  r = init_from_fd (dev, fd, block);
  if (r < 0)
    close (fd);
  return r;
}

static void
fd_close (struct snapfg_device *dev)
{
  struct fd_device *f = fd_of (dev);

  if (f) {
    close (f->fd);
    if (f->direct_fd >= 0)
      close (f->direct_fd);
    pthread_mutex_destroy (&f->write_lock);
    free (f);
  }
}

static bool
fd_identity (const struct snapfg_device *dev, struct device_identity *id)
{
  *id = fd_of (dev)->id;
  return true;
}

static bool
fd_same (const struct snapfg_device *a, const struct snapfg_device *b)
{
  return fd_of (a)->id.dev == fd_of (b)->id.dev &&
    fd_of (a)->id.ino == fd_of (b)->id.ino;
}

/* (Only asked of the backend that claims path, i.e. of the same kind.) */
static bool
fd_is_named (const struct snapfg_device *dev, const char *path)
{
  struct device_identity id;
  struct stat st;

  if (stat (path, &st) == -1)
    return false;               /* does not exist (yet) */
  identity_of (&st, &id);
  return id.dev == fd_of (dev)->id.dev && id.ino == fd_of (dev)->id.ino;
}

static int
fd_lock (const struct snapfg_device *dev, bool exclusive)
{
  return file_lock (fd_of (dev)->fd, exclusive);
}

static int
fd_current_size (const struct snapfg_device *dev, uint64_t *size)
{
  struct fd_device *f = fd_of (dev);
  struct stat st;

  if (f->block)
    return ioctl (f->fd, BLKGETSIZE64, size) == -1 ? -errno : 0;
  /* The end of the file, as lseek finds it: every held write and every
   * write to a bounded file asks, and this costs half a statx (which
   * fills in and copies out a whole attribute block).  The file offset
   * it moves is used by nothing: all I/O here is positioned.  (It also
   * asks no times, which on file systems with fine-grained timestamps
   * would make the next write update them again.)
   */
  off_t end = lseek (f->fd, 0, SEEK_END);

  if (end >= 0) {
    *size = end;
    return 0;
  }
  if (fstat (f->fd, &st) == -1)
    return -errno;
  *size = st.st_size;
  return 0;
}

/* --- I/O --- */

/* Would changing [offset, offset+count) of a bounded regular file go
 * past its current end?  Writing there would grow the file, punching or
 * zeroing would succeed on nothing: either way the request must fail.
 * (Block devices refuse writes past their end themselves.)
 */
static bool
past_current_end (const struct snapfg_device *dev, uint64_t offset,
                  uint64_t count)
{
  uint64_t size;

  if (!dev->bounded || fd_of (dev)->block ||
      fd_current_size (dev, &size) < 0)
    return false;
  return offset + count > size;
}

/* Positioned I/O of all count bytes, resumed after short transfers and
 * signals.
 */
static int
fd_io (const struct snapfg_device *dev, char *p, size_t count,
       uint64_t offset, bool write)
{
  int fd = fd_of (dev)->fd;

  while (count > 0) {
    ssize_t r = write ? pwrite (fd, p, count, offset)
      : pread (fd, p, count, offset);

    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0 && !write) {
      /* Past the end of the origin: it shrank under us. */
      if (dev->bounded)
        return -EIO;
      /* Past the end of a file that has not grown that far yet (a COW
       * file is extended by writes): reads as zeroes.
       */
      memset (p, 0, count);
      return 0;
    }
    p += r;
    count -= r;
    offset += r;
  }
  return 0;
}

static int
fd_pread (const struct snapfg_device *dev, void *buf, size_t count,
          uint64_t offset)
{
  return fd_io (dev, buf, count, offset, false);
}

static int
fd_pwrite (const struct snapfg_device *dev, const void *buf,
           size_t count, uint64_t offset)
{
  if (past_current_end (dev, offset, count))
    return -EIO;
  pthread_mutex_t *lock = large_write_lock (dev, count);
  /* (fd_io only reads buf when writing.) */
  int r = fd_io (dev, (char *) buf, count, offset, true);

  large_write_unlock (lock);
  return r;
}

/* The file again, opened for O_DIRECT writes (through /proc/self/fd:
 * the same open file's inode, whatever its name is now), or -2.
 */
static int
open_direct (const struct fd_device *f)
{
  char path[64];
  struct stat st;
  struct device_identity id;
  int fd;

  snprintf (path, sizeof path, "/proc/self/fd/%d", f->fd);
  fd = open (path, O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (fd == -1)
    return -2;                  /* no /proc, or no O_DIRECT (tmpfs) */
  if (fstat (fd, &st) == -1 || (identity_of (&st, &id),
                                id.dev != f->id.dev || id.ino != f->id.ino)) {
    close (fd);
    return -2;
  }
  return fd;
}

/* Writes the committer's copies into a COW store past the page cache:
 * the old data of first writes, read back only by a backup, later.
 * Through the page cache each such write cost a page's allocation and
 * copy, its buffer heads and delayed allocation, and the commit's sync
 * then wrote every page out (together about a tenth of the CPU of
 * random 4K first writes, perf); and a gigabyte of it pushed the
 * page cache's useful pages out.  Only large aligned writes (the
 * committer's gathered runs are up to 1 MiB); a file system that
 * refuses O_DIRECT, or a write, gets buffered writes from then on.
 * Ordering and durability are the same: the commit's sync still comes
 * before the exceptions are written.
 */
static int
fd_pwrite_uncached (const struct snapfg_device *dev, const void *buf,
                    size_t count, uint64_t offset)
{
  struct fd_device *f = fd_of (dev);
  const char *p = buf;
  int r = 0;

  if (count < LARGE_WRITE_MIN ||
      ((uintptr_t) buf | count | offset) % DEVICE_UNCACHED_ALIGN)
    return fd_pwrite (dev, buf, count, offset);
  if (past_current_end (dev, offset, count))
    return -EIO;
  pthread_mutex_lock (&f->write_lock);
  if (f->direct_fd == -1)
    f->direct_fd = open_direct (f);
  while (f->direct_fd >= 0 && count > 0) {
    ssize_t n = pwrite (f->direct_fd, p, count, offset);

    if (n == -1 && errno == EINTR)
      continue;
    if (n == -1 && errno == EINVAL) {
      /* Not aligned enough for this file system after all. */
      close (f->direct_fd);
      f->direct_fd = -2;
      break;
    }
    if (n == -1) {
      r = -errno;
      break;
    }
    p += n;
    count -= n;
    offset += n;
    if (count % DEVICE_UNCACHED_ALIGN)
      break;                    /* short and unaligned: the rest buffered */
  }
  if (r == 0 && count > 0)
    r = fd_io (dev, (char *) p, count, offset, true);
  pthread_mutex_unlock (&f->write_lock);
  return r;
}

static int
fd_flush (const struct snapfg_device *dev)
{
  if (fdatasync (fd_of (dev)->fd) == -1)
    return -errno;
  return 0;
}

static bool
is_unsupported (int err)
{
  return err == EOPNOTSUPP || err == ENOTTY || err == ENOSYS || err == EINVAL;
}

/* The entries of struct device_ops both kinds share. */
#define FD_DEVICE_OPS                                                    \
  .close = fd_close, .identity = fd_identity, .same = fd_same,          \
  .is_named = fd_is_named, .lock = fd_lock,                             \
  .current_size = fd_current_size, .pread = fd_pread,                   \
  .pwrite = fd_pwrite, .pwrite_uncached = fd_pwrite_uncached,         \
  .flush = fd_flush

/* --- regular files --- */

static bool
file_claims (const char *path)
{
  /* Whatever the backends before it did not claim: open says if it is
   * not a regular file either.
   */
  return true;
}

static int
file_open (struct snapfg_device *dev, const char *path, bool readonly)
{
  return open_path (dev, path, readonly, false);
}

static int
file_create (struct snapfg_device *dev, const char *path)
{
  int fd, r;

  fd = open (path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd == -1)
    return -errno;
  r = init_from_fd (dev, fd, false);
  if (r < 0) {
    close (fd);
    unlink (path);
  }
  return r;
}

int
device_file_init_fd (struct snapfg_device *dev, int fd)
{
  return init_from_fd (dev, fd, false);
}

/* The copy_file_range loop: 0, -EOPNOTSUPP if these files cannot (from
 * now on) or the source ended early, or another error.
 */
static int
copy_range (int from, uint64_t src_offset, struct fd_device *to,
            uint64_t dst_offset, size_t count)
{
  while (count > 0) {
    loff_t in = src_offset, out = dst_offset;
    ssize_t r = copy_file_range (from, &in, to->fd, &out, count, 0);

    if (r == -1) {
      if (errno == EINTR)
        continue;
      if (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
          errno == EOPNOTSUPP || errno == EBADF) {
        /* These files can't: stop trying. */
        atomic_store (&to->no_copy_range, true);
        return -EOPNOTSUPP;
      }
      return -errno;
    }
    if (r == 0)
      return -EOPNOTSUPP;       /* the source ended early */
    src_offset += r;
    dst_offset += r;
    count -= r;
  }
  return 0;
}

/* copy_file_range between two regular files: one system call, no copy
 * through user space (the kernel refuses block devices).  A large copy
 * is a large write into dst: it takes dst's write lock.
 */
static int
file_copy (const struct snapfg_device *src, uint64_t src_offset,
           const struct snapfg_device *dst, uint64_t dst_offset,
           size_t count)
{
  struct fd_device *to = fd_of (dst);
  pthread_mutex_t *lock;
  int r;

  if (atomic_load_explicit (&to->no_copy_range, memory_order_relaxed))
    return -EOPNOTSUPP;
  lock = large_write_lock (dst, count);
  r = copy_range (fd_of (src)->fd, src_offset, to, dst_offset, count);
  large_write_unlock (lock);
  return r;
}

static int
file_preallocate (const struct snapfg_device *dev, uint64_t count,
                  uint64_t offset)
{
  if (fallocate (fd_of (dev)->fd, FALLOC_FL_KEEP_SIZE, offset, count) == -1)
    return is_unsupported (errno) ? -EOPNOTSUPP : -errno;
  return 0;
}

static int
file_punch (const struct snapfg_device *dev, uint64_t count,
            uint64_t offset)
{
  if (past_current_end (dev, offset, count))
    return -EIO;
  if (fallocate (fd_of (dev)->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == -1)
    return is_unsupported (errno) ? -EOPNOTSUPP : -errno;
  return 0;
}

static int
file_zero (const struct snapfg_device *dev, uint64_t count,
           uint64_t offset, bool may_trim, bool fast_only)
{
  int fd = fd_of (dev)->fd;

  if (past_current_end (dev, offset, count))
    return -EIO;
  /* Punching a hole in a file reads back as zeroes and frees space. */
  if (may_trim &&
      fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == 0)
    return 0;
  if (fallocate (fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == 0)
    return 0;
  if (fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == 0)
    return 0;
  if (!is_unsupported (errno))
    return -errno;
  return -EOPNOTSUPP;           /* the dispatcher writes zeroes */
}

static int
file_extents (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  int fd = fd_of (dev)->fd;
  uint64_t end = offset + count;
  int r;

  /* SEEK_DATA past the end of a shrunk origin says "hole": zeroes a
   * client would not even read.
   */
  if (past_current_end (dev, offset, count))
    return -EIO;

  while (offset < end) {
    off_t data = lseek (fd, offset, SEEK_DATA);
    uint64_t hole_end;

    if (data == -1 && errno == ENXIO)
      data = end;                 /* a hole to the end of the file */
    else if (data == -1)
      return fn (opaque, offset, end - offset, 0);  /* can't tell: data */
    hole_end = (uint64_t) data < end ? (uint64_t) data : end;
    if (hole_end > offset) {
      r = fn (opaque, offset, hole_end - offset,
              SNAPFG_EXTENT_HOLE | SNAPFG_EXTENT_ZERO);
      if (r < 0)
        return r;
      offset = hole_end;
      if (offset >= end)
        break;
    }

    off_t hole = lseek (fd, offset, SEEK_HOLE);
    uint64_t data_end;
    if (hole == -1)
      data_end = end;
    else
      data_end = (uint64_t) hole < end ? (uint64_t) hole : end;
    if (data_end <= offset)
      data_end = end;
    r = fn (opaque, offset, data_end - offset, 0);
    if (r < 0)
      return r;
    offset = data_end;
  }
  return 0;
}

static int
file_truncate (struct snapfg_device *dev, uint64_t size)
{
  if (ftruncate (fd_of (dev)->fd, size) == -1)
    return -errno;
  dev->size = size;
  return 0;
}

/* A file gives its space back by becoming empty again. */
static int
file_discard_contents (struct snapfg_device *dev, uint64_t used)
{
  return file_truncate (dev, 0);
}

const struct device_ops device_file_ops = {
  .name = "file",
  .noun = "file",
  .uri = false,
  .claims = file_claims,
  .open = file_open,
  .create = file_create,
  FD_DEVICE_OPS,
  .copy = file_copy,
  .punch = file_punch,
  .zero = file_zero,
  .extents = file_extents,
  .discard_contents = file_discard_contents,
  .preallocate = file_preallocate,
};

/* --- block devices --- */

static bool
block_claims (const char *path)
{
  struct stat st;

  return stat (path, &st) == 0 && S_ISBLK (st.st_mode);
}

static int
block_open (struct snapfg_device *dev, const char *path, bool readonly)
{
  return open_path (dev, path, readonly, true);
}

static int
block_punch (const struct snapfg_device *dev, uint64_t count,
             uint64_t offset)
{
  uint64_t range[2] = { offset, count };

  if (ioctl (fd_of (dev)->fd, BLKDISCARD, range) == -1)
    return is_unsupported (errno) ? -EOPNOTSUPP : -errno;
  return 0;
}

static int
block_zero (const struct snapfg_device *dev, uint64_t count,
            uint64_t offset, bool may_trim, bool fast_only)
{
  uint64_t range[2] = { offset, count };

  if (ioctl (fd_of (dev)->fd, BLKZEROOUT, range) == 0)
    return 0;
  if (!is_unsupported (errno))
    return -errno;
  return -EOPNOTSUPP;           /* the dispatcher writes zeroes */
}

const struct device_ops device_block_ops = {
  .name = "block",
  .noun = "block device",
  .uri = false,
  .claims = block_claims,
  .open = block_open,
  .create = NULL,               /* it exists, or it is not a block device */
  FD_DEVICE_OPS,
  .copy = NULL,                 /* copy_file_range takes regular files only */
  .punch = block_punch,
  .zero = block_zero,
  .extents = NULL,              /* no allocation map: all data */
  .discard_contents = NULL,     /* zeroes what was used */
};
