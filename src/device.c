/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the disks the engine reads and writes (see device.h).
 *
 * The dispatchers, the parts every backend shares, and the file backend
 * (regular files and block devices through one descriptor).  The NBD
 * backend is in device-nbd.c.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <linux/fs.h>
#include <linux/falloc.h>

#include "device.h"

/* --- errors explained by backends --- */

static __thread int last_error_r;
static __thread char last_error_msg[512];

void
device_set_error (int r, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (last_error_msg, sizeof last_error_msg, fmt, ap);
  va_end (ap);
  last_error_r = r;
}

static void
clear_error (void)
{
  last_error_r = 0;
  last_error_msg[0] = '\0';
}

const char *
device_strerror (int r)
{
  if (r < 0 && r == last_error_r && last_error_msg[0] != '\0')
    return last_error_msg;
  return strerror (-r);
}

/* --- dispatch --- */

bool
device_is_uri (const char *path)
{
  /* nbd[s][+unix|+vsock]:// */
  if (strncmp (path, "nbd", 3) != 0)
    return false;
  path += 3;
  if (*path == 's')
    path++;
  if (strncmp (path, "+unix", 5) == 0)
    path += 5;
  else if (strncmp (path, "+vsock", 6) == 0)
    path += 6;
  return strncmp (path, "://", 3) == 0;
}

static void
device_reset (struct snapfg_device *dev, bool readonly)
{
  memset (dev, 0, sizeof *dev);
  dev->fd = -1;
  dev->can_flush = true;
  dev->readonly = readonly;
}

int
device_open (struct snapfg_device *dev, const char *path, bool readonly)
{
  const struct device_ops *ops =
    device_is_uri (path) ? &device_nbd_ops : &device_file_ops;
  int r;

  clear_error ();
  device_reset (dev, readonly);
  dev->path = strdup (path);
  if (dev->path == NULL)
    return -ENOMEM;
  r = ops->open (dev, path, readonly);
  if (r < 0) {
    free (dev->path);
    device_reset (dev, readonly);
    return r;
  }
  dev->ops = ops;
  return 0;
}

void
device_close (struct snapfg_device *dev)
{
  if (dev->ops)
    dev->ops->close (dev);
  dev->ops = NULL;
  dev->priv = NULL;
  dev->fd = -1;
  free (dev->path);
  dev->path = NULL;
}

bool
device_same (const struct snapfg_device *a, const struct snapfg_device *b)
{
  if (a->ops == NULL || a->ops != b->ops)
    return false;
  return a->ops->same (a, b);
}

bool
device_is_named (const struct snapfg_device *dev, const char *path)
{
  if (dev->ops == NULL ||
      device_is_uri (path) != (dev->ops == &device_nbd_ops))
    return false;
  return dev->ops->is_named (dev, path);
}

int
device_pread (const struct snapfg_device *dev, void *buf, size_t count,
              uint64_t offset)
{
  if (count == 0)
    return 0;
  return dev->ops->pread (dev, buf, count, offset);
}

int
device_pwrite (const struct snapfg_device *dev, const void *buf,
               size_t count, uint64_t offset)
{
  if (count == 0)
    return 0;
  return dev->ops->pwrite (dev, buf, count, offset);
}

int
device_flush (const struct snapfg_device *dev)
{
  if (!dev->can_flush)
    return 0;
  return dev->ops->flush (dev);
}

int
device_punch (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset)
{
  if (count == 0)
    return 0;
  return dev->ops->punch (dev, count, offset);
}

/* Write zeroes the slow way, in bounded pieces. */
static int
write_zeroes (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset)
{
  const size_t bufsize = count < 1024 * 1024 ? count : 1024 * 1024;
  void *zeroes = calloc (1, bufsize);
  int r = 0;

  if (zeroes == NULL)
    return -ENOMEM;
  while (count > 0 && r == 0) {
    size_t n = count < bufsize ? count : bufsize;
    r = device_pwrite (dev, zeroes, n, offset);
    count -= n;
    offset += n;
  }
  free (zeroes);
  return r;
}

int
device_zero (const struct snapfg_device *dev, uint64_t count,
             uint64_t offset, bool may_trim, bool fast_only)
{
  int r;

  if (count == 0)
    return 0;
  r = dev->ops->zero (dev, count, offset, may_trim, fast_only);
  if (r != -EOPNOTSUPP || fast_only)
    return r;
  return write_zeroes (dev, count, offset);
}

int
device_extents (const struct snapfg_device *dev, uint64_t count,
                uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  if (count == 0)
    return 0;
  return dev->ops->extents (dev, count, offset, fn, opaque);
}

