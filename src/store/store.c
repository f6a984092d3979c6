/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: exception stores, the parts every store shares (see store.h). */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "store.h"
#include "file-owner.h"
#include "file-create.h"
#include "snapfg-log.h"

#define STORE_TYPE_ENTRY_(name, open, survives, summary)                 \
  { #name, open, survives, summary },
const struct store_type store_types[] = {
  SNAPFG_STORE_TYPES (STORE_TYPE_ENTRY_)
  { NULL, NULL, false, NULL }
};

const struct store_type *
store_type_find (const char *name)
{
  for (const struct store_type *t = store_types; t->name; ++t)
    if (strcmp (t->name, name) == 0)
      return t;
  return NULL;
}

int
store_open (const struct snapfg_store_params *params,
            struct snapfg_store **stp)
{
  const struct store_type *t = store_type_find (params->type);

  if (t == NULL) {
    return snapfg_fail (EINVAL, "store=%s: unknown store type (expected "
                                SNAPFG_STORE_TYPE_CHOICES ")", params->type);
  }
  return t->open (params, stp);
}

int
store_bump_alloc (struct snapfg_store *st, uint64_t want, uint64_t *first,
                  uint64_t *got)
{
  /* An atomic bump pointer: concurrent copy-outs never serialise on a
   * lock to get their chunks, and a run taken by one fetch-and-add is
   * contiguous.  Overshooting max_chunks is harmless: the pointer only
   * grows, and every later caller sees ENOSPC too.
   */
  uint64_t chunk = atomic_fetch_add (&st->next_chunk, want);

  if (chunk >= st->max_chunks)
    return -ENOSPC;
  if (want > st->max_chunks - chunk)
    want = st->max_chunks - chunk;
  *first = chunk;
  *got = want;
  return 0;
}

/* A store in the state directory: the server's own file, named by the
 * server.  Created with O_EXCL (a file already there is not ours to
 * reuse: it is left alone) and never opened through a link, so that
 * nothing planted there makes the server write elsewhere.
 */
static int
open_in_state_dir (const struct snapfg_store_params *params,
                   struct snapfg_store *st)
{
  struct stat sb;
  int fd, r;

  if (params->must_exist)
    fd = openat (params->state_dirfd, params->state_leaf,
                 O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  else
    fd = create_in_dir (params->state_dirfd, params->state_leaf, O_RDWR,
                        0600);
  if (fd < 0) {
    r = fd == -1 ? -errno : fd;
    if (r == -EEXIST) {
      bool link = fstatat (params->state_dirfd, params->state_leaf, &sb,
                           AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK (sb.st_mode);
      snapfg_fail (-r, "cow=%s: %s of that name is already in the state "
                       "directory, but the catalogue records no snapshot "
                       "using it (left by a crash, or put there by someone "
                       "else); the server never reuses, overwrites or writes "
                       "through it: remove it, or give this snapshot another "
                       "name", params->path,
                       link ? "a symbolic link" : "a file");
    }
    else if (r == -ELOOP)
      snapfg_fail (-r, "cow=%s: is a symbolic link; the server never writes a "
                       "store of its state directory through a link (remove "
                       "the link)", params->path);
    else
      snapfg_fail (-r, "cow=%s: cannot %s the COW file: %s", params->path,
                       params->must_exist ? "open" : "create", strerror (-r));
    return r;
  }
  st->created = !params->must_exist;
  if (fstat (fd, &sb) == -1 || !S_ISREG (sb.st_mode)) {
    r = snapfg_fail (EINVAL, "cow=%s: not a regular file", params->path);
    goto fail;
  }
  if (params->must_exist) {
    r = file_check_owner (fd, params->path, false);
    if (r < 0)
      goto fail;
  }
  r = device_adopt_file (&st->dev, params->path, fd);
  if (r < 0) {
    snapfg_fail (-r, "cow=%s: %s", params->path, strerror (-r));
    goto fail;
  }
  return 0;

 fail:
  close (fd);
  if (st->created)
    unlinkat (params->state_dirfd, params->state_leaf, 0);
  st->created = false;
  return r;
}

int
store_open_device (const struct snapfg_store_params *params,
                   struct snapfg_store *st)
{
  int r;

  if (params->state_leaf) {
    r = open_in_state_dir (params, st);
    if (r < 0)
      return r;
    goto lock;
  }
  /* Only a file may be created: an NBD export or a block device exists
   * (device_create says -EEXIST).
   */
  if (!params->must_exist) {
    r = device_create (&st->dev, params->path);
    if (r == 0) {
      st->created = true;
      goto lock;
    }
    if (r != -EEXIST) {
      snapfg_fail (-r, "cow=%s: cannot create the COW file: %s",
                       params->path, device_strerror (r));
      return r;
    }
  }

  r = device_open (&st->dev, params->path, false);
  if (r < 0) {
    snapfg_fail (-r, "cow=%s: cannot open the COW %s: %s", params->path,
                     device_noun (params->path), device_strerror (r));
    return r;
  }
  if (device_same (&st->dev, params->origin)) {
    snapfg_fail (EINVAL, "cow=%s: is the origin itself; the COW store must be "
                         "a different file", params->path);
    device_close (&st->dev);
    return -EINVAL;
  }
lock:
  /* Held until the store closes: a second server (or a second open in
   * this one) cannot use the file meanwhile.  NBD exports cannot be
   * locked.
   */
  r = device_lock (&st->dev, true);
  if (r < 0) {
    if (r == -EAGAIN)
      snapfg_fail (-r, "cow=%s: the COW file is in use (locked by another "
                       "snapfg server, or a program such as QEMU); stop it "
                       "first, or use another file", params->path);
    else
      snapfg_fail (-r, "cow=%s: cannot lock the COW file: %s",
                       params->path, strerror (-r));
    /* A file we created a moment ago and someone else locked is
     * theirs now: leave it.
     */
    if (st->created && r != -EAGAIN)
      unlink (params->path);
    st->created = false;
    device_close (&st->dev);
    return r == -EAGAIN ? -EBUSY : r;
  }
  return 0;
}

void
store_discard_new (struct snapfg_store *st)
{
  if (st->created)
    unlink (st->dev.path);
  device_close (&st->dev);
  free (st);
}

int
store_set_size (const struct snapfg_store_params *params,
                struct snapfg_store *st, uint64_t default_size)
{
  uint64_t cow_size = params->cow_size ? params->cow_size : default_size;

  if (st->dev.fixed_size) {
    if (params->cow_size > st->dev.size) {
      return snapfg_fail (EINVAL, "cow-size=%" PRIu64 ": larger than the COW device "
                                  "%s (%" PRIu64 " bytes)",
                                  params->cow_size, st->dev.path, st->dev.size);
    }
    if (params->cow_size == 0)
      cow_size = st->dev.size;   /* a block device or export: its size */
  }
  st->max_chunks = cow_size >> st->chunk_shift;
  if (st->max_chunks > SNAPFG_MAX_COW_CHUNKS) {
    return snapfg_fail (EINVAL, "cow-size=%" PRIu64 ": the COW store %s would hold more "
                                "than %" PRIu32 " chunks of %" PRIu32 " bytes; use a "
                                "larger chunk-size", cow_size, st->dev.path,
                                SNAPFG_MAX_COW_CHUNKS, st->chunk_size);
  }
  if (st->max_chunks == 0) {
    return snapfg_fail (EINVAL, "cow-size=%" PRIu64 ": smaller than one chunk "
                                "(%" PRIu32 " bytes) of the COW store %s",
                                cow_size, st->chunk_size, st->dev.path);
  }
  return 0;
}
