/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: creating a file in a directory, exclusively.
 *
 * A program that writes into a directory another user may write to
 * (or could have written to once) must never write through a symbolic
 * link planted there, nor into a file that is already there: the file
 * would be someone else's.  So a new file is made with openat(2)
 * relative to the directory's descriptor (the directory cannot be
 * swapped for another by renaming a path component meanwhile) with
 * O_CREAT | O_EXCL | O_NOFOLLOW: an existing name, a link included, is
 * refused with EEXIST, and nothing is written.
 */
#ifndef SNAPFG_FILE_CREATE_H
#define SNAPFG_FILE_CREATE_H

#include <stdbool.h>
#include <sys/types.h>

/* Is name a single path component (not empty, no '/', not "." or "..")? */
extern bool file_name_is_component (const char *name);

/* Create name in the directory dirfd (or AT_FDCWD) and open it with
 * flags (O_RDWR or O_WRONLY, and any of O_APPEND, O_DIRECT, ...;
 * O_CLOEXEC is always added) and mode (less the umask).  Returns the new
 * descriptor, or -errno: -EEXIST if the name exists (whatever it is),
 * -EINVAL if name is not a single path component.
 */
extern int create_in_dir (int dirfd, const char *name, int flags,
                          mode_t mode);

/* fsync the directory holding path (a file's creation, removal or
 * renaming there is durable once this returns 0).  Returns 0 or -errno.
 */
extern int sync_directory_of (const char *path);

#endif
