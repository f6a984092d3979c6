/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: a plain full image written by the tool itself.
 *
 * A full backup without compression or encryption is a qcow2 image
 * created by qemu-img with preallocation=metadata: every cluster of the
 * disk already has its place in the file, and the file is sparse.  The
 * copy then writes each piece straight into the file at that place,
 * instead of sending it through a second socket to qemu-nbd, which
 * would receive it and write it again: the data makes one trip, as with
 * nbdcopy into a raw file.  Clusters that are never written stay holes
 * of the file and read as zeroes.
 *
 * The layout is read back from the image, never assumed: only a qcow2
 * version 3 image without backing file, encryption, extended L2
 * entries or any other incompatible feature, whose every cluster is a
 * plain allocated one laid out contiguously within each L2 table, is
 * written this way.  Anything else (another QEMU may lay it out
 * differently) makes the run fall back to qemu-nbd.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <unistd.h>
#include <fcntl.h>
#include <endian.h>
#include <pthread.h>

#include "snapfg-backup.h"

#define QCOW2_MAGIC 0x514649fb
#define L2_OFFSET_MASK 0x00fffffffffffe00ULL
#define L2_COMPRESSED (1ULL << 62)
#define L2_ZERO 1ULL

static uint32_t
be32_at (const unsigned char *p)
{
  uint32_t v;
  memcpy (&v, p, 4);
  return be32toh (v);
}

static uint64_t
be64_at (const unsigned char *p)
{
  uint64_t v;
  memcpy (&v, p, 8);
  return be64toh (v);
}

int
direct_map_read (int fd, uint64_t size, struct direct_map *m)
{
  unsigned char h[104];
  uint32_t cluster_bits, l1_size;
  uint64_t l1_off, cluster, clusters, span, *l1 = NULL, *l2 = NULL;
  size_t tables;

  memset (m, 0, sizeof *m);
  m->fd = -1;
  if (pread (fd, h, sizeof h, 0) != (ssize_t) sizeof h ||
      be32_at (h) != QCOW2_MAGIC || be32_at (h + 4) != 3 ||
      be64_at (h + 8) != 0 ||           /* backing file */
      be64_at (h + 24) != size ||
      be32_at (h + 32) != 0 ||          /* encryption */
      be64_at (h + 72) != 0)            /* incompatible features */
    return -1;
  cluster_bits = be32_at (h + 20);
  if (cluster_bits < 16 || cluster_bits > 21)
    return -1;
  cluster = 1ULL << cluster_bits;
  span = cluster * (cluster / 8);       /* guest bytes per L2 table */
  clusters = (size + cluster - 1) / cluster;
  tables = (clusters + cluster / 8 - 1) / (cluster / 8);
  l1_size = be32_at (h + 36);
  l1_off = be64_at (h + 40);
  if (tables == 0 || l1_size < tables)
    return -1;
  l1 = malloc (tables * 8);
  l2 = malloc (cluster);
  m->base = malloc (tables * sizeof *m->base);
  if (l1 == NULL || l2 == NULL || m->base == NULL ||
      pread (fd, l1, tables * 8, l1_off) != (ssize_t) (tables * 8))
    goto fail;
  for (size_t t = 0; t < tables; ++t) {
    uint64_t l2_off = be64toh (l1[t]) & L2_OFFSET_MASK, first = 0;
    uint64_t n = clusters - t * (cluster / 8);

    if (n > cluster / 8)
      n = cluster / 8;
    if (l2_off == 0 ||
        pread (fd, l2, cluster, l2_off) != (ssize_t) cluster)
      goto fail;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t e = be64toh (l2[i]), host = e & L2_OFFSET_MASK;
      if ((e & (L2_COMPRESSED | L2_ZERO)) || host == 0)
        goto fail;
      if (i == 0)
        first = host;
      else if (host != first + i * cluster)
        goto fail;
    }
    /* The file offset of guest offset X in this table is X + base. */
    m->base[t] = first - t * span;
  }
  free (l1);
  free (l2);
  m->span = span;
  m->tables = tables;
  m->fd = fd;
  pthread_mutex_init (&m->lock, NULL);
  return 0;

 fail:
  free (l1);
  free (l2);
  free (m->base);
  m->base = NULL;
  return -1;
}

/* Start the writeback of what was written, every this many bytes, for
 * the file range those bytes went to: the disk works while the copy
 * goes on, and the fsync that ends the run finds little left.  A range,
 * not the whole file (as before), so that the kernel does not walk the
 * whole file's pages each time; 16 MiB measured as good as or better
 * than 8 or 32, and better than no hint at all (then the dirty pages
 * pile up until the kernel's own writeback or the fsync).  Waiting for
 * older windows (SYNC_FILE_RANGE_WAIT_*), with or without dropping
 * them from the page cache, was not better: see BENCHMARKS.md.
 */
#define WRITEBACK_EVERY (16 << 20)

/* Note the file range [off, off + len) as written; start its window's
 * writeback when the window is full.
 */
static void
writeback_note (struct direct_map *m, uint64_t off, uint64_t len)
{
  uint64_t lo = 0, hi = 0;

  pthread_mutex_lock (&m->lock);
  if (m->pending == 0 || off < m->lo)
    m->lo = off;
  if (m->pending == 0 || off + len > m->hi)
    m->hi = off + len;
  m->pending += len;
  if (m->pending >= WRITEBACK_EVERY) {
    lo = m->lo;
    hi = m->hi;
    m->pending = 0;
  }
  pthread_mutex_unlock (&m->lock);
  if (hi > lo)
    /* Only a hint: failures show in the fsync that ends the run. */
    (void) sync_file_range (m->fd, lo, hi - lo, SYNC_FILE_RANGE_WRITE);
}

/* Called by the copy's threads at once. */
int
direct_pwrite (struct direct_map *m, const char *buf, uint64_t len,
               uint64_t off)
{
  while (len > 0) {
    size_t t = off / m->span;
    uint64_t n = m->span - off % m->span;
    ssize_t w;

    if (t >= m->tables) {
      errno = EINVAL;
      return -1;
    }
    if (n > len)
      n = len;
    w = pwrite (m->fd, buf, n, off + m->base[t]);
    if (w == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (w == 0) {
      errno = EIO;
      return -1;
    }
    writeback_note (m, off + m->base[t], w);
    buf += w;
    off += w;
    len -= w;
  }
  return 0;
}

void
direct_map_free (struct direct_map *m)
{
  pthread_mutex_destroy (&m->lock);
  free (m->base);
  m->base = NULL;
}
