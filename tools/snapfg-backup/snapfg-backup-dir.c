/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg-backup: the backup directory.
 *
 * Opening and locking it (one run at a time), the names of the files a
 * run writes, whether a directory without a manifest may start a chain,
 * and removing what an interrupted run left behind (see the order of a
 * run at the top of snapfg-backup-main.c).
 */

#include <config.h>

#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <dirent.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <pwd.h>

#include "snapfg-backup.h"

int
open_backup_dir_created (const char *path, bool create, struct backup_dir *d,
                         bool *created)
{
  d->path = path;
  d->lock_fd = -1;
  *created = false;
  /* 0700: the images hold the whole disk. */
  if (create) {
    if (mkdir (path, 0700) == 0)
      *created = true;
    else if (errno != EEXIST) {
      backup_error ("%s: cannot create the backup directory: %m", path);
      return -1;
    }
  }
  d->fd = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d->fd == -1) {
    backup_error ("%s: %m", path);
    if (*created)
      rmdir (path);
    return -1;
  }
  return 0;
}

int
open_backup_dir (const char *path, bool create, struct backup_dir *d)
{
  bool created;

  return open_backup_dir_created (path, create, d, &created);
}

/* As OpenSSH's StrictModes: the owner is the user running the tool or
 * root, and neither group nor others may write.  Whoever can write the
 * directory can plant a link where the tool will create a file, or swap
 * the images under a restore.
 */
int
check_private_dir (struct backup_dir *d)
{
  struct stat st;
  uid_t me = geteuid ();

  if (fstat (d->fd, &st) == -1) {
    backup_error ("%s: %m", d->path);
    return -1;
  }
  if (st.st_uid != me && st.st_uid != 0) {
    struct passwd *pw = getpwuid (st.st_uid);
    backup_error ("%s is owned by %s (uid %u), who can change it under "
                  "snapfg-backup: use a directory of your own (chown %u %s)",
                  d->path, pw ? pw->pw_name : "another user",
                  (unsigned) st.st_uid, (unsigned) me, d->path);
    return -1;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    backup_error ("%s is writable by %s (mode %04o): another user could "
                  "plant links or swap images in it; make it private "
                  "(chmod go-w %s)", d->path,
                  (st.st_mode & S_IWGRP) && (st.st_mode & S_IWOTH)
                  ? "its group and by others"
                  : (st.st_mode & S_IWGRP) ? "its group" : "others",
                  (unsigned) (st.st_mode & 07777), d->path);
    return -1;
  }
  return 0;
}