int
device_current_size (const struct snapfg_device *dev, uint64_t *size)
{
  struct stat st;

  if (dev->ops != &device_file_ops) {
    *size = dev->size;          /* an NBD export's size is fixed */
    return 0;
  }
  if (dev->is_block)
    return ioctl (dev->fd, BLKGETSIZE64, size) == -1 ? -errno : 0;
  if (fstat (dev->fd, &st) == -1)
    return -errno;
  *size = st.st_size;
  return 0;
}

int
device_truncate (struct snapfg_device *dev, uint64_t size)
{
  return dev->ops->truncate (dev, size);
}

int
device_discard_contents (struct snapfg_device *dev, uint64_t used)
{
  if (used > dev->size && dev->fixed_size)
    used = dev->size;
  return dev->ops->discard_contents (dev, used);
}

/* device_is_all_zero: read every extent that is not known to be zero. */
struct zero_scan {
  const struct snapfg_device *dev;
  char *buf;
  size_t bufsize;
  int result;                   /* 1 all zero so far, 0 not, -errno */
};

static int
scan_extent (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct zero_scan *zs = opaque;

  if (type & SNAPFG_EXTENT_ZERO)
    return 0;
  while (length > 0) {
    size_t n = length < zs->bufsize ? length : zs->bufsize;
    int r = device_pread (zs->dev, zs->buf, n, offset);

    if (r < 0) {
      zs->result = r;
      return r;
    }
    /* buf is zero iff its first byte is and it equals itself shifted. */
    if (zs->buf[0] != 0 || memcmp (zs->buf, zs->buf + 1, n - 1) != 0) {
      zs->result = 0;
      return -ECANCELED;        /* stop: the answer is known */
    }
    offset += n;
    length -= n;
  }
  return 0;
}

int
device_is_all_zero (const struct snapfg_device *dev)
{
  struct zero_scan zs = { .dev = dev, .bufsize = 1024 * 1024, .result = 1 };
  int r;

  if (dev->size == 0)
    return 1;
  zs.buf = malloc (zs.bufsize);
  if (zs.buf == NULL)
    return -ENOMEM;
  r = device_extents (dev, dev->size, 0, scan_extent, &zs);
  if (r < 0 && zs.result == 1)
    /* The allocation map itself failed: read everything. */
    scan_extent (&zs, 0, dev->size, 0);
  free (zs.buf);
  return zs.result;
}

/* --- the file backend: regular files and block devices --- */

static int
file_init_from_fd (struct snapfg_device *dev, int fd)
{
  struct stat st;

  if (fstat (fd, &st) == -1)
    return -errno;
  if (S_ISBLK (st.st_mode)) {
    uint64_t size;

    if (ioctl (fd, BLKGETSIZE64, &size) == -1)
      return -errno;
    dev->size = size;
    dev->is_block = true;
    dev->fixed_size = true;
  }
  else if (S_ISREG (st.st_mode)) {
    dev->size = st.st_size;
    dev->is_block = false;
  }
  else
    return -EINVAL;               /* neither a file nor a block device */

  dev->fd = fd;
  dev->st_dev = st.st_dev;
  dev->st_ino = st.st_ino;
  dev->st_rdev = st.st_rdev;
  return 0;
}

static int
file_open (struct snapfg_device *dev, const char *path, bool readonly)
{
  int fd, r;

  fd = open (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1)
    return -errno;
  r = file_init_from_fd (dev, fd);
  if (r < 0)
    close (fd);
  return r;
}

int
device_create (struct snapfg_device *dev, const char *path)
{
  int fd, r;

  clear_error ();
  device_reset (dev, false);
  if (device_is_uri (path))
    return -EEXIST;             /* an export exists: open it instead */
  dev->path = strdup (path);
  if (dev->path == NULL)
    return -ENOMEM;
  fd = open (path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd == -1) {
    r = -errno;
    goto err;
  }
  r = file_init_from_fd (dev, fd);
  if (r < 0) {
    close (fd);
    unlink (path);
    goto err;
  }
  dev->ops = &device_file_ops;
  return 0;

 err:
  free (dev->path);
  device_reset (dev, false);
  return r;
}

static void
file_close (struct snapfg_device *dev)
{
  if (dev->fd >= 0)
    close (dev->fd);
}

