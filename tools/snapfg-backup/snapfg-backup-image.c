/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the qcow2 images of a backup directory.
 *
 * Creating one: the file is created by the tool itself, exclusively and
 * never through a link (create_in_dir), and qemu-img is handed that
 * open file as /proc/self/fd/N, never a name it would resolve again; the
 * name is checked to still be that file afterwards.
 *
 * Opening one through qemu-nbd, as --image-opts: the key (a QEMU secret
 * object read from --key-file) for every image of the chain, and for a
 * backup's writes QEMU's "compress" filter, so that every cluster
 * written is a compressed cluster.
 *
 * Checking a chain before reading it: qemu-img and qemu-nbd follow the
 * backing names written in the images, so images swapped, renamed or
 * edited by hand could make them read another chain, or loop.  The
 * chain is first checked against the manifest, header by header.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
#include <endian.h>
#include <sys/stat.h>

#include "file-create.h"
#include "snapfg-backup.h"

#define QCOW2_MAGIC 0x514649fb  /* "QFI\xfb" */
#define QCOW2_INCOMPAT_DATA_FILE (1 << 2)

void
test_pause (const char *point)
{
  const char *at = getenv ("SNAPFG_BACKUP_TEST_PAUSE");
  const char *resume = getenv ("SNAPFG_BACKUP_TEST_RESUME");

  if (at == NULL || resume == NULL || strcmp (at, point) != 0)
    return;
  for (int i = 0; i < 1200 && access (resume, F_OK) == -1; ++i) {
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep (&ts, NULL);
  }
}

/* PATH with every comma doubled, as QEMU's option syntax wants. */
static void
qemu_escape (const char *path, char *out, size_t len)
{
  size_t j = 0;

  for (; *path && j + 3 < len; ++path) {
    out[j++] = *path;
    if (*path == ',')
      out[j++] = ',';
  }
  out[j] = '\0';
}

/* "--object" "secret,..." for A's key, into ARGV at *n. */
static void
add_secret (char **argv, size_t *n, const struct image_access *a,
            char *buf, size_t len)
{
  char esc[PATH_MAX * 2];

  if (a == NULL || a->key_file == NULL)
    return;
  qemu_escape (a->key_file, esc, sizeof esc);
  snprintf (buf, len, "secret,id=" KEY_SECRET_ID ",format=raw,file=%s", esc);
  argv[(*n)++] = "--object";
  argv[(*n)++] = buf;
}

