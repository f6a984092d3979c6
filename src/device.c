/* snapfg: the disks the engine reads and writes (see device.h). */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <linux/fs.h>
#include <linux/falloc.h>

#include "device.h"

static int
device_init_from_fd (struct snapfg_device *dev, int fd, const char *path,
                     bool readonly)
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
  }
  else if (S_ISREG (st.st_mode)) {
    dev->size = st.st_size;
    dev->is_block = false;
  }
  else
    return -EINVAL;               /* neither a file nor a block device */

  dev->path = strdup (path);
  if (dev->path == NULL)
    return -ENOMEM;
  dev->fd = fd;
  dev->readonly = readonly;
  dev->st_dev = st.st_dev;
  dev->st_ino = st.st_ino;
  dev->st_rdev = st.st_rdev;
  return 0;
}

int
device_open (struct snapfg_device *dev, const char *path, bool readonly)
{
  int fd, r;

  memset (dev, 0, sizeof *dev);
  dev->fd = -1;
  fd = open (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1)
    return -errno;
  r = device_init_from_fd (dev, fd, path, readonly);
  if (r < 0)
    close (fd);
  return r;
}

int
device_create (struct snapfg_device *dev, const char *path)
{
  int fd, r;

  memset (dev, 0, sizeof *dev);
  dev->fd = -1;
  fd = open (path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd == -1)
    return -errno;
  r = device_init_from_fd (dev, fd, path, false);
  if (r < 0) {
    close (fd);
    unlink (path);
  }
  return r;
}

void
device_close (struct snapfg_device *dev)
{
  if (dev->fd >= 0)
    close (dev->fd);
  dev->fd = -1;
  free (dev->path);
  dev->path = NULL;
}

bool
device_same (const struct snapfg_device *a, const struct snapfg_device *b)
{
  if (a->is_block && b->is_block)
    return a->st_rdev == b->st_rdev;
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int
device_pread (const struct snapfg_device *dev, void *buf, size_t count,
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

int
device_pwrite (const struct snapfg_device *dev, const void *buf,
               size_t count, uint64_t offset)
{
  const char *p = buf;

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

int
device_copy (const struct snapfg_device *src, uint64_t src_offset,
             const struct snapfg_device *dst, uint64_t dst_offset,
             size_t count)
{
  while (count > 0) {
    loff_t in = src_offset, out = dst_offset;
    ssize_t r = copy_file_range (src->fd, &in, dst->fd, &out, count, 0);

    if (r == -1) {
      if (errno == EINTR)
        continue;
      if (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
          errno == EOPNOTSUPP || errno == EBADF)
        return -EOPNOTSUPP;
      return -errno;
    }
    if (r == 0)
      return -EOPNOTSUPP;       /* source shorter than expected */
    src_offset += r;
    dst_offset += r;
    count -= r;
  }
  return 0;
}

int
device_flush (const struct snapfg_device *dev)
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

int
device_punch (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset)
{
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

/* Write zeroes the slow way, in bounded pieces. */
static int
write_zeroes (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset)
{
  const size_t bufsize = 1024 * 1024;
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
  if (fast_only)
    return -EOPNOTSUPP;
  return write_zeroes (dev, count, offset);
}

int
device_extents (const struct snapfg_device *dev, uint64_t count,
                uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  uint64_t end = offset + count;
  int r;

  if (dev->is_block)
    return fn (opaque, offset, count, 0);

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

int
device_is_all_zero (const struct snapfg_device *dev)
{
  const size_t bufsize = 1024 * 1024;
  uint64_t offset = 0;
  char *buf;
  int result = 1;

  if (dev->size == 0)
    return 1;
  buf = malloc (bufsize);
  if (buf == NULL)
    return -ENOMEM;

  while (offset < dev->size && result == 1) {
    uint64_t end = dev->size;

    if (!dev->is_block) {
      /* Skip holes: they read as zero. */
      off_t data = lseek (dev->fd, offset, SEEK_DATA);
      if (data == -1 && errno == ENXIO)
        break;
      if (data != -1) {
        off_t hole = lseek (dev->fd, data, SEEK_HOLE);
        offset = data;
        if (hole != -1)
          end = hole;
      }
    }
    while (offset < end) {
      size_t n = end - offset < bufsize ? end - offset : bufsize;
      int r = device_pread (dev, buf, n, offset);
      if (r < 0) {
        result = r;
        break;
      }
      /* buf is zero iff its first byte is and it equals itself shifted. */
      if (buf[0] != 0 || memcmp (buf, buf + 1, n - 1) != 0) {
        result = 0;
        break;
      }
      offset += n;
    }
  }
  free (buf);
  return result;
}

int
device_truncate (struct snapfg_device *dev, uint64_t size)
{
  if (dev->is_block)
    return -EINVAL;
  if (ftruncate (dev->fd, size) == -1)
    return -errno;
  dev->size = size;
  return 0;
}