static bool
file_same (const struct snapfg_device *a, const struct snapfg_device *b)
{
  if (a->is_block && b->is_block)
    return a->st_rdev == b->st_rdev;
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

static bool
file_is_named (const struct snapfg_device *dev, const char *path)
{
  struct stat st;

  if (stat (path, &st) == -1)
    return false;               /* does not exist (yet) */
  if (S_ISBLK (st.st_mode))
    return dev->is_block && dev->st_rdev == st.st_rdev;
  return !dev->is_block && dev->st_dev == st.st_dev &&
    dev->st_ino == st.st_ino;
}

/* Would changing [offset, offset+count) of a bounded regular file go
 * past its end?  Writing there would grow the file, punching or zeroing
 * would succeed on nothing: either way the request must fail.  (Block
 * devices refuse writes past their end themselves.)
 */
static bool
past_current_end (const struct snapfg_device *dev, uint64_t offset,
                  uint64_t count)
{
  struct stat st;

  if (!dev->bounded || dev->is_block || fstat (dev->fd, &st) == -1)
    return false;
  return offset + count > (uint64_t) st.st_size;
}

static int
file_pread (const struct snapfg_device *dev, void *buf, size_t count,
            uint64_t offset)
{
  char *p = buf;

  while (count > 0) {
    ssize_t r = pread (dev->fd, p, count, offset);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0) {
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
file_pwrite (const struct snapfg_device *dev, const void *buf,
             size_t count, uint64_t offset)
{
  const char *p = buf;

  if (past_current_end (dev, offset, count))
    return -EIO;
  while (count > 0) {
    ssize_t r = pwrite (dev->fd, p, count, offset);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += r;
    count -= r;
    offset += r;
  }
  return 0;
}

/* copy_file_range between two regular files.  (Not between block
 * devices: the kernel refuses those.)
 */
static int
file_copy (const struct snapfg_device *src, uint64_t src_offset,
           const struct snapfg_device *dst, uint64_t dst_offset,
           size_t count)
{
  struct snapfg_device *to = (struct snapfg_device *) dst;

  if (src->is_block || dst->is_block ||
      atomic_load_explicit (&to->no_copy_range, memory_order_relaxed))
    return -EOPNOTSUPP;
  while (count > 0) {
    loff_t in = src_offset, out = dst_offset;
    ssize_t r = copy_file_range (src->fd, &in, dst->fd, &out, count, 0);

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

static int
file_flush (const struct snapfg_device *dev)
{
  if (fdatasync (dev->fd) == -1)
    return -errno;
  return 0;
}

static bool
is_unsupported (int err)
{
  return err == EOPNOTSUPP || err == ENOTTY || err == ENOSYS || err == EINVAL;
}

static int
file_punch (const struct snapfg_device *dev, uint64_t count,
            uint64_t offset)
{
  if (past_current_end (dev, offset, count))
    return -EIO;
  if (dev->is_block) {
    uint64_t range[2] = { offset, count };
    if (ioctl (dev->fd, BLKDISCARD, range) == -1)
      return is_unsupported (errno) ? -EOPNOTSUPP : -errno;
    return 0;
  }
  if (fallocate (dev->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == -1)
    return is_unsupported (errno) ? -EOPNOTSUPP : -errno;
  return 0;
}

static int
file_zero (const struct snapfg_device *dev, uint64_t count,
           uint64_t offset, bool may_trim, bool fast_only)
{
  if (past_current_end (dev, offset, count))
    return -EIO;
  if (dev->is_block) {
    uint64_t range[2] = { offset, count };
    if (ioctl (dev->fd, BLKZEROOUT, range) == 0)
      return 0;
    if (!is_unsupported (errno))
      return -errno;
  }
  else {
    /* Punching a hole in a file reads back as zeroes and frees space. */
    if (may_trim &&
        fallocate (dev->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                   offset, count) == 0)
      return 0;
    if (fallocate (dev->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                   offset, count) == 0)
      return 0;
    if (fallocate (dev->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                   offset, count) == 0)
      return 0;
    if (!is_unsupported (errno))
      return -errno;
  }
  return -EOPNOTSUPP;           /* the dispatcher writes zeroes */
}

static int
file_extents (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  uint64_t end = offset + count;
  int r;

  if (dev->is_block)
    return fn (opaque, offset, count, 0);
  /* SEEK_DATA past the end of a shrunk origin says "hole": zeroes a
   * client would not even read.
   */
  if (past_current_end (dev, offset, count))
    return -EIO;

  while (offset < end) {
    off_t data = lseek (dev->fd, offset, SEEK_DATA);
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

    off_t hole = lseek (dev->fd, offset, SEEK_HOLE);
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
  if (dev->is_block)
    return -EINVAL;
  if (ftruncate (dev->fd, size) == -1)
    return -errno;
  dev->size = size;
  return 0;
}

/* A file gives its space back by becoming empty again.  A block device
 * cannot shrink: what was used is zeroed, so that it reads as all zero
 * (a new store) again.
 */
static int
file_discard_contents (struct snapfg_device *dev, uint64_t used)
{
  if (dev->is_block)
    return device_zero (dev, used, 0, true, false);
  return file_truncate (dev, 0);
}

const struct device_ops device_file_ops = {
  .name = "file",
  .open = file_open,
  .close = file_close,
  .same = file_same,
  .is_named = file_is_named,
  .pread = file_pread,
  .pwrite = file_pwrite,
  .flush = file_flush,
  .copy = file_copy,
  .punch = file_punch,
  .zero = file_zero,
  .extents = file_extents,
  .truncate = file_truncate,
  .discard_contents = file_discard_contents,
};