int
image_create (int dirfd, const char *dir, const char *name, uint64_t size,
              const char *backing, const struct image_access *a,
              int *keep_fd)
{
  char size_arg[32], path[64], secret[PATH_MAX * 2 + 64], opts[256];
  char what[PATH_MAX + 256];
  char *argv[24];
  size_t n = 0;
  struct stat made, now;
  int fd, pass, r;

  fd = create_in_dir (dirfd, name, O_RDWR, 0600);
  if (fd < 0) {
    errno = -fd;
    if (errno == EEXIST)
      backup_error ("%s/%s exists, although this run removed it: someone "
                    "else writes this directory; nothing was written "
                    "through it (remove it, and check who can write %s)",
                    dir, name, dir);
    else
      backup_error ("%s/%s: %m", dir, name);
    return -2;
  }
  /* qemu-img opens /proc/self/fd/N: its own copy of this descriptor. */
  pass = fcntl (fd, F_DUPFD, 10);
  if (pass == -1 || fstat (fd, &made) == -1) {
    backup_error ("%s/%s: %m", dir, name);
    close (fd);
    return -1;
  }
  snprintf (size_arg, sizeof size_arg, "%" PRIu64, size);
  snprintf (path, sizeof path, "/proc/self/fd/%d", pass);
  argv[n++] = "qemu-img";
  argv[n++] = "create";
  argv[n++] = "-q";
  argv[n++] = "-f";
  argv[n++] = "qcow2";
  add_secret (argv, &n, a, secret, sizeof secret);
  opts[0] = '\0';
  if (a && a->key_file) {
    /* Tests only: a shorter key derivation than QEMU's 2 s default. */
    const char *iter = getenv ("SNAPFG_BACKUP_TEST_LUKS_ITER_TIME");
    strcat (opts, "encrypt.format=luks,encrypt.key-secret=" KEY_SECRET_ID);
    if (iter && strspn (iter, "0123456789") == strlen (iter) &&
        strlen (iter) < 8)
      strcat (strcat (opts, ",encrypt.iter-time="), iter);
  }
  if (a && a->compress && strcmp (a->compress, "zstd") == 0)
    strcat (strcat (opts, opts[0] ? "," : ""), "compression_type=zstd");
  if (keep_fd)
    strcat (strcat (opts, opts[0] ? "," : ""), "preallocation=metadata");
  if (opts[0]) {
    argv[n++] = "-o";
    argv[n++] = opts;
  }
  if (backing) {
    /* -u: the backing name is relative to the directory, which
     * /proc/self/fd is not; the chain is checked when it is read.
     */
    argv[n++] = "-u";
    argv[n++] = "-b";
    argv[n++] = (char *) backing;
    argv[n++] = "-F";
    argv[n++] = "qcow2";
  }
  argv[n++] = path;
  argv[n++] = size_arg;
  argv[n] = NULL;
  snprintf (what, sizeof what, "%s/%s", dir, name);
  r = run_command (NULL, argv, what);
  /* An encrypted image's key derivation is timed by qemu-img, which
   * measures its first round of PBKDF2 in thread CPU time; on kernels
   * with tick-based CPU accounting that round can read as 0 ms, and
   * qemu-img gives up ("Unable to get accurate CPU usage") without
   * having written anything we need.  Creating again is safe: it
   * rewrites the same file through the same descriptor.
   */
  for (int tries = 1; r != 0 && a && a->key_file && !backup_interrupted &&
         tries < 3; ++tries)
    r = run_command (NULL, argv, what);
  close (pass);
  if (r == 0 && (fstatat (dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == -1 ||
                 now.st_dev != made.st_dev || now.st_ino != made.st_ino)) {
    backup_error ("%s/%s was replaced while qemu-img created it: someone "
                  "else writes this directory", dir, name);
    close (fd);
    return -2;
  }
  if (r == 0 && keep_fd)
    *keep_fd = fd;
  else
    close (fd);
  return r;
}

static struct nbd_handle *
qemu_nbd_open (char **argv, const char *what, bool extents,
               const struct image_access *a)
{
  struct nbd_handle *h = nbd_create ();

  if (h == NULL) {
    backup_error ("%s", nbd_get_error ());
    return NULL;
  }
  if ((extents &&
       nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1) ||
      nbd_connect_systemd_socket_activation (h, argv) == -1) {
    backup_error ("%s: cannot open it with qemu-nbd: %s%s", what,
                  nbd_get_error (),
                  a && a->key_file
                  ? " (the images are encrypted: is --key-file the key "
                    "they were made with?)" : "");
    nbd_close (h);
    return NULL;
  }
  return h;
}

void
image_qemu_nbd_args (const char *dir, const char *name, size_t depth,
                     const struct image_access *a, bool readonly,
                     struct qemu_nbd_args *q)
{
  char esc[PATH_MAX * 2];
  const char *top = "";
  size_t n = 0;

  snprintf (q->path, sizeof q->path, "%s/%s", dir, name);
  qemu_escape (q->path, esc, sizeof esc);
  if (!readonly && a && a->compress) {
    snprintf (q->opts, sizeof q->opts, "driver=compress,file.driver=qcow2,"
              "file.file.driver=file,file.file.filename=%s", esc);
    top = "file.";
  }
  else
    snprintf (q->opts, sizeof q->opts, "driver=qcow2,file.driver=file,"
              "file.filename=%s", esc);
  if (a && a->key_file)
    for (size_t i = 0; i < depth; ++i) {
      size_t l = strlen (q->opts);
      snprintf (q->opts + l, sizeof q->opts - l, ",%s", top);
      for (size_t j = 0; j < i; ++j)
        strncat (q->opts, "backing.", sizeof q->opts - strlen (q->opts) - 1);
      strncat (q->opts, "encrypt.key-secret=" KEY_SECRET_ID,
               sizeof q->opts - strlen (q->opts) - 1);
    }
  q->argv[n++] = "qemu-nbd";
  add_secret (q->argv, &n, a, q->secret, sizeof q->secret);
  q->argv[n++] = readonly ? "-r" : "--cache=writeback";
  q->argv[n++] = "--image-opts";
  q->argv[n++] = q->opts;
  q->argv[n] = NULL;
}

struct nbd_handle *
image_open (const char *dir, const char *name, size_t depth,
            const struct image_access *a, bool readonly)
{
  struct qemu_nbd_args q;

  image_qemu_nbd_args (dir, name, depth, a, readonly, &q);
  return qemu_nbd_open (q.argv, q.path, readonly, a);
}

struct nbd_handle *
output_open (const char *tmp, const char *format, uint64_t size, int *fdp)
{
  char size_arg[32], path[64];
  struct nbd_handle *h;
  int fd, pass;

  fd = open (tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd == -1) {
    backup_error ("%s: %m", tmp);
    return NULL;
  }
  *fdp = fd;
  /* qemu-img and qemu-nbd open /proc/self/fd/N: this file, whatever
   * happens to its name.
   */
  pass = fcntl (fd, F_DUPFD, 10);
  if (pass == -1) {
    backup_error ("%s: %m", tmp);
    return NULL;
  }
  snprintf (path, sizeof path, "/proc/self/fd/%d", pass);
  snprintf (size_arg, sizeof size_arg, "%" PRIu64, size);
  if (strcmp (format, "raw") == 0) {
    if (ftruncate (fd, size) == -1) {
      backup_error ("%s: %m", tmp);
      close (pass);
      return NULL;
    }
  }
  else {
    char *argv[] = { "qemu-img", "create", "-q", "-f", "qcow2", path,
                     size_arg, NULL };
    if (run_command (NULL, argv, tmp) == -1) {
      close (pass);
      return NULL;
    }
  }
  {
    char *argv[] = { "qemu-nbd", "-f", (char *) format, "--cache=writeback",
                     path, NULL };
    h = qemu_nbd_open (argv, tmp, false, NULL);
  }
  close (pass);                 /* qemu-nbd has its own */
  return h;
}

/* The header fields of a qcow2 image the chain check needs. */
struct qcow2_header {
  uint64_t size;
  char backing[PATH_MAX];       /* "" when none */
  bool data_file;               /* an external data file */
};

static int
read_qcow2_header (int fd, struct qcow2_header *q, const char **why)
{
  unsigned char h[104];
  uint32_t magic, version, blen;
  uint64_t boff, incompat = 0;
  ssize_t n = pread (fd, h, sizeof h, 0);

  if (n < 72) {
    *why = "too short for a qcow2 image";
    return -1;
  }
  memcpy (&magic, h, 4);
  memcpy (&version, h + 4, 4);
  memcpy (&boff, h + 8, 8);
  memcpy (&blen, h + 16, 4);
  memcpy (&q->size, h + 24, 8);
  if (be32toh (magic) != QCOW2_MAGIC) {
    *why = "not a qcow2 image";
    return -1;
  }
  version = be32toh (version);
  boff = be64toh (boff);
  blen = be32toh (blen);
  q->size = be64toh (q->size);
  if (version >= 3 && n >= 80) {
    memcpy (&incompat, h + 72, 8);
    incompat = be64toh (incompat);
  }
  q->data_file = incompat & QCOW2_INCOMPAT_DATA_FILE;
  q->backing[0] = '\0';
  if (boff != 0) {
    if (blen == 0 || blen >= sizeof q->backing ||
        pread (fd, q->backing, blen, boff) != (ssize_t) blen) {
      *why = "its backing file name cannot be read";
      return -1;
    }
    q->backing[blen] = '\0';
  }
  return 0;
}

/* The run that wrote image NAME (empty runs only name it). */
static json_t *
image_owner (json_t *manifest, const char *name)
{
  json_t *v;
  size_t i;

  json_array_foreach (json_object_get (manifest, "runs"), i, v)
    if (!json_is_true (json_object_get (v, "empty")) && run_image (v) &&
        strcmp (run_image (v), name) == 0)
      return v;
  return NULL;
}

void
chain_free (char **chain)
{
  if (chain)
    for (size_t i = 0; chain[i]; ++i)
      free (chain[i]);
  free (chain);
}

int
chain_check (int dirfd, const char *dir, json_t *manifest, json_t *run,
             char ***chainp)
{
  size_t max = json_array_size (json_object_get (manifest, "runs"));
  uint64_t seq = json_u64 (run, "seq"), size = json_u64 (run, "size");
  const char *name = run_image (run);
  char **chain = calloc (max + 1, sizeof *chain);
  size_t depth = 0;

  if (chain == NULL) {
    backup_error ("out of memory");
    return -1;
  }
  while (name) {
    json_t *owner = image_owner (manifest, name);
    const char *want = owner ? json_str (owner, "backing") : NULL;
    const char *rebase_to = owner ? json_str (owner, "rebase_to") : NULL;
    const char *why = NULL;
    char file[NAME_MAX + 16], named[2 * NAME_MAX + 64];
    struct qcow2_header q;
    struct stat st;
    int fd;

    if (owner == NULL || strchr (name, '/') || depth >= max) {
      backup_error ("run %" PRIu64 ": the manifest's chain is broken at %s "
                    "(%s): the backup directory is damaged", seq, name,
                    owner == NULL ? "no run wrote it"
                    : depth >= max ? "it loops" : "not a name in the directory");
      goto fail;
    }
    for (size_t i = 0; i < depth; ++i)
      if (strncmp (chain[i], name, strlen (name)) == 0 &&
          (chain[i][strlen (name)] == '\0' ||
           strcmp (chain[i] + strlen (name), ".partial") == 0)) {
        backup_error ("run %" PRIu64 ": the manifest's chain loops at %s: "
                      "the backup directory is damaged", seq, name);
        goto fail;
      }
    snprintf (file, sizeof file, "%s", name);
    fd = openat (dirfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd == -1 && errno == ENOENT && depth == 0) {
      /* A crash between the manifest and the rename (see the order of
       * a run): the manifest vouches for the .partial.
       */
      snprintf (file, sizeof file, "%s.partial", name);
      fd = openat (dirfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd == -1)
        snprintf (file, sizeof file, "%s", name);
    }
    if (fd == -1) {
      backup_error ("%s/%s: %s: cannot restore or verify run %" PRIu64, dir,
                    file, errno == ELOOP ? "a symbolic link, not an image"
                    : strerror (errno), seq);
      goto fail;
    }
    named[0] = '\0';
    if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode))
      why = "not a regular file";
    else if (read_qcow2_header (fd, &q, &why) == 0) {
      if (q.size != size)
        why = "its size is not the run's";
      else if (q.data_file)
        why = "it has an external data file, which snapfg-backup never writes";
      else if (want && rebase_to && strcmp (q.backing, rebase_to) == 0)
        /* An interrupted prune rebased it already (see
         * snapfg-backup-prune.c): the full image is under it.
         */
        want = rebase_to;
      else if (strcmp (q.backing, want ? want : "") != 0) {
        why = want ? "its backing file is not the one the manifest records"
                   : "a full image with a backing file";
        snprintf (named, sizeof named, " (it names '%s', the manifest '%s')",
                  q.backing, want ? want : "");
      }
    }
    close (fd);
    if (why) {
      backup_error ("%s/%s (run %" PRIu64 "'s chain): %s%s: the images do "
                    "not match the manifest; nothing was read", dir, file,
                    seq, why, named);
      goto fail;
    }
    chain[depth] = strdup (file);
    if (chain[depth] == NULL) {
      backup_error ("out of memory");
      goto fail;
    }
    depth++;
    name = want;
  }
  *chainp = chain;
  return depth;

 fail:
  chain_free (chain);
  return -1;
}

