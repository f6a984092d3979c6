/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: its NBD connections.
 *
 * To the server (negotiation stops before the export is chosen, so a run
 * fails before it changes anything on the server), to local images
 * through qemu-nbd, and the data extents of an export: what a full
 * backup or a restore's check has to read.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <pthread.h>

#include "rounding.h"
#include "snapfg-backup.h"
#include "vector.h"

DEFINE_VECTOR_TYPE (range_vector, struct copy_range);

/* Sort and merge ranges, rounding each out to BLOCK. */
static int
cmp_range (const void *a, const void *b)
{
  const struct copy_range *x = a, *y = b;

  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

size_t
normalise_ranges (struct copy_range *r, size_t n, uint64_t block,
                  uint64_t size)
{
  size_t out = 0;

  for (size_t i = 0; i < n; ++i) {
    uint64_t start = r[i].offset / block * block;
    uint64_t end = r[i].offset + r[i].length;
    end = div_round_up (end, block) * block;
    if (end > size)
      end = size;
    r[i].offset = start;
    r[i].length = end > start ? end - start : 0;
  }
  if (n > 1)
    qsort (r, n, sizeof *r, cmp_range);
  for (size_t i = 0; i < n; ++i) {
    if (r[i].length == 0)
      continue;
    if (out > 0 && r[out - 1].offset + r[out - 1].length >= r[i].offset) {
      uint64_t end = r[i].offset + r[i].length;
      if (end > r[out - 1].offset + r[out - 1].length)
        r[out - 1].length = end - r[out - 1].offset;
    }
    else
      r[out++] = r[i];
  }
  return out;
}

/* Connect to the server named by URI and stop in option mode, before
 * an export is chosen: the URI names the server, TLS and its files
 * (tls-psk-file=); the export is ours, set by open_export.  Connecting
 * first lets a run fail before it changes anything on the server.
 */
struct nbd_handle *
connect_server (const char *uri, const char *what, bool want_extents)
{
  struct nbd_handle *h = nbd_create ();

  if (h == NULL) {
    backup_error ("%s", nbd_get_error ());
    return NULL;
  }
  if (nbd_set_opt_mode (h, true) == -1 ||
      nbd_set_uri_allow_local_file (h, true) == -1 ||
      (want_extents &&
       nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) ||
      nbd_connect_uri (h, uri) == -1) {
    backup_error ("cannot connect to %s: %s", what ? what : uri,
                  nbd_get_error ());
    nbd_close (h);
    return NULL;
  }
  return h;
}

/* Finish negotiating: serve EXPORT (the URI's own export is replaced). */
int
open_export (struct nbd_handle *h, const char *what, const char *export)
{
  if (nbd_set_export_name (h, export) == -1 || nbd_opt_go (h) == -1) {
    backup_error ("%s: cannot open export '%s': %s", what, export,
                  nbd_get_error ());
    return -1;
  }
  return 0;
}

struct nbd_handle *
connect_export (const char *uri, const char *what, const char *export)
{
  struct nbd_handle *h = connect_server (uri, what, false);

  if (h && open_export (h, what ? what : uri, export) == -1) {
    nbd_opt_abort (h);
    nbd_close (h);
    return NULL;
  }
  return h;
}

struct connect_arg {
  const char *uri, *what, *export;
  struct nbd_handle *h;
};

static void *
connect_thread (void *arg)
{
  struct connect_arg *a = arg;

  a->h = connect_export (a->uri, a->what, a->export);
  return NULL;
}

/* Each connection is a handshake the server answers in 2-10 ms; made
 * one after another, the extra connections of a full run were the gap
 * between its first read and the others' (strace -ttt).  A thread each
 * makes them at once.
 */
size_t
connect_exports (const char *uri, const char *what, const char *export,
                 struct nbd_handle **out, size_t n)
{
  struct connect_arg a[8];
  pthread_t tid[8];
  bool started[8];
  size_t made = 0;

  if (n > 8)
    n = 8;
  for (size_t i = 0; i < n; ++i) {
    a[i] = (struct connect_arg) { uri, what, export, NULL };
    started[i] = pthread_create (&tid[i], NULL, connect_thread, &a[i]) == 0;
    if (!started[i])
      connect_thread (&a[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    if (started[i])
      pthread_join (tid[i], NULL);
    if (a[i].h)
      out[made++] = a[i].h;
  }
  return made;
}

void
disconnect (struct nbd_handle *h)
{
  if (h) {
    if (nbd_aio_is_negotiating (h))
      nbd_opt_abort (h);
    else
      nbd_shutdown (h, 0);
    nbd_close (h);
  }
}

/* nbd_shutdown waits for the server to close its end, and nbdkit first
 * ends the connection's threads: 2-6 ms a connection, one after another
 * (7-25 ms for a run's four).  With nothing in flight there is nothing
 * to wait for: the disconnect is sent and the socket closed.  A handle
 * with requests in flight (a run that failed) is shut down as before,
 * since nbdkit 1.32 aborts when a client goes away with replies still
 * to send.
 */
void
disconnect_all (struct nbd_handle **h, size_t n)
{
  for (size_t i = 0; i < n; ++i) {
    if (h[i] == NULL)
      continue;
    if (nbd_aio_is_ready (h[i]) && nbd_aio_in_flight (h[i]) == 0 &&
        nbd_aio_disconnect (h[i], 0) == 0)
      nbd_close (h[i]);
    else
      disconnect (h[i]);
    h[i] = NULL;
  }
}

/* A local image through qemu-nbd, started by socket activation. */
struct nbd_handle *
open_image (const char *path, const char *format, bool readonly)
{
  struct nbd_handle *h = nbd_create ();
  char *argv[] = { "qemu-nbd", "-f", (char *) format,
                   readonly ? "-r" : "--cache=writeback", (char *) path, NULL };

  if (h == NULL) {
    backup_error ("%s", nbd_get_error ());
    return NULL;
  }
  if ((readonly &&
       nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) ||
      nbd_connect_systemd_socket_activation (h, argv) == -1) {
    backup_error ("%s: cannot open it with qemu-nbd: %s", path,
                  nbd_get_error ());
    nbd_close (h);
    return NULL;
  }
  return h;
}

struct extent_acc {
  range_vector r;
  uint64_t next;                /* offset after the last extent seen */
  bool failed;
};

static int
extent_cb (void *opaque, const char *context, uint64_t offset,
           uint32_t *entries, size_t nr, int *error)
{
  struct extent_acc *a = opaque;

  if (strcmp (context, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  for (size_t i = 0; i + 1 < nr; i += 2) {
    uint32_t len = entries[i], flags = entries[i + 1];
    if (!(flags & LIBNBD_STATE_ZERO) &&
        range_vector_append (&a->r, (struct copy_range) { offset, len }) < 0) {
      a->failed = true;
      return -1;
    }
    offset += len;
  }
  a->next = offset;
  return 0;
}

/* The ranges of H that may hold data (not known to read as zero),
 * rounded out to BLOCK; the whole disk if the server cannot tell.
 */
int
data_ranges (struct nbd_handle *h, uint64_t size, uint64_t block,
             struct copy_range **out, size_t *nout)
{
  struct extent_acc a = { { 0 }, 0, false };

  if (nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) != 1) {
    if (range_vector_append (&a.r, (struct copy_range) { 0, size }) < 0)
      return -1;
    *out = a.r.ptr;
    *nout = size ? 1 : 0;
    return 0;
  }
  for (uint64_t off = 0; off < size; ) {
    uint64_t count = size - off > (1 << 30) ? (1 << 30) : size - off;
    a.next = off;
    if (nbd_block_status (h, count, off,
                          (nbd_extent_callback) { .callback = extent_cb,
                                                  .user_data = &a }, 0) == -1
        || a.failed) {
      backup_error ("block status at offset %" PRIu64 ": %s", off,
                    a.failed ? "out of memory" : nbd_get_error ());
      range_vector_reset (&a.r);
      return -1;
    }
    if (a.next <= off) {
      backup_error ("block status at offset %" PRIu64 ": the server "
                    "described no extent", off);
      range_vector_reset (&a.r);
      return -1;
    }
    off = a.next;
  }
  *nout = normalise_ranges (a.r.ptr, a.r.len, block, size);
  *out = a.r.ptr;
  return 0;
}
