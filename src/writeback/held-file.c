/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the held file (see held-file.h).
 *
 * Why a file and not the heap: a page of the process's own memory costs
 * a page fault the first time it is touched, and on a virtual machine
 * whose page tables the hypervisor shadows (this project's test and
 * bench machines are such), that fault traps to the hypervisor.  Held
 * data is new memory by nature (a gigabyte of first writes held is a
 * gigabyte touched for the first time), so it paid that for every byte:
 * 1 GiB copied in 4 KiB pieces took 2.95 s into fresh anonymous memory,
 * 3.1 s from malloc, and 0.81 s by pwrite into a memory file, whose
 * pages the kernel fills through its own mapping; in 1 MiB pieces 3.1 s
 * against 0.21 s.  Reading it back costs a pread, paid by the committer,
 * which reads the pieces of a batch that lie side by side with one call.
 *
 * Why a named file on tmpfs and not an anonymous one (memfd): the pages
 * of a tmpfs file outlive the process, so a crash of the server (kill
 * -9, an abort, an OOM kill) loses no acknowledged write: the next start
 * finds the file and replays it (writeback-replay.c).  It costs the same
 * memory and the same copies.  A power cut empties it, which costs only
 * writes no flush covered.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include "held-file.h"
#include "held-record.h"
#include "crc32c.h"
#include "file-create.h"
#include "file-owner.h"
#include "boot-id.h"
#include "snapfg-log.h"

/* Records in the ring: at 64 bytes each, 16 MiB of address space and
 * of file, touched only as writes are held (a page per 64 of them) and
 * given back as they are applied.  Far more than can be held at once:
 * writeback-max is at least a page per write.
 */
#define RING_SLOTS (1u << 18)

/* --- the directory --- */

static int
open_dir (const char *dir, int *fd)
{
  *fd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return *fd == -1 ? -errno : 0;
}

/* Make dir (mode 0700) if it is missing; EEXIST is fine. */
static int
make_own_dir (const char *dir)
{
  if (mkdir (dir, 0700) == -1 && errno != EEXIST)
    return -errno;
  return 0;
}

static bool
is_memory_fs (int fd)
{
  struct statfs sf;

  if (fstatfs (fd, &sf) == -1)
    return false;
  return sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC;
}

/* The default directories, in order: systemd's RuntimeDirectory= for
 * the service, the user's runtime directory, or one of the server's own
 * under /run (root) or /dev/shm (anyone).  The first one on a memory
 * file system is taken: /run is a disk directory on some systems (a
 * container's, say), and a held file there would survive a power cut.
 * own: the server makes it (mode 0700) if it is missing.
 */
#define MAX_DEFAULTS 4
static size_t
default_dirs (char *dirs[MAX_DEFAULTS], bool own[MAX_DEFAULTS])
{
  const char *env = getenv ("RUNTIME_DIRECTORY");
  size_t n = 0;

  if (env && *env) {
    /* Several directories are separated by ':': the first. */
    own[n] = false;
    dirs[n++] = strndup (env, strcspn (env, ":"));
  }
  env = getenv ("XDG_RUNTIME_DIR");
  if (env && *env) {
    own[n] = false;
    dirs[n++] = strdup (env);
  }
  if (access ("/run", W_OK) == 0) {
    own[n] = true;
    dirs[n++] = strdup ("/run/snapfg");
  }
  own[n] = true;
  if (asprintf (&dirs[n++], "/dev/shm/snapfg-%u", (unsigned) geteuid ()) == -1)
    dirs[n - 1] = NULL;
  return n;
}

/* Is the directory that would hold dir (own: made by us) on a memory
 * file system?  Looked at before anything is made there.
 */