int
image_key_check (const char *dir, const char *name,
                 const struct image_access *a)
{
  char path[PATH_MAX], secret[PATH_MAX * 2 + 64], *spec, *json;
  char *argv[10];
  size_t n = 0;
  json_t *opts;
  int r;

  /* The image alone (no backing chain: the chain shares its key), so
   * that only one key derivation is paid; qemu-img check, unlike info,
   * unlocks the image.
   */
  snprintf (path, sizeof path, "%s/%s", dir, name);
  opts = json_pack ("{s:s, s:{s:s, s:s}, s:{s:s}, s:n}",
                    "driver", "qcow2",
                    "file", "driver", "file", "filename", path,
                    "encrypt", "key-secret", KEY_SECRET_ID,
                    "backing");
  json = opts ? json_dumps (opts, JSON_COMPACT) : NULL;
  json_decref (opts);
  if (json == NULL || asprintf (&spec, "json:%s", json) == -1) {
    free (json);
    backup_error ("out of memory");
    return -1;
  }
  free (json);
  argv[n++] = "qemu-img";
  argv[n++] = "check";
  argv[n++] = "-q";
  add_secret (argv, &n, a, secret, sizeof secret);
  argv[n++] = spec;
  argv[n] = NULL;
  r = run_command (NULL, argv, path);
  free (spec);
  if (r == -1)
    backup_error ("--key-file %s does not open %s: is it the key the "
                  "chain was made with?", a->key_file, path);
  return r;
}

