/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: copying between devices (device_copy, see device.h), and the
 * per-thread buffers such copies go through.
 *
 * A copy goes inside the kernel where both backends can (copy_file_range
 * between two regular files: one system call, no copy through user
 * space, nor a large buffer), but only for runs over
 * DEVICE_COPY_BUFFER_CACHED bytes.  Shorter runs go through the thread's
 * buffer, which measured faster: with 4 KiB chunks, first writes at one
 * connection made 38.0k IOPS against 35.3k with copy_file_range (27.5
 * against 29.5 us of nbdkit CPU per request; ext4, files in the page
 * cache), because copy_file_range on a file system without reflink is a
 * splice through a pipe.  At 64 KiB the two were level.  Everything else
 * (an NBD export on either side, a block device, a kernel copy that
 * failed) is copied through a buffer here, which also tells whether the
 * source or the destination failed.
 */

#include <config.h>

#include <stdlib.h>
#include <errno.h>
#include <pthread.h>

#include "device.h"

/* The most bytes read and written at once by a copy through a buffer
 * (the engine copies at most 1 MiB at a time, so one piece for it).
 */
#define COPY_PIECE_MAX (1024 * 1024)

/* nbdkit's worker threads live as long as their connection, so each keeps
 * one buffer for its copies instead of a malloc and free per copy.
 * Larger copies are rare (dm's default chunk is 4 KiB) and cost far more
 * than an allocation; keeping a megabyte per worker thread would not pay,
 * so those allocate per copy.
 */
static pthread_key_t buffer_key;
static pthread_once_t buffer_once = PTHREAD_ONCE_INIT;
static bool buffer_key_ok;
static __thread void *thread_buffer;  /* DEVICE_COPY_BUFFER_CACHED bytes */

static void
make_buffer_key (void)
{
  /* The destructor frees a thread's buffer when the thread exits. */
  buffer_key_ok = pthread_key_create (&buffer_key, free) == 0;
}

void *
device_copy_buffer (size_t len)
{
  if (len > DEVICE_COPY_BUFFER_CACHED)
    return malloc (len);
  if (thread_buffer == NULL) {
    pthread_once (&buffer_once, make_buffer_key);
    if (!buffer_key_ok)
      return malloc (len);
    thread_buffer = malloc (DEVICE_COPY_BUFFER_CACHED);
    if (thread_buffer == NULL)
      return NULL;
    if (pthread_setspecific (buffer_key, thread_buffer) != 0) {
      void *p = thread_buffer;  /* could not arrange its free: don't keep it */
      thread_buffer = NULL;
      return p;
    }
  }
  return thread_buffer;
}

void
device_copy_buffer_release (void *buf)
{
  if (buf != thread_buffer)
    free (buf);
}

/* Copy through a buffer, in pieces of at most COPY_PIECE_MAX bytes. */
static int
copy_through_buffer (const struct snapfg_device *src, uint64_t src_offset,
                     const struct snapfg_device *dst, uint64_t dst_offset,
                     size_t count, bool *src_failed)
{
  size_t bufsize = count < COPY_PIECE_MAX ? count : COPY_PIECE_MAX;
  void *buf = device_copy_buffer (bufsize);
  int r = 0;

  if (buf == NULL)
    return -ENOMEM;
  while (count > 0 && r == 0) {
    size_t n = count < bufsize ? count : bufsize;

    r = device_pread (src, buf, n, src_offset);
    if (r < 0)
      *src_failed = true;
    else
      r = device_pwrite (dst, buf, n, dst_offset);
    src_offset += n;
    dst_offset += n;
    count -= n;
  }
  device_copy_buffer_release (buf);
  return r;
}

int
device_copy (const struct snapfg_device *src, uint64_t src_offset,
             const struct snapfg_device *dst, uint64_t dst_offset,
             size_t count, bool *src_failed)
{
  *src_failed = false;
  if (count == 0)
    return 0;
  /* The backends' copy is in the kernel, which cannot say which side
   * failed: after any failure the copy is done again through a buffer,
   * which can (and which a source that ended early, or a pair of
   * devices the kernel cannot copy between, needs anyway).  Copying the
   * same bytes again is harmless: the failed copy wrote nothing but the
   * range it was asked to fill.
   */
  if (count > DEVICE_COPY_BUFFER_CACHED &&
      src->ops->copy != NULL && src->ops->copy == dst->ops->copy) {
    int r = src->ops->copy (src, src_offset, dst, dst_offset, count);

    device_note_change (dst);
    if (r == 0)
      return 0;
  }
  return copy_through_buffer (src, src_offset, dst, dst_offset, count,
                              src_failed);
}
