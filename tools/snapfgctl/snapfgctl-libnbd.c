/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfgctl: libnbd, loaded only when it is needed.
 *
 * snapfgctl uses libnbd for one thing: inspect of a COW store on an
 * NBD export (the device layer's NBD backend, src/device/device-nbd.c).
 * Linked, libnbd brings GnuTLS, libxml2 and a dozen more libraries into
 * every snapfgctl run, the control commands included, for nothing.  So
 * snapfgctl is linked without it and these definitions of the libnbd
 * functions the device layer calls load libnbd.so.0 at the first call
 * and forward to it (as systemd loads its optional libraries).  Without
 * libnbd installed, nbd_create fails with a message saying so, which the
 * device layer reports like any other connection failure.
 *
 * The prototypes are libnbd.h's own, so a libnbd whose API differs
 * fails to build here, not at run time.
 */

#include <config.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

#include <libnbd.h>

#define LIBNBD_SONAME "libnbd.so.0"

static void *libnbd;
static char load_error[512];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void
load_libnbd (void)
{
  libnbd = dlopen (LIBNBD_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (libnbd == NULL)
    snprintf (load_error, sizeof load_error, "snapfgctl needs %s for an "
              "NBD URI and cannot load it (%s): install libnbd0",
              LIBNBD_SONAME, dlerror ());
}

/* libnbd's NAME, or NULL when libnbd cannot be loaded. */
static void *
symbol (const char *name)
{
  void *p;

  pthread_once (&load_once, load_libnbd);
  if (libnbd == NULL)
    return NULL;
  p = dlsym (libnbd, name);
  if (p == NULL) {
    /* Only after nbd_create succeeded: a libnbd without a function
     * libnbd.h declared is broken.
     */
    fprintf (stderr, "snapfgctl: %s has no %s: %s\n", LIBNBD_SONAME, name,
             dlerror ());
    abort ();
  }
  return p;
}

/* A function that is only called with a handle: libnbd is loaded. */
#define FORWARD(ret, name, params, args)                        \
  ret name params                                               \
  {                                                             \
    static ret (*fn) params;                                    \
    if (fn == NULL)                                             \
      fn = symbol (#name);                                      \
    return fn args;                                             \
  }

struct nbd_handle *
nbd_create (void)
{
  static struct nbd_handle *(*fn) (void);

  if (fn == NULL)
    fn = symbol ("nbd_create");
  if (fn == NULL) {
    errno = ENOSYS;
    return NULL;
  }
  return fn ();
}

const char *
nbd_get_error (void)
{
  static const char *(*fn) (void);

  if (fn == NULL)
    fn = symbol ("nbd_get_error");
  return fn ? fn () : load_error;
}

int
nbd_get_errno (void)
{
  static int (*fn) (void);

  if (fn == NULL)
    fn = symbol ("nbd_get_errno");
  return fn ? fn () : ENOSYS;
}

void
nbd_close (struct nbd_handle *h)
{
  static void (*fn) (struct nbd_handle *);

  if (h == NULL)
    return;
  if (fn == NULL)
    fn = symbol ("nbd_close");
  fn (h);
}

FORWARD (int, nbd_add_meta_context, (struct nbd_handle *h, const char *n),
         (h, n))
FORWARD (int, nbd_connect_uri, (struct nbd_handle *h, const char *uri),
         (h, uri))
FORWARD (int, nbd_is_read_only, (struct nbd_handle *h), (h))
FORWARD (int, nbd_can_flush, (struct nbd_handle *h), (h))
FORWARD (int, nbd_can_trim, (struct nbd_handle *h), (h))
FORWARD (int, nbd_can_zero, (struct nbd_handle *h), (h))
FORWARD (int, nbd_can_fast_zero, (struct nbd_handle *h), (h))
FORWARD (int, nbd_can_multi_conn, (struct nbd_handle *h), (h))
FORWARD (int, nbd_can_meta_context, (struct nbd_handle *h, const char *m),
         (h, m))
FORWARD (int64_t, nbd_get_size, (struct nbd_handle *h), (h))
FORWARD (int64_t, nbd_get_block_size, (struct nbd_handle *h, int t), (h, t))
FORWARD (int, nbd_pread, (struct nbd_handle *h, void *buf, size_t count,
                          uint64_t offset, uint32_t flags),
         (h, buf, count, offset, flags))
FORWARD (int, nbd_pwrite, (struct nbd_handle *h, const void *buf,
                           size_t count, uint64_t offset, uint32_t flags),
         (h, buf, count, offset, flags))
FORWARD (int, nbd_shutdown, (struct nbd_handle *h, uint32_t flags),
         (h, flags))
FORWARD (int, nbd_flush, (struct nbd_handle *h, uint32_t flags), (h, flags))
FORWARD (int, nbd_trim, (struct nbd_handle *h, uint64_t count,
                         uint64_t offset, uint32_t flags),
         (h, count, offset, flags))
FORWARD (int, nbd_zero, (struct nbd_handle *h, uint64_t count,
                         uint64_t offset, uint32_t flags),
         (h, count, offset, flags))
FORWARD (int, nbd_block_status, (struct nbd_handle *h, uint64_t count,
                                 uint64_t offset, nbd_extent_callback cb,
                                 uint32_t flags),
         (h, count, offset, cb, flags))
FORWARD (int, nbd_aio_is_dead, (struct nbd_handle *h), (h))
FORWARD (int, nbd_aio_is_closed, (struct nbd_handle *h), (h))