int
key_file_check (const char *path)
{
  struct stat st;
  int fd;

  /* Opened, not only stat'd: a key the tool cannot read is as missing
   * as one that is not there, and says so before any work starts.
   * O_NONBLOCK: a FIFO (a key handed over by another program) is not
   * waited for here; qemu reads it.
   */
  fd = open (path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd == -1 || fstat (fd, &st) == -1) {
    backup_error ("--key-file %s: %m", path);
    if (fd >= 0)
      close (fd);
    return -1;
  }
  close (fd);
  if (S_ISDIR (st.st_mode)) {
    backup_error ("--key-file %s: a directory, not a key", path);
    return -1;
  }
  if (S_ISREG (st.st_mode) &&
      (st.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)))
    backup_info ("warning: --key-file %s can be read or written by other "
                 "users (mode %04o): anyone who reads it can read the "
                 "backups; chmod 600 %s", path,
                 (unsigned) (st.st_mode & 07777), path);
  return 0;
}

int
key_status (const struct backup_options *o, json_t *run)
{
  if (json_is_true (json_object_get (run, "encrypted")) &&
      o->key_file == NULL) {
    backup_error ("run %" PRIu64 " is encrypted: give its key with "
                  "--key-file FILE", json_u64 (run, "seq"));
    return EXIT_USAGE;
  }
  return EXIT_OK;
}

int
run_access (const struct backup_options *o, json_t *run,
            struct image_access *a)
{
  a->compress = NULL;
  a->key_file = NULL;
  if (!json_is_true (json_object_get (run, "encrypted")))
    return 0;
  if (o->key_file == NULL) {
    backup_error ("run %" PRIu64 " is encrypted: give its key with "
                  "--key-file FILE", json_u64 (run, "seq"));
    return -1;
  }
  if (access (o->key_file, R_OK) == -1) {
    backup_error ("--key-file %s: %m", o->key_file);
    return -1;
  }
  a->key_file = o->key_file;
  return 0;
}