/* Only one run at a time in a directory. */
int
lock_backup_dir (struct backup_dir *d)
{
  struct stat st;

  /* Kept from run to run, so not O_EXCL; never through a link. */
  d->lock_fd = openat (d->fd, ".lock",
                       O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (d->lock_fd == -1) {
    backup_error ("%s/.lock: %m%s", d->path,
                  errno == ELOOP ? " (a symbolic link: remove it)" : "");
    return -1;
  }
  if (fstat (d->lock_fd, &st) == -1 || !S_ISREG (st.st_mode)) {
    backup_error ("%s/.lock is not a regular file: remove it", d->path);
    return -1;
  }
  if (flock (d->lock_fd, LOCK_EX | LOCK_NB) == -1) {
    backup_error ("%s: another snapfg-backup is running on this directory",
                  d->path);
    return -1;
  }
  return 0;
}

/* Names snapfg-backup writes, and the run number they carry:
 * NNNN-full.qcow2[.partial], NNNN-incr.qcow2[.partial],
 * NNNN-diff.qcow2[.partial], NNNN.sums[.tmp].
 */
bool
backup_file_name (const char *name, unsigned *seq, bool *partial)
{
  unsigned n;
  int len = 0;

  *partial = false;
  if (sscanf (name, "%u%n", &n, &len) != 1 || len < 4)
    return false;
  name += len;
  *seq = n;
  if (strcmp (name, "-full.qcow2") == 0 || strcmp (name, "-incr.qcow2") == 0 ||
      strcmp (name, "-diff.qcow2") == 0 || strcmp (name, ".sums") == 0)
    return true;
  if (strcmp (name, "-full.qcow2.partial") == 0 ||
      strcmp (name, "-incr.qcow2.partial") == 0 ||
      strcmp (name, "-diff.qcow2.partial") == 0 ||
      strcmp (name, ".sums.tmp") == 0) {
    *partial = true;
    return true;
  }
  return false;
}

/* An empty directory, or one holding only leftovers of an interrupted
 * first run, may start a chain; anything else is not ours to touch.
 */
int
check_new_dir (struct backup_dir *d)
{
  DIR *dp = fdopendir (dup (d->fd));
  struct dirent *e;
  int r = 0;

  if (dp == NULL) {
    backup_error ("%s: %m", d->path);
    return -1;
  }
  while ((e = readdir (dp)) != NULL) {
    unsigned seq;
    bool partial;
    if (strcmp (e->d_name, ".") == 0 || strcmp (e->d_name, "..") == 0 ||
        strcmp (e->d_name, ".lock") == 0 ||
        strcmp (e->d_name, "lost+found") == 0 ||
        strcmp (e->d_name, "manifest.json.tmp") == 0 ||
        (backup_file_name (e->d_name, &seq, &partial) && (partial ||
                                                 strstr (e->d_name, ".sums"))))
      continue;
    backup_error ("%s: not empty and has no manifest.json (found %s): "
                  "give an empty or new directory", d->path, e->d_name);
    r = -1;
    break;
  }
  closedir (dp);
  return r;
}

/* Remove what interrupted runs left, finish a rename a crash cut short. */
int
clean_leftovers (struct backup_dir *d, json_t *last)
{
  unsigned last_seq = last ? json_u64 (last, "seq") : 0;
  const char *last_image = last ? json_str (last, "image") : NULL;
  DIR *dp;
  struct dirent *e;
  char partial[NAME_MAX + 1];

  /* The manifest names the last image: if only its .partial exists, the
   * run was complete and durable when it stopped.
   */
  if (last_image && faccessat (d->fd, last_image, F_OK, 0) == -1) {
    snprintf (partial, sizeof partial, "%s.partial", last_image);
    if (renameat (d->fd, partial, d->fd, last_image) == -1) {
      backup_error ("%s/%s (run %u in the manifest) is missing: the chain "
                    "is broken; start a new one with --full in an empty "
                    "directory", d->path, last_image, last_seq);
      return -1;
    }
    fsync_dir (d->fd);
    backup_info ("finished the interrupted rename of %s", last_image);
  }

  dp = fdopendir (dup (d->fd));
  if (dp == NULL) {
    backup_error ("%s: %m", d->path);
    return -1;
  }
  while ((e = readdir (dp)) != NULL) {
    unsigned seq;
    bool is_partial, ours = backup_file_name (e->d_name, &seq, &is_partial);
    bool is_sums = ours && strstr (e->d_name, ".sums") != NULL;

    /* An interrupted run leaves temporary files, and sums (written
     * before the manifest).  A finished image the manifest does not
     * know never comes from a crash: it is not ours to remove, and the
     * run would replace it.
     */
    if (ours && !is_partial && !is_sums && seq > last_seq) {
      backup_error ("%s/%s is not in the manifest (its last run is %u): "
                    "move it out of the way", d->path, e->d_name, last_seq);
      closedir (dp);
      return -1;
    }
    if (strcmp (e->d_name, "manifest.json.tmp") == 0 ||
        (ours && (is_partial || (is_sums && seq > last_seq)))) {
      if (unlinkat (d->fd, e->d_name, 0) == 0)
        backup_info ("removed %s, left by an interrupted run", e->d_name);
    }
  }
  closedir (dp);
  return 0;
}
