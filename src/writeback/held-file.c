/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the memory file that holds write-back's data (see held-file.h).
 *
 * Why a file and not the heap: a page of the process's own memory costs
 * a page fault the first time it is touched, and on a virtual machine
 * whose page tables the hypervisor shadows (this project's test and
 * bench machines are such), that fault traps to the hypervisor.  Held
 * data is new memory by nature (a gigabyte of first writes held is a
 * gigabyte touched for the first time), so it paid that for every byte:
 * 1 GiB copied in 4 KiB pieces took 2.95 s into fresh anonymous memory,
 * 3.1 s from malloc (and as much again after a free: glibc gives it
 * back), and 0.81 s by pwrite into a memory file, whose pages the
 * kernel fills through its own mapping; in 1 MiB pieces 3.1 s against
 * 0.21 s.  Reading it back costs a pread (0.65 s per GiB in 4 KiB
 * pieces, 0.11 s in 1 MiB), paid by the committer, which reads the
 * pieces of a batch that lie side by side with one call.
 *
 * Space is handed out by a bump pointer and never reused: a piece's
 * pages are given back when it is released (a hole punched), so there
 * is no free list, no fragmentation, and the file's memory is exactly
 * the pages of what is held.  Offsets are 63 bits of a sparse file: at
 * 10 GB/s they last 29 years.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "held-file.h"
#include "snapfg-log.h"

#define HELD_PAGE 4096

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U   /* Linux 6.3; glibc 2.36's headers lack it */
#endif

int
held_file_open (struct held_file *hf)
{
  /* Never executable: what vm.memfd_noexec=2 asks of every memfd.  A
   * kernel before 6.3 does not know the flag (EINVAL).
   */
  hf->fd = memfd_create ("snapfg-held", MFD_CLOEXEC | MFD_NOEXEC_SEAL);
  if (hf->fd == -1 && errno != EINVAL)
    return -errno;
  if (hf->fd == -1)
    hf->fd = memfd_create ("snapfg-held", MFD_CLOEXEC);
  if (hf->fd == -1)
    return -errno;
  atomic_init (&hf->next, 0);
  return 0;
}

void
held_file_close (struct held_file *hf)
{
  if (hf->fd >= 0)
    close (hf->fd);
  hf->fd = -1;
}

uint64_t
held_file_extent (uint32_t count)
{
  return ((uint64_t) count + HELD_PAGE - 1) & ~(uint64_t) (HELD_PAGE - 1);
}

int
held_file_store (struct held_file *hf, const void *buf, uint32_t count,
                 uint64_t *off)
{
  uint64_t extent = held_file_extent (count);
  uint64_t at = atomic_fetch_add (&hf->next, extent);
  const char *p = buf;
  size_t done = 0;

  while (done < count) {
    ssize_t n = pwrite (hf->fd, p + done, count - done, at + done);

    if (n <= 0) {
      int err = n == 0 ? ENOSPC : errno;

      if (err == EINTR)
        continue;
      /* What was written of it goes back (the offset is never used). */
      held_file_release (hf, at, extent);
      return -err;
    }
    done += n;
  }
  *off = at;
  return 0;
}

int
held_file_load (struct held_file *hf, void *buf, size_t count, uint64_t off)
{
  char *p = buf;
  size_t done = 0;

  while (done < count) {
    ssize_t n = pread (hf->fd, p + done, count - done, off + done);

    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      /* Short: never for pages that were stored and not released. */
      return n == 0 ? -EIO : -errno;
    done += n;
  }
  return 0;
}

void
held_file_release (struct held_file *hf, uint64_t off, uint64_t len)
{
  if (len == 0)
    return;
  if (fallocate (hf->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 off, len) == -1)
    /* Not expected of a memory file; the pages stay until the close. */
    snapfg_error ("writeback: cannot give back %" PRIu64 " bytes of held "
                  "data at %" PRIu64 " of the memory file: %s",
                  len, off, strerror (errno));
}