static bool
parent_is_memory_fs (const char *dir)
{
  char *parent = strdup (dir);
  char *slash = parent ? strrchr (parent, '/') : NULL;
  int fd;
  bool mem;

  if (slash == NULL) {
    free (parent);
    return false;
  }
  *(slash == parent ? slash + 1 : slash) = '\0';
  fd = open (parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free (parent);
  if (fd == -1)
    return false;
  mem = is_memory_fs (fd);
  close (fd);
  return mem;
}

/* The file's name: the origin's path, hashed (FNV-1a), so that one
 * origin always finds its own and two never share one (one server per
 * origin: the origin is locked).
 */
static char *
file_name_for (const char *origin_path)
{
  uint64_t h = UINT64_C (0xcbf29ce484222325);
  char *name;

  for (const unsigned char *p = (const unsigned char *) origin_path; *p; ++p) {
    h ^= *p;
    h *= UINT64_C (0x100000001b3);
  }
  if (asprintf (&name, "snapfg-held-%016" PRIx64, h) == -1)
    return NULL;
  return name;
}

/* Open dir into hf->dirfd and check it: 0, -EAGAIN if it is not on a
 * memory file system and a default may be tried next (quiet), or -errno
 * (logged).
 */
static int
use_dir (struct held_file *hf, const char *dir, bool own, bool on_disk,
         bool is_default)
{
  int r;

  if (is_default && !on_disk &&
      !(own ? parent_is_memory_fs (dir) : true))
    return -EAGAIN;
  if (own && (r = make_own_dir (dir)) < 0) {
    snapfg_error ("writeback: cannot make the directory %s for held writes: "
                  "%s; set held-dir= to a directory on a memory file system "
                  "(tmpfs)", dir, strerror (-r));
    return r;
  }
  r = open_dir (dir, &hf->dirfd);
  if (r < 0) {
    if (is_default && !own)
      return -EAGAIN;           /* a runtime directory that is gone */
    snapfg_error ("held-dir=%s: %s; held writes are kept there (it must be "
                  "a directory on a memory file system, tmpfs)",
                  dir, strerror (-r));
    return r;
  }
  if (!on_disk && !is_memory_fs (hf->dirfd)) {
    close (hf->dirfd);
    hf->dirfd = -1;
    if (is_default)
      return -EAGAIN;
    snapfg_error ("held-dir=%s: not on a memory file system (tmpfs): held "
                  "writes kept on a disk could be replayed after a power "
                  "cut over newer, flushed data.  Use a directory on tmpfs "
                  "(/dev/shm, $XDG_RUNTIME_DIR, /run where it is tmpfs), or "
                  "held-dir-on-disk=true if this disk is emptied at every "
                  "boot", dir);
    return -EINVAL;
  }
  /* Another user able to write it could plant a file or a link. */
  r = file_check_owner (hf->dirfd, dir, true);
  if (r < 0) {
    close (hf->dirfd);
    hf->dirfd = -1;
    return r;
  }
  hf->dir = strdup (dir);
  return hf->dir ? 0 : -ENOMEM;
}

int
held_file_place (struct held_file *hf, const struct held_place *place,
                 const struct held_binding *b)
{
  int r = -ENOENT;

  memset (hf, 0, sizeof *hf);
  hf->fd = -1;
  hf->dirfd = -1;
  if (place->dir)
    r = use_dir (hf, place->dir, false, place->on_disk, false);
  else {
    char *dirs[MAX_DEFAULTS];
    bool own[MAX_DEFAULTS];
    size_t n = default_dirs (dirs, own);

    for (size_t i = 0; i < n; ++i) {
      if (dirs[i] && (r == -ENOENT || r == -EAGAIN))
        r = use_dir (hf, dirs[i], own[i], place->on_disk, true);
      free (dirs[i]);
    }
    if (r == -EAGAIN || r == -ENOENT) {
      snapfg_error ("writeback: no directory on a memory file system for "
                    "held writes ($RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR, "
                    "/run/snapfg and /dev/shm were tried): set held-dir= "
                    "to one on tmpfs, or use writeback=off");
      r = -ENOENT;
    }
  }
  if (r < 0) {
    held_file_forget (hf);
    return r;
  }
  hf->name = file_name_for (b->origin_path);
  if (hf->name == NULL ||
      asprintf (&hf->path, "%s/%s", hf->dir, hf->name) == -1) {
    hf->path = NULL;
    held_file_forget (hf);
    return -ENOMEM;
  }
  hf->max_stores = b->max_stores;
  hf->slots = RING_SLOTS;
  held_layout_of (hf->slots, hf->max_stores, &hf->layout);
  return 0;
}

int
held_file_exists (struct held_file *hf)
{
  struct stat st;

  if (fstatat (hf->dirfd, hf->name, &st, AT_SYMLINK_NOFOLLOW) == 0)
    return 1;
  if (errno == ENOENT)
    return 0;
  snapfg_error ("writeback: cannot look for the held file %s: %s",
                hf->path, strerror (errno));
  return -errno;
}

/* --- mapping --- */

static int
map_file (struct held_file *hf)
{
  hf->map_len = hf->layout.ring_off + (size_t) hf->slots * HELD_RECORD_LEN;
  hf->map = mmap (NULL, hf->map_len, PROT_READ | PROT_WRITE, MAP_SHARED,
                  hf->fd, 0);
  if (hf->map == MAP_FAILED) {
    hf->map = NULL;
    return -errno;
  }
  return 0;
}

static unsigned char *
slot_of (const struct held_file *hf, uint64_t seq)
{
  return hf->map + hf->layout.ring_off +
    ((seq - 1) % hf->slots) * HELD_RECORD_LEN;
}

/* --- an existing file: checks before a replay --- */

static int
refuse (const struct held_file *hf, const char *what)
{
  snapfg_error ("held file %s: %s.  Nothing was written.  It holds writes "
                "this origin's server acknowledged before it stopped "
                "uncleanly; to start without them (they are lost), remove "
                "the file", hf->path, what);
  return -EINVAL;
}

int
held_file_open_existing (struct held_file *hf, const struct held_binding *b,
                         struct held_replay *rp, struct held_header *hdr)
{
  struct held_layout l;
  struct stat st;
  const char *problem;
  char now_boot[HELD_BOOT_ID_LEN] = "";
  char why[2560];
  uint64_t mark;
  int r;

  hf->fd = openat (hf->dirfd, hf->name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (hf->fd == -1) {
    r = -errno;
    if (r == -ELOOP)
      return refuse (hf, "it is a symbolic link, not a file snapfg made");
    snapfg_error ("held file %s: %s", hf->path, strerror (-r));
    return r;
  }
  if (fstat (hf->fd, &st) == -1)
    return -errno;
  if (!S_ISREG (st.st_mode))
    return refuse (hf, "it is not a regular file");
  if (st.st_uid != geteuid ())
    return refuse (hf, "it is owned by another user");
  if (st.st_mode & 077)
    return refuse (hf, "its mode lets other users read or write it "
                   "(snapfg makes it 0600)");
  if ((uint64_t) st.st_size < HELD_HEADER_FIXED)
    return refuse (hf, "it is too short to be a held file");
  {
    unsigned char fixed[HELD_HEADER_FIXED];

    if (pread (hf->fd, fixed, sizeof fixed, 0) != (ssize_t) sizeof fixed)
      return refuse (hf, "its header cannot be read");
    hdr->stores = NULL;
    problem = held_header_decode (fixed, sizeof fixed, hdr, &l);
    /* Only the counts are used from this first look: a header longer
     * than the fixed part is decoded again once mapped.
     */
    if (problem && strcmp (problem, "its header length does not match "
                           "its counts") != 0 &&
        strcmp (problem, "its header checksum is wrong") != 0)
      return refuse (hf, problem);
    if (hdr->slots == 0 || hdr->slots > (1u << 28) ||
        hdr->max_stores > (1u << 20))
      return refuse (hf, "its header gives an impossible ring or store count");
  }
  hf->slots = hdr->slots;
  hf->max_stores = hdr->max_stores;
  held_layout_of (hf->slots, hf->max_stores, &hf->layout);
  if ((uint64_t) st.st_size < hf->layout.data_off)
    return refuse (hf, "it is shorter than its header says");
  r = map_file (hf);
  if (r < 0) {
    snapfg_error ("held file %s: cannot map it: %s", hf->path, strerror (-r));
    return r;
  }
  problem = held_header_decode (hf->map, hf->layout.header_len, hdr, &l);
  if (problem)
    return refuse (hf, problem);

  /* The ring first: a file whose every write was applied (a start that
   * failed after making it, a stop that could not remove it) holds
   * nothing to lose, whatever it was bound to.
   */
  problem = held_mark_decode (hf->map + hf->layout.mark_off, &mark);
  if (problem)
    return refuse (hf, problem);
  r = held_records_scan (hf->map + hf->layout.ring_off, hf->slots, mark,
                         hf->layout.data_off, st.st_size, UINT32_MAX,
                         rp, why, sizeof why);
  if (r == -EINVAL)
    return refuse (hf, why);
  if (r < 0)
    return r;
  if (rp->n == 0)
    return 1;

  /* Bound to this boot, this origin. */
  if (read_boot_id (now_boot, sizeof now_boot) < 0 ||
      strcmp (now_boot, hdr->boot_id) != 0) {
    snprintf (why, sizeof why, "it was written during another boot (boot "
              "id %s; this boot is %s): its writes may be older than data "
              "flushed since, so it is never applied",
              hdr->boot_id, now_boot[0] ? now_boot : "unknown");
    return refuse (hf, why);
  }
  if (strcmp (hdr->origin_path, b->origin_path) != 0) {
    snprintf (why, sizeof why, "it belongs to origin %s, not %s",
              hdr->origin_path, b->origin_path);
    return refuse (hf, why);
  }
  if (hdr->origin_size != b->origin_size) {
    snprintf (why, sizeof why, "its origin was %" PRIu64 " bytes, %s is %"
              PRIu64 " bytes now", hdr->origin_size, b->origin_path,
              b->origin_size);
    return refuse (hf, why);
  }
  if (b->has_identity && !b->origin_moved &&
      (hdr->origin_dev != b->origin_dev || hdr->origin_ino != b->origin_ino)) {
    snprintf (why, sizeof why, "its origin was device %" PRIu64 " inode %"
              PRIu64 "; %s is device %" PRIu64 " inode %" PRIu64 " now (the "
              "origin was replaced; if the same disk was only renumbered, "
              "start with origin-moved=true)", hdr->origin_dev,
              hdr->origin_ino, b->origin_path, b->origin_dev, b->origin_ino);
    return refuse (hf, why);
  }

  return 0;
}

int
held_file_load_record (struct held_file *hf, const struct held_record *r,
                       void *buf)
{
  int err = held_file_load (hf, buf, r->count, r->data_off);

  if (err < 0) {
    snapfg_error ("held file %s: cannot read the data of held write %"
                  PRIu64 ": %s", hf->path, r->seq, strerror (-err));
    return err;
  }
  if (crc32c (0, buf, r->count) != r->data_crc) {
    char why[128];

    snprintf (why, sizeof why, "the data of held write %" PRIu64
              " (%" PRIu32 " bytes at %" PRIu64 " of the file) fails its "
              "checksum", r->seq, r->count, r->data_off);
    return refuse (hf, why);
  }
  return 0;
}

/* --- a new file --- */

int
held_file_create (struct held_file *hf, const struct held_binding *b,
                  char (*stores)[HELD_UUID_LEN], uint32_t nstores)
{
  struct held_header h = {
    .created = time (NULL),
    .pid = getpid (),
    .origin_dev = b->origin_dev,
    .origin_ino = b->origin_ino,
    .origin_size = b->origin_size,
    .slots = hf->slots,
    .max_stores = hf->max_stores,
    .nstores = nstores,
    .stores = stores,
  };
  int r;

  /* This server's layout (a replayed file's may have been another's). */
  hf->slots = RING_SLOTS;
  hf->max_stores = b->max_stores;
  held_layout_of (hf->slots, hf->max_stores, &hf->layout);
  h.slots = hf->slots;
  h.max_stores = hf->max_stores;
  if (nstores > hf->max_stores)
    return -ENOSPC;
  if (read_boot_id (h.boot_id, sizeof h.boot_id) < 0) {
    snapfg_error ("writeback: cannot read this boot's id "
                  "(/proc/sys/kernel/random/boot_id), which binds the held "
                  "file to the boot; writeback=off works without it");
    return -EIO;
  }
  snprintf (h.origin_path, sizeof h.origin_path, "%s", b->origin_path);
  r = create_in_dir (hf->dirfd, hf->name, O_RDWR, 0600);
  if (r < 0) {
    if (r == -EEXIST)
      snapfg_error ("held file %s exists already: another server's, or "
                    "one this server could not replay; it is left as it "
                    "is", hf->path);
    else
      snapfg_error ("writeback: cannot create the held file %s: %s",
                    hf->path, strerror (-r));
    return r;
  }
  hf->fd = r;
  /* Sparse: the header, the mark and the ring take pages only as they
   * are written; the data grows past the end.
   */
  if (ftruncate (hf->fd, hf->layout.data_off) == -1 ||
      (r = map_file (hf)) < 0) {
    r = r < 0 ? r : -errno;
    snapfg_error ("writeback: cannot size or map the held file %s: %s",
                  hf->path, strerror (-r));
    held_file_close (hf, true);
    return r;
  }
  held_header_encode (&h, &hf->layout, hf->map);
  held_mark_encode (0, hf->map + hf->layout.mark_off);
  atomic_init (&hf->next, hf->layout.data_off);
  hf->punched_seq = 0;
  return 0;
}

int
held_file_set_stores (struct held_file *hf, char (*stores)[HELD_UUID_LEN],
                      uint32_t nstores)
{
  struct held_header h;
  struct held_layout l;

  if (hf->map == NULL)
    return 0;
  if (nstores > hf->max_stores)
    return -ENOSPC;
  if (held_header_decode (hf->map, hf->layout.header_len, &h, &l) != NULL)
    return -EIO;                /* our own header: never */
  h.nstores = nstores;
  h.stores = stores;
  {
    /* Encoded aside, then copied: the old stores point into the map. */
    unsigned char *buf = malloc (hf->layout.header_len);

    if (buf == NULL)
      return -ENOMEM;
    held_header_encode (&h, &hf->layout, buf);
    memcpy (hf->map, buf, hf->layout.header_len);
    free (buf);
  }
  return 0;
}

void
held_file_close (struct held_file *hf, bool remove)
{
  if (hf->map)
    munmap (hf->map, hf->map_len);
  hf->map = NULL;
  if (hf->fd >= 0) {
    if (remove && unlinkat (hf->dirfd, hf->name, 0) == -1)
      snapfg_error ("writeback: cannot remove the held file %s: %s",
                    hf->path, strerror (errno));
    close (hf->fd);
  }
  hf->fd = -1;
}

void
held_file_forget (struct held_file *hf)
{
  held_file_close (hf, false);
  if (hf->dirfd >= 0)
    close (hf->dirfd);
  hf->dirfd = -1;
  free (hf->dir);
  free (hf->name);
  free (hf->path);
  hf->dir = hf->name = hf->path = NULL;
}

/* --- data --- */

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
    /* Not expected of tmpfs; the pages stay until the file goes. */
    snapfg_error ("writeback: cannot give back %" PRIu64 " bytes of held "
                  "data at %" PRIu64 " of %s: %s",
                  len, off, hf->path, strerror (errno));
}

/* --- records --- */

bool
held_file_ring_has_room (const struct held_file *hf, uint64_t seq,
                         uint64_t applied)
{
  return seq - applied < hf->slots;
}

void
held_file_write_record (struct held_file *hf, const struct held_record *r)
{
  held_record_encode (r, slot_of (hf, r->seq));
}

void
held_file_drop_record (struct held_file *hf, uint64_t seq)
{
  unsigned char *p = slot_of (hf, seq);
  struct held_record r;

  if (held_record_decode (p, &r) != NULL || r.seq != seq)
    return;                     /* not written: nothing to drop */
  r.dropped = true;
  held_record_encode (&r, p);
}

void
held_file_mark_applied (struct held_file *hf, uint64_t seq)
{
  uint64_t per_page = HELD_PAGE / HELD_RECORD_LEN;
  uint64_t first, last;

  held_mark_encode (seq, hf->map + hf->layout.mark_off);

  /* Whole pages of the ring whose records are all applied go back:
   * sequence numbers (punched_seq, seq], page by page, wrapping.
   */
  first = hf->punched_seq / per_page;   /* the page holding punched_seq + 1 */
  last = seq / per_page;                /* pages before it are all applied */
  for (uint64_t page = first; page < last; ++page) {
    uint64_t slot_page = page % (hf->slots / per_page);

    fallocate (hf->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
               hf->layout.ring_off + slot_page * HELD_PAGE, HELD_PAGE);
  }
  if (last > first)
    hf->punched_seq = last * per_page;
}
